"""diagnose() on hand-built runs: each planted problem is found with its rank, group and seq."""

import dataclasses
import json

import pytest

from graph_sim import SimRun
from prism_rr.format import open_bundle
from prism_rr.analysis import diagnose, diagnosis_json
from windows import diagnosed


def _findings(run, tmp_path, **kw):
    with open_bundle(run.bundle(tmp_path, **kw)) as b:
        return diagnosed(b)


def _only(findings, kind):
    got = [f for f in findings if f.kind == kind]
    assert got, [f.message for f in findings]
    return got


def test_clean_run_has_no_findings(tmp_path):
    run = SimRun(8, groups=[(0, 1, 2, 3), (4, 5, 6, 7)], offsets={r: (r * 7_777_777) - 20_000_000 for r in range(8)})
    for _ in range(6):
        run.train(1)
        run.collective(1 if 0 in run.active() else 2, shape=(64,))
        run.collective(2, shape=(64,))
    findings = _findings(run, tmp_path)
    assert findings == []
    assert diagnosis_json(findings)["summary"]["message"] == "no problems found"


def test_rank_that_skips_a_collective_is_named_as_missing(tmp_path):
    run = SimRun(4)
    run.train(3)
    run.compute(1000)
    run.collective(0, skip=(1,), line=120)
    run.compute(5000, ranks=[1])
    (hang,) = _only(_findings(run, tmp_path), "hang")
    assert hang.ranks == (1,) and hang.group == 0 and hang.seq == 6
    assert hang.details["entered"] == [0, 2, 3]
    assert hang.details["never_completed"] == [0, 2, 3]
    assert hang.details["missing_last"]["1"]["state"] == "finished"
    assert "never by rank 1" in hang.message
    assert any("train.py:120" in frame for frame in hang.stack)


def test_killed_rank_is_missing_and_truncated(tmp_path):
    run = SimRun(4)
    run.train(3)
    run.compute(1000)
    run.kill(2)
    run.collective(0)
    findings = _findings(run, tmp_path, truncated=(2,))
    (hang,) = _only(findings, "hang")
    assert hang.ranks == (2,) and (hang.group, hang.seq) == (0, 6)
    assert hang.details["missing_last"]["2"]["state"] == "truncated"
    (trunc,) = _only(findings, "truncated")
    assert trunc.ranks == (2,)


def test_rank_blocked_in_another_group_is_reported_blocked(tmp_path):
    # rank 1 waits in group 2 for rank 3, which never comes; rank 0 waits for rank 1 in group 1
    run = SimRun(4, groups=[(0, 1), (1, 2, 3)])
    run.train(2)
    run.collective(2, skip=(3,))
    run.collective(1)
    findings = _findings(run, tmp_path)
    hangs = {(f.group, f.ranks): f for f in _only(findings, "hang")}
    assert set(hangs) == {(1, (1,)), (2, (3,))}
    blocked = hangs[(1, (1,))].details["missing_last"]["1"]
    assert blocked["state"] == "blocked" and blocked["group"] == 2 and blocked["seq"] == 0
    assert "blocked in all_reduce (group 2, seq 0)" in hangs[(1, (1,))].message


def test_call_entered_by_all_and_never_completed(tmp_path):
    run = SimRun(2)
    run.train(2)
    run.compute(1000)
    run.collective(0)
    # every member entered, none completed: rewrite the last call as open on both ranks
    for r in (0, 1):
        run.recs[r][-1] = dataclasses.replace(run.recs[r][-1], end_ns=None)
    (f,) = _only(_findings(run, tmp_path), "incomplete")
    assert f.ranks == (0, 1) and (f.group, f.seq) == (0, 4)


@pytest.mark.parametrize("override, field", [
    ({"in_shapes": ((1024, 2),)}, "shapes"),
    ({"in_dtypes": ("bfloat16",)}, "dtypes"),
    ({"op": "broadcast", "reduce_op": None, "root": 0}, "op"),
    ({"reduce_op": "max"}, "reduce op"),
])
def test_mismatch_names_the_odd_rank_and_field(tmp_path, override, field):
    run = SimRun(4)
    run.train(2)
    run.collective(0, override={3: override})
    run.train(2)
    findings = _findings(run, tmp_path)
    (f,) = _only(findings, "mismatch")
    assert f.ranks == (3,) and (f.group, f.seq) == (0, 4)
    assert field in f.details["differences"]
    assert f.details["differences"][field]["ranks"] == [3]
    assert "rank 3" in f.message


def test_root_mismatch(tmp_path):
    run = SimRun(4)
    run.train(1)
    run.collective(0, op="broadcast", reduce_op=None, root=0, override={2: {"root": 1}})
    (f,) = _only(_findings(run, tmp_path), "mismatch")
    assert f.ranks == (2,) and "root" in f.details["differences"]


def test_send_without_receive(tmp_path):
    run = SimRun(4)
    run.train(2)
    run.send(2, 3, skip_recv=True)
    run.train(1)
    (f,) = _only(_findings(run, tmp_path), "unmatched_p2p")
    assert f.ranks == (2, 3) and f.group == 0 and f.seq == 0
    assert f.details["side"] == "send"


def test_send_and_receive_of_different_shapes(tmp_path):
    run = SimRun(2)
    run.train(1)
    run.send(0, 1, shape=(16,), recv_shape=(32,))
    (f,) = _only(_findings(run, tmp_path), "mismatch")
    assert f.ranks == (0, 1)


def test_straggler_is_found_with_time_lost(tmp_path):
    run = SimRun(8, offsets={r: r * 1_000_000_000 for r in range(8)})  # far-apart clocks, corrected
    run.train(12, slow={5: 4_000_000})
    findings = _findings(run, tmp_path)
    (f,) = _only(findings, "straggler")
    assert f.ranks == (5,)
    assert f.details["last"] >= 11  # the warm-up step aside
    assert f.details["waiting_ranks"] == [0, 1, 2, 3, 4, 6, 7]
    assert f.details["lost_per_rank_ns"] > 11 * 3_000_000
    assert [x.kind for x in findings] == ["straggler"]


def test_dropped_records(tmp_path):
    run = SimRun(4)
    run.train(2)
    run.marker(1, "records_dropped", value=17)
    run.train(2)
    (f,) = _only(_findings(run, tmp_path), "dropped")
    assert f.ranks == (1,) and f.details["dropped"] == {"1": 17}


def test_recorder_failure_is_not_a_hang(tmp_path):
    run = SimRun(4)
    run.train(2)
    run.marker(3, "recorder_failed", text="OSError: disk full")
    run.dead.add(3)  # nothing more recorded on rank 3; the run itself went on
    run.train(2)
    findings = _findings(run, tmp_path)
    assert [f.kind for f in findings] == ["recorder_failed"]
    assert findings[0].ranks == (3,)


def test_json_form(tmp_path):
    run = SimRun(4)
    run.train(2)
    run.collective(0, override={3: {"in_shapes": ((7,),)}})
    out = diagnosis_json(_findings(run, tmp_path))
    text = json.dumps(out)
    back = json.loads(text)
    (f,) = back["findings"]
    assert {"kind", "ranks", "group", "seq", "message"} <= set(f)
    assert (f["kind"], f["ranks"], f["group"], f["seq"]) == ("mismatch", [3], 0, 4)
    assert back["summary"]["count"] == 1
