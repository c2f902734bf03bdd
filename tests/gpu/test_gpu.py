"""The CUDA path: the demo recorded on nccl with CUDA tensors, then rank 0 replayed.

`make gpu-check` runs this file with -s, so the fidelity card shows. Without a GPU every
test here is skipped (the `gpu` marker, tests/conftest.py). The world is 2 ranks, or 1
on a machine with one GPU (nccl refuses two ranks on one device).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pytest

from prism_rr import demo
from prism_rr.format import Collective, Step, open_bundle

from cli_helpers import run_cli

pytestmark = pytest.mark.gpu

RECORD_TIMEOUT = 540  # the first nccl/CUDA start-up on a fresh machine is slow
REPLAY_TIMEOUT = 300
MINUTE_NS = 60_000_000_000


@dataclass
class Recorded:
    bundle: Path
    plan: demo.DemoPlan
    stderr: str


@pytest.fixture(scope="module")
def recorded(tmp_path_factory) -> Recorded:
    import torch

    world = min(2, torch.cuda.device_count())
    work = tmp_path_factory.mktemp("gpu")
    bundle = work / "demo.prism"
    out = run_cli("demo", "-o", bundle, "--world", world, "--no-replay", cwd=work, timeout=RECORD_TIMEOUT)
    print(f"\n--- prism-rr demo --world {world} --no-replay (stderr) ---\n{out.stderr[-4000:]}")
    assert out.returncode == 0, out.stderr[-6000:]
    return Recorded(bundle, demo.plan(world), out.stderr)


@pytest.mark.timeout(RECORD_TIMEOUT + 60)
def test_recording_is_on_cuda_with_memory_statistics(recorded):
    world = recorded.plan.world
    with open_bundle(recorded.bundle) as b:
        facts = b.facts()
        assert facts["recorded_ranks"] == list(range(world)), facts
        assert facts["steps"] == [1, 2, 3] and facts["open_calls"] == 0, facts
        assert facts["recorder_failed_ranks"] == [], facts["recorder_failures"]
        for r in range(world):
            info = b.rank_info(r)
            assert info["device"] == "cuda" and "nccl" in info["backend"], info
            assert info["device_name"] and info["versions"]["cuda"], info
            events = list(b.events(r))
            steps = {s.step: s for s in events if type(s) is Step}
            assert sorted(steps) == [1, 2, 3], steps
            for s in steps.values():
                # CUDA allocator statistics: the model's weights alone are on the device
                assert s.mem_peak is not None and s.mem_peak > 0, s
                assert 0 < s.end_ns - s.start_ns < MINUTE_NS, s
            calls = [c for c in events if type(c) is Collective]
            # at world 1 FSDP2 and TP issue nothing (the trainer test below has calls)
            assert calls or world == 1, f"rank {r} recorded no collectives"
            for c in calls:
                assert c.end_ns is not None and 0 <= c.end_ns - c.start_ns < MINUTE_NS, c
                assert c.step in steps and c.start_ns >= steps[c.step].start_ns, (c, steps)
                assert c.mem_alloc is not None and c.mem_peak is not None and c.mem_peak >= c.mem_alloc, c
            print(f"rank {r} on {info['device_name']}: {len(calls)} collectives, step peaks "
                  + ", ".join(f"{s.mem_peak / 2**20:.1f} MiB" for s in steps.values())
                  + ", step times " + ", ".join(f"{(s.end_ns - s.start_ns) / 1e6:.1f} ms" for s in steps.values()))


@pytest.mark.timeout(RECORD_TIMEOUT + REPLAY_TIMEOUT + 60)
def test_replay_rank0_on_cuda(recorded, tmp_path):
    report = tmp_path / "fidelity.json"
    out = run_cli("replay", recorded.bundle, "--ranks", "0", "--report", report,
                  "--timeout", REPLAY_TIMEOUT - 30, "--", *recorded.plan.train,
                  cwd=recorded.bundle.parent, timeout=REPLAY_TIMEOUT)
    print(f"\n--- prism-rr replay {recorded.bundle.name} --ranks 0 (stderr: the fidelity card) ---\n"
          f"{out.stderr[-6000:]}")
    assert out.returncode == 0, out.stderr[-6000:]
    facts = json.loads(report.read_text())
    assert facts["world_size"] == recorded.plan.world and facts["exit_code"] == 0, facts
    assert facts["diverged"] is False and facts["divergences"] == 0, facts
    assert len(facts["steps"]) == 3, facts["steps"]
    # the inputs' digests compared once the device passed them, not by syncing the host
    assert facts["inputs_checked_later"] > 0, facts
    # the allocator's peak, read alike while recording and replaying
    assert facts["peak_memory_replayed_bytes"] and facts["peak_memory_error_pct"] is not None, facts


@pytest.fixture(scope="module")
def cpu_world2(tmp_path_factory) -> Path:
    """The demo's 2 ranks recorded on CPU (CUDA hidden), shapes only: a bundle with a peer to play.

    One GPU cannot hold two nccl ranks, so this is how a virtual peer meets CUDA tensors here.
    """
    import os

    work = tmp_path_factory.mktemp("cpu2")
    bundle = work / "cpu2.prism"
    plan = demo.plan(2)
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="")
    out = run_cli("record", "-o", bundle, "--steps", demo.STEPS, "--payload", "none", "--nproc", 2,
                  "--", *plan.train, cwd=work, env=env, timeout=RECORD_TIMEOUT)
    assert out.returncode == 0, out.stderr[-6000:]
    return bundle


@pytest.mark.timeout(RECORD_TIMEOUT + REPLAY_TIMEOUT + 60)
def test_virtual_peer_feeds_a_cuda_rank(cpu_world2, tmp_path):
    """Rank 0 runs on the GPU (nccl asked for, the replayer's group in its place); rank 1 is virtual."""
    report = tmp_path / "fidelity.json"
    out = run_cli("replay", cpu_world2, "--ranks", "0", "--report", report, "--timeout", REPLAY_TIMEOUT - 30,
                  "--", *demo.plan(2).train, cwd=cpu_world2.parent, timeout=REPLAY_TIMEOUT)
    print(f"\n--- prism-rr replay cpu2.prism --ranks 0 on CUDA (stderr) ---\n{out.stderr[-4000:]}")
    assert out.returncode == 0, out.stderr[-6000:]
    facts = json.loads(report.read_text())
    assert facts["world_size"] == 2 and facts["exit_code"] == 0, facts
    assert facts["diverged"] is False and facts["divergences"] == 0, facts
    assert len(facts["steps"]) == 3, facts["steps"]


TRAINER = Path(__file__).with_name("cuda_train.py")


@pytest.fixture(scope="module")
def trainer(tmp_path_factory) -> Path:
    """cuda_train.py recorded on nccl (steps 1-3, digests): DDP, DeviceMesh, logging calls."""
    import sys

    work = tmp_path_factory.mktemp("trainer")
    bundle = work / "trainer.prism"
    out = run_cli("record", "-o", bundle, "--steps", "1:4", "--payload", "digest", "--nproc", 1,
                  "--", sys.executable, TRAINER, cwd=work, timeout=RECORD_TIMEOUT)
    print(f"\n--- prism-rr record cuda_train.py (stderr) ---\n{out.stderr[-3000:]}")
    assert out.returncode == 0, out.stderr[-6000:]
    return bundle


@pytest.mark.timeout(RECORD_TIMEOUT + 60)
def test_trainer_calls_are_recorded_on_cuda(trainer):
    with open_bundle(trainer) as b:
        facts = b.facts()
        assert facts["steps"] == [1, 2, 3] and facts["open_calls"] == 0, facts
        assert facts["recorder_failed_ranks"] == [], facts["recorder_failures"]
        events = list(b.events(0))
        calls = [c for c in events if type(c) is Collective]
        ops = {c.op for c in calls}
        assert {"all_reduce", "broadcast"} <= ops and any("all_gather" in op for op in ops), ops
        for c in calls:
            assert c.end_ns is not None and c.mem_alloc is not None, c
        print(f"trainer: {len(calls)} collectives in steps 1-3 ({sorted(ops)})")


@pytest.mark.timeout(RECORD_TIMEOUT + REPLAY_TIMEOUT + 60)
def test_trainer_replays_on_cuda(trainer, tmp_path):
    import sys

    report = tmp_path / "fidelity.json"
    out = run_cli("replay", trainer, "--ranks", "0", "--report", report, "--timeout", REPLAY_TIMEOUT - 30,
                  "--", sys.executable, TRAINER, cwd=trainer.parent, timeout=REPLAY_TIMEOUT)
    print(f"\n--- prism-rr replay trainer.prism --ranks 0 (stderr: the fidelity card) ---\n{out.stderr[-4000:]}")
    assert out.returncode == 0, out.stderr[-6000:]
    facts = json.loads(report.read_text())
    assert facts["diverged"] is False and facts["divergences"] == 0, facts
    assert len(facts["steps"]) == 3, facts["steps"]
    # the inputs' digests compared once the device passed them, not by syncing the host
    assert facts["inputs_checked_later"] > 0, facts
    # the allocator's peak, read alike while recording and replaying
    assert facts["peak_memory_replayed_bytes"] and facts["peak_memory_error_pct"] is not None, facts


@pytest.mark.timeout(RECORD_TIMEOUT + 2 * REPLAY_TIMEOUT + 60)
def test_virtual_peers_wait_on_the_stream(trainer, tmp_path):
    """The trainer's recording scaled to dp 8 (`prism-rr scale`), rank 0 replayed with 7
    virtual peers and PRISM_RR_DEVICE_WAITS=auto: every call of the window (steps 1-3)
    waits through the best device mechanism here (the Triton spin where Triton is), each
    wait queued on a side stream that the program's stream then waits for. The same
    replay with host waits beside it for the figures (printed; a prediction; only a
    gross overshoot is asserted)."""
    import os
    import sys

    from prism_rr.replayer._device_wait import mechanisms

    big = tmp_path / "dp8.prism"
    out = run_cli("scale", trainer, "--dp", 8, "-o", big, cwd=tmp_path, timeout=120)
    assert out.returncode == 0, out.stderr[-4000:]
    with open_bundle(big) as b:
        calls = [c for c in b.events(0) if type(c) is Collective and c.step is not None and c.step >= 1]
    facts = {}
    for waits in ("auto", "off"):
        report = tmp_path / f"waits-{waits}.json"
        env = dict(os.environ, PRISM_RR_DEVICE_WAITS=waits)
        out = run_cli("replay", big, "--ranks", "0", "--report", report, "--continue-on-divergence",
                      "--timeout", REPLAY_TIMEOUT - 30, "--", sys.executable, TRAINER,
                      cwd=tmp_path, env=env, timeout=REPLAY_TIMEOUT)
        print(f"\n--- prism-rr replay dp8.prism --ranks 0, waits {waits} (stderr) ---\n{out.stderr[-3000:]}")
        assert out.returncode == 0, out.stderr[-6000:]
        facts[waits] = json.loads(report.read_text())
        assert facts[waits]["diverged"] is False, facts[waits]
    import torch

    best = mechanisms(torch.device("cuda"))[0]
    waits = facts["auto"]["device_waits"]["0"]
    assert (waits["mechanism"], waits["waits"]) == (best, len(calls)), waits
    assert facts["off"]["device_waits"] == {}, facts["off"]
    for waits, f in facts.items():
        print(f"waits {waits}: clock {f.get('clock')}, steps (s) {[s.get('replayed_s') for s in f['steps']]}")
    # Not a timing figure but a bound on a wrong one: the same peers' waits, made on the
    # device instead of the host, cannot take several times the step (an H200 run showed
    # 545 ms a step against 10 ms, the replayer's host blocked behind the device's waits)
    slowest = {w: max(st["replayed_s"] for st in f["steps"][1:]) for w, f in facts.items()}
    assert slowest["auto"] < 3 * slowest["off"], slowest
