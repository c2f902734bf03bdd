"""A restarted job's attempts: what ended each one, and what changed from one to the next.

A bundle of a job that TorchElastic restarted (or whose rank processes a harness made
anew) holds every attempt (FORMAT.md §4). `diagnose` leads with one finding per attempt
that did not end cleanly (who ended first, how, in which step, then the others) and one
per change between consecutive attempts (world size, groups, the hosts ranks ran on).
Read from each attempt's rank info and indexes: no chunk is read.
"""

from __future__ import annotations

from prism_rr.analysis._diagnose import Finding
from prism_rr.format.facts import attempt_endings, ending_line
from prism_rr.text import shown
from prism_rr.specs import format_ranks

__all__ = ["attempt_findings"]

_LISTED = 8  # ranks named in a change


def attempt_findings(bundle) -> list[Finding]:
    """Findings of kind "attempt" of a bundle with more than one attempt (else none): the
    attempts that failed, then what changed between attempts."""
    if len(bundle.attempts) < 2:
        return []
    out: list[Finding] = []
    facts: list[dict] = []
    for entry in bundle.attempts:
        k = entry["attempt"]
        if k == bundle.attempt:
            facts.append(_facts(bundle))
        else:
            with type(bundle)(bundle.path, k) as view:
                facts.append(_facts(view))
    for f in facts:
        ended = f["ended"]
        if not ended["failed"]:
            continue
        first = ended["first"]
        ranks = (first,) if first is not None else tuple(int(r) for r, e in ended["ranks"].items() if e["signal"]
                                                          or e["code"] not in (0,))
        nxt = next((g["attempt"] for g in facts if g["attempt"] > f["attempt"]), None)
        after = f"; the job was restarted as attempt {nxt}" if nxt is not None else "; no attempt came after it"
        out.append(Finding(
            kind="attempt", ranks=ranks,
            message=f"Attempt {f['attempt']} {ending_line(ended)}{after}.",
            details={"attempt": f["attempt"], "ended": ended, "next": nxt}))
    for a, b in zip(facts, facts[1:]):
        changes = _changes(a, b)
        if changes:
            out.append(Finding(
                kind="attempt", ranks=tuple(sorted(set(a["ranks"]) | set(b["ranks"]))),
                message=f"From attempt {a['attempt']} to attempt {b['attempt']}: " + "; ".join(changes) + ".",
                details={"from": a["attempt"], "to": b["attempt"], "changes": changes}))
    return out


def _facts(view) -> dict:
    groups = {g["id"]: tuple(g["ranks"]) for g in view.groups}
    hosts = {r: view.rank_info(r).get("hostname") for r in view.recorded_ranks}
    return {"attempt": view.attempt, "world": view.world_size, "ranks": list(view.recorded_ranks),
            "groups": groups, "hosts": {r: h for r, h in hosts.items() if type(h) is str},
            "ended": attempt_endings(view)}


def _changes(a: dict, b: dict) -> list[str]:
    """What differs between two attempts, in words."""
    out = []
    if a["world"] != b["world"]:
        out.append(f"the world went from {a['world']} to {b['world']} ranks")
    if a["ranks"] != b["ranks"]:
        out.append(f"the recorded ranks went from {format_ranks(a['ranks'])} to {format_ranks(b['ranks'])}")
    if a["groups"] != b["groups"]:
        gone = sorted(set(a["groups"]) - set(b["groups"]))
        new = sorted(set(b["groups"]) - set(a["groups"]))
        moved = sorted(g for g in set(a["groups"]) & set(b["groups"]) if a["groups"][g] != b["groups"][g])
        parts = [f"{len(a['groups'])} groups then, {len(b['groups'])} now"]
        if moved:
            parts.append(f"groups {format_ranks(moved)} have other ranks")
        if gone or new:
            parts.append(f"{len(gone)} gone, {len(new)} new")
        out.append(", ".join(parts))
    moved = [r for r in sorted(set(a["hosts"]) & set(b["hosts"])) if a["hosts"][r] != b["hosts"][r]]
    if moved:
        listed = ", ".join(f"rank {r} from {shown(a['hosts'][r], 60)} to {shown(b['hosts'][r], 60)}"
                           for r in moved[:_LISTED])
        more = f" and {len(moved) - _LISTED} more" if len(moved) > _LISTED else ""
        out.append(f"ranks on other hosts: {listed}{more}")
    return out

