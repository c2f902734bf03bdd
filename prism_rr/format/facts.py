"""What a bundle says of itself without reading a chunk: as data, and as lines for people.

`bundle_facts` is `prism-rr info --json`: the manifest's and the rank info's fields
type-checked here, where they are read, so no caller meets a stranger's wrong type; its
strings are the bundle's, exact. `info_lines` is `prism-rr info`: the same facts for
people, every string from the bundle made safe for a terminal (`text.shown`).
"""

from __future__ import annotations

from typing import Any

from prism_rr.text import shown
from prism_rr.specs import format_ranks

__all__ = ["DEVICE_CLOCKS", "FATAL_SIGNALS", "attempt_endings", "bundle_facts", "crash_reason", "device_time_facts",
           "device_time_line", "exit_noted", "failed_steps", "info_lines", "interrupted_facts", "interrupted_line"]

_LISTED_NODES = 8  # nodes named on info's line; the rest are counted
_LISTED_WORDS = 4  # forms and versions of imported dumps named


def bundle_facts(bundle) -> dict[str, Any]:
    """Format, world, ranks, groups, steps, events, size, dropped and lost records, ranks
    whose recorder turned itself off, and, where the manifest has them, the flight dump,
    the signal that interrupted the recording, the nodes, the clocks' alignment and what a
    bundle was imported from."""
    ranks = bundle.summaries["ranks"]
    failures = _recorder_failures(bundle)
    manifest = bundle.manifest
    return {
        "path": str(bundle.path),
        "format_version": bundle.format_version,
        "attempt": bundle.attempt,
        "attempts": _attempts_facts(bundle),
        "tool": manifest.get("tool", "unknown"),
        "world_size": bundle.world_size,
        "recorded_ranks": bundle.recorded_ranks,
        "groups": len(bundle.groups),
        "steps": bundle.steps,
        "event_count": bundle.event_count,
        "bytes": bundle.size,
        "dropped": sum(int(r.get("dropped", 0) or 0) for r in ranks.values()),
        "truncated_ranks": sorted(r for r, s in ranks.items() if s.get("truncated")),
        "open_calls": sum(int(r.get("open", 0) or 0) for r in ranks.values()),
        "recorder_failed_ranks": [f["rank"] for f in failures],
        "recorder_failures": failures,
        "flight": _flight_facts(manifest.get("flight")),
        "interrupted": interrupted_facts(manifest.get("run")),
        "nodes": _node_facts(manifest.get("nodes")),
        "clock": _clock_facts(manifest.get("clock")),
        "imported": _imported_facts(manifest.get("imported")),
        "cpu": cpu_sharing(bundle),
        "device_time": device_time_facts(bundle),
    }


def info_lines(facts: dict[str, Any]) -> list[str]:
    """`prism-rr info`'s lines, from `bundle_facts`."""
    steps = facts["steps"]
    events = facts["event_count"]
    lines = [
        f"bundle          {shown(facts['path'], None)}",
        f"format          {facts['format_version']} ({shown(facts['tool'])})",
        f"world size      {facts['world_size']}",
        f"recorded ranks  {format_ranks(facts['recorded_ranks'])} ({len(facts['recorded_ranks'])})",
        f"groups          {facts['groups']}",
        f"steps           {format_ranks(steps) if steps else 'none'}",
        f"events          {events:,}",
        f"size            {facts['bytes']:,} bytes" + (f" ({facts['bytes'] / events:.1f} per event)" if events else ""),
    ]
    nodes = facts["nodes"]
    if nodes is not None:
        parts = [f"{shown(n['node'], 40)} ({shown(n['hostname'], 60)}: ranks "
                 f"{'?' if n['ranks'] is None else format_ranks(n['ranks'])})" for n in nodes[:_LISTED_NODES]]
        more = f", +{len(nodes) - _LISTED_NODES} more" if len(nodes) > _LISTED_NODES else ""
        lines.append(f"nodes           {len(nodes)}: {', '.join(parts)}{more}")
    clock = facts["clock"]
    if clock is not None:
        err = clock["max_error_ns"]
        err = "error unknown" if err is None else f"within {err / 1e3:,.0f} us"
        missing = clock["ranks_without_offset"]
        lines.append(f"clocks          aligned to rank 0 by {shown(clock['method'], 40)}, {err}"
                     + (f"; {missing} ranks without an offset" if missing else ""))
    attempts = facts["attempts"]
    if len(attempts) > 1:
        lines.append(f"attempts        {len(attempts)}, the facts above of attempt {facts['attempt']} (--attempt N "
                     f"for another)")
        for a in attempts:
            lines.append(f"  attempt {a['attempt']:<5} world {a['world_size']}, ranks {format_ranks(a['recorded_ranks'])}: "
                         + ending_line(a["ended"]))
    interrupted = facts.get("interrupted")
    if interrupted is not None:
        ended = next((a["ended"] for a in attempts if a["attempt"] == facts["attempt"]), None)
        lines.append(f"interrupted     {interrupted_line(interrupted, ended)}")
    cpu = facts["cpu"]
    if cpu is not None:
        lines.append(f"cpu             {cpu_line(cpu)}")
    device = facts.get("device_time")
    if device is not None:
        lines.append(f"device time     {device_time_line(device)}")
    imported = facts["imported"]
    if imported is not None:
        lines.append(f"imported        from PyTorch Flight Recorder dumps ({_words(imported['forms'])}, "
                     f"version {_words(imported['versions'])}): no steps, payloads or command; replay refuses it")
    lines += _flight_lines(facts["flight"])
    if facts["dropped"]:
        lines.append(f"dropped         {facts['dropped']:,} records (the recorder fell behind)")
    if facts["truncated_ranks"]:
        lines.append(f"truncated       ranks {format_ranks(facts['truncated_ranks'])} lost the tail of their spool")
    if facts["open_calls"]:
        lines.append(f"never completed {facts['open_calls']} calls (a hang or a kill)")
    for f in facts["recorder_failures"]:
        step = "?" if f["step"] is None else f["step"]
        lines.append(f"recorder off    rank {f['rank']} from step {step}: {shown(f['reason'])}")
    return lines


def flight_line(path, flight: dict[str, Any] | None, ranks: int) -> str:
    """What `record --flight` says of one bundle its triggers wrote (`flight`: the
    bundle's `bundle_facts()["flight"]`)."""
    f = flight or {}
    where = f" on rank {f['rank']}" if f.get("rank") is not None else ""
    at = f" at step {f['step']}" if f.get("step") is not None else ""
    return f"flight: wrote {shown(path, None)}: {shown(f.get('trigger', '?'))}{where}{at}, {ranks} ranks"


def _words(values: list) -> str:
    return ", ".join(shown(v, 40) for v in values[:_LISTED_WORDS]) or "?"


def _flight_lines(flight: dict | None) -> list[str]:
    if flight is None:
        return []
    where = f" on rank {flight['rank']}" if flight.get("rank") is not None else ""
    at = f" at step {flight['step']}" if flight.get("step") is not None else ""
    detail = ", ".join(f"{shown(k)} {shown(v)}" for k, v in flight["details"].items())
    lines = [f"flight dump     {shown(flight.get('trigger'))}{where}{at}" + (f" ({detail})" if detail else "")
             + (f"; steps from {flight['first_step']}" if flight.get("first_step") is not None else "")]
    if flight["ranks_from_ring"]:
        lines.append(f"                ranks {format_ranks(flight['ranks_from_ring'])} read from the rings "
                     f"they left (they did not dump: died or too slow)")
    if flight["ranks_missing"]:
        lines.append(f"                ranks {format_ranks(flight['ranks_missing'])} are not in it "
                     f"(another node's spool directory: pack them together)")
    return lines


# --- cores -----------------------------------------------------------------------------

def cpu_sharing(bundle) -> dict[str, Any] | None:
    """Whether the recorded ranks computed on cores of their own, from the rank info's
    `cpu` (recorded since 1.2): per host, the ranks the recording ran there (every rank of
    the world on it, from LOCAL_WORLD_SIZE where not all were recorded), the CPUs they
    could run on and torch's threads. {"hosts": [{"host", "ranks", "cpus", "threads"}],
    "shared": bool (a host ran more threads than it had CPUs), "worst": the most threads
    per CPU}; None when no rank info says (older bundles, imports) or the ranks computed
    on a GPU."""
    hosts: dict[str, dict] = {}
    for rank in bundle.recorded_ranks:
        info = bundle.rank_info(rank)
        cpu = info.get("cpu")
        if type(cpu) is not dict or str(info.get("device", "cpu")).startswith("cuda"):
            continue
        allowed, threads = cpu.get("allowed"), cpu.get("threads")
        if type(allowed) is not int or type(threads) is not int or allowed < 1 or threads < 1:
            continue
        host = info.get("hostname") if type(info.get("hostname")) is str else "?"
        h = hosts.setdefault(host, {"host": host, "ranks": 0, "cpus": 0, "threads": 0, "local": 0, "load": None})
        h["ranks"] += 1
        load = cpu.get("load_1m")
        if type(load) in (int, float) and load >= 0:
            h["load"] = max(h["load"] or 0.0, float(load))
        h["cpus"] = max(h["cpus"], allowed)
        h["threads"] += threads
        env = info.get("env") if type(info.get("env")) is dict else {}
        local = env.get("LOCAL_WORLD_SIZE")
        if type(local) is str and local.isdigit():
            h["local"] = max(h["local"], int(local))
    if not hosts:
        return None
    for h in hosts.values():
        local = h.pop("local")
        if local > h["ranks"]:  # ranks the recording ran there but did not record
            h["threads"] = round(h["threads"] / h["ranks"] * local)
            h["ranks"] = local
    listed = sorted(hosts.values(), key=lambda h: -h["threads"] / h["cpus"])
    worst = listed[0]["threads"] / listed[0]["cpus"]
    # Other work on a host: its load (the run queue's last minute, as the ranks ended)
    # beyond the ranks' own threads, more than half its CPUs.
    busy = [h for h in listed if h["load"] is not None and h["load"] - h["threads"] > h["cpus"] / 2]
    return {"hosts": listed[:_LISTED_NODES], "shared": worst > 1.0, "worst": round(worst, 2),
            "busy": [{"host": h["host"], "load": h["load"], "cpus": h["cpus"], "threads": h["threads"]}
                     for h in busy[:_LISTED_NODES]]}


def cpu_line(cpu: dict[str, Any]) -> str:
    """cpu_sharing in a few words for people."""
    h = cpu["hosts"][0]
    where = f" on {shown(h['host'], 40)}" if len(cpu["hosts"]) > 1 else ""
    said = f"{h['ranks']} ranks, {h['threads']} torch threads on {h['cpus']} CPUs{where}"
    busy = ""
    if cpu.get("busy"):
        b = cpu["busy"][0]
        busy = f"; the host had other work (load {b['load']:.1f} on {b['cpus']} CPUs as the ranks ended)"
    if cpu["shared"]:
        return (f"{said}: the ranks shared cores ({cpu['worst']:g} threads per CPU), so their compute "
                f"ran slower than a replay of fewer ranks will{busy}")
    return f"{said}: cores of their own{busy}"


# --- attempts ---------------------------------------------------------------------------

# faulthandler's words for the fatal signals it handles (a crash file's first line)
FATAL_SIGNALS = {
    "Segmentation fault": "SIGSEGV", "Aborted": "SIGABRT", "Bus error": "SIGBUS",
    "Floating-point exception": "SIGFPE", "Floating point exception": "SIGFPE",
    "Illegal instruction": "SIGILL",
}


def crash_reason(crash) -> str | None:
    """faulthandler's words ("Aborted", ...) in a rank info's `crash`, or None."""
    if type(crash) is not dict or type(crash.get("text")) is not str:
        return None
    for line in crash["text"][:4096].splitlines():
        if line.startswith("Fatal Python error: "):
            return line[len("Fatal Python error: "):].strip()[:100]
    return "unknown"


def attempt_endings(bundle) -> dict[str, Any]:
    """How the open attempt of `bundle` ended, from its rank info and indexes (no chunk is
    read): {"failed": bool, "ranks": {rank: {"how", "code", "signal", "step", "last_ns",
    "where"}}, "first": the rank that ended first among those that did not end cleanly (by
    their last record, on rank 0's clock), or None}. A rank's `how` is what its process said
    (sys.exit's code, an unhandled exception, a signal), its crash file's signal, or
    "no word" (SIGKILL, os._exit: its records just end); `where`, of a signal, the
    program's frames it came in (innermost first; None where not recorded). The ranks are
    keyed by their number as a string, so that the whole is JSON as it stands."""
    ranks: dict[int, dict] = {}
    summaries = bundle.summaries["ranks"]
    for rank in bundle.recorded_ranks:
        info = bundle.rank_info(rank)
        end = info.get("exit")
        crash = crash_reason(info.get("crash"))
        entry: dict[str, Any] = {"how": "no word (killed, or os._exit)", "code": None, "signal": None, "where": None}
        if crash is not None:
            entry.update(how=f"crashed ({crash})", signal=FATAL_SIGNALS.get(crash, "fatal error"))
        elif type(end) is dict:
            how = end.get("how")
            code, sig = end.get("code"), end.get("signal")
            entry.update(how=how if type(how) is str else "?", code=code if type(code) is int else None,
                         signal=sig if type(sig) is str else None, where=_frames(end.get("where")))
        chunks = bundle.chunks(rank)
        entry["step"] = chunks[-1].step_last if chunks else None
        last = summaries.get(rank, {}).get("t_last")
        offset = info.get("clock_offset", {}).get("offset_ns") if type(info.get("clock_offset")) is dict else None
        entry["last_ns"] = None if type(last) is not int else last - (offset if type(offset) is int else 0)
        ranks[rank] = entry
    bad = {r: e for r, e in ranks.items() if e["signal"] or e["code"] not in (0,)}
    first = min((r for r in bad if bad[r]["last_ns"] is not None), key=lambda r: bad[r]["last_ns"], default=None)
    return {"failed": bool(bad), "ranks": {str(r): e for r, e in ranks.items()}, "first": first}


def exit_noted(bundle) -> set[int]:
    """The ranks whose recorder left an exit note (how the process ended). Where some did,
    a rank without one ended without a word: SIGKILL, the OOM killer, os._exit."""
    return {r for r in bundle.recorded_ranks if type(bundle.rank_field(r, "exit")) is dict}


def failed_steps(bundle) -> list[int]:
    """The steps a run failed or hung in: the step each rank that did not end cleanly was
    in when its records end, as `attempt_endings` numbers it (the step its last record is
    in). Not clean: a call it never completed, a crash, an exception, a signal, or no word
    at all where other ranks left their exit notes (a kill). Often no rank ended that step,
    so no step summary holds it; `Bundle.steps` counts it all the same. None of an imported
    dump (its steps are its chunks'). Reads the rank info and indexes, a chunk index only
    of the ranks that ended badly."""
    if bundle.manifest.get("imported") is not None:
        return []
    noted = bool(exit_noted(bundle))
    ranks = bundle.summaries["ranks"]
    opened = (ranks.total("open") if type(ranks) is not dict else sum(int(r.get("open", 0)) for r in ranks.values()))
    out = set()
    for rank in bundle.recorded_ranks:
        bad = _ended_badly({k: bundle.rank_field(rank, k) for k in ("crash", "exit")})
        if bad or (bad is None and noted) or (opened and ranks.get(rank, {}).get("open")):
            chunks = bundle.chunks(rank)
            if chunks:
                out.add(chunks[-1].step_last)
    return sorted(out)


def _ended_badly(info: dict) -> bool | None:
    """Whether a rank's process ended badly, by its rank info (as `attempt_endings` judges
    it): a crash file, or an exit note's signal or code other than 0; None: no word."""
    if crash_reason(info.get("crash")) is not None:
        return True
    end = info.get("exit")
    if type(end) is not dict:
        return None
    code = end.get("code")
    return type(end.get("signal")) is str or (code if type(code) is int else None) != 0


def ending_line(ended: dict[str, Any]) -> str:
    """An attempt's ending (attempt_endings) in a few words for people."""
    ranks = {int(r): e for r, e in ended["ranks"].items()}
    if not ended["failed"]:
        return "ended cleanly" + (f" (rank {min(ranks)} and the others: {shown(ranks[min(ranks)]['how'], 60)})"
                                  if ranks else "")
    return "failed: " + ending_ranks(ended)


def ending_ranks(ended: dict[str, Any]) -> str:
    """How each rank that did not end cleanly ended (attempt_endings), the first first:
    'rank 1 stopped by SIGTERM in step 3 at train.py:14 in <module>; then rank 0 ...'."""
    ranks = {int(r): e for r, e in ended["ranks"].items()}
    first = ended["first"]
    parts = []
    order = sorted(ranks, key=lambda r: (r != first, ranks[r]["last_ns"] is None, ranks[r]["last_ns"] or 0))
    for r in order:
        e = ranks[r]
        if not e["signal"] and e["code"] == 0:
            continue
        step = "" if e["step"] is None else f" in step {e['step']}"
        at = f" at {shown(e['where'][0], 120)}" if e.get("where") else ""
        how = shown(e["how"], 120)
        if e["code"] is not None and not e["signal"]:
            how = f"exited {e['code']}: {how}"
        elif e["code"] is None and not e["signal"]:
            how = f"ended with {how}"
        parts.append(f"rank {r} {how}{step}{at}")
    return "; then ".join(parts[:4]) + (f"; and {len(parts) - 4} more" if len(parts) > 4 else "")


def interrupted_facts(run) -> dict | None:
    """The manifest run's `interrupted` (recorder/launch.py): the SIGINT or SIGTERM that
    `prism-rr record` got and passed on, {signal, after_s: seconds into the run, forced:
    the signal the command then had to be stopped with, or None}; None where the run was
    not interrupted."""
    v = run.get("interrupted") if type(run) is dict else None
    if type(v) is not dict or type(v.get("signal")) is not str:
        return None
    after, forced = v.get("after_s"), v.get("forced")
    return {"signal": v["signal"][:40], "after_s": float(after) if type(after) in (int, float) else None,
            "forced": forced[:40] if type(forced) is str else None}


def interrupted_line(interrupted: dict[str, Any], ended: dict[str, Any] | None) -> str:
    """What interrupted the run, when, and how each rank ended (`ended`: attempt_endings)."""
    i = interrupted
    when = "" if i["after_s"] is None else f" {i['after_s']:,.1f} s into the run"
    forced = f" (it had not ended in time: stopped with {shown(i['forced'], 40)})" if i["forced"] else ""
    ranks = ending_ranks(ended) if ended is not None and ended["failed"] else ""
    return f"by {shown(i['signal'], 40)} to prism-rr record{when}{forced}" + (f"; {ranks}" if ranks else "")


def _frames(v) -> list[str] | None:
    """A stack as recorded (innermost first "file:line function"), type-checked; None where absent."""
    if type(v) not in (list, tuple) or not v or not all(type(f) is str for f in v[:16]):
        return None
    return [f[:300] for f in v[:16]]


def _attempts_facts(bundle) -> list[dict]:
    """Every attempt the bundle holds: {attempt, default, world_size, recorded_ranks,
    ended}; each but the open one read from its own view of the file."""
    out = []
    for entry in bundle.attempts:
        if entry["attempt"] == bundle.attempt:
            ended = attempt_endings(bundle)
        else:
            with type(bundle)(bundle.path, entry["attempt"]) as view:
                ended = attempt_endings(view)
        out.append({"attempt": entry["attempt"], "default": entry["default"], "world_size": entry["world_size"],
                    "recorded_ranks": list(entry["recorded_ranks"]), "ended": ended})
    return out


# --- the manifest's and rank info's fields, type-checked ------------------------------


DEVICE_CLOCKS = {"cuda-events": "CUDA events", "host-events": "host events, a stand-in for a device"}
_DEVICE_TIME_KIND = 8  # records.DeviceTime.KIND


def device_time_facts(bundle) -> dict[str, Any] | None:
    """Whether steps and calls carry device times (format 1.3, FORMAT.md "Device time"):
    {records: DeviceTime records, ranks: the ranks with some, clocks: the clocks their
    rank info names}, or None where no rank has any. From the summaries and rank info."""
    ranks, records = [], 0
    for rank, rs in bundle.summaries["ranks"].items():
        n = rs.get("kinds", {}).get(_DEVICE_TIME_KIND, 0)
        if n:
            ranks.append(rank)
            records += n
    if not records:
        return None
    clocks = set()
    for rank in ranks:
        info = bundle.rank_info(rank).get("device_time")
        clock = info.get("clock") if type(info) is dict else None
        clocks.add(clock[:40] if type(clock) is str else "unknown")
    return {"records": records, "ranks": sorted(ranks), "clocks": sorted(clocks)}


def device_time_line(device: dict[str, Any]) -> str:
    """`info`'s words for device_time_facts: "recorded (CUDA events) on ranks 0-1"."""
    clocks = ", ".join(DEVICE_CLOCKS.get(c) or shown(c, 40) for c in device["clocks"])
    return f"recorded ({clocks}) on ranks {format_ranks(device['ranks'])}: {device['records']:,} step and call times"


def _recorder_failures(bundle) -> list[dict]:
    """Ranks whose recorder turned itself off: {rank, step, reason}, from the rank info
    (a rank notes it there as well as in a `recorder_failed` marker), so no chunk is read."""
    out = []
    for rank in bundle.recorded_ranks:
        f = bundle.rank_field(rank, "recorder_failed")
        if type(f) is not dict:
            continue
        step = f.get("step")
        reason = f.get("reason")
        out.append({
            "rank": rank,
            "step": step if type(step) is int else None,
            "reason": reason[:500] if type(reason) is str else "unknown",
        })
    return out


def _flight_facts(v) -> dict | None:
    """A flight dump's manifest entry (recorder/_flight.py), as plain facts: what fired,
    where, when, and which ranks came from where; None for other bundles."""
    if type(v) is not dict:
        return None
    out = {}
    for key in ("trigger", "rank", "step", "first_step", "steps_kept", "dump", "hostname", "wall_ns"):
        value = v.get(key)
        if type(value) in (str, int, float) or value is None:
            out[key] = value[:200] if type(value) is str else value
    for key in ("ranks_dumped", "ranks_from_ring", "ranks_missing"):
        value = v.get(key)
        out[key] = [int(r) for r in value if type(r) is int][:100_000] if isinstance(value, (list, tuple)) else []
    details = v.get("details")
    out["details"] = {str(k)[:100]: (d[:500] if type(d) is str else d) for k, d in details.items()
                      if type(d) in (str, int, float, bool)} if type(details) is dict else {}
    return out


def _ranks_or_none(v) -> list[int] | None:
    return list(v) if type(v) is tuple and all(type(r) is int for r in v) else None


def _node_facts(v) -> list[dict] | None:
    """The manifest's `nodes` (one per node of a multi-node recording): {node, hostname,
    ranks}, names as strings (absent: ""), ranks None where they are not a list of ranks;
    None where the manifest has no such list."""
    if type(v) is not tuple or not all(type(n) is dict for n in v):
        return None
    return [{"node": "" if n.get("node") is None else str(n.get("node")),
             "hostname": "" if n.get("hostname") is None else str(n.get("hostname")),
             "ranks": _ranks_or_none(n.get("ranks"))} for n in v]


def _clock_facts(v) -> dict | None:
    """The manifest's `clock`: how the ranks' clocks were aligned (method, max_error_ns
    or None, ranks_without_offset: a count); None where it says nothing readable."""
    if type(v) is not dict or type(v.get("method")) is not str:
        return None
    err = v.get("max_error_ns")
    missing = v.get("ranks_without_offset")
    return {"method": v["method"], "max_error_ns": err if type(err) is int else None,
            "ranks_without_offset": len(missing) if type(missing) is tuple else 0}


def _imported_facts(v) -> dict | None:
    """The manifest's `imported`, for a bundle `prism-rr import fr` made: the dumps'
    forms and versions as lists of strings; None for other bundles."""
    if type(v) is not dict or v.get("from") != "flight_recorder":
        return None

    def strings(key: str) -> list[str]:
        value = v.get(key)
        return [str(x) for x in value] if type(value) is tuple else []

    return {"from": "flight_recorder", "forms": strings("forms"), "versions": strings("versions")}
