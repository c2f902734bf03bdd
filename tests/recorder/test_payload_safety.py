"""`--payload full` on FSDP2 x TP with sequence parallel: no tensor is read off the program's
thread, every run is complete, and the recording replays bit for bit (issue 11, part 1).

FSDP2 frees unsharded parameters with `untyped_storage().resize_(0)` on the program's
thread; a backend thread that read an output after the program's wait() returned raced
that (SIGSEGV, or a compressor shared between threads failing). Each recording here runs
the same small model; `PRISM_SOAK_RUNS=20` makes a soak of it.
"""

import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import torch

from prism_rr.format import open_bundle
from prism_rr.format.records import Collective, Marker, PointToPoint
from prism_rr.recorder import RecordOptions
from prism_rr.recorder._session import Recording

from recorder_helpers import SCRIPTS, Spools

RUNS = int(os.environ.get("PRISM_SOAK_RUNS", "2"))
SCRIPT = SCRIPTS / "fsdp_tp_sp.py"
TRAIN = ["--steps", "3"]
ENV = dict(os.environ, PYTHONWARNINGS="ignore", OMP_NUM_THREADS="1")


def _cli(*args, timeout=150, cwd=None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "prism_rr.cli", *map(str, args)], capture_output=True,
                          text=True, timeout=timeout, env=ENV, cwd=cwd)


def _record(out: Path, save: Path, timeout=150) -> subprocess.CompletedProcess:
    return _cli("record", "-o", out, "--payload", "full", "--nproc", "4", "--timeout", timeout - 30, "--",
                sys.executable, SCRIPT, *TRAIN, "--out", save, timeout=timeout)


def _same_tensors(a_path: Path, b_path: Path) -> list[str]:
    a, b = torch.load(a_path), torch.load(b_path)
    assert a.keys() == b.keys()
    return [k for k in a if not torch.equal(a[k], b[k])]


def _complete(bundle) -> dict[int, int]:
    """Check a full-payload bundle holds every call's payloads; its record count per rank."""
    counts = {}
    for rank in bundle.recorded_ranks:
        n = 0
        for ev in bundle.events(rank):
            n += 1
            assert not (isinstance(ev, Marker) and ev.name in ("payload_lost", "recorder_failed")), (rank, ev)
            if isinstance(ev, Collective):
                assert ev.end_ns is not None, (rank, ev.op, ev.seq)
                ids = [*(ev.blob_in or ()), *(ev.blob_out or ())]
                assert ev.blob_in is not None or not ev.in_shapes, (rank, ev.op, ev.seq)
                assert ev.blob_out is not None or not ev.out_shapes, (rank, ev.op, ev.seq)
            elif isinstance(ev, PointToPoint):
                ids = list(ev.blob or ())
            else:
                continue
            for ident in ids:
                assert bundle.blob(ident) is not None
        counts[rank] = n
    return counts


@pytest.mark.timeout(120 + 60 * RUNS)
def test_fsdp_tp_sp_full_payload_runs_alike_and_replays_bitwise(tmp_path):

    if RUNS > 2:  # a soak also checks the training against a run without the recorder
        plain = subprocess.run([sys.executable, "-m", "prism_rr.localrun", "--nproc", "4", "--timeout", "100",
                                "--", sys.executable, SCRIPT, *TRAIN, "--out", tmp_path / "plain"],
                               capture_output=True, text=True, timeout=120, env=ENV)
        assert plain.returncode == 0, plain.stderr[-3000:]
    counts = []
    for i in range(RUNS):
        out = tmp_path / f"run{i}.prism"
        got = _record(out, tmp_path / f"rec{i}")
        assert got.returncode == 0, f"run {i}: exit {got.returncode}\n{got.stderr[-3000:]}"
        assert "recorder turned itself off" not in got.stderr and "recording stopped" not in got.stderr, got.stderr
        with open_bundle(out) as b:
            facts = b.facts()
            assert facts["recorder_failed_ranks"] == [] and facts["dropped"] == 0 and facts["open_calls"] == 0
            assert b.recorded_ranks == [0, 1, 2, 3]
            counts.append(_complete(b))
        # The training is what it is without the recorder, run after run.
        for r in range(4):
            first = tmp_path / ("plain" if RUNS > 2 else "rec0")
            assert _same_tensors(Path(f"{first}.rank{r}.pt"), tmp_path / f"rec{i}.rank{r}.pt") == [], (i, r)
        if i:
            (tmp_path / f"run{i}.prism").unlink()  # keep a soak's disk use small (record left no spools)
    print(f"{RUNS} runs, record counts per rank: {counts[0]}")
    assert all(c == counts[0] for c in counts), counts

    from prism_rr.replayer import replay

    cmd = [sys.executable, str(SCRIPT), *TRAIN, "--out", str(tmp_path / "rep")]
    result = replay(tmp_path / "run0.prism", ranks=(0,), cmd=cmd, timeout=150, log_dir=tmp_path / "logs")
    err = (tmp_path / "logs" / "rank0.stderr")
    assert result.exit_code == 0, err.read_text()[-3000:] if err.exists() else ""
    assert result.report["diverged"] is False and result.report["synthetic_numerics"] is False
    assert _same_tensors(tmp_path / "rec0.rank0.pt", tmp_path / "rep.rank0.pt") == []


# --- the rule itself, in one process ------------------------------------------------------


def _recording(tmp_path, payload="full") -> Recording:
    rec = Recording(RecordOptions.make(tmp_path / "spools", payload=payload), 0, {"world_size": 1})
    rec.active = True
    return rec


def _enter(rec, op, seq, ins, outs):
    """An async call of the program, entered (as the group enters one)."""
    from prism_rr.intercept.group import Call

    call = Call(op, 0, seq, ins, outs, None, (), async_op=True)
    assert rec.calls.enter(call)
    return call


def _on_thread(fn) -> None:
    t = threading.Thread(target=fn)
    t.start()
    t.join()


@pytest.mark.timeout(30)
@pytest.mark.parametrize("payload", ["full", "digest"])
def test_a_backend_thread_reads_no_tensor(tmp_path, monkeypatch, payload):
    """A completion seen on another thread notes the time only; the program's thread
    writes the record, with the outputs as they are when it does."""
    from prism_rr.intercept import payload as _payload

    rec = _recording(tmp_path, payload)
    calls = rec.calls
    program = threading.get_ident()
    reads = []
    from prism_rr.recorder import _calls

    for module, name in ((_payload, "alive"), (_calls, "_log_payload")):  # every read of a tensor's memory
        real = getattr(module, name)
        monkeypatch.setattr(module, name,
                            lambda *a, _real=real, **k: (reads.append(threading.get_ident()), _real(*a, **k))[1])
    x = torch.arange(8.0)
    out = torch.zeros(8)
    call = _enter(rec, "all_gather_into_tensor", 0, [x], [out])
    calls.issued(call)
    out.copy_(x * 2)  # the backend's result
    _on_thread(lambda: calls.complete(call, backend=True))
    assert call.done and call.out_later and set(reads) == {program}
    calls.reap()  # the next call, step or exit: on the program's thread
    assert not call.out_later and set(reads) == {program}
    rec.close()
    coll = Spools(tmp_path / "spools").collectives(0)
    assert len(coll) == 1 and coll[0].end_ns is not None
    if payload == "full":
        assert coll[0].blob_out is not None
    else:
        assert coll[0].digest_out is not None


@pytest.mark.timeout(30)
def test_a_storage_freed_before_the_record_is_written_is_said_not_read(tmp_path):
    """FSDP2's resize_(0) before the program's thread wrote the record: no payload for
    the call, a `payload_lost` marker, no crash, and the recording goes on."""
    rec = _recording(tmp_path)
    calls = rec.calls
    x = torch.arange(8.0)
    out = torch.zeros(16)
    call = _enter(rec, "all_gather_into_tensor", 0, [x], [out])
    calls.issued(call)
    _on_thread(lambda: calls.complete(call, backend=True))
    out.untyped_storage().resize_(0)
    calls.reap()
    nxt = _enter(rec, "all_reduce", 1, [x], [x])
    calls.issued(nxt)
    calls.complete(nxt)
    rec.close()
    spools = Spools(tmp_path / "spools")
    first, second = spools.collectives(0)
    assert first.blob_out is None and first.blob_in is not None
    assert second.blob_out is not None
    lost = [m for m in spools.of_kind(0, Marker) if m.name == "payload_lost"]
    assert [m.value for m in lost] == [0]
    assert rec.failure is None


@pytest.mark.timeout(30)
def test_a_wait_writes_the_record_a_callback_left(tmp_path):
    """torch wakes waiters before it runs done callbacks: the record of a call is written
    where the program's wait() returns, whichever came first."""
    from prism_rr.recorder._policy import TimedWork

    class Inner:
        def wait(self, timeout=None):
            return True

    rec = _recording(tmp_path)
    calls = rec.calls
    x = torch.ones(4)
    call = _enter(rec, "all_reduce", 0, [x], [x])
    calls.issued(call)
    work = TimedWork(Inner(), calls, call)
    _on_thread(lambda: calls.complete(call, backend=True))
    assert call.out_later
    work.wait()
    assert not call.out_later and not calls.finished
    x.fill_(7.0)  # the program's, once its wait() returned
    rec.close()
    (c,) = Spools(tmp_path / "spools").collectives(0)
    assert c.blob_out is not None and c.blob_out == c.blob_in  # ones, not sevens


# --- a result consumed by C++ only (DDP's reducer), changed in place right after ----------


@pytest.mark.timeout(150)
def test_ddp_bucket_results_are_taken_before_the_program_changes_them(tmp_path):
    """DDP waits for its bucket all_reduce in C++, at the end of backward; with gradients as
    bucket views, clipping then changes the results in place. The payload is what the
    all_reduce produced, and the recording replays bit for bit."""
    from prism_rr.replayer import replay

    script = SCRIPTS / "ddp_inplace.py"
    out = tmp_path / "ddp.prism"
    got = _cli("record", "-o", out, "--payload", "full", "--nproc", "2", "--timeout", 100, "--",
               sys.executable, script, tmp_path / "rec")
    assert got.returncode == 0, got.stderr[-3000:]
    for r in range(2):
        grads = torch.load(tmp_path / f"rec.rank{r}.pt")
        with open_bundle(out) as b:
            buckets = [e for e in b.events(r) if isinstance(e, Collective) and e.op == "all_reduce"
                       and e.out_bytes > 1024]
            assert len(buckets) == len(grads) == 3
            for e, gs in zip(buckets, grads):
                recorded = torch.frombuffer(bytearray(b.blob(e.blob_out[0])), dtype=torch.float32)
                produced = torch.cat([g.reshape(-1) for g in gs])
                assert torch.equal(recorded.sort().values, produced.sort().values), (r, e.seq)
    result = replay(out, ranks=(0,), cmd=[sys.executable, str(script), str(tmp_path / "rep")], timeout=120,
                    log_dir=tmp_path / "logs")
    assert result.exit_code == 0 and result.report["diverged"] is False
    rec, rep = torch.load(tmp_path / "rec.rank0.pt"), torch.load(tmp_path / "rep.rank0.pt")
    assert all(torch.equal(a, b) for ga, gb in zip(rec, rep) for a, b in zip(ga, gb))
