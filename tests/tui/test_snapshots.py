"""SVG snapshots of the main screens, compared with tests/tui/snapshots/*.svg.

PRISM_RR_UPDATE_SNAPSHOTS=1 rewrites them; look at the SVGs before committing.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tui_helpers import HANG_GROUP, HANG_SEQ, make_app, settle, sync

SNAPSHOTS = Path(__file__).parent / "snapshots"
SIZE = (120, 36)


def _check(name: str, svg: str) -> None:
    path = SNAPSHOTS / f"{name}.svg"
    if os.environ.get("PRISM_RR_UPDATE_SNAPSHOTS"):
        SNAPSHOTS.mkdir(exist_ok=True)
        path.write_text(svg, encoding="utf-8")
        return
    if not path.exists():
        pytest.fail(f"no snapshot {path.name}: run with PRISM_RR_UPDATE_SNAPSHOTS=1 and review it")
    if path.read_text(encoding="utf-8") != svg:
        (SNAPSHOTS / f"{name}.actual.svg").write_text(svg, encoding="utf-8")
        pytest.fail(f"{name} differs from {path.name}; see {name}.actual.svg beside it")


async def _shot(pilot) -> str:
    await settle(pilot, getattr(pilot.app.screen, "timeline", None))
    return pilot.app.export_screenshot(title="prism-rr")


@sync
async def test_snapshot_overview(small, monkeypatch):
    from prism_rr.tui import analysis

    # the findings are the analysis module's to test; here they are fixed
    fixed = [analysis.Finding(kind="straggler", message="rank 3 arrives last in most calls of step 1",
                              ranks=(3,), group=6, seq=20)]
    monkeypatch.setattr(analysis, "diagnose", lambda bundle: fixed)
    app = make_app(small)
    async with app.run_test(size=SIZE) as pilot:
        _check("overview", await _shot(pilot))


@sync
async def test_snapshot_timeline_with_details(hung):
    app = make_app(hung)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("2")
        await settle(pilot, app.screen.timeline)
        app.screen.goto(2, HANG_GROUP, HANG_SEQ)
        _check("timeline", await _shot(pilot))


@sync
async def test_snapshot_collectives(hung):
    app = make_app(hung)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        await app.show_group(HANG_GROUP)
        _check("collectives", await _shot(pilot))


@sync
async def test_snapshot_compare(small, replay):
    app = make_app(small, replay, start="compare")
    async with app.run_test(size=SIZE) as pilot:
        _check("compare", await _shot(pilot))


@sync
async def test_snapshot_help(small):
    app = make_app(small)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("f1")
        _check("help", await _shot(pilot))
