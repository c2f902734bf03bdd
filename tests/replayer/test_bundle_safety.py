"""`replay` runs only the command the user gives or confirms, passes on only harmless names
of a bundle's environment, and a replay that ends early says so and fails."""

from __future__ import annotations

import json
import os
import pty
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from prism_rr.errors import FormatError, UsageError
from prism_rr.format.blobs import blob_path
from prism_rr.replayer import replay
from prism_rr.replayer._environment import replay_env
from prism_rr.replayer._fidelity import card
from replay_helpers import record
from test_no_code_from_bundles import crafted_bundle

REFUSAL = "replay runs the command a bundle names only when asked"


@pytest.fixture(scope="module")
def crafted(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("crafted")
    bundle, _, marker = crafted_bundle(tmp)
    user = tmp / "user"
    user.mkdir()
    return bundle, marker, user


def _cli(user: Path, *args, stdin=subprocess.DEVNULL, env=None, timeout=90):
    return subprocess.run([sys.executable, "-m", "prism_rr.cli", *map(str, args)], cwd=user, stdin=stdin,
                          capture_output=True, text=True, timeout=timeout, env=env)


def test_library_runs_the_recorded_command_only_when_asked(crafted):
    bundle, marker, _ = crafted
    with pytest.raises(UsageError, match="only when asked"):
        replay(bundle, ranks=(0,), timeout=30)
    with pytest.raises(UsageError, match="not both"):
        replay(bundle, ranks=(0,), cmd=["true"], run_recorded_command=True, timeout=30)
    assert not marker.exists()


def test_the_api_asks_before_it_runs_the_recorded_command(crafted):
    """api.replay hands the recorded command's lines to the caller's consent first, and runs
    nothing when it says no (what `prism-rr replay` asks on a terminal)."""
    from prism_rr import api

    bundle, marker, _ = crafted
    seen = []
    with pytest.raises(UsageError, match="only when asked"):
        api.replay(bundle, ranks="0", timeout=30, consent=lambda lines, asked: seen.append((lines, asked)) or False)
    assert len(seen) == 1 and seen[0][1] is False and "names this command for rank 0" in "\n".join(seen[0][0])
    assert not marker.exists()


@pytest.mark.timeout(60)
def test_without_a_terminal_replay_stops_with_one_line(crafted):
    bundle, marker, user = crafted
    out = _cli(user, "replay", bundle, "--ranks", "0")
    assert out.returncode == 2 and not marker.exists()
    assert out.stderr.count("\n") == 1 and REFUSAL in out.stderr
    assert "-- python train.py" in out.stderr and "--run-recorded-command" in out.stderr
    both = _cli(user, "replay", bundle, "--run-recorded-command", "--", sys.executable, "-c", "pass")
    assert both.returncode == 2 and "not both" in both.stderr and not marker.exists()


def _on_a_terminal(user: Path, bundle: Path, answer: bytes):
    """`prism-rr replay bundle --ranks 0` with a terminal on stdin that answers `answer`."""
    master, slave = pty.openpty()
    try:
        proc = subprocess.Popen([sys.executable, "-m", "prism_rr.cli", "replay", str(bundle), "--ranks", "0",
                                 "--timeout", "60"],
                                cwd=user, stdin=slave, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        os.write(master, answer)  # the terminal keeps the line until the prompt reads it
        out, err = proc.communicate(timeout=90)
    finally:
        os.close(slave)
        os.close(master)
    return proc.returncode, err.decode()


@pytest.mark.timeout(120)
def test_a_terminal_shows_the_command_and_asks(crafted):
    bundle, marker, user = crafted
    code, err = _on_a_terminal(user, bundle, b"n\n")
    assert code == 2 and not marker.exists(), err
    assert "run it? [y/N]" in err and REFUSAL in err
    assert f"in {bundle.parent / 'evil'}" in err  # the recorded working directory, shown
    assert "pathlib.Path" in err and "\\x1b[8m" in err and "\x1b" not in err  # escapes shown, not sent

    code, err = _on_a_terminal(user, bundle, b"y\n")
    assert marker.exists(), err  # asked and confirmed: the recorded command ran
    marker.unlink()
    assert code == 6 and "stopped early: rank 0 ended before the end of step 0, the recording's first (before the first of" in err  # it made no calls


@pytest.mark.timeout(120)
@pytest.mark.parametrize("flag", ["--run-recorded-command", "--yes"])
def test_run_recorded_command_shows_it_and_runs_it(crafted, flag):
    bundle, marker, user = crafted
    out = _cli(user, "replay", bundle, "--ranks", "0", flag, "--timeout", "60")
    try:
        assert marker.exists(), out.stderr
        assert "names this command for rank 0" in out.stderr and "run it?" not in out.stderr
        assert out.returncode == 6 and "diverged: no" not in out.stderr
    finally:
        marker.unlink(missing_ok=True)


DUMP = "import json, os, sys; json.dump({'env': dict(os.environ), 'cwd': os.getcwd()}, open(sys.argv[1], 'w'))"


@pytest.mark.timeout(120)
def test_only_allow_listed_environment_reaches_the_replayed_rank(crafted, tmp_path):
    bundle, marker, user = crafted
    evil = str(bundle.parent / "evil")
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "NCCL_ALGO")}
    dump = tmp_path / "env.json"
    out = _cli(user, "replay", bundle, "--ranks", "0", "--timeout", "60", "--", sys.executable, "-c", DUMP, dump,
               env=env)
    assert out.returncode == 6, out.stderr  # the program made none of the recorded calls
    seen = json.loads(dump.read_text())
    child = seen["env"]
    assert seen["cwd"] == str(user)  # the user's directory, not the recorded one
    assert child["OMP_NUM_THREADS"] == "3" and child["NCCL_ALGO"] == "Ring"  # allow-listed
    for name in ("LD_PRELOAD", "LD_LIBRARY_PATH", "NCCL_NET_PLUGIN", "BASH_ENV", "PYTHONSTARTUP",
                 "PYTHONHOME", "NCCL_PROTO"):
        assert name not in child or evil not in child[name] and "touch" not in child[name], name
    for name in ("PATH", "PYTHONPATH"):
        assert evil not in child.get(name, ""), name
    assert json.loads(child["PRISM_RR_REPLAY"])["bundle"] == str(bundle)  # ours, not the bundle's
    assert not marker.exists() and "libevil" not in out.stderr


def test_replay_env_keeps_only_harmless_names_and_values():
    info = {"env": {"OMP_NUM_THREADS": "8", "MKL_NUM_THREADS": "8; rm -rf /", "NCCL_ALGO": "^NVLS",
                    "NCCL_IB_DISABLE": "2", "PYTHONPATH": "/x", "LD_PRELOAD": "/x.so", "PATH": "/x",
                    "NCCL_PROTO": "/tmp/x", "TORCH_NCCL_DEBUG_INFO_TEMP_FILE": "/tmp/x", 3: "1",
                    "NCCL_MAX_NCHANNELS": 4}}
    assert replay_env(info) == {"OMP_NUM_THREADS": "8", "NCCL_ALGO": "^NVLS"}
    assert replay_env({"env": ["PATH=/x"]}) == {} and replay_env(None) == {}


def test_blob_ids_from_a_bundle_never_leave_the_blob_directory(tmp_path):
    for ident in (bytes(range(16)), b"../../etc/passwd"):  # 16 bytes whatever they hold: 32 hex digits
        path = blob_path(tmp_path, ident)
        assert path.parent.parent == tmp_path / "blobs" and path.name == f"{ident.hex()}.zst"
    for bad in ("../../../etc/passwd", "0" * 32, bytes(15), bytes(17), 7, None, bytearray(16), ["a"], 1.5):
        with pytest.raises(FormatError):
            blob_path(tmp_path, bad)


def _report(**kw) -> dict:
    rep = {"ranks": [0], "world_size": 4, "timing": "live", "steps": [{"step": 1}], "scored_steps": [1],
           "iteration_time_error_pct": None, "compute_ratio": None, "peak_memory_recorded_bytes": None,
           "peak_memory_replayed_bytes": None, "peak_memory_error_pct": None, "synthetic_numerics": False,
           "first_divergence": None}
    rep.update(kw)
    return rep


def test_card_never_says_all_went_well_when_a_rank_failed():
    assert card(_report()).endswith("diverged: no")
    failed = card(_report(stopped_early=[{"rank": 0, "exit_code": 1, "calls": 37, "recorded_calls": 60,
                                          "step": 2, "recorded_last_step": 19, "complete": False}]))
    assert "diverged: no" not in failed
    assert "stopped early: rank 0 exited with code 1 after 37 of 60 recorded calls, in step 2" in failed
    killed = card(_report(stopped_early=[{"rank": 0, "exit_code": -9, "calls": None, "recorded_calls": 60,
                                          "complete": False}]))
    assert "rank 0 was ended by signal 9 (how far it got is not known)" in killed
    late = card(_report(stopped_early=[{"rank": 0, "exit_code": 1, "calls": 60, "recorded_calls": 60,
                                        "step": 20, "recorded_last_step": 19, "complete": True}]))
    assert "failed: rank 0 exited with code 1 after 60 of 60" in late and "diverged: no" not in late


# --- a replay that ends early, on a real recording of 20 steps --------------------------

TRAIN = textwrap.dedent("""
    import os, sys, torch, torch.distributed as dist
    args = dict(zip(sys.argv[1::2], sys.argv[2::2]))
    torch.set_num_threads(1)
    if "--world" in args:
        dist.init_process_group("gloo", world_size=int(args["--world"]), rank=int(os.environ["RANK"]))
    else:
        dist.init_process_group("gloo")
    rank = dist.get_rank()
    p = torch.nn.Parameter(torch.zeros(4))
    opt = torch.optim.SGD([p], lr=0.1)
    for step in range(20):
        x = torch.ones(4) * (rank + step)
        dist.all_reduce(x)
        p.grad = x.clone()
        opt.step()
        if step == int(args.get("--fail-at", -1)):
            raise RuntimeError("the program's own error")
    dist.barrier()
    dist.destroy_process_group()
""")


@pytest.fixture(scope="module")
def twenty_steps(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("twenty")
    script = tmp / "train.py"
    script.write_text(TRAIN)
    return record(tmp, [script], 2, payload="digest"), script


@pytest.mark.timeout(200)
def test_a_program_that_makes_no_calls_fails_and_says_so(twenty_steps, tmp_path):
    bundle, script = twenty_steps
    out = _cli(tmp_path, "replay", bundle, "--ranks", "0", "--timeout", "60", "--", sys.executable, "-c", "pass")
    assert out.returncode == 6, out.stderr
    assert "stopped early: rank 0 ended before the end of step 0, the recording's first (before the first of 21 recorded calls)" in out.stderr
    assert "diverged: no" not in out.stderr

    whole = _cli(tmp_path, "replay", bundle, "--ranks", "0", "--timeout", "60", "--", sys.executable, script)
    assert whole.returncode == 0, whole.stderr
    assert "steps 20" in whole.stderr and "diverged: no" in whole.stderr and "stopped early" not in whole.stderr


@pytest.mark.timeout(120)
def test_a_program_that_stops_with_an_error_says_how_far_it_got(twenty_steps, tmp_path):
    bundle, script = twenty_steps
    out = _cli(tmp_path, "replay", bundle, "--ranks", "0", "--timeout", "60", "--", sys.executable, script,
               "--fail-at", "7")
    assert out.returncode == 1, out.stderr
    assert "the program's own error" in out.stderr  # its traceback is its own
    assert "stopped early: rank 0 exited with code 1 after 8 of 21 recorded calls, in step 8" in out.stderr
    assert "diverged: no" not in out.stderr


@pytest.mark.timeout(120)
@pytest.mark.parametrize("how", ["env", "argument"])
def test_a_world_size_mismatch_is_one_line(twenty_steps, tmp_path, how):
    bundle, script = twenty_steps
    cmd = (["env", "WORLD_SIZE=3", sys.executable, script] if how == "env"
           else [sys.executable, script, "--world", "3"])  # init_process_group(world_size=3)
    out = _cli(tmp_path, "replay", bundle, "--ranks", "0,1", "--timeout", "60", "--", *cmd)
    assert out.returncode == 2, out.stderr
    assert out.stderr == "prism-rr: error: the program made a world of 3; the recording has 2\n"
