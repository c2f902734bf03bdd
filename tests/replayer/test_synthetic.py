"""Without payloads, virtual members are replicas of the real rank: plausible, flagged
synthetic. A `digest` recording keeps small calls whole, so they replay as recorded."""

import pytest
import torch

from prism_rr.replayer import replay

from replay_helpers import SCRIPTS, record, stderr_of

ENV = {"PYTHONWARNINGS": "ignore"}


@pytest.mark.timeout(180)
def test_payload_none_replays_with_synthetic_numerics(tmp_path):
    bundle = record(tmp_path, [SCRIPTS / "ops.py", tmp_path], 2, payload="none")
    result = replay(bundle, ranks=(0,), timeout=120, log_dir=tmp_path / "logs",
                    env={**ENV, "PRISM_TEST_TAG": "syn"}, run_recorded_command=True)
    assert result.exit_code == 0, stderr_of(result, 0)
    assert result.report["synthetic_numerics"] is True and result.report["diverged"] is False
    got = torch.load(tmp_path / "syn-0.pt")
    mine = torch.randn(4, 3, generator=torch.Generator().manual_seed(0))  # rank 0's step-0 input
    assert torch.equal(got["all_reduce0"], mine + mine)  # SUM over two identical replicas
    assert got["all_gather1"].shape == (2, 3)
    # A receive from a virtual peer whose data was not recorded: seeded unit normals,
    # not the uninitialised buffer.
    p2p = got["p2p0"]
    assert torch.isfinite(p2p).all() and 0.1 < p2p.std() < 10


@pytest.mark.timeout(180)
def test_digest_keeps_small_calls_so_they_replay_as_recorded(tmp_path):
    """Every call of ops.py is under 1 KiB: a digest recording holds them whole, and the
    replayed rank receives exactly what it received."""
    bundle = record(tmp_path, [SCRIPTS / "ops.py", tmp_path], 2, payload="digest")
    result = replay(bundle, ranks=(0,), timeout=120, log_dir=tmp_path / "logs",
                    env={**ENV, "PRISM_TEST_TAG": "dig"}, run_recorded_command=True)
    assert result.exit_code == 0, stderr_of(result, 0)
    assert result.report["synthetic_numerics"] is False and result.report["diverged"] is False
    rec, got = torch.load(tmp_path / "rec-0.pt"), torch.load(tmp_path / "dig-0.pt")
    assert rec.keys() == got.keys()
    assert [k for k in rec if not torch.equal(rec[k], got[k])] == []
