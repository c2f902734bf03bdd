"""Each screen names the rank a finding or a call is about, and the step a run failed or
hung in, with the numbers `prism-rr diagnose` and `prism-rr info` give (issue 40, item 5).

On the session's real gloo recordings (tests/conftest.py): crashy.py abort (rank 1 passes
5 floats where rank 0 passes 3 to step 2's all_reduce seq 8; gloo aborts rank 0 in it and
the call fails on rank 1), crashy.py segv (rank 1 segfaults in step 2 before seq 8; rank 0
waits in seq 8 until it fails) and hang.py kill (rank 1 SIGKILLed once it ended step 2;
rank 0 waits in step 3's seq 6 until it fails). The truth is the CLI's, run as a user runs it.
"""

from __future__ import annotations

import asyncio
import json
import re
import time

import pytest
from textual.widgets import DataTable, Static

from cli_helpers import run_cli
from prism_rr.specs import named_ranks
from prism_rr.tui.screens.timeline import TimelineScreen
from prism_rr.tui.widgets.detail import SpanDetail
from tui_helpers import make_app, screen_text, settle, sync

SIZE = (160, 48)
pytestmark = pytest.mark.timeout(120)  # a recording made here, then a few seconds of screens

_truths: dict[str, dict] = {}


@pytest.fixture
def run(request, crashy_runs):
    """The recording a test is parametrized with ("abort", "segv", "kill") and what the
    CLI says of it: {"bundle", "steps": info's, "ended": info's step of each rank that
    ended badly, "findings": diagnose's}."""
    name = request.param
    bundle = request.getfixturevalue("killed_peer").bundle if name == "kill" else crashy_runs(name).bundle
    if name not in _truths:
        info = run_cli("info", "--json", bundle, timeout=60)
        found = run_cli("diagnose", "--json", bundle, timeout=60)
        assert info.returncode == 0, info.stderr
        assert found.stdout, found.stderr
        facts = json.loads(info.stdout)
        (attempt,) = facts["attempts"]
        _truths[name] = {"steps": facts["steps"], "findings": json.loads(found.stdout)["findings"],
                         "ended": {int(r): e["step"] for r, e in attempt["ended"]["ranks"].items()}}
    return {"bundle": bundle, **_truths[name]}


def each(*names):
    return pytest.mark.parametrize("run", names, indirect=True)


async def _diagnosed(pilot, app, timeout: float = 45.0) -> None:
    """Wait for the overview's diagnosis (a child process): every one of these runs has findings."""
    end = time.monotonic() + timeout
    await settle(pilot)
    while not app.findings:
        assert time.monotonic() < end, "the diagnosis never came"
        await asyncio.sleep(0.05)
        await pilot.pause()
    await settle(pilot)


async def _timeline(pilot, app) -> tuple[int, object, str]:
    """Once a jump lands: the cursor's rank, the selected record (or None) and the status line."""
    await settle(pilot)
    assert isinstance(app.screen, TimelineScreen)
    await settle(pilot, app.screen.timeline)
    await settle(pilot, app.screen.timeline)  # (the jump runs after the timeline's first refresh)
    tl = app.screen.timeline
    rec = None if tl.selected is None else tl.model.load(tl.selected[0]).records[tl.selected[1]]
    return tl.cursor_rank, rec, str(app.screen.query_one("#timeline-status", Static).content)


def _details(app) -> str:
    """The details pane's text: the call's fields, then its members."""
    return app.screen.query_one(SpanDetail).text(200)


def _said_step(message: str) -> int | None:
    """The first step a finding's sentence names ("... in step 2")."""
    m = re.search(r"\bin step (\d+)", message)
    return None if m is None else int(m.group(1))


@each("abort", "segv", "kill")
@sync
async def test_the_findings_table_names_the_ranks_and_steps_diagnose_names(run):
    app = make_app(run["bundle"])
    async with app.run_test(size=SIZE) as pilot:
        await _diagnosed(pilot, app)
        table = app.screen.query_one("#findings", DataTable)
        want = run["findings"]
        assert table.row_count == len(want)
        for i, f in enumerate(want):
            kind, ranks, group, seq, _, message = table.get_row(str(i))
            assert (str(kind), ranks, group, seq) == (
                f["kind"], ",".join(map(str, f["ranks"])), "" if f["group"] is None else str(f["group"]),
                "" if f["seq"] is None else str(f["seq"])), (i, f)
            assert str(message) == f["message"]
        # the steps as info numbers them, the one the run failed in last
        steps = app.screen.query_one("#steps", DataTable)
        assert [int(steps.get_row_at(i)[0]) for i in range(steps.row_count)] == run["steps"]


@each("abort", "segv", "kill")
@sync
async def test_enter_on_a_finding_lands_on_its_rank_in_its_step(run):
    """The cursor on the finding's rank; its call selected (a member's, where the rank never
    entered it); the status line's step the one diagnose names, or, for a rank the
    finding's call never reached, the step info says its records end in."""
    app = make_app(run["bundle"])
    async with app.run_test(size=SIZE) as pilot:
        await _diagnosed(pilot, app)
        for i, f in enumerate(run["findings"]):
            await pilot.press("1")
            await settle(pilot)
            table = app.screen.query_one("#findings", DataTable)
            table.focus()
            table.move_cursor(row=i)
            await pilot.press("enter")
            rank, rec, status = await _timeline(pilot, app)
            who = f["ranks"][0]
            assert rank == who, (f["kind"], f["ranks"], status)
            if f["group"] is not None:
                assert rec is not None and (rec.group, rec.seq) == (f["group"], f["seq"]), (f, rec)
            mine = rec is not None and app.screen.timeline.selected[0] == who
            step = rec.step if mine else run["ended"][who]
            assert status.startswith(f"rank {who}  ·  step {step}  ·"), (f["kind"], status)
            said = _said_step(f["message"])  # killed in step 2, failed on rank 0 in step 3, ...
            assert said is None or said == step, (f["message"], status)


@each("segv", "kill")
@sync
async def test_a_rank_that_never_entered_the_call_keeps_the_cursor(run):
    """segv's [hang] names rank 1, which died before seq 8; kill's [killed] names rank 1,
    gone before seq 6: the cursor stays on rank 1, in the step its records end in (2 both
    times: kill's finding says "killed in step 2"), rank 0's call selected beside it. The
    cursor used to land on rank 0 (kill's status read "rank 0 · step 3")."""
    app = make_app(run["bundle"])
    async with app.run_test(size=SIZE) as pilot:
        await _diagnosed(pilot, app)
        i = next(k for k, f in enumerate(run["findings"]) if f["kind"] in ("hang", "killed"))
        f = run["findings"][i]
        assert f["ranks"] == [1], f
        table = app.screen.query_one("#findings", DataTable)
        table.focus()
        table.move_cursor(row=i)
        await pilot.press("enter")
        rank, rec, status = await _timeline(pilot, app)
        assert rank == 1 and status.startswith("rank 1  ·  step 2  ·"), status
        assert app.screen.timeline.selected[0] == 0 and (rec.group, rec.seq) == (f["group"], f["seq"])
        rows = {r[0]: r[3] for r in app.screen.query_one(SpanDetail).arrivals["rows"]}
        assert rows[1] == "did not enter" and re.search(r"^rank +0 *$", _details(app), re.M)


@each("segv")
@sync
async def test_a_crash_outside_a_call_lands_where_the_ranks_records_end(run):
    """segv's [crashed] names rank 1 and no call: Enter shows rank 1 where its records end,
    in step 2 (it used to keep the view at the recording's start: "step 0")."""
    app = make_app(run["bundle"])
    async with app.run_test(size=SIZE) as pilot:
        await _diagnosed(pilot, app)
        i = next(k for k, f in enumerate(run["findings"]) if f["kind"] == "crashed")
        assert run["findings"][i]["ranks"] == [1] and run["findings"][i]["group"] is None
        table = app.screen.query_one("#findings", DataTable)
        table.focus()
        table.move_cursor(row=i)
        await pilot.press("enter")
        rank, rec, status = await _timeline(pilot, app)
        assert rank == 1 and rec is None and status.startswith("rank 1  ·  step 2  ·"), status
        assert app.screen.query_one(SpanDetail).has_class("hidden")  # no call described as if it were the crash
        tl = app.screen.timeline
        last = tl.model.summaries["ranks"][1]["t_last"] - tl.model.offsets[1]
        assert abs(tl.cursor_time - last) <= 2 * tl.ns_per_cell  # at its records' end


@each("segv")
@sync
async def test_the_timeline_reads_the_failed_step_as_that_step(run):
    """Past rank 1's last call of step 2 (a step no rank ended) the status said "step 1";
    ] from step 1 did not reach step 2."""
    app = make_app(run["bundle"], start="timeline")
    async with app.run_test(size=SIZE) as pilot:
        screen = app.screen
        tl = screen.timeline
        await settle(pilot, tl)
        spans = tl.model.load(1)
        i = max(k for k, r in enumerate(spans.records) if getattr(r, "group", None) == 0)
        assert spans.records[i].step == 2
        tl.show_span(1, i)
        await pilot.press("escape", "right")  # no call selected: the status tells the cursor's step
        await settle(pilot, tl)
        status = str(screen.query_one("#timeline-status", Static).content)
        assert tl.selected is None and status.startswith("rank 1  ·  step 2  ·"), status
        assert tl.show_step(1)
        await pilot.press("right_square_bracket")
        await settle(pilot, tl)
        status = str(screen.query_one("#timeline-status", Static).content)
        assert status.startswith("rank 1  ·  step 2  ·"), status


@each("abort", "kill")
@sync
async def test_the_failed_step_in_the_steps_table_and_the_heat_map(run):
    """The overview's step row names the ranks that never ended it and Enter shows it (it
    did nothing); the heat map's column of it holds their time to their last record, says
    so, and Enter shows it too. The step is info's last."""
    failed = run["steps"][-1]  # abort: 2, kill: 3
    app = make_app(run["bundle"])
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        steps = app.screen.query_one("#steps", DataTable)
        row = steps.get_row(str(failed))
        # abort: ranks 0-1 (both records end in step 2); kill: rank 0 (rank 1's end with step 2)
        never = named_ranks(r for r, step in run["ended"].items() if step == failed)
        assert str(row[1]) == f"0; not ended by {never}", row
        steps.focus()
        steps.move_cursor(row=steps.get_row_index(str(failed)))
        await pilot.press("enter")
        rank, _, status = await _timeline(pilot, app)
        assert rank == 0 and status.startswith(f"rank 0  ·  step {failed}  ·"), status
        await pilot.press("5")
        await settle(pilot)
        hm = app.screen.heatmap
        assert hm.grid.steps == run["steps"]
        hm.focus()
        await pilot.press(*["right"] * len(run["steps"]))  # rank 0 (the first row), the last step
        await settle(pilot)
        _, step, value, worst = hm.cursor_cell()
        assert (step, worst) == (failed, 0) and value > 0
        text = screen_text(app)
        assert f"rank 0 · step {failed} · step time" in text and "never ended" in text, text
        await pilot.press("enter")
        rank, _, status = await _timeline(pilot, app)
        assert rank == 0 and status.startswith(f"rank 0  ·  step {failed}  ·"), status


@each("abort", "segv", "kill")
@sync
async def test_the_collectives_screen_names_the_ranks_as_diagnose_does(run):
    """The failing call's row: the ranks it never completed on, failed on and that did not
    enter it, each the rank diagnose names for it; Enter lands on the rank named first."""
    app = make_app(run["bundle"])
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        await app.show_group(0)
        await settle(pilot)
        screen = app.screen
        failed = [f for f in run["findings"] if f["kind"] == "call_failed"]
        (f,) = failed
        row = next(r for r in screen.rows if r.seq == f["seq"])
        problems = "; ".join(row.problems(screen.members))
        assert f"failed on rank {f['ranks'][0]}" in problems, problems
        assert row.step_text == str(run["steps"][-1])
        if f["ranks"] == [1]:  # abort: rank 0 died in it, the call failed on rank 1
            assert "never completed on rank 0" in problems and "never completed on rank 1" not in problems
            first = 0
        else:  # rank 1 died before it
            gone = next(g for g in run["findings"] if g["kind"] in ("hang", "killed"))
            assert f"rank {gone['ranks'][0]} did not enter" in problems and "never completed" not in problems
            first = f["ranks"][0]
        assert problems in screen_text(app)
        table = screen.query_one(DataTable)
        table.move_cursor(row=table.get_row_index(str(f["seq"])))
        await pilot.press("j")
        rank, rec, _ = await _timeline(pilot, app)
        assert rank == first and (rec.group, rec.seq) == (0, f["seq"])


@each("abort")
@sync
async def test_the_details_pane_names_the_calls_rank_and_step(run):
    app = make_app(run["bundle"], start="timeline")
    async with app.run_test(size=SIZE) as pilot:
        screen = app.screen
        await settle(pilot, screen.timeline)
        for rank, says in ((0, "never completed"), (1, "failed")):
            screen.goto(rank, 0, 8)
            await settle(pilot, screen.timeline)
            await settle(pilot)
            fields = _details(app)
            assert re.search(rf"^rank +{rank} *$", fields, re.M), fields
            assert re.search(r"^step +2, entered", fields, re.M), fields  # where it began step 2
            assert says in fields, fields
            detail = screen.query_one(SpanDetail)
            assert {r[0] for r in detail.arrivals["rows"]} == {0, 1}


@each("abort")
@sync
async def test_compare_names_the_rank_and_step_of_the_first_divergence(run, crashy_runs):
    """abort against segv as its "replay": rank 1's seq 8 of step 2 is the first call the
    other never made (rank 1 died before it); j lands on rank 1's call."""
    app = make_app(run["bundle"], crashy_runs("segv").bundle, start="compare")
    async with app.run_test(size=SIZE) as pilot:
        end = time.monotonic() + 45
        while app.screen.result is None:
            assert time.monotonic() < end, "the comparison never came"
            await asyncio.sleep(0.05)
            await pilot.pause()
        await settle(pilot)
        assert "First divergence: rank 1, step 2, group 0 seq 8 (all_reduce)" in screen_text(app)
        await pilot.press("j")
        rank, rec, status = await _timeline(pilot, app)
        assert rank == 1 and (rec.group, rec.seq, rec.step) == (0, 8, 2) and "step 2" in status
