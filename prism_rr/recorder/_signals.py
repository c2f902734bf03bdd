"""Death: SIGTERM/SIGINT flush the spool; other deaths leave what the writer ticked out.

SIGTERM/SIGINT: get the spool onto the disk, then do what the process would have done.

A hung rank sits in C++ (a gloo or NCCL wait) and Python runs its signal handlers only
when the main thread comes back to the interpreter, which a hung rank never does. So a
thread also watches the signal wake-up fd: it flushes the spool, calls still open
included, and where the previous disposition was the default (terminate) it terminates
the process itself once the main thread has had a moment to do so.
"""

from __future__ import annotations

import ctypes
import faulthandler
import os
import signal
import threading
import time

from prism_rr.format.records import Collective, PointToPoint

__all__ = ["crash_path", "install", "on_usr1", "open_records"]

_SIGNALS = (signal.SIGTERM, signal.SIGINT)
_previous: dict[int, object] = {}
_rec = None
_GRACE_S = 1.0


def install(rec) -> None:
    """Install handlers once per process; later recordings reuse them. Also, per
    recording: the spool writer's source of open calls (written every tick, so a rank
    killed with SIGKILL still shows the call it was in) and the crash file."""
    global _rec
    _rec = rec
    try:
        rec.writer.open_calls = lambda: open_records(rec)
        _enable_faulthandler(rec)
    except Exception:  # never let the recorder's own trouble end a training run
        pass
    if _previous or threading.current_thread() is not threading.main_thread():
        return
    for sig in _SIGNALS:
        prev = signal.getsignal(sig)
        if prev is None:  # installed from C: leave it alone
            continue
        _previous[sig] = prev
        signal.signal(sig, _handler)
    _start_watcher()


_usr1 = None  # flight mode: what SIGUSR1 does (a dump of every rank)


def on_usr1(callback) -> None:
    """Flight mode: SIGUSR1 calls `callback` (on a thread of its own: a hung main thread
    never runs a Python handler, so the wake-up fd's watcher calls it too; a dump is
    started once)."""
    global _usr1
    _usr1 = callback
    if threading.current_thread() is not threading.main_thread():
        return
    try:
        if signal.getsignal(signal.SIGUSR1) in (signal.SIG_DFL, signal.SIG_IGN, None):
            signal.signal(signal.SIGUSR1, _usr1_handler)
    except (ValueError, OSError):
        pass


def _usr1_handler(signum, frame):
    _on_usr1()


def _on_usr1() -> None:
    cb = _usr1
    if cb is not None:
        threading.Thread(target=cb, name="prism-rr-flight-usr1", daemon=True).start()


def _flush(reason: str) -> None:
    rec = _rec
    if rec is not None:
        rec.emergency_flush(reason)


def _handler(signum, frame):
    _flush(signal.Signals(signum).name)
    prev = _previous.get(signum, signal.SIG_DFL)
    if callable(prev):
        return prev(signum, frame)
    if prev == signal.SIG_IGN:
        return None
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)
    return None


def _start_watcher() -> None:
    r, w = os.pipe()
    os.set_blocking(w, False)
    try:
        old = signal.set_wakeup_fd(w, warn_on_full_buffer=False)
    except (ValueError, OSError):
        os.close(r)
        os.close(w)
        return
    if old != -1:  # someone (asyncio) owns the wake-up fd: give it back, rely on handlers
        signal.set_wakeup_fd(old)
        os.close(r)
        os.close(w)
        return
    threading.Thread(target=_watch, args=(r,), name="prism-rr-signals", daemon=True).start()


def _watch(fd: int) -> None:
    while True:
        try:
            data = os.read(fd, 64)
        except OSError:
            return
        if not data:
            return
        for signum in data:
            if signum == signal.SIGUSR1:
                _on_usr1()
                continue
            if signum not in _SIGNALS:
                continue
            _flush(signal.Signals(signum).name)
            if _previous.get(signum) == signal.SIG_DFL:
                time.sleep(_GRACE_S)  # the main thread, if alive, has done it by now
                _terminate(signum)


def _terminate(signum: int) -> None:
    """The default action of `signum`, from a thread that cannot call signal.signal."""
    try:
        libc = ctypes.CDLL(None)
        libc.signal.restype = ctypes.c_void_p
        libc.signal.argtypes = (ctypes.c_int, ctypes.c_void_p)
        libc.signal(signum, None)  # SIG_DFL is 0
        os.kill(os.getpid(), signum)
        time.sleep(_GRACE_S)
    finally:
        os._exit(128 + signum)


# --- calls open now, from the spool writer's thread ---------------------------------

SNAPSHOT_MIN_AGE_NS = 25_000_000


def open_records(rec, min_age_ns: int = SNAPSHOT_MIN_AGE_NS) -> list | None:
    """Records of the calls `rec` has open now (end_ns None), and of those a backend
    thread saw complete whose record the program's thread has yet to write (end_ns set,
    no output digests). Runs on the writer thread: reads only what `enter` and
    `complete` computed (never a tensor), under the recording's lock."""
    if not rec.on:
        return None
    # A call younger than this is left to the next tick (50 ms on): one that lasts 100 ms
    # is still in a snapshot in time, and a busy rank's short calls make no snapshots.
    old = time.monotonic_ns() - min_age_ns
    with rec._lock:
        calls = [(c, None) for c in rec.open.values() if not c.done and c.start <= old]
        finished = getattr(rec, "finished", None)
        if finished:
            calls += [(c, getattr(c, "end", None)) for c in finished.values()
                      if not c.written and (getattr(c, "end", None) or 0) <= old]
    out = []
    for call, end in calls:
        in_shapes, in_dtypes, in_bytes = call.in_desc
        mem_alloc, mem_peak = call.mem
        if call.p2p:
            out.append(PointToPoint(
                start_ns=call.start, end_ns=end, step=call.step, op=call.op, group=call.group,
                seq=call.seq, peer=-1 if call.peer is None else call.peer, tag=call.tag,
                shapes=in_shapes, dtypes=in_dtypes, nbytes=in_bytes, async_op=call.async_op,
                issued_ns=call.issued, digest=call.digest_in, blob=call.blob_in,
                mem_alloc=mem_alloc, mem_peak=mem_peak, stack=call.stack))
        else:
            same = call.outs is call.ins  # an identity test: no tensor is read
            out.append(Collective(
                start_ns=call.start, end_ns=end, step=call.step, op=call.op, group=call.group,
                seq=call.seq, in_shapes=in_shapes, in_dtypes=in_dtypes, in_bytes=in_bytes,
                out_shapes=in_shapes if same else (), out_dtypes=in_dtypes if same else (),
                out_bytes=in_bytes if same else 0, reduce_op=call.reduce_op, root=call.root,
                async_op=call.async_op, issued_ns=call.issued, digest_in=call.digest_in,
                blob_in=call.blob_in, mem_alloc=mem_alloc, mem_peak=mem_peak, stack=call.stack))
    return out


# --- crash file ----------------------------------------------------------------------

CRASH_HEADER = "prism-rr crash file: rank {rank}, pid {pid}, main thread 0x{thread:016x}\n"
_crash_file = None  # kept open for the process's life: faulthandler writes to its fd


def crash_path(spool_dir, rank: int):
    from pathlib import Path

    return Path(spool_dir) / f"rank-{rank:05d}.crash"


def _enable_faulthandler(rec) -> None:
    """On SIGSEGV, SIGABRT, SIGBUS, SIGFPE or SIGILL, faulthandler writes every thread's
    Python stack to the rank's crash file, which `pack` carries into the bundle. A
    program (or PYTHONFAULTHANDLER) that enabled faulthandler itself keeps its own file."""
    global _crash_file
    if _crash_file is not None:
        if _crash_file.name == str(crash_path(rec.spool_dir, rec.rank)):
            return
    elif faulthandler.is_enabled():
        return
    f = open(crash_path(rec.spool_dir, rec.rank), "w", encoding="utf-8")
    f.write(CRASH_HEADER.format(rank=rec.rank, pid=os.getpid(), thread=threading.main_thread().ident or 0))
    f.flush()
    faulthandler.enable(file=f, all_threads=True)
    old, _crash_file = _crash_file, f
    if old is not None:
        old.close()
