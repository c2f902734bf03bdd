"""What-if knobs and the virtual clock move the replayed iteration time the right way.

A world-3 recording of fixed-length compute (rank 1 the slowest) and a 4 MB all_reduce,
replayed with rank 0 real. No tight timing asserts: each knob must move the replayed time
by clearly more than the noise of a shared machine.
"""

import statistics
import sys

import pytest

from prism_rr.replayer import replay

from replay_helpers import SCRIPTS, record, stderr_of

STEPS = 6


@pytest.fixture(scope="module")
def recording(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("timed")
    return tmp, record(tmp, [SCRIPTS / "timed.py", STEPS], 3, payload="none")


def _run(recording, tag, ranks=(0,), **kw) -> dict:
    tmp, bundle = recording
    result = replay(bundle, ranks=ranks, timeout=120, log_dir=tmp / f"logs-{tag}", run_recorded_command=True, **kw)
    assert result.exit_code == 0, stderr_of(result, ranks[0])
    CARDS[tag] = result.card
    return result.report


CARDS: dict[str, str] = {}  # tag -> the replay's card


def _scored(rep, key="replayed_s"):
    return statistics.mean(s[key] for s in rep["steps"] if s["step"] in rep["scored_steps"])


def _comm_wait(rep):
    return _scored(rep) - _scored(rep, "replayed_compute_s")


@pytest.fixture(scope="module")
def baseline(recording):
    return _run(recording, "base")


@pytest.mark.timeout(120)
def test_comm_scale_stretches_comm_wait(recording):
    # Rank 1 is the slowest: the others are there before it, its comm wait is the transfer.
    base = _run(recording, "comm-base", ranks=(1,))
    rep = _run(recording, "comm", ranks=(1,), comm_scale=5.0)
    assert rep["what_if"]["comm_scale"] == 5.0
    assert _comm_wait(rep) >= 2 * _comm_wait(base)


@pytest.mark.timeout(120)
def test_slow_rank_delays_the_real_rank(recording, baseline):
    # Rank 1's 30 ms of compute per step gates every all_reduce: tripled, the step grows by ~60 ms.
    rep = _run(recording, "slow", slow_rank={1: 3.0})
    assert _scored(rep) >= _scored(baseline) + 0.03
    # A what-if predicts another run: the card says what it predicts, not an "error".
    assert baseline["mode"] == "fidelity" and baseline["prediction"] is None
    assert rep["mode"] == "prediction" and rep["prediction"]["what_if"] == {"slow_rank": {"1": 3.0}}
    p = rep["prediction"]
    assert p["step_time_s"] == pytest.approx(_scored(rep)) and p["step_time_change_pct"] > 0
    assert "predicted at world 3 (rank 1's compute x3)" in CARDS["slow"] and "error" not in CARDS["slow"]
    assert "iteration time error" in CARDS["base"]
    # Slowing rank 2, which never gates anyone (10 ms, waited for by rank 1), changes little.
    rep2 = _run(recording, "slow2", slow_rank="2:1.5")
    assert _scored(rep2) < _scored(baseline) + 0.02


@pytest.mark.timeout(120)
def test_compute_scale_stretches_every_rank(recording, baseline):
    rep = _run(recording, "compute", compute_scale=2.0)
    assert _scored(rep) >= _scored(baseline) + 0.02


@pytest.mark.timeout(120)
def test_virtual_clock_is_calibrated_and_scales(recording, baseline):
    rep = _run(recording, "virtual", timing="virtual")
    assert rep["timing"] == "virtual"
    cal = rep["calibration"]["0"]
    assert cal is not None and cal > 0
    # On the virtual clock the replayed steps follow the recorded ones.
    assert rep["iteration_time_error_pct"] < 50
    slow = _run(recording, "virtual-slow", timing="virtual", slow_rank={1: 3.0})
    assert _scored(slow) >= _scored(rep) + 0.03


@pytest.mark.timeout(120)
def test_a_program_that_fails_before_a_step_ends_is_named_with_its_last_lines(recording):
    """No step to score: the card says which rank ended, how, before which step, and
    shows what it printed last, instead of a card of n/a."""
    tmp, bundle = recording
    program = "import sys; print('loading config.yaml', file=sys.stderr); sys.exit('KeyError: lr')"
    result = replay(bundle, ranks=(0,), timeout=60, log_dir=tmp / "logs-fails", cmd=[sys.executable, "-c", program])
    assert result.exit_code == 1
    first = result.report["recorded_steps"][0]
    assert f"stopped early: rank 0 exited with code 1 before the end of step {first}, the recording's first" in result.card
    assert "| loading config.yaml" in result.card and "| KeyError: lr" in result.card
    assert "n/a" not in result.card and result.report["steps"] == []
