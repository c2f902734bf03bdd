"""The suite's warm start (tests/warm/server.py): a program forked from the warm interpreter
sees what it would see started cold, and its stand-in (the process the test holds) ends as
it ends. If the warm start quietly stopped working, the suite would only get slow again:
`test_a_script_is_forked_warm` says so instead."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

PROBE = """
import json, os, sys, warnings
import torch
out = {
    "name": __name__, "file": __file__, "argv": sys.argv, "orig_argv": sys.orig_argv[1:],
    "path0": sys.path[0], "cwd": os.getcwd(), "var": os.environ.get("PROBE_VAR"),
    "threads": torch.get_num_threads(), "warnoptions": sys.warnoptions,
    "ignores_user_warnings": any(f[0] == "ignore" and f[2] is UserWarning for f in warnings.filters),
    "stdin": sys.stdin.read(), "parent": os.getppid(), "pid": os.getpid(), "pgid_is_pid": os.getpgid(0) == os.getpid(),
}
print(json.dumps(out), flush=True)
how = sys.argv[1]
if how == "raise":
    raise ValueError("as a program fails")
if how == "exit":
    sys.exit(7)
if how == "kill":
    os.kill(os.getpid(), 9)
if how == "wait":
    import signal, time
    signal.signal(signal.SIGTERM, lambda s, f: sys.exit(3))
    print("waiting", flush=True)
    time.sleep(60)
"""


@pytest.fixture
def probe(tmp_path, warm_start):
    if warm_start is None:
        pytest.skip("PRISM_RR_TEST_COLD is set: nothing starts warm")
    deadline = time.monotonic() + 120
    while not Path(warm_start).exists():  # the server imports torch first
        assert time.monotonic() < deadline, "the warm server never listened"
        time.sleep(0.2)
    path = tmp_path / "probe.py"
    path.write_text(PROBE)
    return path


def _run(probe: Path, how: str, *, warm: bool, **kwargs) -> subprocess.CompletedProcess:
    env = dict(os.environ, PROBE_VAR="seen", OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore::UserWarning")
    if not warm:
        env.pop("PRISM_RR_TEST_WARM")
    return subprocess.run([sys.executable, "-u", str(probe), how], env=env, cwd=probe.parent, input="from stdin",
                          capture_output=True, text=True, timeout=120, **kwargs)


def test_a_script_is_forked_warm(probe):
    """The program's parent is the server, not the stand-in the test started."""
    proc = subprocess.Popen([sys.executable, str(probe), "ok"], stdout=subprocess.PIPE, stdin=subprocess.DEVNULL,
                            text=True)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0
    assert json.loads(out)["parent"] != proc.pid


@pytest.mark.parametrize("argv", [["-m", "prism_rr.cli", "--version"], [str(Path(sys.executable).with_name("prism-rr")),
                                                                     "--version"]],
                         ids=["-m prism_rr.cli", "prism-rr"])
def test_the_cli_is_forked_warm(probe, tmp_path, argv):
    """prism-rr's commands, a few hundred in a run, start warm too, and print what they would."""
    trace = tmp_path / "trace"
    env = dict(os.environ, PRISM_RR_TEST_WARM_TRACE=str(trace))
    warm = subprocess.run([sys.executable, *argv], env=env, capture_output=True, text=True, timeout=120)
    env.pop("PRISM_RR_TEST_WARM")
    cold = subprocess.run([sys.executable, *argv], env=env, capture_output=True, text=True, timeout=120)
    assert (warm.returncode, warm.stdout, warm.stderr) == (cold.returncode, cold.stdout, cold.stderr) == (0, warm.stdout, "")
    assert trace.read_text().split()[0] == "warm", trace.read_text()


@pytest.mark.parametrize("how,code", [("ok", 0), ("exit", 7), ("raise", 1), ("kill", -9)])
def test_a_warm_program_sees_and_ends_as_a_cold_one(probe, how, code):
    cold, warm = _run(probe, how, warm=False), _run(probe, how, warm=True)
    assert (cold.returncode, warm.returncode) == (code, code)
    seen = {}
    for run in (cold, warm):
        out = json.loads(run.stdout.splitlines()[0])
        out.pop("parent"), out.pop("pid")
        seen[run is warm] = out
    assert seen[True] == seen[False]
    assert seen[True]["name"] == "__main__" and seen[True]["threads"] == 1 and seen[True]["stdin"] == "from stdin"
    assert cold.stderr == warm.stderr  # the traceback: the program's frames only


@pytest.mark.parametrize("sig,code", [(signal.SIGTERM, 3), (signal.SIGKILL, -9)])
def test_a_signal_to_the_stand_in_reaches_the_program(probe, sig, code):
    """SIGTERM reaches the program's handler; a stand-in SIGKILLed takes the program with it."""
    proc = subprocess.Popen([sys.executable, "-u", str(probe), "wait"], stdout=subprocess.PIPE,
                            stdin=subprocess.DEVNULL, text=True, start_new_session=True)
    try:
        program = json.loads(proc.stdout.readline())["pid"]
        assert program != proc.pid
        assert proc.stdout.readline() == "waiting\n"
        os.killpg(proc.pid, sig)
        assert proc.wait(timeout=30) == code
        deadline = time.monotonic() + 30
        while Path(f"/proc/{program}").exists() and "Z" not in _state(program):
            assert time.monotonic() < deadline, f"the program ({program}) outlived its stand-in"
            time.sleep(0.05)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return "gone"


SPAWNER = """
import json, multiprocessing as mp, os, sys


def work(q, x):
    q.put((x * 2, __name__, sys.argv[1:], os.environ.get("PROBE_VAR")))


if __name__ == "__main__":
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    procs = [ctx.Process(target=work, args=(q, i)) for i in range(2)]
    for p in procs:
        p.start()
    got = sorted(q.get(timeout=60) for _ in procs)
    for p in procs:
        p.join(60)
    print(json.dumps({"got": got, "codes": [p.exitcode for p in procs]}))
"""


def test_a_spawned_child_starts_warm_with_what_its_parent_passed_it(probe, tmp_path):
    """multiprocessing's spawn start method (torch's MultiProcessTestCase, a process pool):
    each child starts warm, with the pipe, resource tracker and queue its parent passed at
    their numbers, and does what it does cold."""
    script = tmp_path / "spawner.py"
    script.write_text(SPAWNER)
    trace = tmp_path / "trace"
    env = dict(os.environ, PRISM_RR_TEST_WARM_TRACE=str(trace), PROBE_VAR="seen")
    warm = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=120)
    env.pop("PRISM_RR_TEST_WARM")
    cold = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=120)
    assert warm.returncode == cold.returncode == 0, warm.stderr[-3000:]
    expected = {"got": [[0, "__mp_main__", [], "seen"],
                        [2, "__mp_main__", [], "seen"]], "codes": [0, 0]}
    assert json.loads(warm.stdout) == json.loads(cold.stdout) == expected
    assert warm.stderr == cold.stderr == ""
    assert sum(line.startswith("warm") and "'spawn'" in line for line in trace.read_text().splitlines()) == 2
