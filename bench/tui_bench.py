"""Timeline responsiveness on a big synthetic bundle, headless.

    python bench/tui_bench.py [--ranks 8192] [--events 1000] [--cache DIR] [--presses 30]

Prints: time to the first full paint of the timeline (app start until every visible
rank's row is drawn from its loaded spans), and the median redraw time for scroll keys
(down, pagedown) and zoom keys (+, -): from the key press until the screen has been
repainted. Targets: first paint <= 1 s, redraw <= 50 ms median. The bundle is generated
once into the cache directory (minutes for 8192 x 1000). Figures only; nothing asserted.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path


def bundle_path(cache: Path, ranks: int, events: int, prefix: str = "tui") -> Path:
    """The synthetic RANKS x EVENTS bundle in `cache`, generated the first time (also
    bench/analysis_bench.py's)."""
    from prism_rr.format import pack
    from prism_rr.format.synthetic import write_synthetic

    out = cache / f"{prefix}-{ranks}x{events}.prism"
    if not out.exists():
        cache.mkdir(parents=True, exist_ok=True)
        print(f"generating {out} (once) ...", file=sys.stderr)
        t = time.perf_counter()
        spools = Path(tempfile.mkdtemp(dir=cache))
        try:
            write_synthetic(spools, ranks, events)
            pack(spools, out.with_suffix(".tmp"))
            os.replace(out.with_suffix(".tmp"), out)
        finally:
            shutil.rmtree(spools, ignore_errors=True)
        print(f"  took {time.perf_counter() - t:.0f} s", file=sys.stderr)
    return out


async def _settle(pilot, timeline, deadline: float = 60.0) -> None:
    """Wait until the app has handled its messages and every visible row has its spans."""
    end = time.perf_counter() + deadline
    await pilot._wait_for_screen()
    while timeline.missing_visible():
        if time.perf_counter() > end:
            raise TimeoutError("the timeline did not finish loading")
        await asyncio.sleep(0.001)
        await pilot._wait_for_screen()
    await pilot._wait_for_screen()  # the refresh the loader posted


async def measure(path: Path, presses: int, size: tuple[int, int]) -> dict:
    from textual import events

    from prism_rr.tui.app import PrismApp

    t_start = time.perf_counter()
    app = PrismApp(path, start="timeline")
    out: dict = {}
    async with app.run_test(size=size) as pilot:
        await pilot._wait_for_screen()
        timeline = app.screen.timeline
        await _settle(pilot, timeline)
        app.screen._on_timer_update()  # compose the frame and write it to the (headless) terminal
        out["first_paint_s"] = time.perf_counter() - t_start
        out["rows"] = len(timeline.visible_rows())

        async def key_to_frame(key: str, char: str | None) -> float:
            # The key goes in as the terminal driver would send it (Pilot.press adds idle waits).
            t = time.perf_counter()
            event = events.Key(key, char)
            event.set_sender(app)
            app._driver.send_message(event)
            await _settle(pilot, timeline)
            app.screen._on_timer_update()
            return time.perf_counter() - t

        async def idle() -> None:
            while timeline._loading:  # the loader prefetching the pages around the view
                await asyncio.sleep(0.005)
            await pilot._wait_for_screen()

        per_key: dict[str, list[float]] = {}
        for pace in ("rapid", "paced"):  # rapid: back to back, as key repeat; paced: loader idle first
            for name, keys in (("scroll", [("down", None)] * 3 + [("pagedown", None)]),
                               ("zoom", [("plus", "+"), ("minus", "-")])):
                times = []
                for i in range(presses):
                    key, char = keys[i % len(keys)]
                    if pace == "paced":
                        await idle()
                    times.append(await key_to_frame(key, char))
                    per_key.setdefault(f"{key} ({pace})", []).append(times[-1])
                out[f"{name}_{pace}_median_ms"] = statistics.median(times) * 1e3
                out[f"{name}_{pace}_p90_ms"] = sorted(times)[int(len(times) * 0.9)] * 1e3
        out["per_key_ms"] = {k: statistics.median(v) * 1e3 for k, v in per_key.items()}
        # the widget's own share: render_line of every visible row after a zoom
        timeline.action_zoom(0.5)
        await _settle(pilot, timeline)
        t = time.perf_counter()
        timeline._lines.clear()
        for y in range(len(timeline.visible_rows())):
            timeline.render_line(y)
        out["render_lines_ms"] = (time.perf_counter() - t) * 1e3
        out["ranks_loaded"] = timeline.loads
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, default=8192)
    ap.add_argument("--events", type=int, default=1000)
    ap.add_argument("--cache", type=Path, default=Path(os.environ.get("PRISM_BENCH_CACHE", Path.home() / ".cache" / "prism-rr-bench")))
    ap.add_argument("--presses", type=int, default=40)
    ap.add_argument("--size", default="160x50", help="terminal columns x lines")
    args = ap.parse_args()
    path = bundle_path(args.cache, args.ranks, args.events)
    cols, lines = map(int, args.size.split("x"))
    load = os.getloadavg()[0]
    r = asyncio.run(measure(path, args.presses, (cols, lines)))
    print(f"bundle: {path.name} ({path.stat().st_size / 2**20:.0f} MiB), terminal {cols}x{lines}, "
          f"{r['rows']} rows visible, load average {load:.1f} on {os.cpu_count()} cpus")
    print(f"first full paint of the timeline: {r['first_paint_s'] * 1e3:.0f} ms   (target <= 1000 ms)")
    for pace, what in (("rapid", "keys back to back"), ("paced", "each key after the loader is idle")):
        print(f"{what}:")
        for name in ("scroll", "zoom"):
            print(f"  {name} redraw: median {r[f'{name}_{pace}_median_ms']:.1f} ms, "
                  f"p90 {r[f'{name}_{pace}_p90_ms']:.1f} ms   (target <= 50 ms median)")
    print("median per key: " + ", ".join(f"{k} {v:.1f} ms" for k, v in r["per_key_ms"].items()))
    print(f"render_line of all visible rows after a zoom: {r['render_lines_ms']:.1f} ms")
    print(f"ranks loaded in all: {r['ranks_loaded']} of {args.ranks}")


if __name__ == "__main__":
    main()
