"""The fidelity card says what its figures mean (issue 27, honest cards): the recording's
own step-to-step spread and the error of the mean step beside the mean per-step error,
and, where the error is not a fidelity figure, why: ranks that shared cores when
recorded, a busy host, another kind of device, host times of work on a GPU."""

import os
import sys

import pytest

from prism_rr.format import open_bundle
from prism_rr.format.rewrite import Rewrite
from prism_rr.format.synthetic import synthetic_records
from prism_rr.replayer import replay
from prism_rr.replayer._fidelity import headline
from prism_rr.replayer._honesty import caveats, noise

from replay_helpers import record, stderr_of

STEPS_PY = __import__("pathlib").Path(__file__).parents[1] / "recorder" / "scripts" / "steps.py"
QUIET = {"cpus": 2, "cuda": False, "device_name": None, "load_1m": 0.0}


def _bundle(tmp_path, name, world, *, cpus=2, threads=1, load=0.0, device="cpu", device_name=None):
    """A real bundle on disk (spools packed) whose ranks' info says what they ran on."""
    out = tmp_path / f"{name}.prism"
    with Rewrite(out) as rw:
        for rank in range(world):
            info = {"world_size": world, "rank": rank, "backend": "nccl" if device != "cpu" else "gloo",
                    "device": device, "hostname": "node-a",
                    "cpu": {"count": cpus, "allowed": cpus, "affinity": f"0-{cpus - 1}", "threads": threads,
                            "interop_threads": 1, "load_1m": load}}
            if device_name:
                info["device_name"] = device_name
            rw.write_rank(rank, info, [list(synthetic_records(rank, world, 200, tp=1, seed=1))])
        rw.pack({}, manifest_extra={})
    return out


def _kinds(path, ranks=(0,), machine=QUIET, clock="host"):
    with open_bundle(path) as b:
        return [c["kind"] for c in caveats(b, list(ranks), machine=machine, clock=clock)]


def test_noise_beside_the_error():
    rows = [{"recorded_s": 0.100, "replayed_s": 0.110}, {"recorded_s": 0.140, "replayed_s": 0.126},
            {"recorded_s": 0.120, "replayed_s": 0.120}]
    got = noise(rows)
    # the mean step: 0.12 recorded, 0.1187 replayed; the per-step errors 10%, 10%, 0% average 6.7%
    assert got["mean_step_error_pct"] == pytest.approx(1.111, abs=0.01)
    assert got["recorded_step_spread_pct"] == pytest.approx(13.6, abs=0.1)
    assert got["recorded_step_range_pct"] == pytest.approx(33.3, abs=0.1)
    one = noise(rows[:1])
    assert one["recorded_step_spread_pct"] is None and one["mean_step_error_pct"] == pytest.approx(10.0)
    assert noise([])["mean_step_error_pct"] is None


def test_caveats_from_what_the_ranks_ran_on(tmp_path):
    assert _kinds(_bundle(tmp_path, "fits", 2)) == []
    assert _kinds(_bundle(tmp_path, "shared", 4)) == ["shared_cores"]
    assert _kinds(_bundle(tmp_path, "threads", 2, threads=2)) == ["shared_cores"]  # 4 threads, 2 CPUs
    assert _kinds(_bundle(tmp_path, "busy", 2, load=5.0)) == ["busy_host"]
    assert _kinds(_bundle(tmp_path, "fits2", 2), machine=dict(QUIET, load_1m=4.0)) == ["busy_replay"]
    assert _kinds(_bundle(tmp_path, "fits3", 2), ranks=(0, 1), machine=dict(QUIET, cpus=1)) == ["replay_shared_cores"]
    gpu = _bundle(tmp_path, "gpu", 2, device="cuda:0", device_name="NVIDIA H100 80GB HBM3")
    assert _kinds(gpu) == ["device_kind"]  # replayed on CPU
    assert _kinds(gpu, machine=dict(QUIET, cuda=True, device_name="NVIDIA H100 80GB HBM3")) == ["host_clock"]
    assert _kinds(gpu, machine=dict(QUIET, cuda=True, device_name="NVIDIA A100-SXM4-40GB")) == \
        ["device_kind", "host_clock"]
    # scored on the device's clock, work on a GPU is no longer timed on the host
    assert _kinds(gpu, machine=dict(QUIET, cuda=True, device_name="NVIDIA H100 80GB HBM3"), clock="device") == []
    with open_bundle(_bundle(tmp_path, "shared2", 4)) as b:
        text = caveats(b, [0], machine=QUIET)[0]["text"]
    assert "4 ranks, 4 torch threads on 2 CPUs" in text and "record at most 2 ranks per 2 CPUs" in text


@pytest.mark.timeout(300)
def test_a_recording_of_more_ranks_than_cores_is_not_a_fidelity_figure(tmp_path):
    """steps.py at twice as many ranks as this machine's CPUs, rank 0 replayed: the card
    gives its error and says why it is not a fidelity figure; the report says so too."""
    cpus = len(os.sched_getaffinity(0))
    bundle = record(tmp_path, [STEPS_PY], 2 * cpus, payload="none")
    result = replay(bundle, ranks=[0], timeout=120, log_dir=tmp_path / "logs", cmd=[sys.executable, str(STEPS_PY)])
    assert result.exit_code == 0, stderr_of(result, 0)
    rep = result.report
    assert rep["clock"] == "host" and rep["fidelity_figure"] is False
    assert "shared_cores" in [c["kind"] for c in rep["caveats"]]
    assert rep["mean_step_error_pct"] is not None and rep["recorded_step_spread_pct"] is not None
    card = result.card
    assert "host clock)" in card and "mean step error" in card and "the recorded steps themselves vary" in card
    assert f"not a fidelity figure: the recording's ranks shared cores ({2 * cpus} ranks" in card, card
    # the first line is the result to remember, the error said to be no fidelity figure and why
    first = card.splitlines()[0]
    assert first.startswith("result: every recorded call made as recorded (no divergence); step time "), card
    assert "(not a fidelity figure here: the recorded ranks shared CPUs" in first and "peak memory" in first, card


def test_the_headline_says_how_the_replay_ended():
    """The card's first line for each ending: a divergence names its call, a reproduced
    hang or failure and an early stop say so; a clean replay gives its two errors, the
    time error plainly where it is a fidelity figure."""
    clean = {"first_divergence": None, "steps": [{"step": 1}], "iteration_time_error_pct": 1.234,
             "peak_memory_error_pct": 0.0, "caveats": []}
    assert headline(clean) == ("result: every recorded call made as recorded (no divergence); step time 1.23% "
                               "from the recording; peak memory 0.00% from it")
    busy = headline({**clean, "caveats": [{"kind": "busy_replay"}, {"kind": "shared_cores"}]})
    assert "(not a fidelity figure here: the recorded ranks shared CPUs, this machine was busy)" in busy
    diverged = {**clean, "first_divergence": {"rank": 1, "op": "all_reduce\x1b[2J", "group": 2, "seq": 7}}
    assert headline(diverged) == ("result: the program diverged from the recording at rank 1's "
                                  "all_reduce\\x1b[2J (group 2, seq 7): below")
    assert headline({**clean, "hang": {"rank": 0}}).startswith("result: the recorded hang reproduced")
    assert headline({**clean, "reproduced": True}).startswith("result: the recorded failure reproduced")
    assert headline({**clean, "stopped_early": [{"rank": 0}]}).startswith("result: the replay stopped before")


@pytest.mark.timeout(400)
def test_steps_are_scored_on_the_device_clock_where_both_sides_have_it(tmp_path, monkeypatch):
    """steps.py recorded with a device clock (PRISM_RR_DEVICE_CLOCK=host: the host stand-in
    of CUDA events) and replayed with one: the replay marks its step boundaries on the
    program's stream and the card scores device times; replayed without one, the host's.
    The report takes each side's device durations, not their host times."""
    from prism_rr.analysis import step_durations
    from prism_rr.recorder._device import ENV_VAR
    from prism_rr.replayer._fidelity import fidelity_report

    monkeypatch.setenv(ENV_VAR, "host")
    bundle = record(tmp_path, [STEPS_PY], 2, payload="none")
    cmd = [sys.executable, str(STEPS_PY)]
    own = tmp_path / "replayed.prism"  # the replay's own recording (-o): its steps on the device's clock too
    on_device = replay(bundle, ranks=[0], timeout=120, log_dir=tmp_path / "logs", cmd=cmd, output=own)
    assert on_device.exit_code == 0, stderr_of(on_device, 0)
    assert on_device.report["clock"] == "device" and "device clock)" in on_device.card, on_device.card
    assert on_device.report["scored_steps"] == [1, 2, 3]
    from prism_rr.tui.analysis import compare_bundles

    with open_bundle(bundle) as a, open_bundle(own) as b:
        assert b.summaries.get("device_steps"), "the replay's own recording has no device time"
        compared = compare_bundles(a, b)
        assert compared["clock"] == "device" and compared["steps"] and compared["first_divergence"] is None, compared
    monkeypatch.setenv(ENV_VAR, "off")
    on_host = replay(bundle, ranks=[0], timeout=120, log_dir=tmp_path / "logs2", cmd=cmd)
    assert on_host.exit_code == 0, stderr_of(on_host, 0)
    assert on_host.report["clock"] == "host" and "host clock)" in on_host.card
    with open_bundle(bundle) as b:
        dev = {s: step_durations(b, s, clock="device")[0] for s in b.steps}
        host = {s: step_durations(b, s, clock="host")[0] for s in b.steps}
        # a replay whose device steps took twice its host steps: the report reads them
        rows = [[s, 10 ** 9 * s, 10 ** 9 * s + 1_000_000, 0, None, 0] for s in b.steps]
        stats = {0: {"steps": rows, "device_steps": [[s, 0, 2_000_000] for s in b.steps]}}
        rep = fidelity_report(b, [0], stats, timing="live")
        assert rep["clock"] == "device"
        assert [st["replayed_s"] for st in rep["steps"]] == [0.002] * len(b.steps)
        assert [st["recorded_s"] for st in rep["steps"]] == [dev[s] / 1e9 for s in b.steps]
        stats[0]["device_steps"] = None  # a replay without a device clock: the host's, both sides
        rep = fidelity_report(b, [0], stats, timing="live")
        assert rep["clock"] == "host" and [st["replayed_s"] for st in rep["steps"]] == [0.001] * len(b.steps)
        assert [st["recorded_s"] for st in rep["steps"]] == [host[s] / 1e9 for s in b.steps]
