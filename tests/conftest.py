import os
import sys
from pathlib import Path

import pytest

DATA = Path(__file__).parent / "data"


@pytest.fixture
def small_bundle(tmp_path):
    """A 4-rank synthetic bundle with payload blobs, packed from real spools."""
    from prism_rr.format import pack
    from prism_rr.format.synthetic import write_synthetic

    spools = write_synthetic(tmp_path / "run.prism.d", 4, 120, payload=True, chunk_records=64)
    out = tmp_path / "run.prism"
    pack(spools, out)
    return out
