"""Each collective and point-to-point call, recorded from real gloo ranks."""

import json
from collections import Counter

import pytest

from prism_rr.format import ops
from prism_rr.format.blobs import KEEP_SMALL, spool_blobs
from prism_rr.format.records import Collective, GroupInfo, PointToPoint

from prism_rr.format.calllog import accelerated

from recorder_helpers import SCRIPTS, Spools, assert_unbroken_seqs, run_recorded

OPS = [
    "all_reduce", "all_reduce_coalesced", "all_gather", "all_gather_coalesced", "all_gather_into_tensor", "reduce_scatter",
    "reduce_scatter_tensor", "coalesced_into_tensor", "all_to_all", "all_to_all_single", "broadcast",
    "reduce", "gather", "scatter", "barrier", "monitored_barrier", "p2p", "functional", "subgroup",
]


# World 2 and 3, and world 2 again on the call log's pure-Python path (what runs where the
# C speedups were not built: it must record the same).
@pytest.fixture(scope="module", params=[2, 3, "2-python"])
def recording(request, tmp_path_factory):
    world = int(str(request.param)[0])
    pure = str(request.param).endswith("python")
    tmp = tmp_path_factory.mktemp(f"coll{request.param}")
    # torch's functional collectives take seconds to warm up on first use: run them once.
    ops = OPS if world == 2 else [op for op in OPS if op != "functional"]
    spools, _ = run_recorded(tmp, [SCRIPTS / "collectives.py", tmp, ",".join(ops)], world, timeout=90,
                             env_extra={"PRISM_RR_PURE_PYTHON": "1"} if pure else None)
    expected = {r: json.loads((tmp / f"expected-{r}.json").read_text()) for r in range(world)}
    if pure or not accelerated():
        assert all(spools.info[r]["call_log"]["speedups"] is False for r in range(world))
    return world, spools, expected, ops


def _observed(spools: Spools, rank: int) -> list:
    calls = sorted(spools.calls(rank), key=lambda c: c.start_ns)
    return calls[:-1]  # the script's closing barrier is not in its list


def _matches(rec, want) -> None:
    assert rec.op == want["op"], (rec, want)
    assert rec.group == want["group"], (rec, want)
    if isinstance(rec, PointToPoint):
        assert [list(s) for s in rec.shapes] == want["in_shapes"]
        assert rec.nbytes == want["in_bytes"]
        assert rec.peer == want["peer"]
        assert rec.async_op == want["op"].startswith("i")
        return
    assert [list(s) for s in rec.in_shapes] == want["in_shapes"], (rec, want)
    assert [list(s) for s in rec.out_shapes] == want["out_shapes"], (rec, want)
    assert rec.in_bytes == want["in_bytes"] and rec.out_bytes == want["out_bytes"]
    assert rec.reduce_op == want.get("reduce_op")
    assert rec.root == want.get("root")
    assert rec.async_op == want.get("async_op", False)
    assert all(d == "float32" for d in rec.in_dtypes + rec.out_dtypes)


@pytest.mark.timeout(240)
@pytest.mark.parametrize("op", OPS)
def test_each_op_recorded_as_called(recording, op):
    world, spools, expected, ran = recording
    if op not in ran:
        pytest.skip(f"{op} runs in the 2-rank world only")
    for rank in range(world):
        observed = _observed(spools, rank)
        assert len(observed) == len(expected[rank]), [c.op for c in observed]
        pairs = list(zip(observed, expected[rank]))
        section = _section(op, expected[rank])
        for i in section:
            _matches(*pairs[i])
        assert section or (op == "subgroup" and rank >= 2), (op, rank)


def _section(op, wanted) -> list[int]:
    """Indexes in the expected list that the script's `op` block produced."""
    names = {
        "coalesced_into_tensor": {"all_gather_into_tensor_coalesced", "reduce_scatter_tensor_coalesced"},
        "p2p": {"send", "recv", "isend", "irecv"},
    }.get(op, {op})
    if op == "functional":
        return [i for i, w in enumerate(wanted) if w.get("functional")]
    if op == "subgroup":
        return [i for i, w in enumerate(wanted) if w["group"] == 1]
    return [i for i, w in enumerate(wanted) if w["op"] in names and not w.get("functional") and w["group"] == 0]


# Table names no entry point of the script reaches: torch's all_gather_coalesced is deprecated
# and the script does not call it.
NOT_RECORDED: set[str] = set()


@pytest.mark.timeout(240)
def test_recorded_ops_are_the_tables(recording):
    """Every op name the recorder writes is in format/ops.py, and the script's calls write
    every name the table has (but NOT_RECORDED)."""
    world, spools, _, _ = recording
    recorded = {c.op for r in range(world) for c in spools.calls(r)}
    assert recorded <= set(ops.OPS), recorded - set(ops.OPS)
    assert set(ops.OPS) - recorded == NOT_RECORDED
    for r in range(world):
        assert all(ops.is_p2p(c.op) == isinstance(c, PointToPoint) for c in spools.calls(r))


@pytest.mark.timeout(240)
def test_groups_and_sequence_numbers(recording):
    world, spools, _, _ = recording
    assert sorted(spools.records) == list(range(world))
    assert_unbroken_seqs(spools)
    for rank in range(world):
        groups = spools.groups(rank)
        assert groups[0].ranks == tuple(range(world)) and groups[0].backend == "gloo"
        if rank in (0, 1):
            assert groups[1].ranks == (0, 1)
        else:
            assert 1 not in groups
        info = spools.info[rank]
        assert info["rank"] == rank and info["world_size"] == world and info["backend"] == "gloo"
        assert "clock_offset" in info and abs(info["clock_offset"]["offset_ns"]) < 50_000_000
        assert all("SECRET" not in k and "TOKEN" not in k for k in info["env"])
    # Every rank made the same collectives on the world group, in the same order.
    ops = [[(c.op, c.seq) for c in sorted(spools.collectives(r, 0), key=lambda c: c.seq)] for r in range(world)]
    assert all(o == ops[0] for o in ops)


@pytest.mark.timeout(240)
def test_digests_agree_across_ranks(recording):
    world, spools, _, _ = recording
    by_seq = [{c.seq: c for c in spools.collectives(r, 0)} for r in range(world)]
    for seq, c0 in by_seq[0].items():
        if c0.op in ("all_reduce", "all_gather", "all_gather_into_tensor", "broadcast", "all_reduce_coalesced"):
            outs = {by_seq[r][seq].digest_out for r in range(world)}
            assert len(outs) == 1, (c0.op, seq)
        assert c0.digest_in is not None and len(c0.digest_in) == len(c0.in_shapes)
    # What a rank sent is what its peer received.
    sent = {(r, c.peer, c.seq): c.digest for r in range(world) for c in spools.of_kind(r, PointToPoint)
            if c.op.endswith("send")}
    got = {(c.peer, r, c.seq): c.digest for r in range(world) for c in spools.of_kind(r, PointToPoint)
           if c.op.endswith("recv")}
    assert sent and sent == got


@pytest.mark.timeout(240)
def test_digest_keeps_small_calls_whole(recording):
    """`digest` keeps the payload of calls of at most KEEP_SMALL bytes (control data a
    replay must not make up) and only digests of larger ones."""
    world, spools, _, _ = recording
    kept = 0
    stored = {ident for ident, _, _ in spool_blobs(spools.dir)}
    for r in range(world):
        for c in spools.calls(r):
            if isinstance(c, PointToPoint):
                sides = [(c.shapes, c.nbytes, c.blob)]
            else:
                sides = [(c.in_shapes, c.in_bytes, c.blob_in), (c.out_shapes, c.out_bytes, c.blob_out)]
            for shapes, nbytes, blobs in sides:
                small = len(shapes) > 0 and nbytes <= KEEP_SMALL
                assert (blobs is not None) == small, (r, c.op, c.seq, nbytes, blobs)
                if small:
                    kept += 1
                    assert len(blobs) == len(shapes)
                    assert all(b in stored for b in blobs)
    assert kept > 0


@pytest.mark.timeout(240)
def test_timing_fields(recording):
    world, spools, _, _ = recording
    for rank in range(world):
        for c in spools.calls(rank):
            assert c.end_ns is not None and c.start_ns <= c.issued_ns and c.start_ns <= c.end_ns
            assert c.step == 0
        stacks = [c.stack for c in spools.calls(rank) if c.stack]
        assert stacks and all(s[0].startswith("collectives.py:") for s in stacks)
        kinds = Counter(type(r).__name__ for r in spools.records[rank])
        assert kinds["Compute"] > 0 and kinds["GroupInfo"] >= 1
