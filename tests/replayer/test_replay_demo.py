"""The demo with DDP at world 2, replayed with rank 0 real: parameters bitwise as recorded."""

import sys

import pytest
import torch

from prism_rr.replayer import replay

from replay_helpers import record, stderr_of


@pytest.mark.timeout(240)
def test_ddp_replay_is_bitwise(tmp_path):
    argv = ["-m", "prism_rr.demo.train", "--steps", "3", "--dp-mode", "ddp", "--quiet"]
    bundle = record(tmp_path, [*argv, "--save-params", tmp_path / "rec"], 2, payload="full")
    cmd = [sys.executable, *argv, "--save-params", str(tmp_path / "rep")]
    result = replay(bundle, ranks=(0,), cmd=cmd, timeout=120, log_dir=tmp_path / "logs")
    assert result.exit_code == 0, stderr_of(result, 0)
    rec = torch.load(tmp_path / "rec.rank0.pt")
    got = torch.load(tmp_path / "rep.rank0.pt")
    assert rec.keys() == got.keys()
    assert [k for k in rec if not torch.equal(rec[k], got[k])] == []
    assert not (tmp_path / "rep.rank1.pt").exists()  # rank 1 was virtual
    assert result.report["diverged"] is False
    assert len(result.report["steps"]) == 3
