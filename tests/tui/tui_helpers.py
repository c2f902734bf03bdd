"""Helpers for the TUI tests."""

from __future__ import annotations

HANG_GROUP, HANG_SEQ = 5, 3  # in the `hung` bundle: the dp group of even ranks, its 4th call
FAILED_GROUP, FAILED_SEQ = 2, 7  # in the `failed` bundle: rank 3's tp call (ranks 2, 3) that failed


def screen_text(app) -> str:
    """What the terminal shows, as plain text."""
    return "\n".join(strip.text for strip in app.screen._compositor.render_strips())


async def settle(pilot, timeline=None, timeout: float = 30.0) -> None:
    """Let workers finish: the timeline's visible rows are loaded and everything is drawn."""
    import asyncio
    import time

    end = time.monotonic() + timeout
    await pilot.pause()
    while timeline is not None and timeline.missing_visible():
        assert time.monotonic() < end, "timeline rows never loaded"
        await asyncio.sleep(0.01)
        await pilot.pause()
    await pilot.app.workers.wait_for_complete()
    await pilot.pause()


async def palette_pick(pilot, query: str, expect: str, timeout: float = 30.0) -> None:
    """Type `query` into the open command palette and press Enter once its first hit reads `expect`.

    The palette searches in a worker after each key; on a loaded machine a fixed pause
    can end before the hit is listed, and Enter then picks nothing.
    """
    import asyncio
    import time

    from textual.command import CommandList

    await pilot.press(*query)
    end = time.monotonic() + timeout
    while True:
        await pilot.pause()
        lst = pilot.app.screen.query_one(CommandList)
        if lst.option_count and expect in str(lst.get_option_at_index(0).prompt):
            break
        assert time.monotonic() < end, f"the palette never listed {expect!r} for {query!r}"
        await asyncio.sleep(0.02)
    if lst.highlighted is None:
        lst.highlighted = 0
    await pilot.press("enter")


def make_app(bundle, compare=None, **kw):
    """The app with animations off, as every test runs it."""
    from prism_rr.tui.app import PrismApp

    app = PrismApp(bundle, compare, **kw)
    app.animation_level = "none"
    return app


def sync(fn):
    """Run an async test in its own event loop (the project has no async pytest plugin)."""
    import asyncio
    import functools

    @functools.wraps(fn)
    def run(*args, **kw):
        return asyncio.run(fn(*args, **kw))

    return run
