"""Replay fidelity: replayed against recorded iteration time and peak memory.

(1) A controlled workload at world 4 whose compute is timed waits of known, fixed lengths
    (different on each rank) between collectives, one of them asynchronous and overlapped;
    recorded once, replayed with rank 0 real. Target: mean iteration-time error <= 0.5%.
    Rank 0 runs on a core of its own, the other ranks share the rest (PRISM_BENCH_NO_PIN=1
    turns this off): time-shared, its recorded compute carries milliseconds of scheduling
    noise that belongs to this machine, not to the program or the replayer.
(2) The demo GPT at world 2 (FSDP2 over dp=2): two plain recordings in the same run give
    the run-to-run spread of iteration time; the first is replayed with rank 0 real.
    Target: the replay's error is no larger than that spread.
(3) Peak memory (the CPU storage tracker, `--memory`) of the real rank, recorded against
    replayed, on both. Target: <= 0.01%.

    python bench/replay_fidelity.py [--steps 12] [--demo-steps 8] [--repeats 3] [--json]

Recordings use `--payload none`; the first step (start-up) is not scored. Prints figures;
asserts nothing. On a shared machine the figures are noisy (the load average is printed).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

WORLD = 4
# Per-rank compute (ms) before each of the step's calls; rank 0 is never the slowest.
PHASES_MS = [
    (24.0, 36.0, 28.0, 32.0),
    (16.0, 12.0, 24.0, 20.0),
    (20.0, 28.0, 16.0, 24.0),
    (32.0, 32.0, 36.0, 28.0),  # overlapped with an async all_reduce
]


_SPIN_S = 0.0005


def compute(seconds: float) -> None:
    """A timed wait of a fixed length: sleep, then spin the last stretch (a sleep on a loaded
    machine wakes late by up to milliseconds)."""
    deadline = time.perf_counter() + seconds
    if seconds > _SPIN_S:
        time.sleep(seconds - _SPIN_S)
    while time.perf_counter() < deadline:
        pass


def _pin(rank: int) -> None:
    """Rank 0 (the one replayed for real) gets a core of its own, the others share the rest:
    4 ranks time-sharing 2 cores otherwise put milliseconds of scheduling noise into rank 0's
    recorded compute, which no replay can (or should) reproduce. A GPU rank in production
    has its device to itself. Every thread of the process is moved (the recorder's writer
    started before this); threads started later inherit the mask."""
    cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    if len(cores) < 2:
        return
    mask = {cores[0]} if rank == 0 else set(cores[1:])
    for tid in os.listdir("/proc/self/task"):
        try:
            os.sched_setaffinity(int(tid), mask)
        except OSError:
            pass


def worker(steps: int) -> None:
    """One rank of the controlled workload (run under the recorder or the replayer)."""
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    if os.environ.get("PRISM_BENCH_NO_PIN") != "1":
        _pin(int(os.environ.get("RANK", "0")))
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    param = torch.nn.Parameter(torch.zeros(256))
    opt = torch.optim.SGD([param], lr=0.1)
    a, b, c, d = (p[rank] / 1e3 for p in PHASES_MS)
    for step in range(steps):
        compute(a)
        # Activations: 64 MB that the all_reduce's result is computed from, so the peak is
        # the program's and not a 4 KB race with the backend's worker thread.
        act = torch.empty(16 * 2**20)
        x = torch.full((4096,), float(rank + step)) + act[:4096].zero_()
        dist.all_reduce(x)
        del act
        compute(b)
        outs = [torch.empty(1024) for _ in range(WORLD)]
        dist.all_gather(outs, x[:1024].clone())
        compute(c)
        g = torch.cat(outs)[:256].clone()
        work = dist.all_reduce(g, async_op=True)
        compute(d)
        work.wait()
        param.grad = g / WORLD
        opt.step()
    dist.barrier()
    dist.destroy_process_group()


def _record(argv: list[str], world: int, out: Path, payload: str = "none") -> Path:
    from prism_rr.format import pack
    from prism_rr.recorder.launch import spool_dir_for
    from prism_rr.recorder.launch import record_command

    launch = [sys.executable, "-m", "prism_rr.localrun", "--nproc", str(world), "--timeout", "300", "--"]
    code = record_command([*launch, sys.executable, *argv], out, payload=payload, memory=True, timeout=600)
    if code != 0:
        raise RuntimeError(f"recording {argv} exited {code}")
    pack(spool_dir_for(out), out)
    return out


def _replay(bundle: Path, argv: list[str], work: Path, **kw) -> dict:
    from prism_rr.replayer import replay

    logs = work / f"logs-{bundle.stem}-{time.monotonic_ns()}"
    result = replay(bundle, ranks=(0,), cmd=[sys.executable, *argv], timeout=600, log_dir=logs, **kw)
    if result.exit_code != 0:
        tail = (logs / "rank0.stderr").read_text()[-3000:] if (logs / "rank0.stderr").exists() else ""
        raise RuntimeError(f"replay of {bundle} exited {result.exit_code}\n{tail}")
    return result.report


def _recorded_times(bundle: Path, rank: int = 0) -> list[float]:
    from prism_rr.analysis import step_durations
    from prism_rr.format import open_bundle

    with open_bundle(bundle) as b:
        return [d[rank] / 1e9 for d in (step_durations(b, s) for s in b.steps) if rank in d]


def _spread(a: list[float], b: list[float]) -> float:
    """Mean absolute per-step difference between two runs, in % of the first (step 0 left out)."""
    pairs = list(zip(a[1:], b[1:]))
    return statistics.mean(abs(y - x) / x * 100 for x, y in pairs)


def mean_error(rep: dict) -> float:
    """Error of the mean iteration time over the scored steps, in %."""
    steps = [s for s in rep["steps"] if s["step"] in rep["scored_steps"]]
    rec = statistics.mean(s["recorded_s"] for s in steps)
    return abs(statistics.mean(s["replayed_s"] for s in steps) - rec) / rec * 100


def _line(name: str, rep: dict) -> str:
    return (f"  {name}: iteration-time error {rep['iteration_time_error_pct']:.3f}% per step, "
            f"{mean_error(rep):.3f}% of the mean "
            f"(recorded mean {1e3 * statistics.mean(s['recorded_s'] for s in rep['steps'][1:]):.2f} ms, "
            f"replayed {1e3 * statistics.mean(s['replayed_s'] for s in rep['steps'][1:]):.2f} ms), "
            f"compute ratio {rep['compute_ratio'] or float('nan'):.3f}, peak memory error "
            f"{_num(rep['peak_memory_error_pct'])}% of the run's peak "
            f"({rep['peak_memory_recorded_bytes']} vs {rep['peak_memory_replayed_bytes']} B), "
            f"{_num(rep['step_peak_memory_error_pct'])}% per step (median)")


def _summary(name: str, reps: list[dict], **extra) -> dict:
    """One workload's figures over its replays (printing a line per replay)."""
    for i, r in enumerate(reps):
        print(_line(f"{name} replay {i + 1}", r), file=sys.stderr)
    errs = [r["iteration_time_error_pct"] for r in reps]
    return {"errors_pct": errs, "error_pct_median": statistics.median(errs), **extra,
            "peak_memory_error_pct": [r["peak_memory_error_pct"] for r in reps],
            "step_peak_memory_error_pct": [r["step_peak_memory_error_pct"] for r in reps],
            "mean_error_pct": [mean_error(r) for r in reps],
            "reports": reps}


def _num(v) -> str:
    return "n/a" if v is None else f"{v:.4f}"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=12, help="steps of the controlled workload")
    p.add_argument("--demo-steps", type=int, default=8)
    p.add_argument("--repeats", type=int, default=3, help="replays of each recording")
    p.add_argument("--only", choices=("fixed", "demo"), default=None)
    p.add_argument("--json", action="store_true", help="one JSON object on stdout")
    p.add_argument("--worker", type=int, default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker is not None:
        worker(args.worker)
        return
    started = time.monotonic()
    results: dict = {}
    with tempfile.TemporaryDirectory(prefix="prism-fidelity-") as d:
        work = Path(d)
        if args.only in (None, "fixed"):
            fixed = [str(Path(__file__).resolve()), "--worker", str(args.steps)]
            bundle = _record(fixed, WORLD, work / "fixed.prism")
            reps = [_replay(bundle, fixed, work) for _ in range(args.repeats)]
            results["fixed"] = _summary("fixed", reps)
        if args.only in (None, "demo"):
            demo = ["-m", "prism_rr.demo.train", "--steps", str(args.demo_steps), "--quiet"]
            b1 = _record(demo, 2, work / "demo1.prism")
            b2 = _record(demo, 2, work / "demo2.prism")
            spread = _spread(_recorded_times(b1), _recorded_times(b2))
            reps = [_replay(b1, demo, work) for _ in range(args.repeats)]
            results["demo"] = _summary("demo", reps, run_to_run_spread_pct=spread)
    if args.json:
        print(json.dumps(results))
    load = os.getloadavg()[0]
    print(f"\nreplay fidelity ({time.monotonic() - started:.0f} s, load average {load:.2f})", file=sys.stderr)
    if "fixed" in results:
        r = results["fixed"]
        print(f"  (1) fixed-compute workload, world {WORLD}, rank 0 real, {args.steps} steps: error median "
              f"{r['error_pct_median']:.3f}% per step over {args.repeats} replays {['%.3f' % e for e in r['errors_pct']]}, "
              f"of the mean iteration time {['%.3f' % e for e in r['mean_error_pct']]}"
              f"  target <= 0.5% {'ok' if r['error_pct_median'] <= 0.5 else 'MISS'}", file=sys.stderr)
    if "demo" in results:
        r = results["demo"]
        ok = r["error_pct_median"] <= r["run_to_run_spread_pct"]
        print(f"  (2) demo FSDP2 world 2, rank 0 real, {args.demo_steps} steps: error median "
              f"{r['error_pct_median']:.3f}% per step {['%.3f' % e for e in r['errors_pct']]}, of the mean "
              f"{['%.3f' % e for e in r['mean_error_pct']]}; run-to-run spread per step "
              f"{r['run_to_run_spread_pct']:.3f}%  target error <= spread {'ok' if ok else 'MISS'}", file=sys.stderr)
    for key, label in (("peak_memory_error_pct", "of the run's peak"), ("step_peak_memory_error_pct", "per step")):
        mem = [e for k in results for e in results[k][key] if e is not None]
        worst = max(mem, default=None)
        print(f"  (3) peak memory error {label}, worst of all replays: "
              f"{'n/a' if worst is None else f'{worst:.4f}%'}  target <= 0.01% "
              f"{'ok' if worst is not None and worst <= 0.01 else 'MISS'}", file=sys.stderr)


if __name__ == "__main__":
    main()
