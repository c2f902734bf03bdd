"""Flight mode in real gloo ranks: nothing written until a trigger, then every rank's
last K steps in one bundle (recorder/_flight.py, format/calllog.py)."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path


from prism_rr.format.reader import open_bundle
from prism_rr.format.records import Collective, Step

from tests.cli_helpers import run_cli

SCRIPT = Path(__file__).parent / "scripts" / "flight.py"
HANG_S = 2.0


def _start_env_mode(tmp_path: Path, mode: str, steps: int, **flight) -> tuple[subprocess.Popen, Path]:
    """The ranks under the environment `record --print-env` prints (for a launcher that
    cannot be wrapped), started by a launcher of their own."""

    out = tmp_path / "run.prism"
    args = ["record", "-o", out, "--print-env", "--flight", flight.pop("flight")]
    for name, value in flight.items():
        args += [f"--{name.replace('_', '-')}", value]
    printed = run_cli(*args)
    assert printed.returncode == 0, printed.stderr
    env = dict(os.environ)
    for line in printed.stdout.splitlines():
        name, _, value = line.removeprefix("export ").partition("=")
        env[name] = subprocess.run(["sh", "-c", f"printf %s {value}"], env=env, capture_output=True,
                                   text=True, check=True).stdout  # as a shell would expand it
    assert json.loads(env["PRISM_RR_RECORD"])["output"] == str(out.resolve())
    cmd = [sys.executable, "-m", "prism_rr.localrun", "--nproc", "2", "--",
           sys.executable, str(SCRIPT), mode, str(tmp_path), str(steps)]
    return subprocess.Popen(cmd, env=env, start_new_session=True), out


def _wait_for(path: Path, proc: subprocess.Popen, limit: float) -> float:
    t0 = time.monotonic()
    while not path.exists():
        if time.monotonic() - t0 > limit:
            _stop(proc)
            raise AssertionError(f"no {path.name} after {limit} s")
        time.sleep(0.1)
    return time.monotonic() - t0


def _stop(proc: subprocess.Popen) -> None:
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
            proc.wait(10)
            return
        except (ProcessLookupError, subprocess.TimeoutExpired):
            continue


def _stuck_since(tmp_path: Path, step: int) -> float:
    """Wait until both ranks reached `step` (rank 1 then hangs or dies); when."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < 120:
        try:
            if all(int((tmp_path / f"step-{r}").read_text() or -1) >= step for r in (0, 1)):
                return time.monotonic()
        except (OSError, ValueError):
            pass
        time.sleep(0.05)
    raise AssertionError("the ranks never reached the planted step")


def test_a_hang_dumps_every_rank_last_steps_within_the_hang_time(tmp_path):
    steps, keep = 12, 3
    proc, out = _start_env_mode(tmp_path, "hang", steps, flight=keep, flight_hang=HANG_S)
    try:
        stuck = _stuck_since(tmp_path, steps - 1)
        spool_dir = tmp_path / "run.prism.d"
        assert sorted(p.suffix for p in spool_dir.iterdir()) == [".crash", ".crash", ".log", ".log"], \
            "flight mode writes nothing but its call logs before a trigger"
        _wait_for(out, proc, 60)
        after = time.monotonic() - stuck
        assert proc.poll() is None  # the job still hangs: the bundle came from the trigger
    finally:
        _stop(proc)
    print(f"bundle {after:.1f} s after the hang began (hang time {HANG_S} s)")
    with open_bundle(out) as b:
        flight = b.manifest["flight"]
        assert flight["trigger"] == "hang" and list(flight["ranks_dumped"]) == [0, 1] and not flight["ranks_missing"]
        assert flight["details"]["op"] == "all_reduce"
        for r in (0, 1):
            recs = list(b.events(r))
            kept = sorted({x.step for x in recs if isinstance(x, Step)})
            assert kept and kept[-1] == steps - 2 and kept[0] >= steps - 1 - keep - 1, kept
            assert 0 not in kept  # older steps went out of the ring
        hung = [x for x in b.events(0) if isinstance(x, Collective) and x.end_ns is None]
        assert hung and hung[0].op == "all_reduce"
    r = run_cli("diagnose", out, "--json")
    findings = json.loads(r.stdout)["findings"]
    hang = [f for f in findings if f["kind"] == "hang"]
    assert hang and list(hang[0]["ranks"]) == [1], findings
    assert run_cli("verify", out).returncode == 0


def _pid(tmp_path: Path, rank: int) -> int:
    t0 = time.monotonic()
    while time.monotonic() - t0 < 60:
        try:
            return int((tmp_path / f"pid-{rank}").read_text())
        except (OSError, ValueError):
            time.sleep(0.05)
    raise AssertionError(f"rank {rank} never started")


def test_a_slow_step_and_sigusr1_to_one_rank_dump_every_rank(tmp_path):
    proc, out = _start_env_mode(tmp_path, "loop", 0, flight=4, flight_slow=5.0)
    try:
        _wait_for(out, proc, 90)  # step 8 takes 1.2 s, the others about 0.1 s
        with open_bundle(out) as b:
            first = b.manifest["flight"]
        # the sleep after the script's 8th optimizer step falls in the recorder's step 9
        assert first["trigger"] == "slow_step" and first["details"]["step"] == 9, first
        assert list(first["ranks_dumped"]) == [0, 1]
        time.sleep(5.5)  # past the cooldown: a new moment
        os.kill(_pid(tmp_path, 1), signal.SIGUSR1)
        second = tmp_path / "run.2.prism"
        _wait_for(second, proc, 30)
        assert proc.poll() is None  # SIGUSR1 does not end the rank
    finally:
        (tmp_path / "stop").touch()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            _stop(proc)
    with open_bundle(second) as b:
        flight = b.manifest["flight"]
        assert flight["trigger"] == "SIGUSR1" and flight["rank"] == 1 and list(flight["ranks_dumped"]) == [0, 1]
        assert b.recorded_ranks == [0, 1]
        steps = {r: {x.step for x in b.events(r) if isinstance(x, Step)} for r in (0, 1)}
        assert steps[0] and min(steps[0]) == min(steps[1]) > 4  # the same last steps on both ranks
    assert proc.returncode == 0
    assert not list((tmp_path / "run.prism.d").glob("*.log"))  # a clean end removes the rings


def test_a_killed_rank_is_read_from_its_ring(tmp_path):
    """SIGKILL leaves no time to dump, and the launcher stops the other ranks at once
    (SIGTERM, which leaves their rings): what `record` does at the end (finish_logs)
    packs every rank's ring as a dump of its own."""
    from prism_rr.recorder._flight import finish_logs

    steps = 8
    proc, out = _start_env_mode(tmp_path, "kill", steps, flight=3, flight_hang=30.0)
    try:
        assert proc.wait(90) != 0
    finally:
        _stop(proc)
    spool_dir = tmp_path / "run.prism.d"
    assert len(list(spool_dir.glob("*.log"))) >= 1  # rank 1's, at least
    # The same rings after a dump that rank 0 began and never wrote (killed while writing
    # it): its number is free, and the rings' dump takes it (it once went to run.2.prism).
    import shutil

    begun = tmp_path / "begun" / "run.prism.d"
    shutil.copytree(spool_dir, begun, ignore=shutil.ignore_patterns("flight-*"))
    (begun / "flight-1").mkdir()
    begun_out = begun.parent / "run.prism"
    assert finish_logs(begun, begun_out, 3, world_size=2) == [begun_out]
    with open_bundle(begun_out) as b:
        assert b.manifest["flight"]["trigger"] == "crash" and 1 in b.manifest["flight"]["ranks_from_ring"]
    # Rank 0 may also be killed (the launcher's SIGKILL after its SIGTERM) with records
    # after its own dump: those rings are then a second moment (run.2.prism).
    assert set(finish_logs(spool_dir, out, 3, world_size=2)) <= {out, tmp_path / "run.2.prism"}
    assert out.exists()
    assert not list(spool_dir.glob("*.log"))
    with open_bundle(out) as b:
        flight = b.manifest["flight"]
        # Rank 0 either was stopped in the all_reduce ("crash": every ring read after the
        # job) or saw gloo's error first and dumped ("exception", rank 1 from its ring).
        assert flight["trigger"] in ("crash", "exception") and 1 in flight["ranks_from_ring"], flight
        assert b.recorded_ranks == [0, 1]
        last = max(x.step for x in b.events(1) if isinstance(x, Step))
        assert last == steps - 2  # rank 1's last whole step, from the ring it left when killed
    r = run_cli("diagnose", out, "--json")
    findings = json.loads(r.stdout)["findings"]
    # rank 1 killed (SIGKILL) while rank 0 waits for it: "killed" where rank 0 left its exit
    # note, a hang where rank 0 was killed too (the launcher's SIGKILL: nobody said a word)
    hang = [f for f in findings if f["kind"] in ("killed", "hang")]
    assert hang and list(hang[0]["ranks"]) == [1] and hang[0]["details"]["op"] == "all_reduce", r.stdout


def test_the_python_api_dumps_at_the_end_when_asked(tmp_path):
    script = tmp_path / "one.py"
    script.write_text(
        "import sys, torch, torch.distributed as dist, prism_rr\n"
        "torch.set_num_threads(1)\n"
        "with prism_rr.record(sys.argv[1], flight=2, flight_at_exit=True):\n"
        "    dist.init_process_group('gloo', rank=0, world_size=1, init_method='tcp://127.0.0.1:' + sys.argv[2])\n"
        "    for step in range(5):\n"
        "        dist.all_reduce(torch.ones(4))\n"
        "        prism_rr.step()\n"
        "    dist.destroy_process_group()\n")
    from prism_rr.localrun import free_port

    out = tmp_path / "api.prism"
    subprocess.run([sys.executable, str(script), str(out), str(free_port())], timeout=120, check=True)
    with open_bundle(out) as b:
        steps = sorted({x.step for x in b.events(0) if isinstance(x, Step)})
    assert steps == [3, 4], steps


def test_record_reports_the_dump_of_an_unhandled_exception(tmp_path):
    out = tmp_path / "run.prism"
    r = run_cli("record", "--flight", 3, "--flight-hang", 20, "--timeout", 120, "-o", out, "--nproc", 2, "--",
                sys.executable, SCRIPT, "raise", tmp_path, 8, timeout=180)
    assert r.returncode == 1, r.stderr  # the program's failure, as without prism-rr
    assert f"flight: wrote {out}: exception on rank 1" in r.stderr, r.stderr
    with open_bundle(out) as b:
        flight = b.manifest["flight"]
        assert flight["trigger"] == "exception" and "planted failure" in flight["details"]["text"]
        assert b.recorded_ranks == [0, 1] and flight["steps_kept"] == 3
    r = run_cli("info", out)
    assert "flight dump     exception on rank 1 at step 7" in r.stdout, r.stdout
    public = tmp_path / "public.prism"
    assert run_cli("redact", out, "-o", public).returncode == 0
    with open_bundle(public) as b:  # what fired stays; the exception's text does not
        assert b.manifest["flight"]["trigger"] == "exception" and "details" not in b.manifest["flight"]


def test_a_rank_ended_before_it_dumped_is_in_the_dump_from_its_ring(tmp_path):
    """Rank 1 raises and dumps; the launcher ends rank 0 (SIGTERM) before rank 0 has seen
    the dump's key: `record` packs the dump with rank 0's calls read from its ring."""
    out = tmp_path / "run.prism"
    r = run_cli("record", "--flight", 3, "--flight-hang", 60, "--timeout", 120, "-o", out, "--nproc", 2, "--",
                sys.executable, SCRIPT, "orphan", tmp_path, 6, timeout=180)
    assert r.returncode == 1, r.stderr
    with open_bundle(out) as b:
        flight = b.manifest["flight"]
        assert flight["trigger"] == "exception" and flight["rank"] == 1, flight
        assert b.recorded_ranks == [0, 1], (b.recorded_ranks, flight)
        assert list(flight["ranks_from_ring"]) == [0], flight  # not dumped: read from its ring
        assert not flight["ranks_missing"], flight
    assert not list((tmp_path / "run.prism.d").glob("rank-*.log"))


def test_runs_without_a_trigger_write_nothing_and_end_cleanly(tmp_path):
    """Flight mode's threads (watchdog, store listener) never outlive the program badly:
    run after run ends as the program does, and leaves nothing but its notes."""
    out = tmp_path / "run.prism"
    for i in range(int(os.environ.get("PRISM_SOAK_RUNS", "2"))):
        r = run_cli("record", "--flight", 4, "-o", out, "--nproc", 2, "--",
                    sys.executable, SCRIPT, "ok", tmp_path, 6, timeout=120)
        assert r.returncode == 0, (i, r.stderr)
        assert "flight: no trigger fired; nothing was written" in r.stderr
        assert not out.exists()
        left = sorted(p.name for p in (tmp_path / "run.prism.d").iterdir())
        assert left == ["rank-00000.crash", "rank-00001.crash", "run.json"], left


def test_a_dump_replays_like_a_window_of_the_run(tmp_path):
    """A dump holds steps from its first step on, as `--steps A:` would: the replay runs
    the program from its start and checks every call the dump holds."""
    out = tmp_path / "run.prism"
    r = run_cli("record", "--flight", 3, "--flight-at-exit", "-o", out, "--nproc", 2, "--",
                sys.executable, SCRIPT, "ok", tmp_path, 7, timeout=120)
    assert r.returncode == 0, r.stderr
    with open_bundle(out) as b:
        assert b.manifest["flight"]["trigger"] == "exit" and list(b.rank_info(0)["steps"]) == [4, None]
    report = tmp_path / "fidelity.json"
    r = run_cli("replay", out, "--ranks", 0, "--report", report, "--timeout", 120, "--",
                sys.executable, SCRIPT, "ok", tmp_path, 7, timeout=180)
    assert r.returncode == 0, r.stderr
    rep = json.loads(report.read_text())
    assert rep["diverged"] is False and [s["step"] for s in rep["steps"]] == [4, 5, 6]


def test_a_new_record_clears_an_earlier_runs_dumps(tmp_path):
    """A dump directory an earlier `record` into the same output left (its bundle deleted,
    say) is not packed again with this run's rings: `record` clears it with the other
    files of an earlier run."""
    from prism_rr.recorder.launch import _clear_old_spools

    spools = tmp_path / "run.prism.d"
    (spools / "flight-1").mkdir(parents=True)
    (spools / "flight-1" / "rank-00001.spool").write_bytes(b"old")
    (spools / "rank-00000.log").write_bytes(b"old")
    (spools / "notes.txt").write_text("the user's")
    _clear_old_spools(spools)
    assert sorted(p.name for p in spools.iterdir()) == ["notes.txt"]


def test_a_job_dead_before_any_dump_is_packed_from_its_logs(tmp_path):
    """The whole job died (SIGKILL) before any trigger: the rings it left are all there is,
    and `record` packs them as a dump of their own (trigger "crash")."""
    from prism_rr.api import _flight_result
    from prism_rr.format.calllog import E_SAME_OUT, CallLog, log_path

    spools = tmp_path / "run.prism.d"
    for rank in (0, 1):
        log = CallLog(log_path(spools, rank), rank, ring_size=1 << 16, persist_size=1 << 16, flight=True)
        log.define(1, ((4,), "float32", 16))
        log.define(2, "all_reduce")
        log.enter(E_SAME_OUT, 100, 90, 0, 0, 0, -1, 0, 1, 0, 0, 2, 0, -1, -1)  # the call it died in
        log._mm.flush()  # (a killed rank's mapping: the page cache keeps it)
    out = tmp_path / "run.prism"
    result = _flight_result(out, spools, -9, [], 3)
    assert list(result.flight) == [out]
    with open_bundle(out) as b:
        assert b.manifest["flight"]["trigger"] == "crash" and b.recorded_ranks == [0, 1]
