"""The bundle as the program: replayed against recorded iteration time, without the code.

Three trainers of prism_rr.demo.train at world 2 (2 ranks on this machine's 2 cores: their
compute is not slowed by sharing cores while recorded), each recorded once with digest
payloads and the memory tracker:

    demo    the demo GPT, dp1 x tp2 (DTensor tensor parallel; `prism-rr demo --world 2`)
    ddp     DDP over dp=2
    fsdp    FSDP2 over dp=2

and each replayed `--repeats` times three ways: its program with rank 0 real (what a
program replay meets today), the bundle as the program with rank 0 real (`--from-bundle`),
and the bundle as the program with every rank real (`--ranks all`). Per way: the
iteration-time error (mean over the scored steps of |replayed - recorded| / recorded, the
first step left out), its mean over repeats, and the recording's own step-to-step spread
(std / mean over the scored steps) beside it: the issue's target is an error within that
spread. Also the peak-memory error where both sides have one.

    python bench/bundle_fidelity.py [--steps 8] [--repeats 3] [--workloads demo,ddp,fsdp] [--json]

Prints figures; asserts nothing. The load average is printed with them: on a shared
machine they are noisy.
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

WORKLOADS = {
    "demo": ["--tp", "2"],
    "ddp": ["--dp-mode", "ddp"],
    "fsdp": [],
}
WAYS = ("program, rank 0", "bundle, rank 0", "bundle, all ranks")


def _record(argv: list[str], out: Path) -> Path:
    from prism_rr.format import pack
    from prism_rr.recorder.launch import record_command, spool_dir_for

    launch = [sys.executable, "-m", "prism_rr.localrun", "--nproc", "2", "--timeout", "300", "--"]
    code = record_command([*launch, sys.executable, *argv], out, payload="digest", memory=True, timeout=600)
    if code != 0:
        raise RuntimeError(f"recording {argv} exited {code}")
    pack(spool_dir_for(out), out)
    return out


def _replay(bundle: Path, way: str, argv: list[str], work: Path) -> dict:
    from prism_rr.replayer import replay

    logs = work / f"logs-{bundle.stem}-{time.monotonic_ns()}"
    if way == WAYS[0]:
        result = replay(bundle, ranks=(0,), cmd=[sys.executable, *argv], timeout=600, log_dir=logs)
    else:
        result = replay(bundle, ranks=(0,) if way == WAYS[1] else "all", from_bundle=True, timeout=600, log_dir=logs)
    if result.exit_code != 0:
        raise RuntimeError(f"{way} replay of {bundle} exited {result.exit_code}\n{result.card}")
    return result.report


def _cell(reps: list[dict]) -> dict:
    errs = [r["iteration_time_error_pct"] for r in reps]
    mem = [r["peak_memory_error_pct"] for r in reps if r["peak_memory_error_pct"] is not None]
    return {"errors_pct": errs, "error_pct_mean": statistics.mean(errs),
            "spread_pct": reps[0]["recorded_step_spread_pct"], "peak_memory_error_pct_max": max(mem, default=None),
            "setup_s": [r["setup_s"] for r in reps]}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--repeats", type=int, default=3, help="replays of each recording, each way")
    p.add_argument("--workloads", default=",".join(WORKLOADS))
    p.add_argument("--json", action="store_true", help="one JSON object on stdout")
    args = p.parse_args()
    started = time.monotonic()
    results: dict = {}
    with tempfile.TemporaryDirectory(prefix="prism-bundle-fidelity-") as d:
        work = Path(d)
        for name in args.workloads.split(","):
            argv = ["-m", "prism_rr.demo.train", "--steps", str(args.steps), "--quiet", *WORKLOADS[name]]
            bundle = _record(argv, work / f"{name}.prism")
            results[name] = {}
            for i in range(args.repeats):  # the ways interleaved, so that the machine's noise hits all alike
                for way in WAYS:
                    rep = _replay(bundle, way, argv, work)
                    results[name].setdefault(way, []).append(rep)
                    print(f"  {name} / {way} / {i + 1}: error {rep['iteration_time_error_pct']:.2f}% "
                          f"(load {os.getloadavg()[0]:.2f})", file=sys.stderr)
            results[name] = {way: _cell(reps) for way, reps in results[name].items()}
    if args.json:
        print(json.dumps(results))
    print(f"\nthe bundle as the program ({time.monotonic() - started:.0f} s, {args.steps} steps, world 2, "
          f"load average {os.getloadavg()[0]:.2f})", file=sys.stderr)
    print(f"  {'workload':8} {'replay':18} {'error, mean':>12} {'each':>24} {'recorded spread':>16} "
          f"{'peak mem err':>13}", file=sys.stderr)
    for name, ways in results.items():
        for way, c in ways.items():
            mem = "n/a" if c["peak_memory_error_pct_max"] is None else f"{c['peak_memory_error_pct_max']:.4f}%"
            spread = "n/a" if c["spread_pct"] is None else f"{c['spread_pct']:.2f}%"
            each = " ".join(f"{e:.2f}" for e in c["errors_pct"])
            print(f"  {name:8} {way:18} {c['error_pct_mean']:11.2f}% {each:>24} {spread:>16} {mem:>13}",
                  file=sys.stderr)


if __name__ == "__main__":
    main()
