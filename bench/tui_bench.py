"""Timeline responsiveness on a big synthetic bundle, headless.

    python bench/tui_bench.py [--ranks 8192] [--events 1000] [--cache DIR] [--presses 30] [--repeat 1]

Prints: time to the first full paint of the timeline (app start until every visible
rank's row is drawn from its loaded spans), and the median redraw time for scroll keys
(down, pagedown) and zoom keys (+, -): from the key press until the screen has been
repainted. Then the heat map (every rank by step): from its key until it is painted, its
redraw for cursor and zoom keys, and `t` until it is coloured by lateness; and a finding jump: from Enter on a finding
in the overview until the timeline shows its call with every visible row drawn (the
synthetic bundle has no findings: each is placed on a real call of a rank far from the
last). Targets: first paint <= 1 s, redraw <= 50 ms median. With --repeat N, first paint,
heat map and jump are medians over N fresh apps (first paint: the first in this process,
the others each in a fresh one). The bundle is generated once into the
cache directory (minutes for 8192 x 1000). Figures only; nothing asserted.
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
    """Wait until the app has handled its messages and every visible row has its spans.
    Between checks it sleeps: waiting for every widget's queue at each check took the
    interpreter from the loader thread (a rank read in 14 ms instead of 2.5)."""
    end = time.perf_counter() + deadline
    await pilot._wait_for_screen()
    while timeline.missing_visible():
        if time.perf_counter() > end:
            raise TimeoutError("the timeline did not finish loading")
        await asyncio.sleep(0.002)
    await pilot._wait_for_screen()  # the refresh the loader posted


async def _key_to_frame(app, pilot, key: str, char: str | None, settled, state=None,
                        grace: float = 30.0) -> float | None:
    """From a key sent as the terminal driver sends it (Pilot.press adds idle waits) until
    the screen is repainted. `state()`: what the key changes; the wait for the repaint
    begins once it has changed (the driver hands the key to the loop later: without this,
    a key could be timed before it was handled, and its work counted in the next key's).
    None where it changed nothing within `grace` seconds (a page key at the last page)."""
    from textual import events

    t = time.perf_counter()
    before = state() if state is not None else None
    event = events.Key(key, char)
    event.set_sender(app)
    app._driver.send_message(event)
    while state is not None and state() == before:
        if time.perf_counter() > t + grace:
            if grace < 30:
                return None
            raise TimeoutError(f"{key} changed nothing")
        await asyncio.sleep(0)
    await settled()
    app.screen._on_timer_update()
    return time.perf_counter() - t


async def measure_heatmap(path: Path, presses: int, size: tuple[int, int]) -> dict:
    from prism_rr.tui.app import PrismApp
    from prism_rr.tui.screens.heatmap import HeatmapScreen

    out: dict = {}
    app = PrismApp(path, start="timeline")  # the overview would start a diagnosis beside it
    async with app.run_test(size=size) as pilot:
        await pilot._wait_for_screen()
        await _settle(pilot, app.screen.timeline)
        while app.screen.timeline._loading:  # the loader prefetching the pages around the view
            await asyncio.sleep(0.005)
        async def heatmap_shown() -> None:
            while not isinstance(app.screen, HeatmapScreen):
                await asyncio.sleep(0.001)
            await pilot._wait_for_screen()

        out["heatmap_open_ms"] = await _key_to_frame(app, pilot, "5", "5", heatmap_shown) * 1e3
        out["heatmap_per_row"] = app.screen.heatmap.per
        times: dict[str, list[float]] = {}
        for i in range(presses):
            for key, char in (("down", None), ("pagedown", None), ("plus", "+"), ("minus", "-")):
                hm = app.screen.heatmap
                took = await _key_to_frame(app, pilot, key, char, pilot._wait_for_screen,
                                           lambda: (hm.row, hm.col, hm.top, hm.per), grace=0.5)
                if took is not None:  # (a key that changed nothing is not a redraw)
                    times.setdefault(key, []).append(took)
        out["heatmap_keys_ms"] = {k: statistics.median(v) * 1e3 for k, v in times.items()}
        out["heatmap_redraw_median_ms"] = statistics.median(x for v in times.values() for x in v) * 1e3
        out["heatmap_redraws_ms"] = [x * 1e3 for v in times.values() for x in v]
        hm = app.screen.heatmap

        async def lateness_shown() -> None:
            while hm.lateness is None:  # read from the calls by a child process
                await asyncio.sleep(0.01)
            await pilot._wait_for_screen()

        out["lateness_s"] = await _key_to_frame(app, pilot, "t", "t", lateness_shown)
    return out


async def measure_jumps(path: Path, size: tuple[int, int], jumps: int = 5) -> dict:
    """Enter on each of `jumps` findings, each on the first collective of a rank not yet read."""
    from prism_rr.analysis import Finding
    from prism_rr.format import Collective, open_bundle
    from prism_rr.tui.app import PrismApp

    out: dict = {}
    app = PrismApp(path)
    async with app.run_test(size=size) as pilot:
        await pilot._wait_for_screen()
        ranks = app.model.ranks
        targets = [ranks[int(len(ranks) * (i + 0.5) / jumps)] for i in range(jumps)]
        with open_bundle(path) as b:
            calls = [next(r for r in b.events(rank) if isinstance(r, Collective)) for rank in targets]
        found = [Finding(kind="straggler", ranks=(rank,), group=c.group, seq=c.seq, message=f"rank {rank} (bench)")
                 for rank, c in zip(targets, calls)]
        jump_s = []
        for i in range(jumps):
            await app.switch_mode("overview")
            await pilot._wait_for_screen()
            overview = app.screen
            overview._show_findings(found)
            table = overview.query_one("#findings")
            table.focus()
            table.move_cursor(row=i)
            await pilot._wait_for_screen()

            async def shown() -> None:
                end = time.perf_counter() + 60
                while True:
                    await pilot._wait_for_screen()
                    tl = getattr(app.screen, "timeline", None)
                    if tl is not None and tl.selected and tl.selected[0] == targets[i]:
                        await _settle(pilot, tl)
                        return
                    if time.perf_counter() > end:
                        raise TimeoutError("the jump never showed its call")
                    await asyncio.sleep(0.001)

            jump_s.append(await _key_to_frame(app, pilot, "enter", None, shown))
        out["jump_median_ms"] = statistics.median(jump_s) * 1e3
        out["jump_ms"] = [round(x * 1e3) for x in jump_s]
    return out


async def measure(path: Path, presses: int, size: tuple[int, int]) -> dict:
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
            return await _key_to_frame(app, pilot, key, char, lambda: _settle(pilot, timeline),
                                       lambda: (timeline.cursor_row, timeline.scroll_offset.y, timeline.ns_per_cell,
                                                timeline.t0))

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


def _first_paint_apart(path: Path, cols: int, lines: int) -> float:
    import subprocess

    code = ("import asyncio, sys; sys.path.insert(0, sys.argv[1]); import tui_bench; from pathlib import Path; "
            "print(asyncio.run(tui_bench.measure(Path(sys.argv[2]), 1, (int(sys.argv[3]), int(sys.argv[4]))))"
            "['first_paint_s'])")
    out = subprocess.run([sys.executable, "-c", code, str(Path(__file__).parent), str(path), str(cols), str(lines)],
                         capture_output=True, text=True, check=True)
    return float(out.stdout.split()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, default=8192)
    ap.add_argument("--events", type=int, default=1000)
    ap.add_argument("--cache", type=Path, default=Path(os.environ.get("PRISM_BENCH_CACHE", Path.home() / ".cache" / "prism-rr-bench")))
    ap.add_argument("--presses", type=int, default=40)
    ap.add_argument("--size", default="160x50", help="terminal columns x lines")
    ap.add_argument("--repeat", type=int, default=1, help="fresh apps for first paint, heat map and jump (medians)")
    args = ap.parse_args()
    path = bundle_path(args.cache, args.ranks, args.events)
    cols, lines = map(int, args.size.split("x"))
    load = os.getloadavg()[0]
    r = asyncio.run(measure(path, args.presses, (cols, lines)))
    # each repeat is a fresh process, as a user's start is: an app started after others in
    # one interpreter pays for what they left (threads, caches to collect)
    paints = [r["first_paint_s"]] + [_first_paint_apart(path, cols, lines) for _ in range(args.repeat - 1)]
    print(f"bundle: {path.name} ({path.stat().st_size / 2**20:.0f} MiB), terminal {cols}x{lines}, "
          f"{r['rows']} rows visible, load average {load:.1f} (now {os.getloadavg()[0]:.1f}) on {os.cpu_count()} cpus")
    print(f"first full paint of the timeline: median {statistics.median(paints) * 1e3:.0f} ms, p90 "
          f"{_p90(paints) * 1e3:.0f} ms of {', '.join(f'{p * 1e3:.0f}' for p in paints)}   (target <= 1000 ms)")
    for pace, what in (("rapid", "keys back to back"), ("paced", "each key after the loader is idle")):
        print(f"{what}:")
        for name in ("scroll", "zoom"):
            print(f"  {name} redraw: median {r[f'{name}_{pace}_median_ms']:.1f} ms, "
                  f"p90 {r[f'{name}_{pace}_p90_ms']:.1f} ms   (target: p90 <= 50 ms)")
    print("median per key: " + ", ".join(f"{k} {v:.1f} ms" for k, v in r["per_key_ms"].items()))
    print(f"render_line of all visible rows after a zoom: {r['render_lines_ms']:.1f} ms")
    print(f"ranks loaded in all: {r['ranks_loaded']} of {args.ranks}")
    med = statistics.median
    h = [asyncio.run(measure_heatmap(path, max(1, args.presses // 5), (cols, lines))) for _ in range(args.repeat)]
    opened, coloured = [x["heatmap_open_ms"] for x in h], [x["lateness_s"] * 1e3 for x in h]
    print(f"heat map ({h[0]['heatmap_per_row']} ranks a row): open median {med(opened):.0f} ms, p90 {_p90(opened):.0f} ms "
          f"(target <= 1000 ms); redraw median {med(x['heatmap_redraw_median_ms'] for x in h):.1f} ms, p90 "
          f"{_p90([v for x in h for v in x['heatmap_redraws_ms']]):.1f} ms (per key: "
          + ", ".join(f"{k} {v:.1f}" for k, v in h[0]["heatmap_keys_ms"].items()) + "); "
          f"coloured by lateness (t, read from every rank's calls apart): median {med(coloured):.0f} ms, p90 "
          f"{_p90(coloured):.0f} ms (target <= 1000 ms)", flush=True)
    try:
        j = [asyncio.run(measure_jumps(path, (cols, lines))) for _ in range(args.repeat)]
    except Exception as exc:  # a figure, not a crash: say what stopped it
        print(f"finding jump to the timeline: failed, {type(exc).__name__}: {exc}")
        return
    jumps = [v for x in j for v in x["jump_ms"]]
    print(f"finding jump to the timeline: median {med(jumps):.0f} ms, p90 {_p90(jumps):.0f} ms (each: "
          f"{', '.join(map(str, jumps))})   (target <= 300 ms)")


def _p90(values) -> float:
    """The 90th percentile (the highest of fewer than ten values)."""
    values = sorted(values)
    return values[min(len(values) - 1, int(len(values) * 0.9))]


if __name__ == "__main__":
    main()
