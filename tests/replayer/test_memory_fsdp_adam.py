"""Peak memory of a plain FSDP2 trainer (fsdp_adam.py: four blocks, Adam) at dp 2 on gloo,
recorded with --memory and rank 0 replayed. gloo's reduce_scatter_tensor copies its input
into a flat buffer of its own on the program's thread (one layer's gradients, 37,440
bytes here), which the recording's tracker counts and which raised its running peak at
each backward reduce-scatter; a virtual call has no such buffer, and the replayed peak
was 2.6% under the recorded one from step 1 on (5.8% with a bf16 MixedPrecisionPolicy)
until the replay held each call's recorded footprint for a moment (session.footprint):
the rise of the running peak the records carry, which on CPU now starts again at each
step as CUDA's does (it ran from the recording's start, so a step after the one that set
the run's peak showed no footprint)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from prism_rr.replayer import replay

from replay_helpers import record, stderr_of

SCRIPT = Path(__file__).parent / "scripts" / "fsdp_adam.py"


@pytest.mark.timeout(300)
def test_plain_fsdp2_with_adam_replays_its_peak_memory(tmp_path):
    bundle = record(tmp_path, [SCRIPT], 2, payload="none", memory=True)
    result = replay(bundle, ranks=[0], timeout=120, log_dir=tmp_path / "logs", cmd=[sys.executable, str(SCRIPT)])
    assert result.exit_code == 0, stderr_of(result, 0)
    steps = result.report["steps"]
    for st in steps:  # every step's peak, to the byte
        assert st["peak_recorded_bytes"] == st["peak_replayed_bytes"], steps
    assert result.report["peak_memory_error_pct"] == 0.0
