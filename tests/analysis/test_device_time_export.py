"""The chrome export of a bundle with device time (format 1.3): each rank's steps and
calls as the device passed them, on device threads placed by the rank's device epoch, and
the trace says which clock they are on."""

import json

from graph_sim import SimRun
from prism_rr.analysis import export_chrome
from prism_rr.format import Collective, DeviceTime, Step, open_bundle

EPOCH = 1_000_000_000  # SimRun's ranks start here, on one clock
LAG = 50_000  # the device passes each mark 50 us after the host made it


def _device_times(records) -> list:
    out = []
    for r in records:
        if type(r) is Step:
            out.append(DeviceTime(start_ns=r.start_ns, end_ns=r.end_ns, step=r.step, name="step",
                                  dev_start_ns=r.start_ns - EPOCH + LAG, dev_end_ns=r.end_ns - EPOCH + LAG))
        elif type(r) is Collective and r.end_ns is not None:
            out.append(DeviceTime(start_ns=r.start_ns, end_ns=r.end_ns, step=r.step, name="call", op=r.op,
                                  group=r.group, seq=r.seq, dev_start_ns=r.start_ns - EPOCH + LAG,
                                  dev_wait_ns=r.start_ns - EPOCH + LAG + 1_000, dev_end_ns=r.end_ns - EPOCH + LAG,
                                  dev_duration_ns=7_000))
    return out


def test_chrome_trace_shows_device_threads_on_their_clock(tmp_path):
    run = SimRun(2)
    run.train(3)
    for r in range(2):
        run.recs[r] += _device_times(run.recs[r])
    bundle = run.bundle(tmp_path, info_extra={"device_time": {"clock": "cuda-events", "epoch_host_ns": EPOCH,
                                                              "device": "cuda:0"}})
    out = tmp_path / "trace.json"
    with open_bundle(bundle) as b:
        export_chrome(b, out)
    doc = json.loads(out.read_text())
    assert doc["otherData"]["device_clock"].startswith("cuda-events")
    events = doc["traceEvents"]
    threads = {(e["pid"], e["tid"]): e["args"]["name"] for e in events if e["name"] == "thread_name"}
    assert {threads[(r, 4)] for r in range(2)} == {"device: steps"}
    assert all(threads[(r, 1000)] == "device: calls" for r in range(2))
    for rank in range(2):
        host = {e["name"]: e for e in events if e["pid"] == rank and e.get("cat") == "step" and e["tid"] == 1}
        device = {e["name"]: e for e in events if e["pid"] == rank and e.get("cat") == "step" and e["tid"] == 4}
        assert sorted(device) == sorted(host) == ["step 0", "step 1", "step 2"]
        for name, e in device.items():
            assert abs(e["ts"] - (host[name]["ts"] + LAG / 1000)) < 0.01 and e["dur"] == host[name]["dur"]
        calls = [e for e in events if e["pid"] == rank and e.get("tid", 0) >= 1000 and e["ph"] == "X"]
        assert len(calls) == 6 and all(e["args"]["backend_us"] == 7.0 for e in calls)
