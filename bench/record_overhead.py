"""Recorder overhead: demo step time with the recorder over step time without.

Runs the demo GPT at world 2 (FSDP2 over dp=2, gloo) plainly (A) and under
`prism-rr record` (B) in interleaved pairs, A B A B ..., so machine noise hits both
alike; each run's figure is its median step time after warm-up, each mode's figure the
median of its per-pair ratios B/A.

    python bench/record_overhead.py [--pairs 10] [--steps 12] [--modes none,digest,full]

Targets: none <= 1.03, digest <= 1.10. Prints figures; asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

STEP = re.compile(r"step (\d+) loss \S+ time ([0-9.]+)s")
TARGETS = {"none": 1.03, "digest": 1.10}


def step_time(stderr: str, warmup: int) -> float:
    times = [float(t) for s, t in STEP.findall(stderr) if int(s) >= warmup]
    if not times:
        raise RuntimeError(f"no step times in the run's output:\n{stderr[-2000:]}")
    return statistics.median(times)


def run(train: list[str], world: int, mode: str | None, work: Path, warmup: int) -> float:
    launch = [sys.executable, "-m", "prism_rr.localrun", "--nproc", str(world), "--timeout", "300", "--"]
    if mode is None:
        cmd = launch + train
    else:
        out = work / f"{mode}.prism"
        cmd = [sys.executable, "-m", "prism_rr.cli", "record", "-o", str(out), "--payload", mode,
               "--", *launch, *train]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return step_time(proc.stderr, warmup)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--pairs", type=int, default=10)
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--warmup", type=int, default=2, help="steps left out of each run's median")
    p.add_argument("--world", type=int, default=2)
    p.add_argument("--modes", default="none,digest,full")
    p.add_argument("--no-pin", dest="pin", action="store_false", help="let ranks float over the cores")
    p.add_argument("--json", action="store_true", help="one JSON object on stdout")
    args = p.parse_args()
    train = [sys.executable, "-m", "prism_rr.demo.train", "--steps", str(args.steps)]
    if args.pin and len(os.sched_getaffinity(0)) >= args.world:
        # Each rank on a core of its own (LOCAL_RANK), the recorder's thread beside it:
        # unpinned, ranks migrate and steps vary by tens of percent from run to run.
        train = ["sh", "-c", 'exec taskset -c "$LOCAL_RANK" "$@"', "sh", *train]
    modes = args.modes.split(",")
    results = {}
    started = time.monotonic()
    with tempfile.TemporaryDirectory() as d:
        work = Path(d)
        for mode in modes:
            ratios, plain, recorded = [], [], []
            for i in range(args.pairs):
                a = run(train, args.world, None, work, args.warmup)
                b = run(train, args.world, mode, work, args.warmup)
                plain.append(a)
                recorded.append(b)
                ratios.append(b / a)
                print(f"{mode:6s} pair {i + 1:2d}: plain {a * 1e3:7.2f} ms  recorded {b * 1e3:7.2f} ms  ratio {b / a:.3f}",
                      file=sys.stderr)
            results[mode] = {
                "ratio_median": statistics.median(ratios),
                "plain_step_ms_median": statistics.median(plain) * 1e3,
                "recorded_step_ms_median": statistics.median(recorded) * 1e3,
                "pairs": args.pairs,
                "target": TARGETS.get(mode),
            }
    if args.json:
        print(json.dumps(results))
    print(f"\nrecorder overhead, demo at world {args.world}, {args.pairs} interleaved pairs, "
          f"{args.steps} steps/run (first {args.warmup} left out), {time.monotonic() - started:.0f} s", file=sys.stderr)
    for mode, r in results.items():
        target = r["target"]
        verdict = "" if target is None else ("ok" if r["ratio_median"] <= target else "MISS")
        print(f"  {mode:6s} ratio {r['ratio_median']:.3f}  (plain {r['plain_step_ms_median']:.2f} ms, "
              f"recorded {r['recorded_step_ms_median']:.2f} ms)  target {target or '-'} {verdict}", file=sys.stderr)


if __name__ == "__main__":
    main()
