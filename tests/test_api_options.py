"""The decisions the command line leaves to the api: the recording's and the replay's
options (one typed object each, checked once), what `record` says and exits with,
`analyze --attempt all`'s output, and progress drawn on a terminal only."""

import io
import json
import re
import sys
from pathlib import Path

import pytest

from prism_rr import api
from prism_rr.errors import UsageError
from prism_rr.format import PackResult

GOLDEN = Path(__file__).parent / "data" / "golden-v1.prism"


def _result(tmp_path, code, **kw) -> api.RecordResult:
    out = tmp_path / "run.prism"
    return api.RecordResult(output=out, spool_dir=api.spool_dir_for(out), exit_code=code, **kw)


def _packed(tmp_path, **kw) -> PackResult:
    return PackResult(path=tmp_path / "run.prism", ranks=2, chunks=4, events=1200, blobs=0, bytes=34567, **kw)


def test_what_record_exits_with(tmp_path):
    """The program's exit code (1 for death by a signal), and 1 where the recording or its
    bundle failed although the program succeeded: the five endings `record` had to tell apart."""
    failed = OSError("no such program")
    assert _result(tmp_path, None, error=failed).exit_status == 1  # nothing ran
    for flight_or_node in ({"flight": ()}, {"node": "1", "pack_command": "prism-rr pack ..."}):
        assert _result(tmp_path, 0, **flight_or_node).exit_status == 0
        assert _result(tmp_path, 3, **flight_or_node).exit_status == 3
        assert _result(tmp_path, 137, **flight_or_node).exit_status == 1
    assert _result(tmp_path, 0, error=failed, spools_left=True).exit_status == 1  # no bundle written
    assert _result(tmp_path, 3, error=failed, spools_left=True).exit_status == 3
    packed = _packed(tmp_path)
    assert [_result(tmp_path, c, packed=packed).exit_status for c in (0, 3, 139)] == [0, 3, 1]


def test_what_record_says(tmp_path):
    out, spools = tmp_path / "run.prism", tmp_path / "run.prism.d"
    elsewhere = f"prism-rr: the spools are in {spools}/; pack them elsewhere with:\n  prism-rr pack {spools} -o ELSEWHERE/run.prism"
    full = OSError("No space left on device")
    assert _result(tmp_path, 0, error=full, spools_left=True).lines() == [
        f"prism-rr: error: could not write {out}: No space left on device; the command succeeded (exit code 0), "
        f"but no bundle was written", elsewhere]
    assert _result(tmp_path, None, error=full).lines() == [
        f"prism-rr: error: recording into {spools}/ failed: No space left on device"]
    said = _result(tmp_path, 0, packed=_packed(tmp_path, torn={1: "torn frame"}), spools_left=True,
                   readback_error="bad", recorder_failures=({"rank": 1, "step": 2, "reason": "out of\x1b memory"},)).lines()
    assert said[:4] == ["warning: rank 1: tail of its spool lost (torn frame)",
                        f"wrote {out}: 2 ranks, 1,200 records, 34,567 bytes",
                        f"warning: could not read back {out}: bad",
                        f"the spools stay in {spools}/; pack them again with: prism-rr pack {spools} -o {out}"]
    assert said[4].startswith("warning: rank 1: the recorder turned itself off at step 2 (") and "\x1b" not in said[4]
    node = _result(tmp_path, 0, node="3", pack_command="prism-rr pack X -o Y", spools_left=True).lines()
    assert node[0].startswith(f"node 3: the spools are in {spools}/;") and node[0].endswith("\n  prism-rr pack X -o Y")
    assert _result(tmp_path, 0, flight=()).lines() == [
        "flight: no trigger fired; nothing was written (the last steps stayed in memory)"]


def test_the_recording_options_are_one_object_built_once(tmp_path, monkeypatch):
    """The command line's RecordOptions reaches the launcher as it was built; the node and
    its spool directory are found once, and the options placed there (flight mode: with
    the bundle rank 0 packs a dump into)."""
    import prism_rr.recorder.launch as launch

    asked, found = [], []
    real_node = launch.launch_node
    monkeypatch.setattr(launch, "launch_node", lambda *a, **kw: found.append(a) or real_node(*a, **kw))

    def fake_record(cmd, output, *, request, interrupted):
        asked.append(request)
        return 0

    monkeypatch.setattr(launch, "record_command", fake_record)
    out = tmp_path / "run.prism"
    options = api.RecordOptions(steps="1:4", ranks="0,2-3", payload="full", flight_hang=5)
    assert (options.steps, options.ranks, options.flight_hang, options.spool_dir) == ((1, 4), (0, 2, 3), 5.0, None)
    with pytest.raises(UsageError, match="nothing was recorded"):
        api.record(["train"], out, options)
    (request,) = asked
    assert len(found) == 1 and request.cmd == ("train",) and request.node is None
    assert request.options == options.placed(api.spool_dir_for(out).resolve(), out)
    assert request.options.spool_dir == str(api.spool_dir_for(out).resolve()) and request.options.output is None

    asked.clear()
    with pytest.raises(UsageError, match="nothing was recorded"):
        api.record(["train"], out, flight=4, nproc=2, node="b")
    (request,) = asked
    assert request.options.output == str(out.resolve()) and request.options.payload == "small"
    assert request.cmd[1:5] == ("-m", "prism_rr.localrun", "--nproc", "2") and request.cmd[-1] == "train"
    assert request.spool_dir == tmp_path / "run.prism.d" / "node-b"
    with pytest.raises(TypeError):
        api.record(["train"], out, options, steps="1:2")  # the options, or their fields: not both


def test_the_recording_options_travel_whole(tmp_path):
    options = api.RecordOptions(steps="2:5", ranks="1", ops=True, slice="roles", mesh="dp=2,tp=2", stack_depth=0)
    placed = options.placed(tmp_path / "x.d", tmp_path / "x.prism")
    assert type(placed).from_json(placed.to_json()) == placed
    env = api.record_env(tmp_path / "run.prism", options)
    assert env == api.record_env(tmp_path / "run.prism", steps="2:5", ranks="1", ops=True, slice="roles",
                                 mesh="dp=2,tp=2", stack_depth=0)
    sent = json.loads(env["PRISM_RR_RECORD"])
    assert sent["steps"] == [2, 5] and sent["slice"] == "roles" and sent["spool_dir"] == str((tmp_path / "run.prism.d"))
    for bad, said in ((dict(payload="all"), "payload must be one of"), (dict(flight=0), "--flight takes"),
                      (dict(flight=2, steps="1:2"), "not both"), (dict(steps="x"), "steps must look like")):
        with pytest.raises(UsageError, match=said):
            api.RecordOptions(**bad)


@pytest.mark.parametrize("asks, said", [
    (dict(timing="bogus", cmd=["true"]), "--timing must be live, virtual or none, not 'bogus'"),
    (dict(cmd=["true"], run_recorded_command=True), "give either -- CMD or --run-recorded-command, not both"),
    (dict(from_bundle=True, cmd=["true"]), "(--from-bundle) runs no command"),
    (dict(from_bundle=True, launcher=True), "(--from-bundle) runs no command"),
    (dict(cmd=["true"], comm_scale=0), "comm_scale must be positive, not 0"),
    (dict(cmd=["true"], slow_rank="1:0"), "slow_rank factor for rank 1 must be positive"),
    (dict(cmd=["true"], slow_rank="1"), "slow_rank must look like R:F"),
])
def test_a_replay_request_is_checked_once_where_it_is_made(asks, said):
    """What `replay` refuses before reading the bundle, refused by the request itself:
    the library and the command line say the same."""
    with pytest.raises(UsageError) as caught:
        api.ReplayRequest(bundle=GOLDEN, **asks)
    assert said in str(caught.value)
    with pytest.raises(UsageError, match=re.escape(str(caught.value))):
        api.replay(GOLDEN, **asks)


def test_the_command_line_refuses_a_replay_as_the_request_does():
    from cli_helpers import run_cli

    got = run_cli("replay", GOLDEN, "--timing", "bogus", "--", "true")
    assert got.returncode == 2 and got.stderr == "prism-rr: error: --timing must be live, virtual or none, not 'bogus'\n"


def test_a_replay_request_of_the_recorded_command():
    request = api.ReplayRequest(bundle=GOLDEN, ranks="0,1", slow_rank={2: 3})
    assert request.names_no_program and not request.run_recorded_command and request.slow_rank == ((2, 3.0),)
    assert request.agreed().run_recorded_command and request.agreed().slow_rank == request.slow_rank
    assert not api.ReplayRequest(bundle=GOLDEN, from_bundle=True).names_no_program
    assert api.ReplayRequest.of(GOLDEN, {"cmd": ["x"]}).cmd == ("x",)
    with pytest.raises(TypeError):
        api.ReplayRequest.of(request, {"timing": "none"})


def test_analysis_output_of_one_attempt_and_of_all(monkeypatch):
    one = "".join(api.analysis_output(GOLDEN, as_json=True))
    assert one.endswith("\n") and json.loads(one) == json.loads("".join(api.analysis_json_text(api.analyze(GOLDEN))))
    text = "".join(api.analysis_output(GOLDEN, steps="0:1"))
    assert text == "".join(line + "\n" for line in api.analysis_lines(api.analyze(GOLDEN, steps="0:1")))
    monkeypatch.setattr(api, "attempts_of", lambda bundle: [0, 0])  # a restarted job's two attempts
    both = json.loads("".join(api.analysis_output(GOLDEN, as_json=True, attempt="all")))
    assert both == {"attempts": [{"attempt": 0, "analysis": json.loads(one)}] * 2}
    text = "".join(api.analysis_output(GOLDEN, steps="0:1", attempt="all"))
    assert text.startswith("attempt 0\nstep 0: ") and "\n\nattempt 0\nstep 0: " in text and text.endswith("\n")
    with pytest.raises(UsageError, match="--attempt takes an attempt's number or all, not 'x'"):
        list(api.analysis_output(GOLDEN, attempt="x"))


class _Terminal(io.StringIO):
    def isatty(self):
        return True


def test_progress_is_a_bar_on_a_terminal_and_quiet_elsewhere(monkeypatch):
    from prism_rr import cli

    monkeypatch.setattr(sys, "stderr", io.StringIO())
    with cli._progress("packing ranks") as progress:
        assert progress is None
    terminal = _Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    with cli._progress("packing ranks") as progress:
        for done in range(1, 4):
            progress(done, 3)
    drawn = terminal.getvalue()
    assert "packing ranks" in drawn and "3/3" in drawn and "ranks/s" in drawn
    terminal.truncate(0)
    with cli._progress("packing ranks"):
        pass  # no work reported: nothing drawn
    assert terminal.getvalue() == ""
