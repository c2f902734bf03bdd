"""Cost-model fit quality: scale a dp=2 recording to dp=4 and compare with a dp=4 recording.

    python bench/scale_fit.py [--steps 6] [--repeats 2] [--json]

Records the demo (FSDP2 over dp) at world 2 and at world 4, scales the world-2 bundle
to dp=4 with each latency form of the cost model (`constant`: alpha once per call;
`steps`: alpha per algorithm step) and compares the predicted transfer times with the
world-4 recording's, call by call (matched by group and sequence number). The line
"as recorded" is the world-2 times taken unchanged: what the model adds over none.
Prints figures; asserts nothing. On this 2-core machine a world of 4 time-shares the
cores, so its transfer times are mostly scheduling, which no bytes-and-latency model
predicts: expect large errors here, and measure on the cluster that will run the job.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def _record(out: Path, nproc: int, steps: int) -> Path:
    env = dict(os.environ, OMP_NUM_THREADS="1")
    subprocess.run([sys.executable, "-m", "prism_rr.cli", "record", "-o", str(out), "--nproc", str(nproc), "--",
                    sys.executable, "-m", "prism_rr.demo.train", "--steps", str(steps), "--quiet"],
                   check=True, env=env, capture_output=True)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--repeats", type=int, default=2, help="pairs of recordings")
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    from prism_rr.topology.scale import compare_transfers, scale

    results: dict[str, list[dict]] = {"constant": [], "steps": [], "as recorded": []}
    with tempfile.TemporaryDirectory(prefix="scale-fit-") as d:
        work = Path(d)
        for i in range(args.repeats):
            dp2 = _record(work / f"dp2-{i}.prism", 2, args.steps)
            dp4 = _record(work / f"dp4-{i}.prism", 4, args.steps)
            for latency in ("constant", "steps"):
                pred = work / f"pred-{latency}-{i}.prism"
                note = scale(dp2, pred, dp=4, latency=latency)
                rep = compare_transfers(pred, dp4)
                rep["in_sample_mape_pct"] = note["model"]["fit_error"]["mape_pct"]
                results[latency].append(rep)
            results["as recorded"].append(compare_transfers(dp2, dp4))
    if args.json:
        print(json.dumps(results))
    print(f"cost model, demo dp=2 scaled to dp=4 against a dp=4 recording ({args.repeats} pairs, {args.steps} steps):",
          file=sys.stderr)
    for name, reps in results.items():
        tot = [r["total_error_pct"] for r in reps if r["total_error_pct"] is not None]
        per = [r["call_mape_pct"] for r in reps if r["call_mape_pct"] is not None]
        calls = reps[0]["calls"] if reps else 0
        extra = ""
        if name != "as recorded":
            extra = f", in-sample error {statistics.median(r['in_sample_mape_pct'] for r in reps):.1f}%"
        print(f"  {name:<12} {calls} calls: total transfer time {['%+.1f%%' % t for t in tot]}, "
              f"mean abs error per call {['%.1f%%' % m for m in per]}{extra}", file=sys.stderr)


if __name__ == "__main__":
    main()
