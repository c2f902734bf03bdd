"""Every attempt of a job that restarts is in the bundle (issue 31): torchrun's restarts, a
harness's fresh processes for the same ranks, an attempt killed while the next starts."""

import os
import random
import signal
import subprocess
import sys
import time

import pytest

from prism_rr.format import open_bundle, pack, verify
from prism_rr.format.records import Collective, Marker, PointToPoint, Step
from prism_rr.recorder.launch import spool_dir_for

from recorder_helpers import SCRIPTS, finish, start_ranks

# CI=... makes torch's own harness (run_tests) write JUnit XML through xmlrunner, which it does
# not install: the suite under test runs as a developer's machine runs it.
ENV = {k: v for k, v in os.environ.items() if k != "CI"} | {"PYTHONWARNINGS": "ignore", "OMP_NUM_THREADS": "1"}


def _calls(bundle, rank):
    return [e for e in bundle.events(rank) if type(e) in (Collective, PointToPoint)]


@pytest.mark.timeout(240)
def test_a_restarted_job_keeps_both_attempts(restarted_job):
    """elastic.py under `record` (tests/conftest.py's restarted_job): attempt 0 fails (rank 1
    exits 17 in step 2), torchrun restarts it, attempt 1 runs to the end."""
    got, out = restarted_job, restarted_job.bundle
    assert got.returncode == 0, got.stderr[-3000:]  # the job succeeded in the end
    with open_bundle(out) as b:
        verify(b)
        assert [e["attempt"] for e in b.attempts] == [0, 1]
        assert b.attempt == 0  # the one that failed is what a reader sees first
        assert "attempts" in b.manifest["features_required"]
    with open_bundle(out, attempt=0) as first:
        assert first.rank_info(1)["exit"] == {"code": 17, "how": "sys.exit(17)"}
        ended = first.rank_info(0)["exit"]
        # rank 0 lost its peer in its next call, unless torchrun stopped it first
        assert "Connection closed by peer" in ended.get("how", "") or ended.get("signal") == "SIGTERM", ended
        assert {s.step for s in first.events(1) if type(s) is Step} == {0, 1}  # it died in step 2
        assert [c.op for c in _calls(first, 1)][-1] == "all_reduce"
    with open_bundle(out, attempt=1) as second:
        assert [second.rank_info(r)["exit"]["code"] for r in (0, 1)] == [0, 0]
        assert second.steps == [0, 1, 2, 3]
        for r in (0, 1):
            seqs = [c.seq for c in _calls(second, r) if c.group == 0]
            assert seqs == list(range(len(seqs)))  # an attempt's own sequence numbers, from 0


@pytest.mark.timeout(240)
def test_each_test_of_a_multiprocess_suite_is_an_attempt(tmp_path):
    """PyTorch's own harness spawns fresh rank processes for every test: one attempt per
    test, with its calls, and the suite passes (its two tests, OK) as it does without the
    recorder (a plain run of it, which spawns as many torch processes again, proves nothing
    the recorded run's "Ran 2 tests ... OK" does not)."""
    script = SCRIPTS / "mptc_suite.py"
    out = tmp_path / "suite.prism"
    got = subprocess.run([sys.executable, "-m", "prism_rr.cli", "record", "-o", str(out), "--", sys.executable,
                          str(script)], capture_output=True, text=True, timeout=200, env=ENV, cwd=tmp_path)
    assert got.returncode == 0 and "Ran 2 tests" in got.stderr and "OK" in got.stderr, got.stderr[-3000:]
    with open_bundle(out) as b:
        verify(b)
        attempts = [e["attempt"] for e in b.attempts]
    assert attempts == [0, 1]
    ops = {}
    for k in attempts:
        with open_bundle(out, attempt=k) as v:
            assert v.recorded_ranks == [0, 1]
            ops[k] = {r: [c.op for c in _calls(v, r)] for r in (0, 1)}
    # unittest runs the tests by name: all_reduce, send_recv
    assert ops == {0: {0: ["all_reduce", "all_reduce"], 1: ["all_reduce", "all_reduce"]},
                   1: {0: ["send", "barrier"], 1: ["recv", "barrier"]}}


@pytest.mark.timeout(120)
def test_an_attempt_killed_while_the_next_starts_loses_no_call(tmp_path):
    """Both ranks of attempt 0 are killed (SIGKILL) at a random moment of their loop while
    attempt 1 is started in the same directory: attempt 0 keeps every call its ranks
    entered (each rank's calls cover what the other completed), attempt 1 is whole."""
    first, procs = start_ranks(tmp_path, "crashy.py", "loop", 2, "attempt-0")
    deadline = time.monotonic() + 60
    while not all((tmp_path / f"ready-{r}").exists() for r in range(2)):
        assert time.monotonic() < deadline and all(p.poll() is None for p in procs), (tmp_path / "rank1.log").read_text()
        time.sleep(0.02)
    time.sleep(random.Random(int(os.environ.get("PRISM_RR_SEED", "0")) or None).uniform(0.05, 0.4))
    for p in procs:
        p.send_signal(signal.SIGKILL)
    _, again = start_ranks(tmp_path, "crashy.py", "clean", 2, "attempt-1")  # the restart, at once
    assert finish(procs, 10) == [-signal.SIGKILL] * 2
    assert finish(again, 60) == [0, 0], (tmp_path / "rank0.log").read_text()[-3000:]
    out = tmp_path / "run.prism"
    result = pack(spool_dir_for(first), out)
    assert result.attempts == [0, 1] and result.default_attempt == 0  # killed: it failed
    with open_bundle(out) as b:
        verify(b)
    with open_bundle(out, attempt=0) as killed:
        calls = {r: _calls(killed, r) for r in (0, 1)}
        assert all(len(c) > 10 for c in calls.values())
        for r in (0, 1):
            have = {(c.group, c.seq) for c in calls[r]}
            # what the peer completed; not a call it ended in an error (gloo's, once this
            # rank was gone: the two die a moment apart, and this one may never have entered it)
            failed = {m.value for m in killed.events(1 - r) if type(m) is Marker and m.name == "call_failed"}
            done_by_peer = {(c.group, c.seq) for c in calls[1 - r] if c.end_ns is not None and c.seq not in failed}
            assert done_by_peer <= have, sorted(done_by_peer - have)
        assert "exit" not in killed.rank_info(0)  # no word: killed
    with open_bundle(out, attempt=1) as clean:
        assert [clean.rank_info(r)["exit"]["code"] for r in (0, 1)] == [0, 0]
        assert all(c.end_ns is not None for r in (0, 1) for c in _calls(clean, r))


def _cli(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "prism_rr.cli", *map(str, args)], capture_output=True, text=True,
                          timeout=120, env=ENV, cwd=cwd)


@pytest.mark.timeout(240)
def test_every_command_shows_the_attempts(restarted_job, tmp_path):
    """info lists the attempts and how each ended; diagnose names what ended the failed
    one; analyze and export show them side by side; diff compares two attempts."""
    out = restarted_job.bundle
    info = _cli("info", out)
    assert info.returncode == 0, info.stderr
    text = info.stdout
    assert "attempts        2, the facts above of attempt 0" in text
    assert "attempt 0     world 2, ranks 0-1: failed: rank 1 exited 17: sys.exit(17) in step 2" in text, text
    assert "attempt 1     world 2, ranks 0-1: ended cleanly" in text, text
    facts = __import__("json").loads(_cli("info", out, "--json", "--attempt", "1").stdout)
    assert facts["attempt"] == 1 and [a["attempt"] for a in facts["attempts"]] == [0, 1]
    ended = facts["attempts"][0]["ended"]
    assert ended["failed"] and ended["first"] == 1 and ended["ranks"]["1"]["code"] == 17
    assert not facts["attempts"][1]["ended"]["failed"]

    found = _cli("diagnose", out, "--json")
    assert found.returncode == 5, found.stderr
    first = __import__("json").loads(found.stdout)["findings"][0]
    assert first["kind"] == "attempt" and first["ranks"] == [1], first
    assert first["message"].startswith("Attempt 0 failed: rank 1 exited 17: sys.exit(17) in step 2; then rank 0 ")
    assert first["message"].endswith("; the job was restarted as attempt 1."), first["message"]
    assert "[/" not in first["message"]  # the exception's text, without gloo's source line
    later = __import__("json").loads(_cli("diagnose", out, "--json", "--attempt", "1").stdout)["findings"]
    # attempt 1 itself ended cleanly: the attempt finding (of attempt 0) and, at most, the
    # start-up's noise read as a straggler
    assert later[0]["kind"] == "attempt" and {f["kind"] for f in later[1:]} <= {"straggler"}, later

    side = _cli("analyze", out, "--attempt", "all")
    assert side.returncode == 0 and "attempt 0\nstep 0:" in side.stdout and "\nattempt 1\nstep 0:" in side.stdout
    trace = tmp_path / "both.json"
    assert _cli("export", out, "--format", "chrome", "-o", trace, "--attempt", "all").returncode == 0
    names = {e["args"]["name"] for e in __import__("json").loads(trace.read_text())["traceEvents"]
             if e.get("name") == "process_name"}
    assert names == {"attempt 0, rank 0", "attempt 0, rank 1", "attempt 1, rank 0", "attempt 1, rank 1"}
    assert _cli("export", out, "--format", "parquet", "-o", tmp_path / "t", "--attempt", "all").returncode == 2

    # the same program, restarted: steps 0 and 1 issue the same calls; in step 2, where
    # attempt 0 failed, rank 1 exited before the call attempt 1 made (issue 40: diff keeps
    # the failed step)
    compared = _cli("diff", out, out, "--attempt", "0", "--other-attempt", "1")
    assert compared.returncode == 6, compared
    assert "first: step 2, rank 1, group 0, the rank's call 8 in that group: missing in A" in compared.stdout, compared
    assert "step 0 " in compared.stdout and "step 1 " in compared.stdout and "did not end" in compared.stdout
    missing = _cli("info", out, "--attempt", "7")
    assert missing.returncode == 2 and "holds no attempt 7 (it holds 0, 1)" in missing.stderr


@pytest.mark.timeout(120)
def test_redact_keeps_every_attempt(restarted_job, tmp_path):
    """A redacted copy of a restarted job holds every attempt, each rank's exit code and
    the kind of its end, never an exception's message; info reads the same endings."""
    out = restarted_job.bundle
    clean = tmp_path / "clean.prism"
    got = _cli("redact", out, "-o", clean)
    assert got.returncode == 0, got.stderr
    with open_bundle(clean) as b:
        verify(b)
        assert [e["attempt"] for e in b.attempts] == [0, 1] and b.attempt == 0
        assert b.rank_info(1)["exit"] == {"code": 17, "how": "sys.exit(17)"}
        how = b.rank_info(0)["exit"].get("how", "")
        assert "Connection closed" not in how and len(how) < 60, how  # the type, not the message
        with open_bundle(out) as original:
            assert [c.seq for c in _calls(b, 1)] == [c.seq for c in _calls(original, 1)]
    with open_bundle(clean, attempt=1) as second:
        assert second.steps == [0, 1, 2, 3] and second.rank_info(1)["exit"]["code"] == 0
    info = _cli("info", clean)
    assert "attempt 0     world 2, ranks 0-1: failed: rank 1 exited 17: sys.exit(17) in step 2" in info.stdout


@pytest.mark.timeout(120)
def test_the_tui_opens_one_attempt_at_a_time(restarted_job):
    """The title and the overview name the attempt; `a` lists them, Enter opens another
    in every screen."""
    import asyncio

    from textual.widgets import OptionList

    from prism_rr.tui.app import PrismApp
    from prism_rr.tui.screens.attempts import AttemptsScreen

    out = restarted_job.bundle

    async def browse():
        app = PrismApp(out)
        async with app.run_test(size=(160, 45)) as pilot:
            await pilot.pause()
            assert app.bundle.attempt == 0 and "attempt 0 of 2" in app.sub_title
            await pilot.press("a")
            await pilot.pause()
            assert isinstance(app.screen, AttemptsScreen)
            listed = [str(o.prompt) for o in app.screen.query_one(OptionList).options]
            assert listed[0].startswith("▶ attempt 0") and "failed: rank 1 exited 17" in listed[0]
            assert "ended cleanly" in listed[1]
            await pilot.press("down", "enter")
            for _ in range(20):
                await pilot.pause(0.1)
                if app.bundle.attempt == 1:
                    break
            assert app.bundle.attempt == 1 and app.model.bundle is app.bundle
            assert "attempt 1 of 2" in app.sub_title
            await pilot.press("2")
            await pilot.pause()
            assert app.screen.timeline.cursor_rank == 0
            assert app.model.step_stats() and [s["step"] for s in app.model.step_stats()] == [0, 1, 2, 3]

    asyncio.run(browse())
