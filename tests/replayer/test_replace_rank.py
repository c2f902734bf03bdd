"""`replay --replace-rank R@STEP`: a virtual rank replaced by a new process mid-run.

Its peers wait for it to start, rejoin and receive its state: the downtime estimated from
the bundle (replayer/_replace.py) or given, placed before its first call of that step.
A 4-rank data-parallel job (tests/replayer/scripts/replace_job.py) is recorded once and
replayed with rank 0 real; the estimate's parts are checked exactly on hand-made bundles.
No tight timing asserts: a replaced step must be longer by most of the downtime, which
is seconds, against steps of tens of milliseconds.
"""

import json
import re
import subprocess
import sys
from types import SimpleNamespace

import pytest

from prism_rr.errors import UsageError
from prism_rr.format import layout, pack
from prism_rr.format.records import Collective, GroupInfo, Memory, PointToPoint, Step
from prism_rr.format.reader import open_bundle
from prism_rr.format.spool import encode_frame, spool_header, spool_path
from prism_rr.replayer import replay
from prism_rr.replayer._policy import _peer_classes
from prism_rr.replayer._replace import _from_note, cost_model, plan_replacements, replacement_cost
from prism_rr.replayer._timing import PeerClock
from prism_rr.specs import parse_replace_rank
from prism_rr.topology.costmodel import fit, samples
from prism_rr.topology.scale import scale

from replay_helpers import SCRIPTS, record, stderr_of

STEPS = 5
JOB = [sys.executable, str(SCRIPTS / "replace_job.py"), str(STEPS)]


# --- the spec, the timing model, the role classes (no processes) --------------------------


def test_the_spec_reads_as_users_write_it():
    assert parse_replace_rank("1@2") == ((1, 2),)
    assert parse_replace_rank(["3@4", "1@2,1@2"]) == ((1, 2), (3, 4))  # repeated option, each once
    assert parse_replace_rank({5: 0}) == ((5, 0),) and parse_replace_rank([(2, 1)]) == ((2, 1),)
    assert parse_replace_rank(None) == () and parse_replace_rank([]) == ()
    for bad in ("1-2", "a@b", "1@2@3", "-1@2"):
        with pytest.raises(UsageError, match="replace_rank"):
            parse_replace_rank(bad)


def _c(start, end, *, step, seq=0):
    return Collective(start_ns=start, end_ns=end, step=step, op="all_reduce", group=0, seq=seq)


def test_a_replaced_rank_enters_its_step_late_once_after_the_boundary_placement():
    clock = PeerClock(0, {}, replaced={1: [(1, 5_000)]})
    clock.anchor(0, _c(0, 10, step=0))
    for r in (1, 2):
        clock.completed(r, _c(0, 100, step=0), 0, 100)
    # recorded: the real rank's step 0 ended at 900, the replay's at 400 (the placement
    # moves the peers to 400 + 100); the downtime comes after it, or it would be undone
    clock.step_started(400, 900)
    first = _c(1_000, 1_100, step=1, seq=1)
    assert clock.entry(2, first) == 500
    assert clock.entry(1, first) == 500 + 5_000
    clock.completed(1, first, 5_500, 5_600)
    # its later calls follow from there, without a second downtime
    assert clock.entry(1, _c(1_200, 1_300, step=1, seq=2)) == 5_600 + 100
    # a replacement at a step where the rank makes no call: its next call takes it
    late = PeerClock(0, {}, replaced={1: [(1, 7)]})
    late.anchor(0, _c(0, 10, step=0))
    assert late.entry(1, _c(50, 60, step=2)) == 50 + 7  # its first call, on the recording's time line


def test_a_replaced_rank_leaves_its_role_and_moves_alone():
    """In a scaled bundle the ranks of one role share one clock ("r<rep>"): a replaced rank
    is its own class, or its whole role would wait for the new process."""
    session = SimpleNamespace(clock=PeerClock(0, {}, replaced={5: [(1, 1)]}),
                              source=lambda g: g if g < 2 else 2)
    classes = {c.key: c.positions for c in _peer_classes(session, 0, tuple(range(8)), {0})}
    assert classes == {1: [1], 2: [2], "r2": [3, 4, 6, 7], 5: [5]}


# --- the estimate, on hand-made bundles ----------------------------------------------------

MS = 1_000_000
GIB = 1 << 30


def _rank_records(rank: int, *, memory: bool, messages: bool) -> list:
    peer = 1 - rank
    recs = [GroupInfo(start_ns=1_600 * MS, end_ns=1_600 * MS, step=0, group=0, ranks=(0, 1), name="0",
                      text="default_pg", backend="gloo"),
            Collective(start_ns=3_000 * MS, end_ns=3_001 * MS, step=0, op="all_reduce", group=0, seq=0,
                       in_bytes=4096, out_bytes=4096),
            Step(start_ns=2_500 * MS, end_ns=3_002 * MS, step=0)]
    if memory:
        recs.append(Memory(start_ns=3_003 * MS, end_ns=3_003 * MS, step=1, mem_alloc=GIB, mem_peak=GIB))
    # step 1 begins 9 ms of compute after step 0's call
    recs += [Collective(start_ns=3_010 * MS, end_ns=3_011 * MS, step=1, op="all_reduce", group=0, seq=1,
                        in_bytes=4096, out_bytes=4096),
             Collective(start_ns=3_012 * MS, end_ns=3_013 * MS, step=1, op="reduce_scatter_tensor", group=0,
                        seq=2, in_bytes=4096, out_bytes=2048)]
    t = 3_020 * MS
    if messages:  # 10 us + 0.1 ns a byte: 10 GB/s, exactly
        for i, size in enumerate((1 << 20, 2 << 20, 4 << 20, 8 << 20)):
            span = 10_000 + size // 10
            op = "send" if rank == 1 else "recv"
            recs.append(PointToPoint(start_ns=t, end_ns=t + span, step=1, op=op, group=0, seq=i, peer=peer,
                                     nbytes=size))
            t += span + MS
    recs += [Collective(start_ns=t, end_ns=t + MS, step=1, op="barrier", group=0, seq=3),
             Step(start_ns=3_002 * MS, end_ns=t + 2 * MS, step=1)]
    return recs


def _handmade(tmp_path, name="hand", *, clock=None, memory=True, messages=True):
    spool_dir = tmp_path / f"{name}.prism.d"
    spool_dir.mkdir()
    clock = {"monotonic_ns": 1_500 * MS, "process_start_ns": 1_000 * MS} if clock is None else clock
    for rank in (0, 1):
        info = {"world_size": 2, "rank": rank, "backend": "gloo", "argv": ["train.py"], "clock": clock}
        recs = _rank_records(rank, memory=memory, messages=messages)
        parts = [spool_header(rank), encode_frame(layout.FRAME_RANK_INFO, rank, 0, info=info),
                 encode_frame(layout.FRAME_EVENTS, rank, 1, records=recs)]
        spool_path(spool_dir, rank).write_bytes(b"".join(parts))
    out = tmp_path / f"{name}.prism"
    pack(spool_dir, out)
    return out


def test_the_estimate_is_start_up_rejoin_and_state(tmp_path):
    with open_bundle(_handmade(tmp_path)) as b:
        e = replacement_cost(b, 1, 1)
    p = e["parts"]
    assert e["rank"] == 1 and e["step"] == 1 and e["estimated"] is True and e["notes"] == []
    # start-up: process start (1.0 s) to the first call (3.0 s), less the 9 ms of compute
    # before its first call of step 1, which the timing model adds anyway
    assert p["start_up_from"] == "process start" and p["start_up_s"] == pytest.approx(2.0 - 0.009)
    # rejoin: a rendezvous of the world, priced as the recorded barrier (1 ms)
    assert p["rejoin_as"] == "barrier" and p["rejoin_world"] == 2 and p["rejoin_s"] == pytest.approx(0.001)
    # state: 1 GiB allocated at the step's start, at the point-to-point fit's 10 GB/s (+ 10 us)
    assert p["state_from"] == "allocated memory" and p["state_bytes"] == GIB
    assert p["bandwidth_bytes_per_s"] == pytest.approx(10e9) and p["bandwidth_from"] == "point-to-point fit"
    assert p["state_s"] == pytest.approx(10e-6 + GIB / 10e9)
    assert e["downtime_s"] == pytest.approx(p["start_up_s"] + p["rejoin_s"] + p["state_s"])


def test_the_estimate_says_what_it_could_not_tell(tmp_path):
    # no process start: from init_process_group (1.5 s), imports not counted
    with open_bundle(_handmade(tmp_path, "init", clock={"monotonic_ns": 1_500 * MS})) as b:
        e = replacement_cost(b, 1, 1)
    assert e["parts"]["start_up_from"] == "init_process_group"
    assert e["parts"]["start_up_s"] == pytest.approx(1.5 - 0.009)
    assert any("imports not counted" in n for n in e["notes"])
    # no memory: the gradients it reduced in the step (all_reduce inputs, its reduce_scatter
    # shard) are a floor; no bandwidth to tell: the transfer counts 0 s, and says so
    with open_bundle(_handmade(tmp_path, "bare", memory=False, messages=False)) as b:
        e = replacement_cost(b, 1, 1)
    p = e["parts"]
    assert p["state_from"] == "gradients" and p["state_bytes"] == 4096 + 2048
    assert p["bandwidth_bytes_per_s"] is None and p["state_s"] == 0
    assert any("a floor" in n for n in e["notes"]) and any("does not tell the bandwidth" in n for n in e["notes"])
    # a given downtime skips the estimate
    with open_bundle(_handmade(tmp_path, "given")) as b:
        (g,) = plan_replacements(b, "1@0", real=(0,), downtime=0.25)
    assert g == {"rank": 1, "step": 0, "downtime_s": 0.25, "estimated": False, "parts": None, "notes": []}


def test_a_scaled_bundle_is_priced_with_the_model_scale_used(tmp_path):
    rec = _handmade(tmp_path)
    with open_bundle(rec) as b:
        model = fit(samples(b))
    again = _from_note(json.loads(json.dumps(model.to_dict())))  # as a manifest holds it
    for fam, nbytes, n in (("p2p", 1 << 20, 2), ("barrier", 0, 8192), ("all_reduce", 4096, 64)):
        assert again.predict_ns(fam, nbytes, n) == pytest.approx(model.predict_ns(fam, nbytes, n))
    assert _from_note({"params": {"p2p": {"alpha_ns": "x"}}}) is None  # a bundle is hostile input
    big = tmp_path / "big.prism"
    scale(rec, big, dp=4096, bandwidth=50e9)
    with open_bundle(big) as b:
        assert cost_model(b).given_bytes_per_s == 50e9
        (e,) = plan_replacements(b, "4095@1", real=(0,))
    p = e["parts"]
    assert p["rejoin_world"] == 4096 and p["start_up_rank"] in (0, 1)
    assert p["bandwidth_bytes_per_s"] == 50e9 and p["bandwidth_from"] == "given to scale"
    assert p["state_s"] == pytest.approx(GIB / 50e9)
    assert e["downtime_s"] > 1.9


def test_a_replacement_names_a_virtual_rank_and_a_recorded_step(tmp_path):
    with open_bundle(_handmade(tmp_path)) as b:
        for spec, words in (("0@1", "is a real rank"), ("2@1", "not a rank of the recorded world of 2"),
                            ("1@7", "holds no step 7 (its steps: 0-1)")):
            with pytest.raises(UsageError, match=re.escape(words)):
                plan_replacements(b, spec, real=(0,))
        with pytest.raises(UsageError, match="replace_rank"):
            plan_replacements(b, None, real=(0,), downtime=1.0)


# --- real replays of a real recording ------------------------------------------------------


@pytest.fixture(scope="module")
def recording(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("replace")
    # Started cold (not forked from the suite's warm interpreter, tests/warm): the estimate's
    # start-up is what a new rank's process spends before its first call, torch's import first.
    with pytest.MonkeyPatch.context() as mp:
        mp.delenv("PRISM_RR_TEST_WARM", raising=False)
        return tmp, record(tmp, [SCRIPTS / "replace_job.py", STEPS], 4, payload="none", memory=True)


def _run(recording, tag, **kw) -> tuple[dict, str]:
    tmp, bundle = recording
    result = replay(bundle, ranks=(0,), cmd=JOB, timeout=150, log_dir=tmp / f"logs-{tag}", **kw)
    assert result.exit_code == 0, stderr_of(result, 0)
    return result.report, result.card


def _step(rep, step) -> float:
    return next(s["replayed_s"] for s in rep["steps"] if s["step"] == step)


@pytest.fixture(scope="module")
def baseline(recording):
    return _run(recording, "base")[0]


@pytest.mark.timeout(240)
def test_replacing_a_rank_delays_its_step_by_the_estimate(recording, baseline):
    rep, card = _run(recording, "replace", replace_rank="1@2")
    (e,) = rep["what_if"]["replace_rank"]
    p = e["parts"]
    assert (e["rank"], e["step"], e["estimated"]) == (1, 2, True)
    assert p["start_up_from"] == "process start" and p["start_up_s"] > 0.3  # torch's import at least
    assert p["state_from"] == "allocated memory" and p["state_bytes"] > 1 << 20  # the 1 MiB layer
    assert e["downtime_s"] == pytest.approx(p["start_up_s"] + p["rejoin_s"] + p["state_s"])
    down = e["downtime_s"]
    # rank 0 waits in step 2's first all_reduce for the new rank 1; the other steps are as before
    assert _step(rep, 2) >= _step(baseline, 2) + 0.8 * down
    for step in (1, 3, 4):
        assert _step(rep, step) < _step(baseline, step) + 0.5 * down
    assert rep["mode"] == "prediction" and rep["prediction"]["what_if"]["replace_rank"] == [e]
    assert "predicted at world 4 (rank 1 replaced at step 2)" in card
    shown = f"{down * 1e3:.1f} ms" if down < 1 else f"{down:.2f} s"
    assert f"rank 1 replaced at step 2: downtime {shown} (start-up" in card
    assert "; step 2 took" in card and "error" not in card


def _cli(*args, timeout=150):
    return subprocess.run([sys.executable, "-m", "prism_rr.cli", "replay", *map(str, args)],
                          capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)


@pytest.mark.timeout(200)
def test_a_given_downtime_is_emulated_as_given(recording, baseline):
    tmp, bundle = recording
    report = tmp / "given.json"
    out = _cli(bundle, "--ranks", "0", "--replace-rank", "3@1", "--replace-downtime", "0.5", "--report", report,
               "--timeout", "120", "--", *JOB)
    assert out.returncode == 0, out.stderr[-3000:]
    rep = json.loads(report.read_text())
    assert rep["what_if"]["replace_rank"] == [{"rank": 3, "step": 1, "downtime_s": 0.5, "estimated": False,
                                              "parts": None, "notes": []}]
    # rank 0 waits out rank 3's 0.5 s in step 1's first call with it: a wait a loaded machine
    # makes longer, never shorter (unlike the baseline's step, which load inflates; it was
    # 0.17 s against a replaced step of 0.57 s in one run on 3 workers)
    assert _step(rep, 1) >= 0.5
    assert "rank 3 replaced at step 1: downtime 500.0 ms (given)" in out.stderr


@pytest.mark.timeout(120)
def test_a_replacement_that_cannot_be_is_refused_in_one_line(recording):
    _, bundle = recording
    for args, words in ((["--replace-rank", "0@2"], "rank 0 is a real rank"),
                        (["--replace-rank", "9@2"], "not a rank of the recorded world of 4"),
                        (["--replace-rank", "1@99"], "holds no step 99"),
                        (["--replace-rank", "1-2"], "R@STEP"),
                        (["--replace-downtime", "1"], "--replace-rank R@STEP")):
        out = _cli(bundle, "--ranks", "0", *args, "--", *JOB, timeout=60)
        assert out.returncode == 2, (args, out.stderr)
        assert len(out.stderr.strip().splitlines()) == 1 and words in out.stderr, (args, out.stderr)


@pytest.mark.timeout(240)
def test_replacing_a_rank_at_target_scale(recording, tmp_path):
    """The recording scaled to dp=4096: rank 4095, of rank 0's role, is replaced; the
    estimate is priced at world 4096 from its representative's records, and the step waits
    for it while the role's other 4094 virtual ranks do not move with it."""
    _, bundle = recording
    big = tmp_path / "big.prism"
    scale(bundle, big, dp=4096)
    report = tmp_path / "big.json"
    out = _cli(big, "--ranks", "0", "--replace-rank", "4095@2", "--report", report, "--timeout", "150",
               "--", *JOB, timeout=200)
    assert out.returncode == 0, out.stderr[-3000:]
    rep = json.loads(report.read_text())
    (e,) = rep["what_if"]["replace_rank"]
    assert rep["world_size"] == 4096 and rep["diverged"] is False
    assert e["estimated"] and e["parts"]["rejoin_world"] == 4096 and e["parts"]["start_up_rank"] == 0
    assert _step(rep, 2) >= 0.8 * e["downtime_s"]
    assert _step(rep, 3) < 0.5 * e["downtime_s"]
    assert "predicted at world 4096 (rank 4095 replaced at step 2)" in out.stderr
