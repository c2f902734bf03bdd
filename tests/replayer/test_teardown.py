"""A native abort in teardown, after the program finished, does not undo a replay; one
before it finished fails it."""

import sys

import pytest

from prism_rr.replayer import replay

from replay_helpers import SCRIPTS, record, stderr_of

SCRIPT = SCRIPTS / "abort_at_exit.py"
pytestmark = pytest.mark.teardown


@pytest.mark.timeout(180)
def test_abort_after_the_program_finished_is_reported_not_fatal(tmp_path):
    bundle = record(tmp_path, [SCRIPT, "none"], 2, payload="digest")
    ok = replay(bundle, ranks=(0,), cmd=[sys.executable, str(SCRIPT), "exit"], timeout=60, log_dir=tmp_path / "a")
    assert ok.exit_code == 0, stderr_of(ok, 0)
    assert ok.report["teardown_aborts"] == [0] and ok.report["rank_exit_codes"] == {"0": -6}
    assert ok.report["diverged"] is False
    early = replay(bundle, ranks=(0,), cmd=[sys.executable, str(SCRIPT), "early"], timeout=60,
                   log_dir=tmp_path / "b")
    assert early.exit_code == 128 + 6 and "teardown_aborts" not in early.report
