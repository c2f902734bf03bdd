"""Analysis at scale: diagnose, analyze and diff on synthetic bundles, events/s and peak RSS.

    python bench/analysis_bench.py [--ranks 1024,8192] [--events 1000] [--cache DIR] [--repeat 3] [--limit S]

Each bundle (`prism_rr.format.synthetic`, a dp x tp run) is generated once into the cache
directory (about two minutes for 8192 x 1000). Each command runs in a fresh process, so its
peak RSS is its own; the figure is the median wall time of --repeat runs, as events/s
(the bundle's records over that time), with the load average beside it: on a shared
machine the figures are noisy. diff compares a bundle with itself (every call is
compared). analyze and diff are skipped, with a line saying so, where this build lacks
them. Figures only; nothing asserted. Target: diagnose 8192 x 1000 in at most 5 s.

A bundle of more than 12M events is diagnosed in windows of steps (bounded memory):
`--ranks 8192 --events 10000 --commands diagnose --repeat 1` measures that path (the
bundle takes about six minutes to generate). There the helper's figure is not its own:
the kernel counts the size of the process that started it, at its start.
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

# What each command runs, in a fresh interpreter: prints {"seconds", "peak_rss_mib",
# "helper_rss_mib"} (the peak of any process it started: diagnose's second reader).
_RUN = """
import json, resource, sys, time
from prism_rr.format import open_bundle
import prism_rr.analysis as A
what, path = sys.argv[1], sys.argv[2]
t = time.perf_counter()
with open_bundle(path) as b:
    if what == "diagnose":
        A.diagnosis_json(A.diagnose(b))
    elif what == "analyze":
        A.straggler_totals(A.attribute(b))
    elif what == "diff":
        with open_bundle(path) as other:
            A.diff_json(A.diff_bundles(b, other))
print(json.dumps({"seconds": time.perf_counter() - t,
                  "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                  "helper_rss_mib": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024}))
"""

_NEEDS = {"diagnose": ("diagnose",), "analyze": ("attribute", "straggler_totals"),
          "diff": ("diff_bundles", "diff_json")}


def bundle_path(cache: Path, ranks: int, events: int) -> Path:
    from tui_bench import bundle_path as make  # bench/ is on the path of a bench script

    return make(cache, ranks, events, prefix="analysis")


def missing(what: str) -> list[str]:
    import prism_rr.analysis as A

    return [name for name in _NEEDS[what] if not hasattr(A, name)]


def measure(what: str, path: Path, repeat: int, limit: float) -> dict | None:
    """The figures of `repeat` runs, or None when one ran past `limit` seconds (stopped)."""
    runs = []
    for _ in range(repeat):
        try:
            out = subprocess.run([sys.executable, "-c", _RUN, what, str(path)], capture_output=True, text=True,
                                 timeout=limit)
        except subprocess.TimeoutExpired:
            return None
        if out.returncode != 0:
            raise SystemExit(f"{what} {path.name} failed:\n{out.stderr[-2000:]}")
        runs.append(json.loads(out.stdout))
    seconds = statistics.median(r["seconds"] for r in runs)
    return {"seconds": seconds, "runs": [round(r["seconds"], 2) for r in runs],
            "peak_rss_mib": max(r["peak_rss_mib"] for r in runs),
            "helper_rss_mib": max(r["helper_rss_mib"] for r in runs), "load": os.getloadavg()[0]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ranks", default="1024,8192", help="comma-separated world sizes")
    ap.add_argument("--events", type=int, default=1000, help="records per rank")
    ap.add_argument("--cache", type=Path, default=Path(tempfile.gettempdir()) / "prism-analysis-bench")
    ap.add_argument("--repeat", type=int, default=3, help="runs per figure (the median is printed)")
    ap.add_argument("--commands", default="diagnose,analyze,diff")
    ap.add_argument("--limit", type=float, default=120.0, help="seconds a run may take before it is stopped")
    ap.add_argument("--json", action="store_true", help="one JSON object on stdout")
    args = ap.parse_args()

    from prism_rr.format import open_bundle

    results = []
    for ranks in map(int, args.ranks.split(",")):
        path = bundle_path(args.cache, ranks, args.events)
        with open_bundle(path) as b:
            events = b.event_count
        for what in args.commands.split(","):
            lacking = missing(what)
            if lacking:
                print(f"{what:9} {ranks:>6} x {args.events}: skipped: prism_rr.analysis has no "
                      f"{', '.join(lacking)} in this build", file=sys.stderr)
                continue
            r = measure(what, path, args.repeat, args.limit)
            if r is None:
                print(f"{what:9} {ranks:>6} x {args.events}: over {args.limit:.0f} s (stopped; --limit)",
                      file=sys.stderr if args.json else sys.stdout)
                results.append({"command": what, "ranks": ranks, "events": events, "seconds": None,
                                "over_s": args.limit})
                continue
            r.update(command=what, ranks=ranks, events=events, events_per_s=events / r["seconds"])
            results.append(r)
            print(f"{what:9} {ranks:>6} x {args.events}: {r['seconds']:7.2f} s (median of {r['runs']}), "
                  f"{r['events_per_s']:>12,.0f} events/s, peak RSS {r['peak_rss_mib']:,.0f} MiB"
                  f"{f' (+ {helper:,.0f} MiB helper process)' if (helper := r['helper_rss_mib']) else ''}, "
                  f"load {r['load']:.1f}", file=sys.stderr if args.json else sys.stdout)
    if args.json:
        print(json.dumps({"results": results, "cpus": os.cpu_count()}))


if __name__ == "__main__":
    main()
