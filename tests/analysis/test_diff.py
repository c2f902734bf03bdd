"""prism-rr diff: the first call where two runs' collective sequences differ, and the time
per step and rank; exit 0 when they match, 6 when they differ.

Real recordings: a 2-rank gloo script recorded as written and with one broadcast turned
into an all_gather (both recorded at once), and the session's demo runs.
"""

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest

from cli_helpers import run_cli
from graph_sim import SimRun
from prism_rr.analysis import diff_bundles, diff_json, diff_lines
from prism_rr.format import Collective, PointToPoint, open_bundle

SCRIPT = Path(__file__).parent / "scripts" / "collectives.py"


PP_DEMO = ("--pp", "2", "--world", "2")  # the README's pipeline demo line


@pytest.fixture(scope="module")
def recorded(tmp_path_factory, demo_runs):
    """(A, B): the script as written, and changed; recorded side by side, while the
    session's demo thread makes the demo runs that the last test of this file diffs."""
    demo_runs.start()
    demo_runs.start(*PP_DEMO)
    d = tmp_path_factory.mktemp("diff")

    def start(name, args):
        return subprocess.Popen([sys.executable, "-m", "prism_rr.cli", "record", "-o", str(d / f"{name}.prism"),
                                 "--nproc", "2", "--", sys.executable, str(SCRIPT), *args],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=d)

    runs = {name: (start(name, args), args) for name, args in (("a", []), ("b", ["changed"]))}
    for name, (proc, args) in runs.items():
        _, err = proc.communicate(timeout=150)
        assert proc.returncode == 0, err
    return d / "a.prism", d / "b.prism"


@pytest.mark.timeout(200)
def test_cli_diff_of_recorded_runs(recorded, tmp_path):
    a, b = recorded
    out = run_cli("diff", a, b)
    assert out.returncode == 6, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].startswith("collective sequences differ: 2 (rank, group) sequences")
    assert lines[1] == "first: step 1, rank 0, group 0, the rank's call 3 in that group: op, root"
    assert "broadcast" in lines[2] and "collectives.py:20" in lines[3]
    assert "all_gather" in lines[4] and "collectives.py:18" in lines[5]
    assert any(line.startswith("  step 1 ") for line in lines)

    doc = json.loads(run_cli("diff", a, b, "--json").stdout)
    first = doc["first_difference"]
    assert doc["same"] is False and (first["rank"], first["group"], first["step"]) == (0, 0, 1)
    assert (first["a"]["op"], first["a"]["seq"], first["a"]["root"]) == ("broadcast", 3, 0)
    assert (first["b"]["op"], first["b"]["shapes"], first["b"]["dtypes"]) == ("all_gather", [[4]], ["float32"])
    assert first["a"]["stack"][0].startswith("collectives.py:20") and first["b"]["stack"][0].startswith("collectives.py:18")
    assert [d["rank"] for d in doc["sequence_differences"]] == [0, 1]
    assert {(t["step"], t["rank"]) for t in doc["times"]} == {(s, r) for s in range(3) for r in range(2)}
    assert all(t["a_ns"] > 0 and t["b_ns"] > 0 and t["delta_ns"] == t["b_ns"] - t["a_ns"] for t in doc["times"])

    # the same run, redacted (no payloads, stacks cut to file:line): the same sequences
    public = tmp_path / "public.prism"
    assert run_cli("redact", a, "-o", public).returncode == 0
    same = run_cli("diff", a, public)
    assert same.returncode == 0, same.stdout + same.stderr
    _both_ways(a, b)
    _both_ways(a, public)
    assert same.stdout.startswith("collective sequences match: 12 calls in A, 12 in B, on ranks 0-1")


def _both_ways(a, b):
    """diff_bundles(a, b), which reads columns, after checking it says what reading every
    rank's records says, and what a second process comparing half the ranks says."""
    with open_bundle(a) as ba, open_bundle(b) as bb:
        d = diff_bundles(ba, bb, processes=1)
        assert diff_json(d) == diff_json(diff_bundles(ba, bb, columns=False))
        shared = diff_bundles(ba, bb, processes=2)
        assert diff_json(shared) == diff_json(d) and diff_lines(shared) == diff_lines(d)
        return d


def _pair(tmp_path, change):
    a, b = SimRun(4, groups=[(0, 1), (2, 3)]), SimRun(4, groups=[(0, 1), (2, 3)])
    a.train(3)
    change(b)
    return _both_ways(a.bundle(tmp_path, "a"), b.bundle(tmp_path, "b"))


def test_a_message_sent_with_another_tag(tmp_path):
    def change(b):
        b.train(3)
        for i, rec in enumerate(b.recs[0]):
            if type(rec) is PointToPoint and rec.seq == 1:
                b.recs[0][i] = dataclasses.replace(rec, tag=7)

    d = _pair(tmp_path, change)
    assert not d.same and (d.first.rank, d.first.group) == (0, 0) and d.first.fields == ("tag",)


def test_a_call_one_run_did_not_make(tmp_path):
    def extra(b):
        b.train(1)
        b.collective(1, shape=(8,))  # only B all_reduces in group 1 (ranks 0, 1) in step 1
        b.train(2)
    d = _pair(tmp_path, extra)
    assert not d.same
    assert [(s.rank, s.group, s.index, s.fields) for s in d.sequences] == [
        (0, 1, 0, ("missing in A",)), (1, 1, 0, ("missing in A",))]
    assert d.first.a is None and d.first.b.group == 1 and d.first.step == 1
    text = diff_lines(d)
    assert "  A: no call (the run made 0 calls of this group on this rank)" in text
    assert json.loads(json.dumps(diff_json(d)))["first_difference"]["a"] is None


def test_shapes_and_reduce_op_differences_and_time(tmp_path):
    def changed(b):
        b.train(1)
        b.compute(5_000_000)  # step 1 is 3 ms slower in B than the 2 ms of train()
        b.collective(0, line=88, override={2: {"reduce_op": "max"}})
        b.compute(500_000)
        b.collective(0, shape=(256, 8), line=89)
        b.send(0, 1)
        b.end_step()
        b.train(1)
    d = _pair(tmp_path, changed)
    got = {(s.rank, s.index): s.fields for s in d.sequences}
    assert got == {(0, 4): ("shapes",), (1, 4): ("shapes",), (2, 2): ("reduce_op",), (3, 3): ("shapes",)}
    assert d.first.rank == 0 and d.first.a.in_shapes == ((256, 4),) and d.first.b.in_shapes == ((256, 8),)
    slow = {t.rank: t.delta_ns for t in d.times if t.step == 1}
    assert all(2_900_000 < v < 3_100_000 for v in slow.values()), slow
    assert all(t.delta_ns == 0 for t in d.times if t.step != 1)


def test_group_with_other_members(tmp_path):
    a, b = SimRun(4, groups=[(0, 1)]), SimRun(4, groups=[(0, 2)])
    a.train(1)
    b.train(1)
    with open_bundle(a.bundle(tmp_path, "a")) as ba, open_bundle(b.bundle(tmp_path, "b")) as bb:
        d = diff_bundles(ba, bb)
    assert not d.same and not d.sequences
    assert [(g.group, g.a, g.b) for g in d.groups] == [(1, (0, 1), (0, 2))]
    assert "  group 1: ranks 0-1 in A, 0,2 in B" in diff_lines(d)


def test_windows_starting_at_other_sequence_numbers(tmp_path):
    """Two rings of one run without steps (as imported Flight Recorder dumps are): B lost its
    first step's calls; both are compared from the first sequence number both hold."""
    from prism_rr.format import Step

    a, b = SimRun(2), SimRun(2)
    for run in (a, b):
        run.train(3)
        for r in range(2):
            run.recs[r] = [x for x in run.recs[r] if type(x) is not Step
                           and not (run is b and x.step == 0 and type(x) in (Collective, PointToPoint))]
    with open_bundle(a.bundle(tmp_path, "a")) as ba, open_bundle(b.bundle(tmp_path, "b")) as bb:
        assert ba.steps == [] and bb.steps == []
        d = diff_bundles(ba, bb)
        assert d.same, diff_lines(d)
        assert d.calls == (18, 12)
    # and a difference after the cut is still found, at B's sequence number
    a.collective(0)
    b.collective(0, shape=(5,))
    with open_bundle(a.bundle(tmp_path, "a2")) as ba, open_bundle(b.bundle(tmp_path, "b2")) as bb:
        d = diff_bundles(ba, bb)
    assert [(s.rank, s.a.seq, s.b.seq, s.fields) for s in d.sequences] == [(0, 6, 6, ("shapes",)), (1, 6, 6, ("shapes",))]


@pytest.mark.timeout(400)
def test_cli_diff_of_demo_runs(make_demo, demo_runs):
    """The 4-rank FSDP2 x TP demo against itself, and against the 2-rank pipeline one."""
    assert make_demo.result().returncode == 0, make_demo.result().stderr
    same = run_cli("diff", make_demo.bundle, make_demo.bundle, "--json")
    assert same.returncode == 0 and json.loads(same.stdout)["same"] is True
    pp = demo_runs.start(*PP_DEMO)
    assert pp.result().returncode == 0, pp.result().stderr
    out = run_cli("diff", make_demo.bundle, pp.bundle, "--json")
    assert out.returncode == 6, out.stderr
    doc = json.loads(out.stdout)
    assert doc["world_size"] == {"a": 4, "b": 2} and doc["ranks_compared"] == [0, 1]
    assert doc["ranks_only_in_a"] == [2, 3] and doc["group_differences"]
    first = doc["first_difference"]
    assert first["rank"] in (0, 1) and first["differs_in"]
    text = run_cli("diff", make_demo.bundle, pp.bundle)
    assert text.returncode == 6 and "world size 4 in A, 2 in B" in text.stdout
    assert _both_ways(make_demo.bundle, make_demo.bundle).same
    assert not _both_ways(make_demo.bundle, pp.bundle).same
    assert not _both_ways(pp.bundle, make_demo.bundle).same


def test_diff_says_how_far_it_has_compared(tmp_path):
    """8192 ranks x 10,000 take minutes: the ranks compared are counted as they go, and the
    result is the same with or without anyone listening."""
    run = SimRun(4)
    run.train(3)
    path = run.bundle(tmp_path)
    said = []
    with open_bundle(path) as a, open_bundle(path) as b:
        heard = diff_json(diff_bundles(a, b, progress=lambda *x: said.append(x)))
        assert heard == diff_json(diff_bundles(a, b))
    assert said == [(0, 4), (1, 4), (2, 4), (3, 4)]
