"""Bundles of every released format version stay readable forever."""

from pathlib import Path

from prism_rr.format import Collective, Step, open_bundle, verify

GOLDEN = Path(__file__).parent.parent / "data" / "golden-v1.prism"


def test_golden_v1_reads_and_verifies():
    with open_bundle(GOLDEN) as b:
        assert b.format_version == "1.0"
        assert (b.world_size, b.recorded_ranks, b.steps) == (4, [0, 1, 2, 3], [0, 1])
        assert b.event_count == 420
        assert [g["desc"] for g in b.groups] == ["default_pg", "mesh_tp", "mesh_tp", "mesh_dp", "mesh_dp"]
        report = verify(b)
        assert (report.chunks, report.events, report.blobs) == (16, 420, 8)
        first = next(r for r in b.events(2) if isinstance(r, Collective))
        assert (first.op, first.group, first.seq, first.in_dtypes) == ("all_gather_into_tensor", 3, 0, ("bfloat16",))
        assert first.stack == ("train.py:88 in train_step", "model.py:41 in forward")
        steps = [r for r in b.events(0) if isinstance(r, Step)]
        assert [s.step for s in steps] == [0, 1]
        blob_ids = [i for r in b.events(1) if isinstance(r, Collective) and r.blob_out for i in r.blob_out]
        assert blob_ids and len(b.blob(blob_ids[0])) == 256
