"""Replay at target scale: set-up time, per-step overhead and peak RSS of one real rank.

    python bench/scale_bench.py [--worlds 4,64,1024,8192] [--bundle w4.prism] [--timing live] [--from-bundle]

Records the demo at world 4 (dp2 x tp2) unless --bundle is given, scales it to each
world (dp = world / 2; world 4 too, so that every row takes the same path; the row
`rec` replays the recording itself) with `prism_rr.topology.scale.scale`, and replays rank 0 with
`prism_rr.replayer.replay` in a fresh interpreter per world, so that the peak RSS of
the replayed rank (RUSAGE_CHILDREN of that interpreter) is its own. The program gets a
global batch of 4 x dp (the recorded 4 rows per rank). Prints one table on stderr and,
with --json, one JSON object on stdout.

--from-bundle: the same replays with the bundle as the program (`replay(...,
from_bundle=True)`, no command: the rank runs `prism_rr.replayer.driver`). There setup_s is
the card's set-up, from the rank's start-up hook to its first step; outside_s is the wall
time outside the steps (launch, set-up and teardown: what setup_s is without the option).
Each row carries the load average, and the last line compares the largest world with world
4 against the issue's targets: peak RSS at most 1.5x, wall time at most 2x.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

_ONE = r"""
import json, resource, sys, time
from prism_rr.replayer import replay
bundle, dp, timing, timeout, logs = sys.argv[1], int(sys.argv[2]), sys.argv[3], float(sys.argv[4]), sys.argv[5]
from_bundle = sys.argv[6:] == ["--from-bundle"]
cmd = None if from_bundle else [sys.executable, "-m", "prism_rr.demo.train", "--tp", "2", "--steps", "4", "--quiet",
                                "--batch-size", str(4 * dp)]
t = time.perf_counter()
r = replay(bundle, ranks=(0,), cmd=cmd, timing=timing, timeout=timeout, continue_on_divergence=True, log_dir=logs,
           from_bundle=from_bundle)
wall = time.perf_counter() - t
rss = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024
print(json.dumps({"exit_code": r.exit_code, "wall_s": wall, "rss_bytes": rss, "report": r.report}))
"""


def _record(out: Path) -> Path:
    env = dict(os.environ, OMP_NUM_THREADS="1")
    subprocess.run([sys.executable, "-m", "prism_rr.cli", "record", "-o", str(out), "--nproc", "4", "--",
                    sys.executable, "-m", "prism_rr.demo.train", "--tp", "2", "--steps", "4", "--quiet"],
                   check=True, env=env, capture_output=True)
    return out


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--worlds", default="rec,4,64,1024,8192", help="worlds; rec: the world-4 recording unscaled")
    p.add_argument("--bundle", type=Path, help="a world-4 dp2 x tp2 recording of the demo")
    p.add_argument("--timing", default="live")
    p.add_argument("--timeout", type=float, default=600)
    p.add_argument("--from-bundle", action="store_true", help="replay the bundle as the program (no command)")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    from prism_rr.topology.scale import scale

    work = Path(tempfile.mkdtemp(prefix="scale-bench-"))
    base = args.bundle or _record(work / "recorded-w4.prism")
    rows = []
    for spec in args.worlds.split(","):
        world = 4 if spec == "rec" else int(spec)
        dp = world // 2
        bundle, scale_s = base, 0.0
        if spec != "rec":
            bundle = work / f"w{world}.prism"
            t = time.perf_counter()
            scale(base, bundle, dp=dp)
            scale_s = time.perf_counter() - t
        logs = work / f"logs-{spec}"
        proc = subprocess.run([sys.executable, "-c", _ONE, str(bundle), str(dp), args.timing, str(args.timeout),
                               str(logs)] + ["--from-bundle"] * args.from_bundle, capture_output=True, text=True)
        row = {"world": spec if spec == "rec" else world, "scale_s": round(scale_s, 3), "bundle_bytes": Path(bundle).stat().st_size}
        try:
            res = json.loads(proc.stdout.strip().splitlines()[-1])
        except (ValueError, IndexError):
            row.update(error=(proc.stderr or proc.stdout)[-800:])
            rows.append(row)
            if args.from_bundle:
                print(f"world {spec:>5}: failed (exit {proc.returncode}): {row['error'].strip()}", file=sys.stderr)
            continue
        rep = res["report"]
        steps = rep.get("steps", [])
        replayed = [s["replayed_s"] for s in steps]
        recorded = [s["recorded_s"] for s in steps]
        err = ""
        stderr = logs / "rank0.stderr"
        if res["exit_code"] != 0 and stderr.exists():
            err = stderr.read_text(errors="replace")[-800:]
        row.update(
            exit_code=res["exit_code"], wall_s=round(res["wall_s"], 2), rss_mb=round(res["rss_bytes"] / 2**20, 1),
            steps=len(steps),
            setup_s=round(res["wall_s"] - sum(replayed), 2) if steps else None,
            step_s=[round(x, 3) for x in replayed], recorded_step_s=[round(x, 3) for x in recorded],
            overhead_s=[round(a - b, 3) for a, b in zip(replayed[1:], recorded[1:])],
            overhead_mean_s=round(sum(a - b for a, b in zip(replayed[1:], recorded[1:])) / max(1, len(steps) - 1), 3),
            predicted_shape_calls=rep.get("predicted_shape_calls"),
            divergences=rep.get("divergences"), first_divergence=rep.get("first_divergence"), error=err or None,
        )
        if args.from_bundle:
            outside = row["setup_s"]
            row.update(setup_s=None if rep.get("setup_s") is None else round(rep["setup_s"], 2), outside_s=outside,
                       load=round(os.getloadavg()[0], 2))
        rows.append(row)
        if args.from_bundle:
            _print_from_bundle(spec, row)
            continue
        print(f"world {spec:>5}: exit {row['exit_code']} wall {row['wall_s']}s setup {row['setup_s']}s "
              f"steps {row['step_s']} (recorded {row['recorded_step_s']}) overhead/step {row['overhead_mean_s']}s "
              f"rss {row['rss_mb']} MB scale {row['scale_s']}s divergences {row['divergences']} "
              f"predicted-shape calls {row['predicted_shape_calls']}", file=sys.stderr)
        if err:
            print("   " + err.strip().splitlines()[-1], file=sys.stderr)
    if args.from_bundle:
        _print_targets(rows)
    if args.json:
        print(json.dumps({"rows": rows}, indent=1))


def _print_from_bundle(spec: str, row: dict) -> None:
    print(f"world {spec:>5}: exit {row['exit_code']} wall {row['wall_s']}s setup {row['setup_s']}s "
          f"outside steps {row['outside_s']}s steps {row['step_s']} (recorded {row['recorded_step_s']}) "
          f"overhead/step {row['overhead_mean_s']}s rss {row['rss_mb']} MB scale {row['scale_s']}s "
          f"divergences {row['divergences']} load {row['load']}", file=sys.stderr)
    if row["error"]:
        print("   " + row["error"].strip().splitlines()[-1], file=sys.stderr)


def _print_targets(rows: list) -> None:
    """The largest world against world 4: the issue's targets for the driver at scale."""
    done = [r for r in rows if r.get("exit_code") == 0 and r["world"] != "rec"]
    if len(done) < 2 or done[0]["world"] != 4:
        return
    small, big = done[0], max(done, key=lambda r: r["world"])
    rss, wall = big["rss_mb"] / small["rss_mb"], big["wall_s"] / small["wall_s"]
    step = sum(big["step_s"][1:]) / max(1e-9, sum(small["step_s"][1:]))
    print(f"world {big['world']} / world 4: rss x{rss:.2f} (target 1.5: {'ok' if rss <= 1.5 else 'MISS'}), "
          f"wall x{wall:.2f} (target 2: {'ok' if wall <= 2 else 'MISS'}), steps after the first x{step:.2f}",
          file=sys.stderr)


if __name__ == "__main__":
    main()
