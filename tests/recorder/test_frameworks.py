"""DDP, FSDP2 x DTensor TP and pipelining (the demo workload) recorded through the hook."""

import sys
from collections import Counter

import pytest
import torch

from prism_rr.localrun import free_port
from prism_rr.format.records import Collective, PointToPoint, Step
from prism_rr.recorder.launch import record_command

from recorder_helpers import Spools, assert_unbroken_seqs

DEMO = ["-m", "prism_rr.demo.train", "--quiet"]
# The demo trainer's layouts are run once a session plainly and once recorded (full
# payloads, memory tracker) by conftest.demo_training, with these arguments:
# tests/demo/test_demo_training.py checks both train alike (the demo is reproducible);
# here the recorded run is held against the plain one and its records are read.
TRAIN = ["--steps", "3", "--seed", "7"]


def _params_equal(a_prefix, b_prefix, world):
    for r in range(world):
        a = torch.load(f"{a_prefix}.rank{r}.pt")
        b = torch.load(f"{b_prefix}.rank{r}.pt")
        assert a.keys() == b.keys()
        for k in a:
            assert torch.equal(a[k], b[k]), (r, k)


def _recorded_and_plain(demo_training, world, args):
    """The session's recorded run of the demo trainer with `args` (its spools) and the
    prefixes of its and the plain run's saved parameters."""
    rec, plain = demo_training(world, [*TRAIN, *args], 1), demo_training(world, [*TRAIN, *args], 0)
    assert rec.recorded and not plain.recorded
    for run in (rec, plain):
        assert run.codes == [0] * world, "".join((run.logs / f"rank{r}.stderr").read_text()[-3000:]
                                                 for r in range(world))
    return Spools(rec.spool_dir), rec.params, plain.params


def _groups_agree(spools):
    """A group id means the same ranks on every rank that has it."""
    seen = {}
    for r in spools.records:
        for gid, g in spools.groups(r).items():
            assert seen.setdefault(gid, g.ranks) == g.ranks
            assert r in g.ranks


@pytest.mark.timeout(150)
def test_ddp_bitwise_identical_and_recorded(demo_training):
    spools, rec, plain = _recorded_and_plain(demo_training, 2, ["--dp-mode", "ddp"])
    _params_equal(rec, plain, 2)
    assert_unbroken_seqs(spools)
    _groups_agree(spools)
    for r in range(2):
        steps = spools.of_kind(r, Step)
        assert [s.step for s in steps] == [0, 1, 2]
        grads = [c for c in spools.collectives(r) if c.op == "all_reduce"]
        assert len(grads) == 3 and all(c.in_bytes > 100_000 for c in grads)
        assert {c.step for c in grads} == {0, 1, 2}
        # Each step's gradient all_reduce finished before that step's boundary.
        for c, s in zip(grads, steps):
            assert s.start_ns <= c.start_ns and c.end_ns <= s.end_ns
    # The last gradient all_reduce's results are the same on both ranks (blob ids are
    # content hashes; the closing barrier, the last call, has none).
    last = [[c for c in spools.collectives(r) if c.op == "all_reduce"][-1].blob_out for r in (0, 1)]
    assert last[0] and last[0] == last[1], last


@pytest.mark.timeout(150)
def test_fsdp2_tensor_parallel_bitwise_identical_and_recorded(demo_training):
    spools, rec, plain = _recorded_and_plain(demo_training, 4, ["--tp", "2"])
    _params_equal(rec, plain, 4)
    assert_unbroken_seqs(spools)
    _groups_agree(spools)
    for r in range(4):
        mesh = spools.info[r]["device_mesh"]
        assert mesh["shape"] == (2, 2) and mesh["dim_names"] == ("dp", "tp") and mesh["ranks"] == (0, 1, 2, 3)
        groups = spools.groups(r)
        by_group = Counter((c.group, c.op) for c in spools.collectives(r))
        dp = next(g for g, info in groups.items() if info.text == "mesh_dp")
        tp = next(g for g, info in groups.items() if info.text == "mesh_tp")
        assert groups[dp].ranks == (r % 2, r % 2 + 2) and groups[tp].ranks == (r // 2 * 2, r // 2 * 2 + 1)
        assert by_group[(dp, "all_gather_into_tensor")] > 0 and by_group[(dp, "reduce_scatter_tensor")] > 0
        assert by_group[(tp, "all_reduce")] > 0  # the TP activations and gradients
    # The TP all_reduces of one tp group have the same results on both members.
    a = [c.blob_out for c in spools.collectives(0) if c.op == "all_reduce"]
    b = [c.blob_out for c in spools.collectives(1) if c.op == "all_reduce"]
    assert a and all(a) and a == b  # blob ids are content hashes


@pytest.mark.timeout(150)
def test_pipelining_through_torchrun_and_pack(tmp_path):
    """The whole user path: record_command(torchrun ...), then pack and read the bundle."""
    out = tmp_path / "pp.prism"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port", str(free_port()),
           *DEMO, "--pp", "2", "--steps", "2"]
    code = record_command(cmd, out, steps="1:2", timeout=120)
    assert code == 0
    spools = Spools(out.with_name(out.name + ".d"))
    assert sorted(spools.records) == [0, 1]
    assert_unbroken_seqs_within_window(spools)
    for r in range(2):
        p2p = spools.of_kind(r, PointToPoint)
        assert p2p and {c.step for c in p2p} == {1}  # only the window's step
        assert {c.peer for c in p2p} == {1 - r}
        assert {s.step for s in spools.of_kind(r, Step)} == {1}
    sent = {(r, c.peer, c.seq): (c.shapes, c.digest) for r in range(2) for c in spools.of_kind(r, PointToPoint)
            if c.op.endswith("send")}
    got = {(c.peer, r, c.seq): (c.shapes, c.digest) for r in range(2) for c in spools.of_kind(r, PointToPoint)
           if c.op.endswith("recv")}
    assert sent and sent == got

    import prism_rr.format as fmt

    fmt.pack(out.with_name(out.name + ".d"), out)
    bundle = fmt.open_bundle(out)
    try:
        assert bundle.world_size == 2 and bundle.recorded_ranks == [0, 1]
        events = list(bundle.events(0))
        assert any(isinstance(e, PointToPoint) for e in events)
    finally:
        bundle.close()


def assert_unbroken_seqs_within_window(spools):
    """Inside a step window seq numbers keep counting from the run's start: no resets."""
    for r in spools.records:
        for c in spools.collectives(r):
            assert c.seq >= 0
        seqs = sorted((c.group, c.op.lstrip("i"), c.peer, c.seq) for c in spools.of_kind(r, PointToPoint))
        assert len(seqs) == len(set(seqs))
