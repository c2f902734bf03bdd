"""The overview of a bundle with device time (format 1.3) says so, and which clock its
step times are on."""

from __future__ import annotations

from prism_rr.format import DeviceTime, SpoolWriter, Step, pack, spool_path
from prism_rr.format.synthetic import synthetic_records
from tui_helpers import make_app, screen_text, settle, sync

SIZE = (120, 40)


def _with_device_time(rank, records):
    out = list(records)
    for s in [r for r in records if type(r) is Step and r.end_ns is not None]:
        out.append(DeviceTime(start_ns=s.start_ns, end_ns=s.end_ns, step=s.step, name="step",
                              dev_start_ns=s.start_ns - 1_000, dev_end_ns=s.end_ns - 2_000))
    return out


@sync
async def test_overview_names_the_device_clock(tmp_path):
    out, spools = tmp_path / "device.prism", tmp_path / "device.d"
    for rank in range(4):
        w = SpoolWriter(spool_path(spools, rank), rank, chunk_records=64, info={
            "world_size": 4, "rank": rank, "backend": "nccl", "argv": ["train.py"],
            "device_time": {"clock": "cuda-events", "epoch_host_ns": 0, "device": "cuda:0"}})
        for rec in _with_device_time(rank, list(synthetic_records(rank, 4, 120))):
            w.append(rec)
        w.close()
    pack(spools, out, manifest_extra={"created_unix_ns": 0})
    app = make_app(out)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        text = screen_text(app)
        assert "device time" in text and "recorded (CUDA events) on ranks 0-3" in text, text
        assert "Iteration time per step (across ranks, device clock)" in text, text
