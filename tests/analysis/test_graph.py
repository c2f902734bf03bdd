"""The execution graph: matching by (group, seq), clocks, per-step figures, critical path."""

from graph_sim import SimRun
from prism_rr.format import open_bundle
from prism_rr.analysis import analyze_step, build_graph


def test_collectives_match_across_ranks_with_clock_offsets(tmp_path):
    offsets = {0: 0, 1: 3_000_000_000, 2: -2_000_000, 3: 12345}
    run = SimRun(4, offsets=offsets)
    run.train(3)
    with open_bundle(run.bundle(tmp_path)) as b:
        g = build_graph(b)
    assert len(g.calls) == 6  # two all_reduces per step
    call = g.call_of(0, 0)
    assert call.entered == (0, 1, 2, 3) and call.missing == () and call.incomplete == ()
    # on rank 0's clock every member completes within a microsecond of the others
    ends = [m.end_ns for m in call.members]
    assert max(ends) - min(ends) < 1_000
    assert 29_000 <= call.transfer_ns <= 31_000
    assert call.last_arrival.rank == max(range(4), key=lambda r: (r * 7919) % 3000)
    assert call.skew_ns == max((r * 7919) % 3000 for r in range(4)) - min((r * 7919) % 3000 for r in range(4))
    assert all(call.wait_ns(m) == call.last_arrival.enter_ns - m.enter_ns for m in call.members)
    sends = [pm for pm in g.p2p.values()]
    assert len(sends) == 3 and all(pm.send and pm.recv and (pm.src, pm.dst) == (0, 1) for pm in sends)


def test_step_figures_and_critical_path_through_the_slow_rank(tmp_path):
    run = SimRun(4)
    run.train(4, slow={2: 3_000_000})
    with open_bundle(run.bundle(tmp_path)) as b:
        g = build_graph(b)
        st = g.steps[1]
        assert set(st.iteration_ns) == {0, 1, 2, 3}
        assert st.wait_ns[2] < 100_000 < 2_900_000 < st.wait_ns[0]
        a = analyze_step(b, 1)
    assert a.iteration_ns == st.iteration_ns
    assert abs(a.wait_ns[0] - st.wait_ns[0]) < 1_000
    path = a.critical_path
    assert path.segments and path.ranks[0] == 2  # the step's length is set by rank 2's compute
    kinds = path.by_kind()
    assert kinds["compute"] > 5_000_000 > kinds.get("comm", 0) > 0
    starts = [s.start_ns for s in path.segments]
    assert starts == sorted(starts)
    assert all(a.end_ns <= b.start_ns for a, b in zip(path.segments, path.segments[1:]))


def test_steps_window_reads_only_those_steps(tmp_path):
    run = SimRun(2)
    run.train(6)
    with open_bundle(run.bundle(tmp_path, chunk_records=8)) as b:
        g = build_graph(b, steps=(2, 3))
    assert set(g.steps) == {2, 3}
    assert sorted(k[1] for k in g.calls) == [4, 5, 6, 7]
