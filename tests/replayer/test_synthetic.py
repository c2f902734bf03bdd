"""Without payloads, virtual members are replicas of the real rank: plausible, flagged synthetic."""

import pytest
import torch

from prism_rr.replayer import replay

from replay_helpers import SCRIPTS, record, stderr_of


@pytest.mark.timeout(180)
def test_digest_recording_replays_with_synthetic_numerics(tmp_path):
    bundle = record(tmp_path, [SCRIPTS / "ops.py", tmp_path], 2, payload="digest")
    result = replay(bundle, ranks=(0,), timeout=120, log_dir=tmp_path / "logs",
                    env={"PYTHONWARNINGS": "ignore", "PRISM_TEST_TAG": "syn"})
    assert result.exit_code == 0, stderr_of(result, 0)
    assert result.report["synthetic_numerics"] is True and result.report["diverged"] is False
    got = torch.load(tmp_path / "syn-0.pt")
    mine = torch.randn(4, 3, generator=torch.Generator().manual_seed(0))  # rank 0's step-0 input
    assert torch.equal(got["all_reduce0"], mine + mine)  # SUM over two identical replicas
    assert got["all_gather1"].shape == (2, 3)
