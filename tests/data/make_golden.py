"""How tests/data/golden-v1.prism was made (kept for the record; never regenerate it).

The golden bundle is read by the tests forever, so a change that breaks reading format
1.x bundles fails CI. Run: python tests/data/make_golden.py OUT.prism
"""
import sys
import tempfile

from prism_rr.format import pack
from prism_rr.format.synthetic import write_synthetic

with tempfile.TemporaryDirectory() as d:
    write_synthetic(d, 4, 60, payload=True, chunk_records=32, seed=7)
    pack(d, sys.argv[1], manifest_extra={"created_unix_ns": 0})
