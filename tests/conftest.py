import os
import sys
from pathlib import Path

import pytest

DATA = Path(__file__).parent / "data"


def pytest_collection_modifyitems(config, items):
    """Tests marked `gpu` are skipped where torch sees no CUDA device (`make gpu-check` runs them)."""
    gpu = [item for item in items if item.get_closest_marker("gpu")]
    if not gpu:
        return
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU: torch.cuda.is_available() is false")
    for item in gpu:
        item.add_marker(skip)


@pytest.fixture
def small_bundle(tmp_path):
    """A 4-rank synthetic bundle with payload blobs, packed from real spools."""
    from prism_rr.format import pack
    from prism_rr.format.synthetic import write_synthetic

    spools = write_synthetic(tmp_path / "run.prism.d", 4, 120, payload=True, chunk_records=64)
    out = tmp_path / "run.prism"
    pack(spools, out)
    return out
