"""What the collectives, diagnosis and compare screens show; imports no UI.

Diagnosis is `prism_rr.analysis.diagnose`, named here for the screens. A group's calls are matched here from the timeline model's spans, so the screen reads
only that group's members, and shares their cached spans with the timeline.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from statistics import median
from typing import Callable

from prism_rr.analysis import Finding, diagnose, step_durations
from prism_rr.format import Bundle, Collective, PointToPoint
from prism_rr.tui.model import FAR, TimelineModel

__all__ = ["CallRow", "Finding", "compare_bundles", "diagnose", "group_calls"]


@dataclass(slots=True)
class CallRow:
    """One sequence number of a group: who entered, who did not, skew, and what is wrong."""

    group: int
    seq: int
    ops: dict[str, int] = field(default_factory=dict)  # op -> how many members called it
    arrivals: dict[int, int] = field(default_factory=dict)  # rank -> enter time
    ends: dict[int, int] = field(default_factory=dict)  # rank -> end (FAR: never completed)
    nbytes: dict[int, int] = field(default_factory=dict)
    step: int | None = None

    @property
    def op(self) -> str:
        return max(self.ops, key=self.ops.get) if self.ops else ""

    @property
    def skew(self) -> int:
        return max(self.arrivals.values()) - min(self.arrivals.values()) if self.arrivals else 0

    @property
    def last(self) -> int | None:
        return max(self.arrivals, key=self.arrivals.get) if self.arrivals else None

    @property
    def hung(self) -> list[int]:
        return sorted(r for r, e in self.ends.items() if e == FAR)

    def missing(self, expected) -> list[int]:
        return [r for r in expected if r not in self.arrivals]

    def problems(self, expected) -> list[str]:
        out = []
        if len(self.ops) > 1:
            out.append("op mismatch: " + ", ".join(f"{o}x{n}" for o, n in sorted(self.ops.items())))
        if len(set(self.nbytes.values())) > 1:
            out.append("size mismatch")
        if self.hung:
            out.append(f"never completed on {len(self.hung)}")
        if self.missing(expected):
            out.append(f"{len(self.missing(expected))} did not enter")
        return out


def group_calls(tm: TimelineModel, group: int, *, progress: Callable[[int, int], None] | None = None,
                stop: Callable[[], bool] | None = None) -> tuple[list[CallRow], tuple[int, ...]]:
    """Every call of `group`, matched by sequence number over its recorded members."""
    members = tuple(r for r in tm.group_members(group) if r in tm.row_of)
    rows: dict[int, CallRow] = {}
    for n, r in enumerate(members):
        if stop is not None and stop():
            break
        spans = tm.load(r)
        for i, rec in enumerate(spans.records):
            if isinstance(rec, Collective) and rec.group == group:
                row = rows.get(rec.seq)
                if row is None:
                    row = rows[rec.seq] = CallRow(group=group, seq=rec.seq, step=rec.step)
                row.ops[rec.op] = row.ops.get(rec.op, 0) + 1
                row.arrivals[r] = spans.starts[i]
                row.ends[r] = spans.ends[i]
                row.nbytes[r] = rec.in_bytes
        if progress is not None:
            progress(n + 1, len(members))
    return [rows[s] for s in sorted(rows)], members


# --- compare ---------------------------------------------------------------------------


def _step_medians(bundle: Bundle) -> dict[int, float]:
    out = {}
    for s in bundle.steps:
        d = step_durations(bundle, s)
        if d:
            out[s] = median(d.values())
    return out


def _rank_means(bundle: Bundle, ranks) -> dict[int, float]:
    out = {}
    per_step = [step_durations(bundle, s) for s in bundle.steps]
    for r in ranks:
        d = [durations[r] for durations in per_step if r in durations]
        if d:
            out[r] = sum(d) / len(d)
    return out


def _call_key(rec) -> tuple:
    if isinstance(rec, Collective):
        return ("collective", rec.op, rec.group, rec.seq, rec.in_shapes, rec.in_dtypes, rec.digest_in)
    return ("p2p", rec.op, rec.group, rec.seq, rec.peer, rec.shapes, rec.dtypes, rec.digest)


def first_divergence(recorded: Bundle, replayed: Bundle, rank: int) -> dict | None:
    """The first call where the replay of `rank` differs from its recording, if any."""
    def calls(b):
        return (rec for rec in b.events(rank) if isinstance(rec, (Collective, PointToPoint)))

    rec_it, rep_it = calls(recorded), calls(replayed)
    n = 0
    while True:
        a, b = next(rec_it, None), next(rep_it, None)
        if a is None and b is None:
            return None
        if a is None or b is None or _call_key(a) != _call_key(b):
            what = "replay made more calls" if a is None else ("replay stopped early" if b is None else "")
            if not what:
                ka, kb = _call_key(a), _call_key(b)
                names = ("kind", "op", "group", "seq", "shapes/peer", "dtypes/shapes", "digest/dtypes", "digest")
                what = next(f"{names[i]} differs" for i in range(len(ka)) if ka[i] != kb[i])
            ref = a or b
            return {"rank": rank, "index": n, "step": ref.step, "op": ref.op, "group": ref.group,
                    "seq": ref.seq, "what": what, "recorded": a, "replayed": b}
        n += 1


def compare_bundles(recorded: Bundle, replayed: Bundle) -> dict:
    """Iteration times per step and per rank, recorded vs replayed, and the first divergence.

    Only the replay's ranks are compared call by call (a replay runs a few ranks).
    """
    rec_steps, rep_steps = _step_medians(recorded), _step_medians(replayed)
    ranks = [r for r in replayed.recorded_ranks if r in set(recorded.recorded_ranks)]
    rec_ranks, rep_ranks = _rank_means(recorded, ranks), _rank_means(replayed, ranks)
    divergences = [d for r in ranks if (d := first_divergence(recorded, replayed, r)) is not None]
    first = min(divergences, key=lambda d: (d["step"], d["index"]), default=None)
    note = replayed.manifest.get("divergence") or replayed.manifest.get("run", {}).get("divergence")
    return {
        "steps": [(s, rec_steps.get(s), rep_steps.get(s)) for s in sorted(set(rec_steps) | set(rep_steps))],
        "ranks": [(r, rec_ranks.get(r), rep_ranks.get(r)) for r in ranks],
        "first_divergence": first,
        "replay_note": note,
    }
