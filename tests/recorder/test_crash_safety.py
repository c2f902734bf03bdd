"""A rank that dies hard (SIGKILL, SIGABRT, SIGSEGV, os._exit) loses no call it entered.

Every call is written to the rank's call log, a file mapped into memory, before the backend
is entered: the kernel keeps it whatever ends the process. Each check holds a dead rank's
bundle against its peer's: every call the peer completed before the death needs the dead
rank to have entered it, so it must be in the dead rank's records, completed or open.
"""

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from prism_rr.format import open_bundle, pack, verify
from prism_rr.format.records import Collective
from prism_rr.localrun import free_port, rank_env
from prism_rr.recorder import RecordOptions
from prism_rr.recorder.launch import hook_env, spool_dir_for

from recorder_helpers import SCRIPTS, finish, start_ranks

WORLD = 2
# Kills per signal: each is a fresh pair of ranks. 3 by default, their moments spread over
# the loop (one random moment in each third of it); PRISM_RR_KILLS=30 for a soak run.
KILLS = int(os.environ.get("PRISM_RR_KILLS", "3"))


def _kill_delays(n: int, span_s: float) -> list[float]:
    """`n` random moments in [0, span_s), one in each of n equal slices, shuffled."""
    rng = random.Random(int(os.environ.get("PRISM_RR_SEED", "0")) or None)
    delays = [span_s * (i + rng.random()) / n for i in range(n)]
    rng.shuffle(delays)
    return delays


def _start(workdir, mode, **options):
    workdir.mkdir(parents=True, exist_ok=True)
    return start_ranks(workdir, "crashy.py", mode, WORLD, "crash", **options)


def _calls(out):
    pack(spool_dir_for(out), out)
    return _read(out)


def _read(out):
    with open_bundle(out) as b:
        calls = {r: [e for e in b.events(r) if type(e) is Collective] for r in b.recorded_ranks}
        info = {r: b.rank_info(r) for r in b.recorded_ranks}
    return calls, info


def _lost(calls, dead, death_ns):
    """The survivor's calls completed before the death that the dead rank's records lack,
    as (seq, age at death in ns)."""
    have = {(c.group, c.seq) for c in calls[dead]}
    return [(c.seq, death_ns - c.end_ns) for c in calls[1 - dead]
            if c.end_ns is not None and c.end_ns < death_ns and (c.group, c.seq) not in have]


def _kill_once(workdir, delay_s, mode="loop", sig=signal.SIGKILL, **options):
    out, procs = _start(workdir, mode, **options)
    ready = [workdir / f"ready-{r}" for r in range(WORLD)]
    deadline = time.monotonic() + 60
    while not all(p.exists() for p in ready):
        if time.monotonic() > deadline or any(p.poll() is not None for p in procs):
            finish(procs, 1)
            pytest.fail("ranks never reached their loop: " + (workdir / "rank1.log").read_text()[-2000:])
        time.sleep(0.02)
    time.sleep(delay_s)
    death = time.monotonic_ns()  # CLOCK_MONOTONIC, as the ranks' records
    procs[1].send_signal(sig)
    # The survivor, stuck in a call its dead peer never joins, would wait out gloo's
    # timeout: SIGTERM ends it sooner, its recorder flushing every call it made first.
    time.sleep(0.5)
    procs[0].send_signal(signal.SIGTERM)
    codes = finish(procs, 8)
    assert codes[1] == -sig, (codes, (workdir / "rank1.log").read_text()[-2000:])
    calls, _ = _calls(out)
    return calls, death, out


@pytest.mark.timeout(60 + 20 * KILLS)
@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGABRT, signal.SIGSEGV], ids=lambda s: s.name)
def test_a_rank_killed_at_a_random_moment_loses_no_call(tmp_path, sig):
    report = []
    for i, delay in enumerate(_kill_delays(KILLS, 0.6)):
        calls, death, out = _kill_once(tmp_path / f"kill{i}", delay, sig=sig)
        with open_bundle(out) as b:
            verify(b)
        lost = _lost(calls, 1, death)
        assert not lost, f"kill {i} at +{delay:.3f}s: calls the peer completed are missing: {lost}"
        survivor = [c for c in calls[0] if c.end_ns is not None and c.end_ns < death]
        assert len(survivor) > 10  # the loop ran
        last = max((c.start_ns for c in calls[1]), default=None)
        report.append((len(calls[1]), sum(c.end_ns is None for c in calls[1]),
                       "-" if last is None else "%.2f" % ((death - last) / 1e6)))
    print(f"\n{sig.name} at random moments: rank 1's calls, of them open, last entered before the signal (ms):")
    for row in report:
        print("  %d  %d  %s" % row)


@pytest.mark.timeout(90)
def test_os_exit_inside_a_collective_leaves_that_call(crashy_runs):
    """Rank 1 waits in an all_reduce its peer comes to late, and a thread of its own ends
    the process with os._exit (no handler, no atexit): the call it was in is on disk, open,
    with its shapes and stack."""
    run = crashy_runs("exit")
    assert run.codes[1] == 7, (run.codes, run.log(1))
    calls, _ = _read(run.bundle)
    with open_bundle(run.bundle) as b:
        verify(b)
    dying = [c for c in calls[1] if c.in_shapes == ((7,),)]
    assert len(dying) == 1, calls[1]
    (c,) = dying
    assert c.end_ns is None and c.step == 2 and c.stack and c.stack[0].startswith("crashy.py:")
    before = {(x.group, x.seq) for x in calls[0] if x.seq < c.seq}
    assert before <= {(x.group, x.seq) for x in calls[1]}


@pytest.mark.timeout(60 + 40 * max(2, KILLS // 3))
def test_sigkill_during_full_payload_leaves_a_whole_bundle(tmp_path):
    """With `--payload full`, 8 MiB payloads are compressed beside the program and a record
    names them as the call happens: a rank killed meanwhile leaves a bundle that verifies,
    every call there, a payload still being written said lost (payload_lost), never named
    without its blob."""
    from prism_rr.format.records import Marker

    report = []
    for i, delay in enumerate(_kill_delays(max(2, KILLS // 2), 0.5)):
        calls, death, out = _kill_once(tmp_path / f"kill{i}", delay, "bigloop", payload="full")
        with open_bundle(out) as b:
            verify(b)  # raises on a record whose blob is missing
            big = [c for c in calls[1] if c.in_bytes == 8 << 20 and c.end_ns is not None]
            lost_payloads = {m.value for m in b.events(1) if type(m) is Marker and m.name == "payload_lost"}
            assert big and all(c.blob_out or c.seq in lost_payloads for c in big)
            kept = [c for c in big if c.blob_out]
            assert kept and len(kept) >= len(big) - 2  # at most the last ones were still being written
            for c in kept[-2:]:
                assert len(b.blob(c.blob_out[0], expected=8 << 20)) == 8 << 20
        lost = _lost(calls, 1, death)
        assert not lost, f"kill {i} at +{delay:.3f}s: calls the peer completed are missing: {lost}"
        report.append((len(big), len(big) - len(kept)))
    print(f"\nfull payload, {len(report)} kills: (8 MiB calls completed, of them payload lost): {report}")


@pytest.mark.timeout(90)
@pytest.mark.parametrize("mode,sig", [("abort", signal.SIGABRT), ("segv", signal.SIGSEGV)])
def test_abort_and_segfault_keep_records_and_the_stack(crashy_runs, mode, sig):
    # The session's run of crashy.py MODE (conftest.crashy_runs), which
    # tests/analysis/test_diagnose_crashes.py diagnoses too.
    run = crashy_runs(mode)
    codes = run.codes
    # gloo aborts the rank that finds the sizes differ (either); the segfault is rank 1's
    assert -sig in codes, (codes, run.log(1))
    dead = codes.index(-sig)
    calls, info = _read(run.bundle)
    # the death is after the 300 ms sleep that follows step 2's all_reduces; the dead
    # rank's records hold every call before it (the survivor's are the reference)
    before = [c for c in calls[1 - dead] if c.step < 2 or (c.step == 2 and c.seq < 6)]
    assert before and all(c.end_ns is not None for c in before)
    have = {(c.group, c.seq) for c in calls[dead]}
    assert {(c.group, c.seq) for c in before} <= have
    if mode == "abort":  # the call gloo aborted it in, with the shapes it passed
        mine = ((5,),) if dead == WORLD - 1 else ((3,),)
        died_in = [c for c in calls[dead] if c.step == 2 and c.seq == 8 and c.end_ns is None]
        assert [c.in_shapes for c in died_in] == [mine], calls[dead]
    crash = info[dead].get("crash")
    assert crash and type(crash["text"]) is str
    name = {signal.SIGABRT: "Aborted", signal.SIGSEGV: "Segmentation fault"}[sig]
    assert name in crash["text"] and "crashy.py" in crash["text"]
    assert "crash" not in info[1 - dead]


def _wait_gone(pid: int, limit: float = 10.0) -> None:
    """Until process `pid` is gone (or a zombie)."""
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            return
        if state in ("Z", "X"):
            return
        time.sleep(0.01)
    pytest.fail(f"process {pid} still runs {limit} s after its SIGKILL")


@pytest.mark.timeout(90)
def test_sigkilled_rank_shows_the_call_it_was_in(tmp_path):
    """Rank 0 waits in an all_reduce rank 1 never joins and is killed there: its bundle
    still holds the call, open."""
    out = tmp_path / "run.prism"
    env = dict(os.environ, PYTHONWARNINGS="ignore", OMP_NUM_THREADS="1")
    env.update(hook_env(RecordOptions.make(spool_dir_for(out))))
    port = free_port()
    procs = [subprocess.Popen([sys.executable, str(SCRIPTS / "hang.py"), "hang", str(tmp_path)],
                              env=dict(env, **rank_env(r, WORLD, port, "hang")), stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL, start_new_session=True) for r in range(WORLD)]
    deadline = time.monotonic() + 60
    while not all((tmp_path / f"stuck-{r}").exists() for r in range(WORLD)):
        if time.monotonic() > deadline:
            finish(procs, 0.1)
            pytest.fail("ranks never reached the planted hang")
        time.sleep(0.05)
    time.sleep(0.3)  # rank 0 is in the all_reduce: for longer than 100 ms
    procs[0].send_signal(signal.SIGKILL)
    # rank 1 only once rank 0's program is gone: forked warm (tests/warm), it outlives the
    # process the test holds by the moment the warm server takes to kill it, and rank 1's end
    # in that moment would end its all_reduce with an error first
    _wait_gone(int((tmp_path / "stuck-0").read_text()))
    procs[1].send_signal(signal.SIGTERM)
    codes = finish(procs, 10)
    assert codes[0] == -signal.SIGKILL
    calls, _ = _calls(out)
    last = max(calls[0], key=lambda c: c.seq)
    assert (last.op, last.seq, last.end_ns) == ("all_reduce", 6, None)
    assert last.stack and last.stack[0].startswith("hang.py:")
    assert [c.seq for c in sorted(calls[0], key=lambda c: c.seq)] == list(range(7))


def test_pack_keeps_only_the_last_snapshots_unwritten_calls(tmp_path):
    """Open-call snapshots in a spool of an earlier version: pack keeps the last one's
    calls that no later chunk names, and no earlier snapshot's."""
    from prism_rr.format import layout
    from prism_rr.format.spool import FRAME_OPEN, encode_frame, spool_header, spool_path

    def call(seq, end=None):
        return Collective(start_ns=1000 * (seq + 1), end_ns=end, step=0, op="all_reduce", group=0, seq=seq,
                          in_shapes=((3,),), in_dtypes=("float32",), in_bytes=12)

    frames = [
        encode_frame(layout.FRAME_RANK_INFO, 0, 0, info={"world_size": 1}),
        encode_frame(FRAME_OPEN, 0, 1, records=[call(0)]),
        encode_frame(layout.FRAME_EVENTS, 0, 2, records=[call(0, 5000)]),  # seq 0 completes
        # seq 1 entered, seq 2 seen complete with its record not yet written
        encode_frame(FRAME_OPEN, 0, 3, records=[call(1), call(2, 9000)]),
    ]  # as if the process died here: no record names seq 1 or 2
    spool_path(tmp_path, 0).write_bytes(spool_header(0) + b"".join(frames))
    out = tmp_path / "run.prism"
    pack(tmp_path, out)
    with open_bundle(out) as b:
        got = sorted((c.seq, c.end_ns) for c in b.events(0) if type(c) is Collective)
        assert b.rank_summary(0)["open"] == 1
    assert got == [(0, 5000), (1, None), (2, 9000)]
