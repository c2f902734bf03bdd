"""Cost per call: microseconds the recorder adds to one small collective call.

Two real gloo ranks (world 2) call all_reduce, broadcast, all_gather and send/recv on a
one-float tensor, plainly and under the recorder in each mode, in interleaved rounds
(plain, torch_fr, intercepted, none, ..., plain, ...) so machine noise hits all alike:

    plain        no recorder: torch's gloo group
    torch_fr     torch's own Flight Recorder on (TORCH_FR_BUFFER_SIZE=20000), no prism-rr:
                 the anchor, the cost of always-on recording done in C++
    intercepted  the recorder's process group, outside its step window: every call goes
                 through the Python backend, nothing is recorded (the fixed cost of
                 interception, not of recording)
    none         --payload none
    digest       --payload digest (calls of at most 1 KiB also keep their bytes)
    flight       --flight 8 with its default payload (small: calls of at most 1 KiB whole), on
                 a 1 MiB ring gone round before the timing starts (always-on's steady state)
    none_py, flight_py
                 none and flight on the pure-Python path (PRISM_RR_PURE_PYTHON=1: what runs
                 where the C speedups were not built)

Then one rank alone (world 1) on one core, `--solo-rounds` rounds of every mode, without
send/recv: its threads (gloo's, the recorder's) share that core and it waits for no peer,
so what the recorder costs the program shows to about a microsecond, where world 2's wall
time on a 2-core machine swings by a hundred between rounds.

Each rank process times `--calls` calls per repeat, `--repeats` repeats per op; a mode's
figure per op is the median over repeats and rounds of microseconds per call. Solo: what a
mode adds is that minus plain's, its ratio to the anchor is (plain + added) / (plain +
torch_fr's added). World 2, where a round's plain time swings by tens of percent with the
machine's load: each round's ratio of a mode's median to that round's plain median per op
(the runs next to each other in time; the order of the modes turns by one each round, so
no mode always follows another), the median of those over rounds, then over ops; the
spread of the per-round ratios and the load average at each round are printed beside it.
Where the spread is wider than the margin to a target, the figure says little: rerun with
more rounds on a quieter machine. A send/recv round trip counts as two calls. Also: the digest function's hashing
rate (prism_rr.intercept.payload.digests) on `--hash-mib` MiB tensors, in GB/s.

The calls of a run fit in the call log's ring: what is timed is the program's path. The
compactor's work (the log into the spool's frames) comes at close, or, for a recording
longer than a quarter of the ring, on its thread beside the program; `--long` adds a
solo run of 100,000 calls in spool mode that includes it.

    python bench/call_overhead.py [--rounds 3] [--repeats 5] [--calls 1000] [--solo-rounds 3] [--json]

Targets (issue 28): solo, added per call: none <= 5 us, flight <= 5 us, digest <= 15 us;
world 2, ratio to plain: none <= 1.10, digest <= 1.20; hashing >= 5 GB/s. Prints figures;
asserts nothing.
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
MODES = ("plain", "torch_fr", "intercepted", "none", "digest", "flight", "none_py", "flight_py")
RECORDED = ("intercepted", "none", "digest", "flight", "none_py", "flight_py")
TARGETS = {"none": 5.0, "flight": 5.0, "digest": 15.0}  # solo, us added per call
RATIO_TARGETS = {"none": 1.10, "digest": 1.20}  # world 2, recorded / plain
HASH_TARGET = 5.0
# Flight modes record into a 1 MiB ring (--flight-budget's least) that FLIGHT_FILL untimed
# one-float all_reduces (about 130 bytes each) have filled: an always-on recording's ring is
# full nearly all its life, and a full ring makes room as it writes.
FLIGHT_RING = 1 << 20
FLIGHT_FILL = 10_000


# --- inside a rank -------------------------------------------------------------------


def _rank_main(out: str, calls: int, repeats: int, warmup: int, fill: int = 0) -> None:
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
    for _ in range(fill):  # a flight ring gone round before anything is timed: always-on's steady state
        i += 1
        all_reduce(i)
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
    if mode == "torch_fr":
        return {"TORCH_FR_BUFFER_SIZE": "20000"}
    from prism_rr.recorder._options import RecordOptions
    from prism_rr.recorder.launch import hook_env

    spool = work / f"{mode}-{n}-{os.urandom(4).hex()}.d"
    base = mode.removesuffix("_py")
    if base == "intercepted":  # a window that never opens: the group forwards every call
        opts = RecordOptions.make(spool, payload="none", steps="1000000000:")
    elif base == "flight":
        # its default payload (small), on the smallest ring, gone round before the timing
        opts = RecordOptions(spool_dir=str(spool), flight=8, flight_budget=FLIGHT_RING)
    else:
        opts = RecordOptions.make(spool, payload=base)
    env = hook_env(opts)
    if mode.endswith("_py"):
        env["PRISM_RR_PURE_PYTHON"] = "1"
    return env


def _run_mode(mode: str, work: Path, n: int, args, world: int = 2, calls: int | None = None) -> dict | None:
    from prism_rr.localrun import run_local

    out = work / f"{mode}-{n}-w{world}.json"
    argv = [sys.executable, os.path.abspath(__file__), "--rank", str(out), "--calls", str(calls or args.calls),
            "--repeats", str(args.repeats), "--warmup", str(args.warmup)]
    if mode.removesuffix("_py") == "flight":
        argv += ["--fill", str(FLIGHT_FILL)]
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
    base = mode.removesuffix("_py")
    expect = {"plain": None, "torch_fr": None, "intercepted": "none"}.get(base, base)
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


def _med(values) -> float | None:
    return statistics.median(values) if values else None


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=3, help="interleaved rounds of every mode at world 2 (0: none)")
    p.add_argument("--repeats", type=int, default=5, help="timed loops per op in each rank process")
    p.add_argument("--calls", type=int, default=1000, help="calls per timed loop")
    p.add_argument("--warmup", type=int, default=200, help="untimed calls per op first")
    p.add_argument("--modes", default=",".join(MODES))
    p.add_argument("--hash-mib", type=int, default=64)
    p.add_argument("--solo-rounds", type=int, default=3,
                   help="rounds of every mode at world 1 on one core (0: none)")
    p.add_argument("--long", action="store_true",
                   help="also: solo, 100,000 calls a mode (plain, none, digest): the compactor included")
    p.add_argument("--no-pin", dest="pin", action="store_false", help="let ranks float over the cores")
    p.add_argument("--json", action="store_true", help="one JSON object on stdout")
    p.add_argument("--rank", help=argparse.SUPPRESS)  # internal: run as a rank, write here
    p.add_argument("--fill", type=int, default=0, help=argparse.SUPPRESS)  # internal: untimed calls before all
    args = p.parse_args()
    if args.rank:
        _rank_main(args.rank, args.calls, args.repeats, args.warmup, args.fill)
        return

    modes = [m for m in args.modes.split(",") if m]
    if "plain" not in modes:
        modes.insert(0, "plain")
    started = time.monotonic()
    failed: set[str] = set()
    # samples[world][mode][op or op:thread_cpu] -> us per call, every repeat of every round
    samples: dict[int, dict[str, dict[str, list[float]]]] = {2: {}, 1: {}}
    # by_round[world][mode][n][op] -> that round's median us/call; loads[world] -> load average per round
    by_round: dict[int, dict[str, dict[int, dict[str, float]]]] = {2: {}, 1: {}}
    loads: dict[int, list[float]] = {2: [], 1: []}
    with tempfile.TemporaryDirectory() as d:
        work = Path(d)
        for world, rounds, ops in ((2, args.rounds, OPS), (1, args.solo_rounds, SOLO_OPS)):
            for n in range(rounds):
                loads[world].append(os.getloadavg()[0])
                for mode in modes[n % len(modes):] + modes[: n % len(modes)]:
                    if mode in failed:
                        continue
                    r = _run_mode(mode, work, n, args, world=world)
                    if r is None:
                        failed.add(mode)
                        continue
                    got = samples[world].setdefault(mode, {})
                    for op in ops:
                        for k in (op, op + ":thread_cpu"):
                            got.setdefault(k, []).extend(r[k])
                    by_round[world].setdefault(mode, {})[n] = {op: statistics.median(r[op]) for op in ops}
                    print(f"world {world} round {n + 1}/{rounds} {mode:11s} " + "  ".join(
                        f"{op} {statistics.median(r[op]):7.1f}" for op in ops) + "  us/call", file=sys.stderr)
        long = {}
        if args.long:
            for mode in ("plain", "none", "digest"):
                r = _run_mode(mode, work, 99, args, world=1, calls=20_000)
                if r is not None:
                    long[mode] = _med([statistics.median(r[op]) for op in SOLO_OPS])
    gb_s = _hash_rate(args.hash_mib, 5)
    if "plain" in failed or not samples[1].get("plain") and not samples[2].get("plain"):
        raise SystemExit("the plain runs failed: nothing to compare with")

    def per_op(world: int, mode: str, kind: str = "") -> dict[str, float]:
        got = samples[world].get(mode)
        ops = OPS if world == 2 else SOLO_OPS
        return {op: statistics.median(got[op + kind]) for op in ops} if got else {}

    # world 1: us added per call (median over ops), and the ratio to the anchor's time per call
    solo_plain = per_op(1, "plain")
    solo = {}
    for m in modes:
        if m == "plain" or not per_op(1, m):
            continue
        wall, cpu = per_op(1, m), per_op(1, m, ":thread_cpu")
        plain_cpu = per_op(1, "plain", ":thread_cpu")
        solo[m] = {"added": _med([wall[op] - solo_plain[op] for op in SOLO_OPS]),
                   "added_thread_cpu": _med([cpu[op] - plain_cpu[op] for op in SOLO_OPS]),
                   "per_call": _med(list(wall.values()))}
    anchor = solo.get("torch_fr")
    for m, v in solo.items():
        if anchor is not None:
            v["ratio_to_torch_fr"] = v["per_call"] / anchor["per_call"]
    # world 2: recorded / plain per op, median over ops
    duo_plain = per_op(2, "plain")
    duo = {}
    for m in modes:
        if m == "plain" or not per_op(2, m) or not duo_plain:
            continue
        cpu = per_op(2, m, ":thread_cpu")
        plain_cpu = per_op(2, "plain", ":thread_cpu")
        # per round, against that round's plain run
        paired = {n: {op: v[op] / by_round[2]["plain"][n][op] for op in OPS}
                  for n, v in by_round[2][m].items() if n in by_round[2].get("plain", {})}
        per_op_ratio = {op: _med([r[op] for r in paired.values()]) for op in OPS}
        rounds_ratio = [_med(list(r.values())) for r in paired.values()]
        duo[m] = {"ratio": _med(list(per_op_ratio.values())),
                  "per_op_ratio": per_op_ratio,
                  "round_ratios": rounds_ratio,
                  "pooled_ratio": _med([per_op(2, m)[op] / duo_plain[op] for op in OPS]),
                  "added_thread_cpu": _med([cpu[op] - plain_cpu[op] for op in OPS])}
    result = {
        "solo_us_per_call": {m: v["added"] for m, v in solo.items()},
        "solo_thread_cpu_us_per_call": {m: v["added_thread_cpu"] for m, v in solo.items()},
        "solo_ratio_to_torch_fr": {m: v.get("ratio_to_torch_fr") for m, v in solo.items()},
        "solo_plain_us_per_call": solo_plain,
        "world2_ratio": {m: v["ratio"] for m, v in duo.items()},
        "world2_per_op_ratio": {m: v["per_op_ratio"] for m, v in duo.items()},
        "world2_round_ratios": {m: v["round_ratios"] for m, v in duo.items()},
        "world2_pooled_ratio": {m: v["pooled_ratio"] for m, v in duo.items()},
        "world2_thread_cpu_us_per_call": {m: v["added_thread_cpu"] for m, v in duo.items()},
        "world2_plain_us_per_call": duo_plain,
        "long_solo_us_per_call": {m: v - long["plain"] for m, v in long.items() if m != "plain"} if "plain" in long
        else {},
        "digest_gb_per_s": gb_s,
        "failed": sorted(failed),
        "rounds": args.rounds, "solo_rounds": args.solo_rounds, "repeats": args.repeats, "calls": args.calls,
        "load_average": os.getloadavg()[0],
        "load_averages": {"world2": loads[2], "solo": loads[1]},
    }
    if args.json:
        print(json.dumps(result))
    say = lambda text: print(text, file=sys.stderr)  # noqa: E731
    say(f"\ncost per call, gloo, one float; {time.monotonic() - started:.0f} s, load average {result['load_average']:.2f}")
    if solo_plain:
        say(f"one rank on one core (world 1, {args.solo_rounds} rounds x {args.repeats} x {args.calls} calls, load "
            f"average " + " ".join(f"{x:.2f}" for x in loads[1]) + "): plain "
            + "  ".join(f"{op} {solo_plain[op]:.1f}" for op in SOLO_OPS) + " us/call")
        say("  added per call (median over ops): wall / program thread cpu; time per call against torch's "
            "Flight Recorder's")
        for m, v in solo.items():
            target = TARGETS.get(m)
            verdict = f"target {target} {'ok' if v['added'] <= target else 'MISS'}" if target else ""
            ratio = f"x{v['ratio_to_torch_fr']:.2f} of torch_fr" if "ratio_to_torch_fr" in v else ""
            say(f"  {m:11s} {v['added']:+6.1f} / {v['added_thread_cpu']:+6.1f} us   {ratio:18s} {verdict}")
    if duo:
        say(f"world 2 ({args.rounds} rounds, load average " + " ".join(f"{x:.2f}" for x in loads[2])
            + "): plain " + "  ".join(f"{op} {duo_plain[op]:.1f}" for op in OPS) + " us/call")
        say("  time per call against the same round's plain, median over rounds then ops (per op); the rounds' "
            "spread; program thread cpu added")
        for m, v in duo.items():
            target = RATIO_TARGETS.get(m)
            verdict = f"target {target} {'ok' if v['ratio'] <= target else 'MISS'}" if target else ""
            spread = f"rounds x{min(v['round_ratios']):.2f}-{max(v['round_ratios']):.2f}" if v["round_ratios"] else ""
            say(f"  {m:11s} x{v['ratio']:.3f}  (" + "  ".join(f"{op} x{r:.2f}" for op, r in v["per_op_ratio"].items())
                + f")  {spread}  {v['added_thread_cpu']:+.1f} us cpu  {verdict}")
    if result["long_solo_us_per_call"]:
        say(f"solo, {args.repeats} x 20,000 calls an op (the compactor's batches included): " + "  ".join(
            f"{m} {v:+.1f} us" for m, v in result["long_solo_us_per_call"].items()))
    say(f"digest hashing {gb_s:.2f} GB/s on {args.hash_mib} MiB  target {HASH_TARGET} "
        f"{'ok' if gb_s >= HASH_TARGET else 'MISS'}")
    if failed:
        say(f"did not run: {', '.join(sorted(failed))}")


if __name__ == "__main__":
    main()
