"""A failed run told from a good one, and the step it failed in numbered alike everywhere.

On the session's real gloo recordings (conftest): crashy.py abort (the last rank
all_reduces 5 floats where the other passes 3 in step 2; gloo aborts rank 0 in it),
crashy.py exit (rank 1 leaves by os._exit inside that step's last all_reduce), hang.py
kill (rank 1 SIGKILLed after step 2, rank 0 then waits for it in step 3) and crashy.py ok
(the same program run to its end). `diff` names the call that differs and the calls the
failed run never completed (exit 6); `diagnose` names a killed rank as killed; the failing
step is one step to `info`, `diagnose`, `analyze`, `diff` and the TUI's heat map, and
`analyze` shows where its time went.
"""

import json

import pytest

from cli_helpers import run_cli
from prism_rr import api
from prism_rr.analysis import diagnose
from prism_rr.format import open_bundle
from prism_rr.tui.analysis import step_grid
from prism_rr.tui.model import TimelineModel
from windows import diagnosed


def _text(findings):
    return [f"[{f.kind}] {f.message}" for f in findings]


@pytest.mark.timeout(120)
def test_diff_of_a_failed_run_names_the_call_and_exits_6(crashy_runs):
    good, failed = crashy_runs("ok").bundle, crashy_runs("abort").bundle
    got = run_cli("diff", good, failed)
    assert got.returncode == 6, got.stdout + got.stderr
    out = got.stdout
    assert "steps 0-2 (the steps both recorded)" in out, out
    assert "first: step 2, rank 1, group 0" in out, out
    assert "A: seq 8  all_reduce  shapes [[3]]" in out and "B: seq 8  all_reduce  shapes [[5]]" in out, out
    assert out.count("at crashy.py:") >= 2, out  # both sides' stacks
    assert "B: rank 0, all_reduce (group 0, seq 8) in step 2" in out, out  # aborted inside it
    assert "did not end" in out, out
    d = api.diff(good, failed).json()
    first = d["first_difference"]
    assert (first["rank"], first["group"], first["step"], first["differs_in"]) == (1, 0, 2, ["shapes"]), first
    assert (first["a"]["seq"], first["a"]["shapes"], first["b"]["shapes"]) == (8, [[3]], [[5]]), first
    assert {"side": "B", "rank": 0, "group": 0, "seq": 8, "op": "all_reduce", "step": 2} in d["never_completed"]
    assert d["steps_not_ended"] == {"a": [], "b": [2]}
    assert api.diff(failed, failed).same  # a failed run against itself: nothing one-sided


@pytest.mark.timeout(120)
def test_a_killed_rank_is_diagnosed_as_killed(killed_peer, crashy_runs):
    with open_bundle(killed_peer.bundle) as b:
        findings = diagnosed(b)
    first = findings[0]
    assert (first.kind, first.ranks, first.group, first.seq) == ("killed", (1,), 0, 6), _text(findings)
    assert first.message.startswith("Rank 1 was killed in step 2 (its process ended without a word: SIGKILL"), \
        first.message
    assert "Then rank 0 waited for it in all_reduce (group 0, seq 6), which it never entered" in first.message
    assert not [f for f in findings if f.kind in ("hang", "incomplete")], _text(findings)
    # os._exit inside a call every member entered: killed in it, not a call "never completed"
    with open_bundle(crashy_runs("exit").bundle) as b:
        findings = diagnose(b)
    first = findings[0]
    assert (first.kind, first.ranks, first.seq) == ("killed", (1,), 8), _text(findings)
    assert "Rank 1 was killed inside all_reduce (group 0, seq 8) in step 2" in first.message, first.message


def _one_number(bundle, step: int, waited: int | None = None) -> None:
    """`step`, the one the run failed in, as each command shows it (`waited`: a rank that
    waited in it for a peer that never came)."""
    info = api.info(bundle).facts
    assert info["steps"][-1] == step, info["steps"]
    found = api.diagnose(bundle).json()["findings"]
    assert any(f"in step {step}" in f["message"] for f in found), found
    (a,) = list(api.analyze(bundle, steps=f"{step}:{step + 1}"))
    assert a.step == step and a.ranks[0].total_ns > 0
    if waited is not None:
        assert a.ranks[waited].waiting_ns > 0, a.ranks
    lines = "\n".join(api.analysis_lines(iter([a])))
    assert lines.startswith(f"step {step}:"), lines
    assert api.diff(bundle, bundle).json()["times"][-1]["step"] == step
    with open_bundle(bundle) as b:
        grid = step_grid(TimelineModel(b))
        assert grid.steps[-1] == step and grid.time[grid.ranks.index(0), -1] > 0


@pytest.mark.timeout(120)
def test_the_failing_step_is_one_step_to_every_command(killed_peer, crashy_runs):
    _one_number(killed_peer.bundle, 3, waited=0)  # rank 0 waited in step 3 for the rank killed after step 2
    _one_number(crashy_runs("abort").bundle, 2)
    got = run_cli("analyze", killed_peer.bundle, "--steps", "3:4", "--json")
    assert got.returncode == 0, got.stderr
    (step,) = json.loads(got.stdout)["steps"]
    assert step["step"] == 3 and step["ranks"]["0"]["waiting_ns"] > 0, step


@pytest.mark.timeout(120)
def test_the_exports_show_the_step_a_run_failed_in(crashy_runs, killed_peer, tmp_path):
    """Chrome's steps thread and Parquet's steps table hold the step a rank never ended (an
    abort in it, a peer killed in it), numbered as every command numbers it, beside the
    steps that ended; a good run has no such step."""
    import gzip

    import pyarrow.parquet as pq

    from prism_rr.format.facts import failed_steps

    for name, bundle in (("abort", crashy_runs("abort").bundle), ("killed", killed_peer.bundle),
                         ("ok", crashy_runs("ok").bundle)):
        with open_bundle(bundle) as b:
            failed = failed_steps(b)
        api.export(bundle, tmp_path / f"{name}.json.gz", fmt="chrome")
        trace = json.loads(gzip.decompress((tmp_path / f"{name}.json.gz").read_bytes()))
        trace = trace["traceEvents"] if isinstance(trace, dict) else trace
        chrome = {(e["pid"], e["args"]["step"]): e for e in trace if e.get("cat") == "step" and e.get("ph") == "X"}
        api.export(bundle, tmp_path / name, fmt="parquet")
        rows = {(r["rank"], r["step"]): r for r in pq.read_table(tmp_path / name / "steps.parquet").to_pylist()}
        assert set(rows) == set(chrome), (name, sorted(rows), sorted(chrome))  # a process per rank, pid = rank
        unended = {k for k, e in chrome.items() if e["args"].get("never_ended")}
        assert unended == {k for k, r in rows.items() if r["end_ns"] is None}, name
        if name == "ok":
            assert failed == [] and not unended
            continue
        # abort: both ranks in step 2; killed: rank 1 killed in step 2 (which it ended), rank 0 in step 3
        assert unended and {step for _, step in unended} <= set(failed), (name, failed, unended)
        assert unended == {"abort": {(0, 2), (1, 2)}, "killed": {(0, 3)}}[name], (name, unended)
        for key in unended:
            assert chrome[key]["name"] == f"step {key[1]} (never ended)" and chrome[key]["dur"] >= 0
            assert rows[key]["start_ns"] >= 0 and rows[key]["duration_ns"] is None
