"""The graph at scale: calls read as columns and matched by sorting, objects made on demand.

Synthetic runs of a few hundred ranks with problems planted in their records; the small
hand-built runs of test_diagnose.py cover what each finding says.
"""

import dataclasses

import pytest

from prism_rr.analysis import build_graph, diagnose
from prism_rr.errors import FormatError
from prism_rr.format import Collective, PointToPoint, layout, open_bundle, pack
from prism_rr.format.spool import encode_frame, spool_header, spool_path
from prism_rr.format.synthetic import synthetic_records
from windows import diagnosed

WORLD, EVENTS = 256, 207  # 4 whole steps of a dp x tp run, tp=2: dp groups of 128 ranks


def _bundle(tmp_path, edit=None, chunk=64):
    spools = tmp_path / "run.prism.d"
    spools.mkdir()
    for rank in range(WORLD):
        recs = list(synthetic_records(rank, WORLD, EVENTS))
        if edit is not None:
            recs = edit(rank, recs)
        info = {"world_size": WORLD, "rank": rank, "backend": "gloo", "argv": ["train.py"]}
        parts = [spool_header(rank), encode_frame(layout.FRAME_RANK_INFO, rank, 0, info=info)]
        parts += [encode_frame(layout.FRAME_EVENTS, rank, 1 + i // chunk, records=recs[i : i + chunk])
                  for i in range(0, len(recs), chunk)]
        spool_path(spools, rank).write_bytes(b"".join(parts))
    out = tmp_path / "run.prism"
    pack(spools, out)
    return out


def _dp_group(rank):
    return 1 + WORLD // 2 + rank % 2


def test_problems_planted_among_256_ranks_are_found(tmp_path):
    def edit(rank, recs):
        out = []
        for r in recs:
            if type(r) is Collective and r.group == _dp_group(rank):
                if rank == 37 and r.seq == 40:
                    continue  # never enters it, then carries on
                if rank == 100 and r.seq == 3:
                    r = dataclasses.replace(r, in_dtypes=("float16",))
            if type(r) is PointToPoint and rank == 201 and r.seq == 2:
                continue  # rank 200's send is never received
            out.append(r)
        return out

    with open_bundle(_bundle(tmp_path, edit)) as b:
        found = diagnosed(b)
    by_kind = {}
    for f in found:
        by_kind.setdefault(f.kind, []).append(f)
    (mismatch,) = by_kind["mismatch"]
    assert (mismatch.ranks, mismatch.group, mismatch.seq) == ((100,), _dp_group(100), 3)
    assert "rank 100 passed dtypes float16" in mismatch.message
    (unmatched,) = by_kind["unmatched_p2p"]
    assert unmatched.details["src"] == 200 and unmatched.details["dst"] == 201 and unmatched.seq == 2
    # rank 37 skipped a call, so its later calls of the group pair with the wrong ones
    assert [(f.ranks, f.group) for f in by_kind["drift"]] == [((37,), _dp_group(37))]
    drift = by_kind["drift"][0]
    assert drift.details["step"] == 2 and "rank 37 made 7 of the 8 reduce_scatter_tensor calls" in drift.message


def test_the_graph_reads_like_dicts_of_calls(tmp_path):
    with open_bundle(_bundle(tmp_path)) as b:
        g = build_graph(b)
        steps = build_graph(b, steps=(1, 2))
        last = g.traces[5].last_record  # looked up in the bundle when asked
    tp_calls = WORLD // 2 * 8 * 4  # per tp group: 8 all_reduces a step
    dp_calls = 2 * 16 * 4  # per dp group: 8 all_gathers and 8 reduce_scatters a step
    assert len(g.calls) == tp_calls + dp_calls == len(list(g.calls)) == len(g.calls.values())
    call = g.calls[(_dp_group(0), 5)]
    assert call.entered == tuple(range(0, WORLD, 2)) and call.missing == () and call.incomplete == ()
    assert [m.rank for m in call.members] == sorted(m.rank for m in call.members)
    assert g.call_of(999, 0) is None and (999, 0) not in g.calls and g.call_of(0, 0) is None
    assert len(g.p2p) == WORLD // 2 * 4 and all(pm.send and pm.recv for pm in g.p2p.values())
    assert set(steps.steps) == {1, 2} and {m.step for c in steps.calls.values() for m in c.members} == {1, 2}
    assert g.steps[2].iteration_ns.keys() == set(range(WORLD))
    assert type(last).__name__ == "Step" and last.step == 3 and g.traces[5].events == EVENTS


def test_a_chunk_of_the_wrong_types_is_refused_by_the_format_reader(tmp_path):
    def edit(rank, recs):
        return [dataclasses.replace(r, op=7) if rank == 203 and type(r) is Collective else r for r in recs]

    with open_bundle(_bundle(tmp_path, edit)) as b:
        with pytest.raises(FormatError, match="field op has a value of the wrong type"):
            diagnosed(b)
        with pytest.raises(FormatError, match="field op has a value of the wrong type"):
            build_graph(b, processes=2)  # the second process fails; its ranks are read again here


def test_a_second_process_reads_half_the_ranks_to_the_same_graph(tmp_path):
    def edit(rank, recs):  # rank 200 (read by the second process) never leaves its calls of seq 30
        if rank != 200:
            return recs
        return [dataclasses.replace(r, end_ns=None) if type(r) is Collective and r.seq == 30 else r
                for r in recs if not (type(r) is Collective and r.seq > 30)]

    with open_bundle(_bundle(tmp_path, edit)) as b:
        one, two = build_graph(b, processes=1), build_graph(b, processes=2)
        assert diagnose(b, graph=one) == diagnose(b, graph=two) != []
    assert list(one.calls.items()) == list(two.calls.items())
    assert list(one.p2p.items()) == list(two.p2p.items())
    assert one.steps == two.steps
    assert {r: t.open_calls for r, t in one.traces.items()} == {r: t.open_calls for r, t in two.traces.items()}
