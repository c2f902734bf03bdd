"""Step window, rank selection, payload modes, per-op records and the CPU memory tracker."""

import pytest

from prism_rr.format.blobs import spool_blobs
from prism_rr.format.records import Collective, Compute, Marker, Step

from recorder_helpers import SCRIPTS, run_recorded


@pytest.mark.timeout(120)
def test_window_ranks_full_payload_ops_memory(tmp_path):
    spools, _ = run_recorded(tmp_path, [SCRIPTS / "steps.py"], 2, timeout=90, steps="1:3", ranks="1",
                             payload="full", ops=True, memory=True)
    assert sorted(spools.records) == [1]  # rank 0 was not selected
    colls = spools.collectives(1)
    # Only steps 1 and 2; seq numbers count the calls made outside the window too.
    assert [(c.step, c.seq, c.op) for c in colls] == [(1, 1, "all_reduce"), (2, 2, "all_reduce")]
    assert [s.step for s in spools.of_kind(1, Step)] == [1, 2]
    stored = {ident for ident, _, _ in spool_blobs(spools.dir)}
    for c in colls:
        assert c.digest_in is None and len(c.blob_in) == 1 and len(c.blob_out) == 1
        for ident in c.blob_in + c.blob_out:
            assert ident in stored
        assert c.mem_alloc is not None and c.mem_alloc > 0
    ops = [r for r in spools.of_kind(1, Compute) if r.name is not None]
    assert {"addmm", "relu"} <= {o.name.split(".")[0] for o in ops}
    assert all(o.step in (1, 2) for o in ops)
    peaks = [s.mem_peak for s in spools.of_kind(1, Step)]
    assert all(p and p > 0 for p in peaks)
    names = [m.name for m in spools.of_kind(1, Marker)]
    assert names[0] == "window_start" and "window_end" in names
    assert spools.info[1]["payload"] == "full" and spools.info[1]["steps"] == (1, 3)


@pytest.mark.timeout(120)
def test_payload_none_records_no_digests(tmp_path):
    spools, _ = run_recorded(tmp_path, [SCRIPTS / "steps.py"], 2, timeout=90, payload="none")
    for r in (0, 1):
        colls = [c for c in spools.collectives(r) if c.op == "all_reduce"]
        assert len(colls) == 4 and all(c.digest_in is None and c.blob_in is None for c in colls)
        assert [c.step for c in colls] == [0, 1, 2, 3]
