"""The column reader checks a chunk's time columns once over all its tables: a column
it does not read as int64 on its own is still left to the format's reader."""

import dataclasses

import pytest

from prism_rr.analysis import attribute, attribution_json
from prism_rr.errors import FormatError
from prism_rr.format import Memory, layout, open_bundle, pack
from prism_rr.format.spool import encode_frame, spool_header, spool_path
from prism_rr.format.synthetic import synthetic_records

WORLD = 4


def _bundle(tmp_path, edit=lambda rank, recs: recs):
    spools = tmp_path / "run.prism.d"
    spools.mkdir()
    for rank in range(WORLD):
        recs = edit(rank, list(synthetic_records(rank, WORLD, 120)))
        info = {"world_size": WORLD, "rank": rank, "backend": "gloo", "argv": ["train.py"]}
        parts = [spool_header(rank), encode_frame(layout.FRAME_RANK_INFO, rank, 0, info=info)]
        parts += [encode_frame(layout.FRAME_EVENTS, rank, 1 + i // 64, records=recs[i : i + 64])
                  for i in range(0, len(recs), 64)]
        spool_path(spools, rank).write_bytes(b"".join(parts))
    pack(spools, tmp_path / "run.prism")
    return tmp_path / "run.prism"


def test_a_time_column_of_booleans_is_refused_by_the_format_reader(tmp_path):
    def edit(rank, recs):  # beside the chunk's integer columns, one of booleans only
        return [dataclasses.replace(r, start_ns=False) if rank == 1 and type(r) is Memory else r for r in recs]

    with open_bundle(_bundle(tmp_path, edit)) as b:
        with pytest.raises(FormatError, match="start times are not integers"):
            list(attribute(b))


def test_batches_of_any_size_read_the_same_windows(tmp_path, monkeypatch):
    """Chunks cut across steps, read a step at a time or all at once: the same attribution."""
    import prism_rr.analysis._attribution as at

    with open_bundle(_bundle(tmp_path)) as b:
        whole = attribution_json(attribute(b))
        monkeypatch.setattr(at, "BATCH_RECORDS", 1)
        assert attribution_json(attribute(b)) == whole and whole["steps"]
