"""The overview of a bundle with device time (format 1.3) says so, and which clock its
step times are on."""

from __future__ import annotations

import dataclasses

from prism_rr.format import DeviceTime, Step, pack
from tui_helpers import make_app, screen_text, settle, sync
from conftest import _write_spools

SIZE = (120, 40)


def _with_device_time(rank, records):
    out = list(records)
    for s in [r for r in records if type(r) is Step and r.end_ns is not None]:
        out.append(DeviceTime(start_ns=s.start_ns, end_ns=s.end_ns, step=s.step, name="step",
                              dev_start_ns=s.start_ns - 1_000, dev_end_ns=s.end_ns - 2_000))
    return out


@sync
async def test_overview_names_the_device_clock(tmp_path):
    out = tmp_path / "device.prism"
    pack(_write_spools(tmp_path / "device.d", 4, 120, _with_device_time,
                       info_extra={"device_time": {"clock": "cuda-events", "epoch_host_ns": 0, "device": "cuda:0"}}),
         out, manifest_extra={"created_unix_ns": 0})
    app = make_app(out)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        text = screen_text(app)
        assert "device time" in text and "recorded (CUDA events) on ranks 0-3" in text, text
        assert "Iteration time per step (across ranks, device clock)" in text, text
