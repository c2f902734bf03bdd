"""Steps marked by hand (`prism_rr.step()`) are the replay's steps too."""

import sys

import pytest

from prism_rr.format import open_bundle
from prism_rr.replayer import replay

from replay_helpers import SCRIPTS, record, stderr_of

STEPS = 4


@pytest.mark.timeout(180)
def test_replay_follows_manual_steps(tmp_path):
    bundle = record(tmp_path, [SCRIPTS / "manual_steps.py", STEPS], 2, payload="digest")
    with open_bundle(bundle) as b:
        assert b.steps == list(range(STEPS))
    out = tmp_path / "replay.prism"
    result = replay(bundle, ranks=(0,), cmd=[sys.executable, str(SCRIPTS / "manual_steps.py"), str(STEPS)],
                    timeout=120, log_dir=tmp_path / "logs", output=out)
    assert result.exit_code == 0, stderr_of(result, 0)
    rep = result.report
    assert rep["diverged"] is False
    assert [s["step"] for s in rep["steps"]] == list(range(STEPS))
    assert rep["scored_steps"] == list(range(1, STEPS))
    assert all(s["replayed_s"] > 0 for s in rep["steps"])
    # The replay's own recording marks the same boundaries: two calls in each step.
    with open_bundle(out) as b:
        assert b.steps == list(range(STEPS))
        from prism_rr.format.records import Collective

        per_step = {}
        for e in b.events(0):
            if isinstance(e, Collective) and e.op == "all_reduce":
                per_step[e.step] = per_step.get(e.step, 0) + 1
        assert per_step == {s: 2 for s in range(STEPS)}
