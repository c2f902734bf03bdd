"""Overview, collectives, compare, help, command palette and quitting, from the keyboard."""

from __future__ import annotations

import subprocess
import sys

from textual.widgets import DataTable, HelpPanel, MarkdownViewer, Sparkline

from prism_rr.tui.screens.collectives import CollectivesScreen
from prism_rr.tui.screens.compare import CompareScreen
from prism_rr.tui.screens.help import HelpScreen
from prism_rr.tui.screens.overview import OverviewScreen
from prism_rr.tui.screens.timeline import TimelineScreen
from tui_helpers import HANG_GROUP, HANG_SEQ, make_app, palette_pick, screen_text, settle, sync


SIZE = (120, 40)


@sync
async def test_overview_shows_manifest_steps_and_ranks(small):
    app = make_app(small)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        assert isinstance(app.screen, OverviewScreen)
        text = screen_text(app)
        assert "8 ranks, 8 recorded" in text and "mesh_tp" in text and "1970-01-01" in text
        steps = app.screen.query_one("#steps", DataTable)
        assert steps.row_count == len(app.bundle.steps) == 3
        assert len(app.screen.query_one(Sparkline).data) == 8
        ranks = app.screen.query_one("#ranks", DataTable)
        assert ranks.row_count == 8
        assert any(ch in text for ch in "▁▂▃▄▅▆▇█")
        # enter on a rank row shows that rank in the timeline
        ranks.focus()
        await pilot.press("down", "enter")
        await settle(pilot)
        assert isinstance(app.screen, TimelineScreen)
        assert app.screen.timeline.cursor_rank == int(ranks.coordinate_to_cell_key((1, 0)).row_key.value)
        await pilot.press("1")
        steps = app.screen.query_one("#steps", DataTable)
        steps.focus()
        await pilot.press("down", "enter")
        await settle(pilot)
        tl = app.screen.timeline
        assert tl.model.step_at(tl.cursor_rank, tl.cursor_time) == 1


@sync
async def test_findings_jump_to_the_timeline(hung, monkeypatch):
    from prism_rr.tui import analysis

    fake = [analysis.Finding(kind="hang", message="rank 2 never completed", ranks=(2,), group=HANG_GROUP, seq=HANG_SEQ)]
    monkeypatch.setattr(analysis, "diagnose", lambda bundle: fake)
    app = make_app(hung)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        assert "rank 2 never completed" in screen_text(app)
        await pilot.press("j")
        await settle(pilot)
        tl = app.screen.timeline
        rec = tl.model.load(2).records[tl.selected[1]]
        assert (tl.cursor_rank, rec.group, rec.seq, rec.end_ns) == (2, HANG_GROUP, HANG_SEQ, None)


@sync
async def test_diagnosis_from_the_analysis_module(hung):
    from prism_rr.tui.analysis import diagnose

    found = diagnose(app_bundle := make_app(hung).bundle)
    app = make_app(app_bundle)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        note = str(app.screen.query_one("#findings-note").render())
        if found is None:
            assert "no analysis module" in note
        else:
            assert app.screen.query_one("#findings", DataTable).row_count == len(found)


@sync
async def test_collectives_show_who_entered_and_problems(hung):
    app = make_app(hung)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        await app.show_group(HANG_GROUP)
        await settle(pilot)
        screen = app.screen
        assert isinstance(screen, CollectivesScreen) and screen.group == HANG_GROUP
        table = screen.query_one(DataTable)
        assert table.row_count == 3 * 16  # 16 dp calls a step; the others go on after rank 2 hangs
        row = next(r for r in screen.rows if r.seq == HANG_SEQ)
        assert row.missing(screen.members) == [4] and row.hung == [2]
        problems = " ".join(row.problems(screen.members))
        assert "op mismatch" in problems and "never completed" in problems and "did not enter" in problems
        text = screen_text(app)
        assert "did not enter" in text and "ok" in text
        await pilot.press("x")
        assert all(r.problems(screen.members) for r in screen.rows if str(r.seq) in
                   [table.coordinate_to_cell_key((i, 0)).row_key.value for i in range(table.row_count)])
        table.move_cursor(row=0)
        await pilot.press("j")
        await settle(pilot)
        tl = app.screen.timeline
        rec = tl.model.load(tl.cursor_rank).records[tl.selected[1]]
        assert (tl.cursor_rank, rec.seq, rec.end_ns) == (2, HANG_SEQ, None)  # the hung rank


@sync
async def test_collectives_change_group(small):
    app = make_app(small)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        await pilot.press("3")
        await settle(pilot)
        screen = app.screen
        first = screen.group
        assert screen.query_one(DataTable).row_count > 0
        await pilot.press("right_square_bracket")
        await settle(pilot)
        assert screen.group == first + 1
        await pilot.press("left_square_bracket")
        await settle(pilot)
        assert screen.group == first
        await pilot.press("enter")
        await settle(pilot)
        assert isinstance(app.screen, TimelineScreen) and app.screen.timeline.selected


@sync
async def test_compare_shows_times_and_first_divergence(small, replay):
    app = make_app(small, replay)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        await pilot.press("4")
        await settle(pilot)
        screen = app.screen
        assert isinstance(screen, CompareScreen)
        assert screen.query_one("#compare-steps", DataTable).row_count == 2  # steps 1, 2: replay's scored ones
        assert screen.query_one("#compare-ranks", DataTable).row_count == 2
        d = screen.result["first_divergence"]
        assert (d["rank"], d["group"], d["seq"]) == (1, 1, 5)
        assert "First divergence" in screen_text(app)
        await pilot.press("j")
        await settle(pilot)
        tl = app.screen.timeline
        rec = tl.model.load(1).records[tl.selected[1]]
        assert (tl.cursor_rank, rec.group, rec.seq) == (1, 1, 5)


@sync
async def test_compare_without_replay_says_how(small):
    app = make_app(small)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("4")
        await settle(pilot)
        assert "--compare" in screen_text(app)


@sync
async def test_help_keys_and_quit(small):
    app = make_app(small)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("f1")
        await settle(pilot)
        assert isinstance(app.screen, HelpScreen)
        assert app.screen.query_one(MarkdownViewer)
        assert "Timeline" in screen_text(app)
        await pilot.press("escape")
        assert isinstance(app.screen, OverviewScreen)
        await pilot.press("2")
        await settle(pilot)
        await pilot.press("question_mark")
        await settle(pilot)
        assert app.screen.query(HelpPanel)
        assert "Zoom in" in screen_text(app)
        await pilot.press("question_mark")
        await settle(pilot)
        assert not app.screen.query(HelpPanel)
        await pilot.press("q")
        await pilot.pause()
    assert app.return_code == 0


@sync
async def test_command_palette_finds_ranks_groups_and_ops(small):
    app = make_app(small)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        for query, check in (
            ("rank 5", lambda: app.screen.timeline.cursor_rank == 5),
            ("group 4", lambda: isinstance(app.screen, CollectivesScreen) and app.screen.group == 4),
            ("op all_reduce", lambda: app.screen.timeline.model.load(app.screen.timeline.cursor_rank)
                .records[app.screen.timeline.selected[1]].op == "all_reduce"),
        ):
            await pilot.press("ctrl+p")
            await settle(pilot)
            await palette_pick(pilot, query, query)
            await settle(pilot)
            assert check(), query


@sync
async def test_keymap_remaps_bindings_by_id(small):
    app = make_app(small, keymap={"timeline.zoom_in": "z"})
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("2")
        await settle(pilot)
        npc = app.screen.timeline.ns_per_cell
        await pilot.press("z")
        assert app.screen.timeline.ns_per_cell == npc / 2


def test_importing_the_package_loads_no_ui():
    code = "import sys, prism_rr.tui; print(any(m.split('.')[0] == 'textual' for m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


@sync
async def test_real_findings_jump_even_to_a_rank_that_never_entered(hung):
    from prism_rr.tui.analysis import diagnose

    if diagnose(make_app(hung).bundle) is None:
        import pytest

        pytest.skip("no prism_rr.analysis.diagnose in this build")
    app = make_app(hung)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        findings = app.findings
        assert any(f.kind == "hang" and f.group == HANG_GROUP for f in findings)
        table = app.screen.query_one("#findings", DataTable)
        for i, f in enumerate(findings):
            if f.group is None:
                continue
            await pilot.press("1")
            await settle(pilot)
            table = app.screen.query_one("#findings", DataTable)
            table.move_cursor(row=i)
            await pilot.press("j")
            await settle(pilot)
            tl = app.screen.timeline
            rank, idx = tl.selected
            rec = tl.model.load(rank).records[idx]
            assert (rec.group, rec.seq) == (f.group, f.seq)
