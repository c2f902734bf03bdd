"""Cost per call: microseconds the recorder adds to one small collective call.

Two real gloo ranks (world 2) call all_reduce, broadcast, all_gather and send/recv on a
one-float tensor, plainly and under the recorder in each mode, in interleaved rounds
(plain, intercepted, none, digest, flight, plain, ...) so machine noise hits all alike:

    plain        no recorder: torch's gloo group
    intercepted  the recorder's process group, outside its step window: every call goes
                 through the Python backend, nothing is recorded (the fixed cost of
                 interception, not of recording)
    none         --payload none
    digest       --payload digest (calls of at most 1 KiB also keep their bytes as a blob)
    flight       --flight 8 --payload none (the in-memory ring; null if it fails to start)

Then one rank alone (world 1) on one core, `--solo-rounds` rounds of every mode, without
send/recv: its threads (gloo's, the recorder's) share that core and it waits for no peer,
so what the recorder costs the program shows to about a microsecond, where world 2's wall
time on a 2-core machine swings by a hundred between rounds.

Each rank process times `--calls` calls per repeat, `--repeats` repeats per op; a mode's
figure per op is the median over repeats and rounds of microseconds per call, and what
the recorder adds is that minus plain's. A send/recv round trip counts as two calls.
Also: the digest function's hashing rate (prism_rr.intercept.payload.digests) on
`--hash-mib` MiB tensors, in GB/s, on this process's thread.

    python bench/call_overhead.py [--rounds 3] [--repeats 5] [--calls 1000] [--solo-rounds 3] [--json]

Targets (issue 13): none and flight <= 5 us added per call, digest <= 10 us, hashing
>= 5 GB/s. Prints figures; asserts nothing.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

OPS = ("all_reduce", "broadcast", "all_gather", "send_recv")
SOLO_OPS = ("all_reduce", "broadcast", "all_gather")  # world 1: no one to send to
MODES = ("plain", "intercepted", "none", "digest", "flight")
TARGETS = {"none": 5.0, "flight": 5.0, "digest": 10.0}
HASH_TARGET = 5.0


# --- inside a rank -------------------------------------------------------------------


def _rank_main(out: str, calls: int, repeats: int, warmup: int) -> None:
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    t = torch.zeros(1)
    gathered = [torch.zeros(1) for _ in range(dist.get_world_size())]
    other = 1 - rank

    # Every call carries a value of its own (a loss, a count), as a program's would: the
    # digest mode's blob of a small call is then a new one each time.
    def all_reduce(i):
        t.fill_(i)
        dist.all_reduce(t)

    def broadcast(i):
        t.fill_(i)
        dist.broadcast(t, src=0)

    def all_gather(i):
        t.fill_(i)
        dist.all_gather(gathered, t)

    def send_recv(i):
        t.fill_(i)
        if rank == 0:
            dist.send(t, other)
            dist.recv(t, other)
        else:
            dist.recv(t, other)
            dist.send(t, other)

    fns = {"all_reduce": (all_reduce, 1), "broadcast": (broadcast, 1), "all_gather": (all_gather, 1),
           "send_recv": (send_recv, 2)}
    result = {}
    i = 0
    for op in OPS if dist.get_world_size() > 1 else SOLO_OPS:
        fn, per = fns[op]
        for _ in range(warmup):
            i += 1
            fn(i)
        # A full collection that start-up's objects have made due comes sooner where a
        # recorder allocates, then charged to whichever mode it fell in: every mode starts
        # its timing without one pending.
        gc.collect()
        wall, thread, proc = [], [], []
        for _ in range(repeats):
            dist.barrier()
            t0, c0, p0 = time.perf_counter_ns(), time.thread_time_ns(), time.process_time_ns()
            for _ in range(calls):
                i += 1
                fn(i)
            t1, c1, p1 = time.perf_counter_ns(), time.thread_time_ns(), time.process_time_ns()
            n = 1e3 * calls * per
            wall.append((t1 - t0) / n)
            thread.append((c1 - c0) / n)
            proc.append((p1 - p0) / n)
        result[op] = wall
        result[op + ":thread_cpu"] = thread
        result[op + ":process_cpu"] = proc
    dist.barrier()
    # Whether the recorder is on and in which mode: a recorder that failed to start (it
    # says so on stderr and lets the program run plainly) must not pass for a cheap one.
    try:
        from prism_rr.recorder import _session

        rec = _session.current()
    except Exception:
        rec = None
    result["recording"] = None if rec is None or not rec.on else (
        "flight" if getattr(rec, "flight", None) is not None else rec.options.payload)
    if rank == 0:
        Path(out).write_text(json.dumps(result))
    dist.destroy_process_group()


# --- the driver ----------------------------------------------------------------------


def _env(mode: str, work: Path, n: int) -> dict[str, str]:
    if mode == "plain":
        return {}
    from prism_rr.recorder._options import RecordOptions
    from prism_rr.recorder.launch import hook_env

    spool = work / f"{mode}-{n}-{os.urandom(4).hex()}.d"
    if mode == "intercepted":  # a window that never opens: the group forwards every call
        opts = RecordOptions.make(spool, payload="none", steps="1000000000:")
    elif mode == "flight":
        opts = RecordOptions(spool_dir=str(spool), flight=8)  # its default payload (small)
    else:
        opts = RecordOptions.make(spool, payload=mode)
    return hook_env(opts)


def _run_mode(mode: str, work: Path, n: int, args, world: int = 2) -> dict | None:
    from prism_rr.localrun import run_local

    out = work / f"{mode}-{n}-w{world}.json"
    argv = [sys.executable, os.path.abspath(__file__), "--rank", str(out), "--calls", str(args.calls),
            "--repeats", str(args.repeats), "--warmup", str(args.warmup)]
    if args.pin and len(os.sched_getaffinity(0)) >= 2:
        # Each rank on a core of its own, the recorder's threads beside it (as in production).
        argv = ["sh", "-c", 'exec taskset -c "$LOCAL_RANK" "$@"', "sh", *argv]
    logs = work / f"{mode}-{n}-w{world}.logs"
    codes = run_local(argv, world, env=_env(mode, work, n), timeout=600, log_dir=logs)
    if any(codes) or not out.exists():
        err = (logs / "rank0.stderr").read_text(errors="replace")[-2000:]
        print(f"{mode}: ranks exited {codes}; rank 0's stderr ends:\n{err}", file=sys.stderr)
        return None
    result = json.loads(out.read_text())
    expect = {"plain": None, "intercepted": "none"}.get(mode, mode)
    if result.get("recording") != expect:
        err = (logs / "rank0.stderr").read_text(errors="replace")[-2000:]
        print(f"{mode}: the ranks recorded as {result.get('recording')!r}, not {expect!r}; rank 0's stderr "
              f"ends:\n{err}", file=sys.stderr)
        return None
    return result


def _hash_rate(mib: int, repeats: int) -> float:
    import torch

    from prism_rr.intercept.payload import digests

    t = torch.randn(mib << 18)  # float32: mib MiB
    digests([t])
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        digests([t])
        times.append(time.perf_counter() - t0)
    return t.numel() * t.element_size() / statistics.median(times) / 1e9


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=3, help="interleaved rounds of every mode")
    p.add_argument("--repeats", type=int, default=5, help="timed loops per op in each rank process")
    p.add_argument("--calls", type=int, default=1000, help="calls per timed loop")
    p.add_argument("--warmup", type=int, default=200, help="untimed calls per op first")
    p.add_argument("--modes", default=",".join(MODES))
    p.add_argument("--hash-mib", type=int, default=64)
    p.add_argument("--solo-rounds", type=int, default=3,
                   help="rounds of every mode at world 1 on one core (0: none)")
    p.add_argument("--no-pin", dest="pin", action="store_false", help="let ranks float over the cores")
    p.add_argument("--json", action="store_true", help="one JSON object on stdout")
    p.add_argument("--rank", help=argparse.SUPPRESS)  # internal: run as a rank, write here
    args = p.parse_args()
    if args.rank:
        _rank_main(args.rank, args.calls, args.repeats, args.warmup)
        return

    modes = [m for m in args.modes.split(",") if m]
    if "plain" not in modes:
        modes.insert(0, "plain")
    keys = [op + k for op in OPS for k in ("", ":thread_cpu", ":process_cpu")]
    samples: dict[str, dict[str, list[float]]] = {m: {k: [] for k in keys} for m in modes}
    failed: set[str] = set()
    started = time.monotonic()
    with tempfile.TemporaryDirectory() as d:
        work = Path(d)
        for n in range(args.rounds):
            for mode in modes:
                if mode in failed:
                    continue
                r = _run_mode(mode, work, n, args)
                if r is None:
                    failed.add(mode)
                    continue
                for k in keys:
                    samples[mode][k] += r[k]
                print(f"round {n + 1}/{args.rounds} {mode:11s} " + "  ".join(
                    f"{op} {statistics.median(r[op]):7.1f} ({statistics.median(r[op + ':thread_cpu']):5.1f} cpu)"
                    for op in OPS) + "  us/call", file=sys.stderr)
        # One rank on one core: its threads, gloo's and the recorder's, share that core,
        # and no peer's arrival is waited for: the recorder's own cost, steady to a
        # microsecond where world 2's wall time on a small machine swings by a hundred.
        solo: dict[str, dict[str, list[float]]] = {m: {} for m in modes}
        for n in range(args.solo_rounds):
            for mode in modes:
                if mode in failed:
                    continue
                r = _run_mode(mode, work, n, args, world=1)
                if r is None:
                    continue
                for op in SOLO_OPS:
                    for k in (op, op + ":thread_cpu"):
                        solo[mode].setdefault(k, []).extend(r[k])
    gb_s = _hash_rate(args.hash_mib, 5)
    if "plain" in failed:
        raise SystemExit("the plain runs failed: nothing to compare with")

    med = {m: {k: statistics.median(v) for k, v in samples[m].items()} for m in modes if m not in failed}
    recorded = [m for m in med if m != "plain"]

    def added(kind: str) -> dict[str, dict[str, float]]:
        return {m: {op: med[m][op + kind] - med["plain"][op + kind] for op in OPS} for m in recorded}

    wall, thread, proc = added(""), added(":thread_cpu"), added(":process_cpu")
    solo_med = {m: {k: statistics.median(v) for k, v in t.items()} for m, t in solo.items() if t}

    def solo_added(m: str, kind: str) -> float | None:
        if m not in solo_med or "plain" not in solo_med:
            return None
        return statistics.median(solo_med[m][op + kind] - solo_med["plain"][op + kind] for op in SOLO_OPS)

    def headline(table, m):
        return statistics.median(table[m].values()) if m in table else None

    result = {
        "us_per_call": {m: headline(wall, m) for m in ("none", "digest", "flight")},
        "digest_gb_per_s": gb_s,
        "intercepted_us_per_call": headline(wall, "intercepted"),
        # CPU time added per call: the program's thread, and the whole process (the
        # recorder's threads and gloo's included); steadier than wall time on a busy machine
        "thread_cpu_us_per_call": {m: headline(thread, m) for m in ("intercepted", "none", "digest", "flight")},
        "process_cpu_us_per_call": {m: headline(proc, m) for m in ("intercepted", "none", "digest", "flight")},
        "plain_us_per_call": {op: med["plain"][op] for op in OPS},
        "per_op_us_added": wall,
        "per_op_thread_cpu_us_added": thread,
        "failed": sorted(failed),
        "rounds": args.rounds, "repeats": args.repeats, "calls": args.calls,
        # world 1, one core: us added per call (median over all_reduce, broadcast, all_gather)
        "solo_us_per_call": {m: solo_added(m, "") for m in ("intercepted", "none", "digest", "flight")},
        "solo_thread_cpu_us_per_call": {m: solo_added(m, ":thread_cpu")
                                        for m in ("intercepted", "none", "digest", "flight")},
        "solo_plain_us_per_call": {op: solo_med["plain"][op] for op in SOLO_OPS} if "plain" in solo_med else None,
        "solo_rounds": args.solo_rounds,
    }
    if args.json:
        print(json.dumps(result))
    load = os.getloadavg()[0]
    print(f"\ncost per call at world 2 (gloo, one float), {args.rounds} rounds x {args.repeats} repeats x "
          f"{args.calls} calls, {time.monotonic() - started:.0f} s, load average {load:.2f}", file=sys.stderr)
    print("  plain:       " + "  ".join(f"{op} {med['plain'][op]:.1f}" for op in OPS) + " us/call "
          "(" + "  ".join(f"{med['plain'][op + ':thread_cpu']:.1f}" for op in OPS) + " thread cpu)",
          file=sys.stderr)
    print("  added per call, median over ops: wall / thread cpu / process cpu (per op, wall)", file=sys.stderr)
    for m in ("intercepted", "none", "digest", "flight"):
        if m not in modes:
            continue
        if m in failed:
            print(f"  {m:11s} did not run (null)", file=sys.stderr)
            continue
        target = TARGETS.get(m)
        verdict = "" if target is None else ("ok" if headline(wall, m) <= target else "MISS")
        print(f"  {m:11s} {headline(wall, m):+7.1f} / {headline(thread, m):+6.1f} / {headline(proc, m):+6.1f} us  ("
              + "  ".join(f"{op} {wall[m][op]:+.1f}" for op in OPS) + f")  target {target or '-'} {verdict}",
              file=sys.stderr)
    if "plain" in solo_med:
        print(f"\none rank on one core (world 1; {args.solo_rounds} rounds): plain " + "  ".join(
            f"{op} {solo_med['plain'][op]:.1f}" for op in SOLO_OPS) + " us/call", file=sys.stderr)
        print("  added per call, median over ops: wall / thread cpu", file=sys.stderr)
        for m in ("intercepted", "none", "digest", "flight"):
            w, c = solo_added(m, ""), solo_added(m, ":thread_cpu")
            if w is not None:
                target = TARGETS.get(m)
                verdict = "" if target is None else ("ok" if w <= target else "MISS")
                print(f"  {m:11s} {w:+7.1f} / {c:+6.1f} us  target {target or '-'} {verdict}", file=sys.stderr)
    print(f"  digest hashing {gb_s:.2f} GB/s on {args.hash_mib} MiB  target {HASH_TARGET} "
          f"{'ok' if gb_s >= HASH_TARGET else 'MISS'}", file=sys.stderr)


if __name__ == "__main__":
    main()
