"""Before a replay: recorded versions against this machine's; refuse what cannot work."""

import platform

import pytest

from prism_rr.errors import UsageError
from prism_rr.replayer._environment import check_environment, current_versions


def _info(**kw):
    here = current_versions()
    info = {"backend": "gloo", "device": "cpu", "versions": {**here, "cuda": ""}}
    info.update(kw)
    return info


def test_same_environment_says_nothing():
    assert check_environment({0: _info(), 1: _info()}, timing="live") == []


def test_a_different_version_is_one_warning_line():
    old = _info(versions={"torch": "1.0.0", "python": "2.7.18", "platform": platform.platform()})
    warnings = check_environment({0: old, 1: old}, timing="live")
    assert len(warnings) == 2  # once per field, not once per rank
    assert any("torch 1.0.0" in w for w in warnings) and any("python 2.7.18" in w for w in warnings)
    assert all("\n" not in w for w in warnings)


def test_local_build_tags_are_the_same_torch():
    here = current_versions()["torch"]
    if here is None:
        pytest.skip("torch has no package metadata here")
    tagged = here.split("+")[0] + "+cu121"
    assert check_environment({0: _info(versions={**current_versions(), "torch": tagged})}, timing="live") == []


def test_cuda_recording_without_cuda(monkeypatch):
    from prism_rr.replayer import _environment

    monkeypatch.setattr(_environment, "_cuda_here", lambda: False)
    gpu = _info(backend="nccl", device="cuda")
    with pytest.raises(UsageError, match="no CUDA device"):
        check_environment({0: gpu}, timing="live")
    warnings = check_environment({0: gpu}, timing="virtual")  # a CPU replay of a GPU recording
    assert any("virtual clock" in w for w in warnings)
    # a Flight Recorder dump of a GPU job has no compute to score: any timing, on CPU
    warnings = check_environment({0: gpu}, timing="live", dump=True)
    assert any("dump is of CUDA" in w for w in warnings)


@pytest.mark.timeout(60)
def test_replay_refuses_before_starting_anything(tmp_path, monkeypatch):
    from prism_rr.replayer import _environment, launch

    monkeypatch.setattr(_environment, "_cuda_here", lambda: False)
    monkeypatch.setattr(launch, "check_environment",
                        lambda infos, timing, **more: _environment.check_environment(
                            {r: _info(backend="nccl", device="cuda") for r in infos}, timing=timing, **more))
    started = []
    monkeypatch.setattr(launch.subprocess, "Popen", lambda *a, **k: started.append(a))
    bundle = _bundle(tmp_path)
    with pytest.raises(UsageError, match="no CUDA device"):
        launch.replay(bundle, ranks=(0,), cmd=["true"])
    assert started == []


def _bundle(tmp_path):
    from prism_rr.format import pack
    from prism_rr.format.synthetic import write_synthetic

    spools = tmp_path / "spools"
    write_synthetic(spools, 2, 20)
    pack(spools, tmp_path / "s.prism")
    return tmp_path / "s.prism"
