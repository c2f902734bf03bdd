"""The driver's own cost a call: what `replay --from-bundle` adds beyond the backend's.

    python bench/driver_overhead.py [--calls 5000] [--repeats 7] [--payloads none,digest] [--json]

A world-1 program makes `--calls` small calls, a quarter of each kind: all_reduce of one
float, broadcast, all_gather_into_tensor, and an asynchronous all_reduce waited for at
once; it is recorded under `prism-rr record --nproc 1 --payload P` for each payload (none:
the driver makes up every input; digest: a call of at most 1 KiB keeps its bytes, which
the driver reads back from the bundle). Then, in this process, on one core (gloo's threads
too) with one torch thread and a world-1 gloo group:

    plain   the same calls made directly through torch.distributed on tensors made once
    driver  `program_of(bundle, 0)` with every compute hold taken out (each action at and
            back at recorded time 0, so the driver never sleeps), run by the driver's
            `_Driver.run()` with no replay session: what start() does at world 1, less
            init_process_group (this process's group is the world) and the session

in interleaved pairs whose order turns each repeat, per kind and all kinds together. A
figure is the median over repeats of microseconds a call (wall, and the program thread's
CPU time beside it); the driver's own is driver minus plain. Not counted here: what the
replay's session does in a call (its Python backend, virtual peers, checks), which any
replayed program pays alike. Target (the issue): the driver adds at most 5 us a call.
Prints one table on stderr and, with --json, one JSON object on stdout; asserts nothing.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

KINDS = ("all_reduce", "broadcast", "all_gather_into_tensor", "all_reduce_async")
TARGET_US = 5.0

_PROGRAM = r"""
import sys
import torch
import torch.distributed as dist
dist.init_process_group("gloo")
gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
t, out = torch.zeros(1), torch.zeros(1)
for _ in range(int(sys.argv[1])):
    dist.all_reduce(t)
    dist.broadcast(t, src=0)
    gather(out, t)
    dist.all_reduce(t, async_op=True).wait()
dist.destroy_process_group()
"""


def _record(work: Path, rounds: int, payload: str) -> Path:
    script, out = work / "calls.py", work / f"calls-{payload}.prism"
    script.write_text(_PROGRAM)
    env = dict(os.environ, OMP_NUM_THREADS="1")
    subprocess.run([sys.executable, "-m", "prism_rr.cli", "record", "-o", str(out), "--nproc", "1", "--payload",
                    payload, "--", sys.executable, str(script), str(rounds)],
                   check=True, env=env, capture_output=True)
    return out


def _kind(rec) -> str:
    return rec.op + ("_async" if rec.async_op else "")


def _free(program, kind: str | None):
    """The program with no compute to hold (every action at and back at recorded 0, as its
    start: run() holds at_ns minus the latest back_ns before it), only `kind`'s calls and
    their waits where given."""
    keep = tuple(dataclasses.replace(a, at_ns=0, back_ns=0) for a in program.actions
                 if kind is None or (a.kind != "step" and _kind(program.calls[a.index]) == kind))
    return dataclasses.replace(program, actions=keep, start_ns=0)


def _driver(program, bundle):
    """A _Driver set up as start() sets it up at world 1, on this process's group."""
    import torch.distributed as dist
    from prism_rr.replayer.driver import _Driver

    if program.last_gid:
        raise SystemExit(f"the recording made groups 1..{program.last_gid}: this bench runs world-1 programs "
                         "on the world group only")
    d = _Driver(program, bundle, (0,))
    d.groups[0] = dist.group.WORLD
    d.warm_up()  # as start() does
    return d


def _plain(kind: str | None, rounds: int) -> int:
    """The recorded program's calls (one kind's, or all), made directly; returns the count."""
    import torch
    import torch.distributed as dist

    gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    t, out = torch.zeros(1), torch.zeros(1)
    if kind == "all_reduce":
        for _ in range(rounds):
            dist.all_reduce(t)
    elif kind == "broadcast":
        for _ in range(rounds):
            dist.broadcast(t, src=0)
    elif kind == "all_gather_into_tensor":
        for _ in range(rounds):
            gather(out, t)
    elif kind == "all_reduce_async":
        for _ in range(rounds):
            dist.all_reduce(t, async_op=True).wait()
    else:
        for _ in range(rounds):
            dist.all_reduce(t)
            dist.broadcast(t, src=0)
            gather(out, t)
            dist.all_reduce(t, async_op=True).wait()
        return 4 * rounds
    return rounds


def _timed(fn) -> tuple[float, float, int]:
    """(wall us, program thread cpu us, calls) of one run of `fn`."""
    wall, cpu = time.perf_counter_ns(), time.thread_time_ns()
    calls = fn()
    return (time.perf_counter_ns() - wall) / 1e3, (time.thread_time_ns() - cpu) / 1e3, calls


def _measure(bundle_path: Path, rounds: int, repeats: int) -> dict:
    """kind -> {plain, driver: (wall, cpu) median us a call}, and the loads seen."""
    import gc

    from prism_rr.format import open_bundle
    from prism_rr.replayer._program import program_of

    out: dict = {}
    loads = []
    with open_bundle(bundle_path) as bundle:
        program = program_of(bundle, 0)
        found = {_kind(c) for c in program.calls}
        if found != set(KINDS):
            raise SystemExit(f"the recording's calls are {sorted(found)}, not {list(KINDS)}")
        for kind in (None,) + KINDS:
            free = _free(program, kind)
            calls = sum(a.kind == "call" for a in free.actions)

            def driven(free=free, calls=calls):
                d = _driver(free, bundle)  # a fresh one each run, made before the clock starts
                return lambda: (d.run(), calls)[1]

            def plain(kind=kind):
                return lambda: _plain(kind, rounds)

            runs: dict[str, list] = {"plain": [], "driver": []}
            for make in (plain, driven):  # warm-up: the first made-up input, the first call of each op
                _timed(make())
            for r in range(repeats):
                for name, make in (("plain", plain), ("driver", driven))[:: 1 if r % 2 == 0 else -1]:
                    fn = make()
                    gc.collect()
                    wall, cpu, n = _timed(fn)
                    runs[name].append((wall / n, cpu / n))
                loads.append(os.getloadavg()[0])
            out[kind or "all"] = {name: (statistics.median(w for w, _ in v), statistics.median(c for _, c in v))
                                  for name, v in runs.items()}
            out[kind or "all"]["calls"] = calls
        parts = _parts(_free(program, None), bundle, repeats)
    return {"kinds": out, "parts": parts, "load": (min(loads), max(loads))}


def _parts(program, bundle, repeats: int) -> dict:
    """Where the driver's own time goes: its steps around a call timed alone over every call
    of the program, (wall, program thread cpu) us a call, medians of repeats."""
    d = _driver(program, bundle)
    calls = program.calls
    readies = [d.prepare(rec) for rec in calls]

    def inputs():
        for rec in calls:
            d._inputs(rec.in_shapes, rec.in_dtypes, rec.blob_in, True)

    def prepare():
        for rec in calls:
            d.prepare(rec)

    def completed():
        for i, ready in enumerate(readies):
            d.completed(i, ready, 0)

    out = {}
    for name, fn in (("prepare", prepare), ("inputs", inputs), ("completed", completed)):
        runs = []
        for _ in range(repeats):
            wall, cpu, _ = _timed(lambda fn=fn: fn() or len(calls))
            runs.append((wall / len(calls), cpu / len(calls)))
        out[name] = (statistics.median(w for w, _ in runs), statistics.median(c for _, c in runs))
    return out


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--calls", type=int, default=5000, help="calls a run, a quarter of each kind")
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--payloads", default="none,digest", help="recording payloads to measure (none, digest, full)")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    rounds = max(1, args.calls // len(KINDS))
    payloads = args.payloads.split(",")

    work = Path(tempfile.mkdtemp(prefix="driver-overhead-"))
    bundles = {payload: _record(work, rounds, payload) for payload in payloads}

    # one core for this process and the threads it starts (gloo's), one torch thread
    os.sched_setaffinity(0, {0})
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()), RANK="0", WORLD_SIZE="1")
    dist.init_process_group("gloo")
    results = {}
    try:
        for payload, path in bundles.items():
            results[payload] = _measure(path, rounds, args.repeats)
            _print(payload, results[payload], rounds, args.repeats)
    finally:
        dist.destroy_process_group()
        shutil.rmtree(work, ignore_errors=True)
    if args.json:
        print(json.dumps({"calls": 4 * rounds, "repeats": args.repeats, "target_us": TARGET_US, "payloads": results},
                         indent=1))


def _print(payload: str, res: dict, rounds: int, repeats: int) -> None:
    lo, hi = res["load"]
    print(f"\npayload {payload}: {4 * rounds} calls a run ({rounds} of each kind), world 1, gloo, one core, "
          f"median of {repeats} repeats, us a call (wall / program thread cpu); load average {lo:.2f}-{hi:.2f}",
          file=sys.stderr)
    print(f"  {'kind':<24}{'plain':>16}{'driver':>16}{'driver own':>18}", file=sys.stderr)
    for kind, r in res["kinds"].items():
        (pw, pc), (dw, dc) = r["plain"], r["driver"]
        verdict = f"   target {TARGET_US:g}  {'ok' if dw - pw <= TARGET_US else 'MISS'}" if kind == "all" else ""
        print(f"  {kind:<24}{pw:>8.1f} / {pc:<5.1f}{dw:>8.1f} / {dc:<5.1f}{dw - pw:>+9.1f} / {dc - pc:<+6.1f}{verdict}",
              file=sys.stderr)
    r, parts = res["kinds"]["all"], res["parts"]
    print("  the driver's steps alone, us a call (wall / program thread cpu):", file=sys.stderr)
    for name, (w, c) in parts.items():
        label = "  of which inputs" if name == "inputs" else name
        print(f"    {label:<22}{w:>8.1f} / {c:<6.1f}", file=sys.stderr)
    rest = [r["driver"][i] - r["plain"][i] - parts["prepare"][i] - parts["completed"][i] for i in (0, 1)]
    print(f"    {'the rest':<22}{rest[0]:>8.1f} / {rest[1]:<6.1f}(own minus prepare and completed: "
          f"the loop, and the calls on its new tensors)", file=sys.stderr)


if __name__ == "__main__":
    main()
