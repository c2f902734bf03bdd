"""Replay, `tui --compare` and `diff` agree on what a divergence is (issue 29).

The README's demo is a digest recording whose virtual peers' data was not recorded: the
replay makes it up, says "diverged: no", and its own recording's digests part from the
recording's from then on. `tui demo.prism --compare replay.prism` opened with "First
divergence: ... data (digest) differ"; now all three show the one rule's verdict
(analysis.call_divergence). The edited-program case, where they must all say "diverged",
is replay's own test (tests/replayer/test_replay_ops.py) and tests/analysis/test_divergence.py.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from cli_helpers import run_cli

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tui"))
from tui_helpers import make_app, screen_text, settle, sync  # noqa: E402


@pytest.fixture(scope="module")
def replayed(make_demo, tmp_path_factory):
    """`prism-rr replay demo.prism --ranks 0 -o replay.prism`, as a user runs it after `make demo`."""
    demo = make_demo.result()
    assert demo.returncode == 0, demo.stderr[-3000:]
    out = tmp_path_factory.mktemp("verdict") / "replay.prism"
    r = run_cli("replay", make_demo.bundle, "--ranks", "0", "--run-recorded-command", "-o", out,
                "--timeout", "240", timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"})
    return make_demo.bundle, out, r


@pytest.mark.timeout(400)
def test_replay_compare_and_diff_agree_the_demo_did_not_diverge(replayed):
    bundle, out, r = replayed
    assert r.returncode == 0, r.stderr[-3000:]
    assert "numerics synthetic (no payloads)" in r.stderr and "diverged: no" in r.stderr

    from prism_rr.analysis import replay_data
    from prism_rr.format import open_bundle
    from prism_rr.tui.analysis import compare_bundles

    with open_bundle(bundle) as a, open_bundle(out) as b:
        made_up = replay_data(a, b)
        result = compare_bundles(a, b)
    assert set(made_up) == {0} and made_up[0] is not None  # the replay said when it made data up
    assert result["first_divergence"] is None and result["data_compared"] is True

    diffed = run_cli("diff", bundle, out, "--json")
    assert diffed.returncode == 0, diffed.stdout[-2000:] + diffed.stderr[-2000:]
    doc = json.loads(diffed.stdout)
    assert doc["same"] is True and doc["ranks_compared"] == [0] and doc["calls"]["a"] > 0


@pytest.mark.timeout(400)
@sync
async def test_the_compare_screen_says_no_divergence_for_the_demo(replayed):
    bundle, out, r = replayed
    assert r.returncode == 0, r.stderr[-3000:]
    app = make_app(bundle, out, start="compare")
    async with app.run_test(size=(140, 40)) as pilot:
        await settle(pilot)
        text = screen_text(app)
        assert "No divergence" in text and "First divergence" not in text, text
        assert "data compared where the replay ran on the recorded data" in text
