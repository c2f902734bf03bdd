"""Where the step time went and what each straggler cost: on hand-built runs (exact
figures), on odd input, and on real gloo recordings checked against a replay."""

import json
import statistics
import sys
from pathlib import Path

import pytest

from cli_helpers import run_cli
from graph_sim import SimRun
from prism_rr.analysis import attribute, attribute_step, attribution_json, attribution_lines, retimed_span
from prism_rr.format import open_bundle, pack
from prism_rr.format.records import Collective, PointToPoint, Step
from prism_rr.recorder.launch import record_command, spool_dir_for
from prism_rr.replayer import replay

SCRIPTS = Path(__file__).parent / "scripts"
MS = 1_000_000


def _adds_up(a):
    for t in a.ranks.values():
        assert t.compute_ns + t.overlapped_ns + t.exposed_ns + t.waiting_ns == t.total_ns, t
        assert min(t.compute_ns, t.overlapped_ns, t.exposed_ns, t.waiting_ns) >= 0, t


def test_slow_rank_costs_what_it_made_the_others_wait(tmp_path):
    # Rank 2 computes 3 ms more than the others before each step's first all_reduce.
    run = SimRun(4, offsets={0: 0, 1: 5_000_000_000, 2: -7 * MS, 3: 0})  # rank 1 on a host of its own
    run.train(3, slow={2: 3 * MS})
    with open_bundle(run.bundle(tmp_path)) as b:
        steps = list(attribute(b))
    assert [a.step for a in steps] == [0, 1, 2]
    for a in steps:
        _adds_up(a)
        assert a.modelled_ns == a.span_ns  # unchanged, the model gives back the recording
        top = a.stragglers[0]
        assert top.rank == 2 and 2.9 * MS < top.cost_ns <= 3 * MS, a.stragglers
        assert all(s.cost_ns < 0.01 * MS for s in a.stragglers[1:])
        assert a.critical_path.ranks[0] == 2  # the path starts with rank 2's compute
        assert a.ranks[2].waiting_ns < 0.01 * MS
        for r in (0, 1, 3):
            assert 2.9 * MS < a.ranks[r].waiting_ns < 3.1 * MS
            assert a.ranks[r].overlapped_ns == 0  # every call blocks
            assert 0.05 * MS < a.ranks[r].exposed_ns < 0.1 * MS  # two 30 us transfers and a send


def test_what_if_a_rank_were_slower(tmp_path):
    run = SimRun(4)
    run.train(2, slow={2: 3 * MS})
    with open_bundle(run.bundle(tmp_path)) as b:
        base = retimed_span(b, 1)
        # rank 2's 5 ms before the first all_reduce and 0.5 ms before the second, doubled
        assert 5.4 * MS < retimed_span(b, 1, slow={2: 2.0}) - base < 5.6 * MS
        # rank 1 doubled is still earlier than rank 2 into the first call: 0.5 ms more
        assert 0.4 * MS < retimed_span(b, 1, slow={1: 2.0}) - base < 0.6 * MS
        assert retimed_span(b, 1, on_time=[2]) < base - 2.9 * MS


def _at(ms: float) -> int:
    return 1_000_000_000 + round(ms * MS)


def _async_run():
    """Two ranks. Rank 0 issues an async all_reduce at 1 ms and waits for it; rank 1
    enters it at 9 ms; it completes at 9.1 ms. Then rank 0 sends at 10 ms, rank 1 posts
    the receive at 12 ms, both complete at 12.5 ms. The step ends at 13 ms."""
    run = SimRun(2)
    rec = run.recs
    kw = dict(step=0, op="all_reduce", group=0, seq=0, in_shapes=((4,),), in_dtypes=("float32",),
              out_shapes=((4,),), out_dtypes=("float32",), reduce_op="sum", async_op=True)
    rec[0].append(Collective(start_ns=_at(1), end_ns=_at(9.1), issued_ns=_at(1.1), **kw))
    rec[1].append(Collective(start_ns=_at(9), end_ns=_at(9.1), issued_ns=_at(9.05), **kw))
    p2p = dict(step=0, group=0, seq=0, shapes=((16,),), dtypes=("float32",), nbytes=64)
    rec[0].append(PointToPoint(start_ns=_at(10), end_ns=_at(12.5), op="send", peer=1, **p2p))
    rec[1].append(PointToPoint(start_ns=_at(12), end_ns=_at(12.5), op="recv", peer=0, **p2p))
    for r in (0, 1):
        rec[r].append(Step(start_ns=_at(0), end_ns=_at(13), step=0))
    return run


def test_async_call_waiting_for_a_late_peer(tmp_path):
    with open_bundle(_async_run().bundle(tmp_path)) as b:
        a = attribute_step(b, 0)
    _adds_up(a)
    r0, r1 = a.ranks[0], a.ranks[1]
    # rank 0: in flight 8 ms before rank 1 came, in the send 2 ms before the receive was
    # posted (waiting); issuing (0.1 ms) and the send's 0.5 ms after (exposed); the
    # all_reduce's last 0.1 ms in flight (overlapped)
    assert (r0.waiting_ns, r0.exposed_ns, r0.overlapped_ns, r0.compute_ns) == (10 * MS, MS // 2, MS // 10, 2.4 * MS)
    assert (r1.waiting_ns, r1.exposed_ns, r1.overlapped_ns) == (0, 0.55 * MS, 0.05 * MS)
    assert (r1.late_ns, r1.late_calls, r0.late_ns) == (10 * MS, 2, 0)
    (cost,) = a.stragglers
    # on time into both calls, rank 1 would have let rank 0 finish 9.9 ms sooner (rank 0
    # still computes 1 ms between the calls)
    assert cost.rank == 1 and 9.8 * MS < cost.cost_ns <= 10 * MS, a.stragglers
    assert [s.rank for s in a.critical_path.segments][-1] in (0, 1) and a.critical_path.ranks[0] == 1


def test_hangs_dumps_and_odd_records_do_not_break_it(tmp_path):
    run = SimRun(4)
    run.train(2, slow={1: 2 * MS})
    run.compute(1000)
    run.collective(0, skip=(3,))  # ranks 0-2 hang in a call rank 3 never makes
    run.compute(1000, ranks=[3])
    run.end_step()
    t = 5_000_000_000
    odd = dict(step=1, op="all_reduce", group=0, in_shapes=(), in_dtypes=())
    run.recs[0].append(Collective(start_ns=t, end_ns=t - 5, seq=99, **odd))  # ends before it starts
    run.recs[0].append(Collective(start_ns=t, end_ns=t + 5, seq=99, **odd))  # the same call twice
    run.recs[1].append(Collective(start_ns=t, end_ns=None, seq=99, async_op=True, **odd))  # never completes
    run.recs[2].append(Collective(start_ns=t + 1, end_ns=t + 9, seq=98, async_op=True, issued_ns=t - 10**9, **odd))
    run.recs[3].append(PointToPoint(start_ns=t, end_ns=t + 3, step=1, op="recv", group=0, seq=-1, peer=-1))
    run.recs[3].append(PointToPoint(start_ns=t, end_ns=t + 3, step=-7, op="send", group=0, seq=0, peer=2))
    with open_bundle(run.bundle(tmp_path)) as b:
        steps = list(attribute(b))
        lines = list(attribution_lines(attribute(b)))
        json.dumps(attribution_json(attribute(b)))
    assert {a.step for a in steps} >= {0, 1, 2}
    for a in steps:
        _adds_up(a)
    assert any("stragglers: rank 1" in line for line in lines), lines


def test_imported_dump_without_call_durations(tmp_path):
    # What a Flight Recorder dump gives: entries with a creation time and no duration, no steps.
    run = SimRun(3)
    t = 1_000_000_000
    for seq in range(3):
        for r in range(3):
            s = t + seq * MS + r * 100_000
            run.recs[r].append(Collective(start_ns=s, end_ns=s, step=0, op="all_reduce", group=0, seq=seq))
    with open_bundle(run.bundle(tmp_path)) as b:
        (a,) = attribute(b)
    _adds_up(a)
    assert not a.call_durations
    assert all(t.waiting_ns == 0 and t.exposed_ns == 0 for t in a.ranks.values())
    assert all(s.cost_ns == 0 for s in a.stragglers)



def _exact_run():
    """Two ranks, a step from 0 to 6 ms. all_reduce 0: rank 0 enters at 1 ms, rank 1 at
    4 ms, it completes at 4.1 ms; all_reduce 1: both enter at 5 ms, it completes at 5.2 ms."""
    run = SimRun(2)
    kw = dict(step=0, op="all_reduce", group=0, in_shapes=((4,),), in_dtypes=("float32",), out_shapes=((4,),),
              out_dtypes=("float32",), reduce_op="sum")
    for r, entry in ((0, 1), (1, 4)):
        run.recs[r].append(Collective(start_ns=_at(entry), end_ns=_at(4.1), seq=0, **kw))
        run.recs[r].append(Collective(start_ns=_at(5), end_ns=_at(5.2), seq=1, **kw))
        run.recs[r].append(Step(start_ns=_at(0), end_ns=_at(6), step=0))
    return run


def test_retiming_worked_by_hand(tmp_path):
    with open_bundle(_exact_run().bundle(tmp_path)) as b:
        a = attribute_step(b, 0)
        # on time, rank 1 enters all_reduce 0 at 1 ms with rank 0: it completes at 1.1 ms,
        # both enter all_reduce 1 0.9 ms later, at 2 ms, and end the step at 3 ms
        assert retimed_span(b, 0, on_time=[1]) == 3 * MS
        # rank 0's time between calls doubled: it enters all_reduce 0 at 2 ms (still before
        # rank 1), all_reduce 1 at 4.1 + 1.8 ms, and ends the step at 6.1 + 1.6 ms
        assert retimed_span(b, 0, slow={0: 2.0}) == 7.7 * MS
    assert a.span_ns == a.modelled_ns == 6 * MS
    assert [(s.rank, s.cost_ns, s.late_ns, s.late_calls) for s in a.stragglers] == [(1, 3 * MS, 3 * MS, 1)]


def _crossed_sends_run():
    """Two ranks each send the other a buffered message, then receive the other's: rank 0
    sends at 1 ms (buffered, done at 1.1 ms) and posts its receive at 2 ms; rank 1 sends
    at 4 ms and receives rank 0's message at 5 ms. Each call waits on the other rank's
    next one: the model's graph has a cycle."""
    run = SimRun(2)
    p2p = dict(step=0, group=0, seq=0, shapes=((16,),), dtypes=("float32",), nbytes=64)
    run.recs[0].append(PointToPoint(start_ns=_at(1), end_ns=_at(1.1), op="send", peer=1, **p2p))
    run.recs[0].append(PointToPoint(start_ns=_at(2), end_ns=_at(4.1), op="recv", peer=1, **p2p))
    run.recs[1].append(PointToPoint(start_ns=_at(4), end_ns=_at(4.1), op="send", peer=0, **p2p))
    run.recs[1].append(PointToPoint(start_ns=_at(5), end_ns=_at(5.05), op="recv", peer=0, **p2p))
    for r in (0, 1):
        run.recs[r].append(Step(start_ns=_at(0), end_ns=_at(6), step=0))
    return run


def test_crossed_buffered_sends(tmp_path):
    with open_bundle(_crossed_sends_run().bundle(tmp_path)) as b:
        a = attribute_step(b, 0)
        # rank 1 on time into its send (2 ms after rank 0's receive was posted): rank 0's
        # send is let go first (it came first), rank 0 posts its receive at 2 ms, rank 1
        # sends then, both complete at 2.1 ms and each rank ends 1.9 ms later, at 4 ms
        assert retimed_span(b, 0, on_time=[1]) == 4 * MS
    _adds_up(a)
    assert a.span_ns == a.modelled_ns == 6 * MS
    assert a.ranks[0].waiting_ns == 2 * MS and a.ranks[1].late_calls == 1


@pytest.mark.parametrize("make", [_exact_run, _async_run, _crossed_sends_run])
def test_level_timing_matches_event_timing(tmp_path, make):
    """Twins: the level-at-a-time re-timing gives what the event-by-event model gives, time
    for time (or declines: a graph with a cycle), unchanged, each rank on time, and slowed."""
    from prism_rr.analysis import _attribution as A
    from prism_rr.analysis._build import clock_offsets

    with open_bundle(make().bundle(tmp_path)) as b:
        g = A._read_step(b, 0, b.recorded_ranks, clock_offsets(b, b.recorded_ranks))
    plan = A._plan(g)
    levels = A._levels(g, plan, g.held > 0)
    if make is _crossed_sends_run:
        assert levels is None and A._levels(g, plan, g.held < 0) is None
        return
    ref, got = A._Timing(g).times(), A._fast_times(g, plan, levels)
    assert (ref.entry.tolist(), ref.done.tolist(), ref.end, ref.end_cause) == (got.entry.tolist(), got.done.tolist(),
                                                                             got.end, got.end_cause)
    assert [ref.entry_cause(i) for i in range(len(g.start))] == [got.entry_cause(i) for i in range(len(g.start))]
    assert A._critical_path(g, ref) == A._critical_path(g, got)
    sets = [(r,) for r in g.ranks] + [tuple(g.ranks)]
    assert A._fast_spans(g, plan, sets, levels=levels) == [A._Timing(g, on_time=s).span() for s in sets]
    slow = {g.ranks[-1]: 1.7}
    assert A._fast_spans(g, plan, sets, slow) == [A._Timing(g, on_time=s, slow=slow).span() for s in sets]


# --- real recordings ----------------------------------------------------------------------


def _record(tmp: Path, world: int, argv: list) -> Path:
    out = tmp / "run.prism"
    cmd = [sys.executable, "-m", "prism_rr.localrun", "--nproc", str(world), "--", sys.executable, *map(str, argv)]
    assert record_command(cmd, out, payload="none", timeout=120) == 0
    pack(spool_dir_for(out), out)
    return out


@pytest.fixture(scope="module")
def slow_rank_run(tmp_path_factory):
    """faults.py slow: 2 ranks, each computing 100 ms a step; rank 1 then sleeps 100 ms."""
    tmp = tmp_path_factory.mktemp("slow")
    return tmp, _record(tmp, 2, [SCRIPTS / "faults.py", "slow"])


@pytest.mark.timeout(200)
def test_straggler_cost_agrees_with_a_replay_that_removes_it(slow_rank_run):
    tmp, bundle = slow_rank_run
    with open_bundle(bundle) as b:
        steps = [a for a in attribute(b) if a.step > 0]
        base = {a.step: a.modelled_ns for a in steps}
        what_if = {a.step: base[a.step] - retimed_span(b, a.step, slow={1: 0.5}) for a in steps}
    costs = [a.stragglers[0] for a in steps]
    assert all(c.rank == 1 for c in costs), [a.stragglers for a in steps]
    cost = statistics.median(c.cost_ns for c in costs)
    # Replayed with rank 1 computing half as long (its 200 ms become rank 0's 100 ms), rank 1
    # is on time: the real rank 0's steps shorten by about what the straggler cost.
    result = replay(bundle, ranks=(0,), slow_rank={1: 0.5}, timeout=120, log_dir=tmp / "logs",
                    run_recorded_command=True)
    assert result.exit_code == 0, result.card
    rep = result.report
    shorter = statistics.median((s["recorded_s"] - s["replayed_s"]) * 1e9 for s in rep["steps"]
                                if s["step"] in rep["scored_steps"])
    assert 0.4 < shorter / cost < 2.5, (shorter, cost)
    assert 0.4 < statistics.median(what_if.values()) / cost < 2.5, (what_if, cost)


@pytest.mark.timeout(200)
def test_demo_with_a_straggler_names_it_costliest(tmp_path):
    # The demo's GPT (DTensor tensor parallel, async all_reduces) on 2 ranks, rank 1
    # sleeping 150 ms before each forward pass.
    bundle = _record(tmp_path, 2, [SCRIPTS / "demo_straggler.py", 1, 0.15, "--steps", 4, "--tp", 2, "--quiet"])
    out = run_cli("analyze", bundle, "--json")
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout)
    assert got["stragglers"][0]["rank"] == 1, got["stragglers"]
    steps = got["steps"]
    assert sum(s["ranks"]["0"]["waiting_ns"] for s in steps) > sum(s["ranks"]["1"]["waiting_ns"] for s in steps)
    # a loaded machine may make rank 0 late too, once
    named = [s for s in steps if s["stragglers"] and s["stragglers"][0]["rank"] == 1
             and s["stragglers"][0]["cost_ns"] > 50 * MS]
    assert len(named) >= len(steps) - 1, steps
    text = run_cli("analyze", bundle, "--steps", "2:3")
    assert text.returncode == 0 and "stragglers: rank 1 cost" in text.stdout, text.stdout
    diag = run_cli("diagnose", bundle, "--json")
    assert diag.returncode in (0, 5), diag.stderr
    found = json.loads(diag.stdout)
    # diagnose re-times the steps (as analyze does) only when it found a straggler
    if any(f["kind"] == "straggler" for f in found["findings"]):
        assert found["straggler_cost"][0]["rank"] == 1
    else:
        assert found["straggler_cost"] == []


def _fr_entry(seq: int, created_ms: float, completed_ms: float) -> dict:
    """A completed all_reduce as ProcessGroupNCCL's Flight Recorder keeps it (times in ns)."""
    t0 = 1_700_000_000_000_000_000
    return {"record_id": seq, "pg_id": 0, "process_group": ("0", "default_pg"), "collective_seq_id": seq,
            "p2p_seq_id": 0, "op_id": seq + 1, "profiling_name": "nccl:all_reduce",
            "time_created_ns": t0 + round(created_ms * MS), "input_sizes": [[1024]], "input_dtypes": ["Float"],
            "output_sizes": [[1024]], "output_dtypes": ["Float"], "state": "completed", "retired": True,
            "is_p2p": False, "timeout_ms": 600000, "time_discovered_started_ns": t0 + round(created_ms * MS),
            "time_discovered_completed_ns": t0 + round(completed_ms * MS), "duration_ms": 0.05}


def test_imported_flight_recorder_dumps(tmp_path):
    import pickle

    from prism_rr.format.fr import import_fr

    data = Path(__file__).parent.parent / "data" / "fr"
    for scenario in ("normal", "skip", "groups"):
        for form in ("pickle", "json"):
            out = tmp_path / f"{scenario}-{form}.prism"
            import_fr([data / scenario / form], out)
            with open_bundle(out) as b:
                for a in attribute(b):
                    _adds_up(a)
    # NCCL's dumps hold completion times: rank 1 enters each of three all_reduces 5 ms
    # after rank 0, which waits for it every time.
    dumps = tmp_path / "nccl"
    dumps.mkdir()
    for r in (0, 1):
        entries = [_fr_entry(k + 1, 10 * k + 5 * r, 10 * k + 5.05) for k in range(3)]
        dump = {"version": "2.4", "pg_config": {"0": {"name": "0", "desc": "default_pg", "ranks": "[0, 1]"}},
                "pg_status": {}, "entries": entries}
        (dumps / f"nccl_trace_rank_{r}").write_bytes(pickle.dumps(dump, protocol=2))
    import_fr([dumps], tmp_path / "nccl.prism")
    out = run_cli("analyze", tmp_path / "nccl.prism", "--json")
    assert out.returncode == 0, out.stderr
    (step,) = json.loads(out.stdout)["steps"]
    assert step["call_durations"] and step["ranks"]["0"]["waiting_ns"] == 15 * MS
    # On time, rank 1 gains 5 ms at the second and third calls; not at the first, where
    # its records (and so what is known of its step) begin.
    (cost,) = step["stragglers"]
    assert cost["rank"] == 1 and 9.9 * MS < cost["cost_ns"] <= 10 * MS, step


@pytest.mark.timeout(400)
@pytest.mark.parametrize("args", [(), ("--pp", "2", "--world", "2")], ids=["fsdp-tp", "pipeline"])
def test_the_demos(demo_runs, args):
    # The session's demo runs (the README's), FSDP2 x DTensor TP on 4 ranks and the
    # pipeline on 2 (sends and receives): every step of every rank adds up, and the model
    # gives the recorded steps back.
    run = demo_runs.start(*args)
    assert run.result().returncode == 0, run.result().stderr[-2000:]
    out = run_cli("analyze", run.bundle, "--json")
    assert out.returncode == 0, out.stderr
    steps = json.loads(out.stdout)["steps"]
    assert [s["step"] for s in steps] == [1, 2, 3]
    for s in steps:
        assert s["modelled_ns"] == s["span_ns"] and s["critical_path"]["segments"] > 0
        for t in s["ranks"].values():
            assert t["compute_ns"] + t["overlapped_ns"] + t["exposed_ns"] + t["waiting_ns"] == t["total_ns"]
        assert [c["cost_ns"] for c in s["stragglers"]] == sorted((c["cost_ns"] for c in s["stragglers"]), reverse=True)
    # read as columns a batch at a time, as from each step's records (async calls, their
    # issue times, sends and receives)
    with open_bundle(run.bundle) as b:
        assert attribution_json(attribute(b)) == attribution_json(attribute_step(b, s) for s in b.steps)


def test_diagnose_gives_each_straggler_finding_its_cost(tmp_path):
    """`diagnose` re-times the steps only when it found a straggler, and then says what it
    cost; a run without one is not re-timed at all."""
    run = SimRun(4)
    run.train(12, slow={2: 3 * MS})
    found = run_cli("diagnose", run.bundle(tmp_path / "slow"), "--json")
    assert found.returncode == 5, found.stderr
    got = json.loads(found.stdout)
    (straggler,) = [f for f in got["findings"] if f["kind"] == "straggler"]
    assert straggler["ranks"] == [2] and 12 * 2.9 * MS < straggler["cost_ns"] <= 12 * 3 * MS, straggler
    assert got["straggler_cost"][0]["rank"] == 2
    text = run_cli("diagnose", run.bundle(tmp_path / "slow2"))
    assert "cost: the steps would have ended 3" in text.stdout, text.stdout
    even = SimRun(4)
    even.train(12)
    quiet = run_cli("diagnose", even.bundle(tmp_path / "even"), "--json")
    assert quiet.returncode == 0 and json.loads(quiet.stdout)["straggler_cost"] == [], quiet.stdout


def test_steps_read_in_batches_attribute_as_steps_read_one_by_one(tmp_path, monkeypatch):
    """`attribute` reads each rank's chunks once for a batch of steps (a chunk holds many):
    any batch size gives what reading step by step (attribute_step alone) gives."""
    import prism_rr.analysis._attribution as at

    run = SimRun(6)
    run.train(9, slow={4: 2_000_000})
    path = run.bundle(tmp_path, chunk_records=4096)  # one chunk a rank: every step in it
    with open_bundle(path) as b:
        alone = attribution_json(attribute_step(b, s) for s in b.steps)
        assert len(b.chunks(0)) == 1 and len(alone["steps"]) == 9
        per_step = b.event_count // len(b.steps)
        for size in (1, 2, 4, 100):  # steps a batch
            monkeypatch.setattr(at, "BATCH_RECORDS", per_step * size)
            assert attribution_json(attribute(b)) == alone, size


def test_a_second_process_reads_part_of_the_ranks_to_the_same_attribution(tmp_path):
    """From PARALLEL_FROM_RANKS ranks a second process reads the last part of each batch:
    its ranks' calls, windows and Step records give what reading them all here gives,
    odd records and a rank that never ends its last step included."""
    run = SimRun(6)
    run.train(3, slow={5: 2 * MS})
    run.compute(1000)
    run.collective(0, skip=(4,))  # ranks 0-3 and 5 hang in a call rank 4 never makes
    t = 5_000_000_000
    odd = dict(step=1, op="all_reduce", group=0, in_shapes=(), in_dtypes=())
    run.recs[5].append(Collective(start_ns=t, end_ns=t - 5, seq=99, **odd))  # ends before it starts
    run.recs[4].append(Collective(start_ns=t + 1, end_ns=t + 9, seq=98, async_op=True, issued_ns=t - 10**9, **odd))
    with open_bundle(run.bundle(tmp_path)) as b:
        here = list(attribute(b, processes=1))
        shared = list(attribute(b, processes=2))
    assert attribution_json(shared) == attribution_json(here)
    assert [a.critical_path for a in shared] == [a.critical_path for a in here]
    assert [a.step for a in here] == [0, 1, 2, 3] and any(a.stragglers for a in here)
