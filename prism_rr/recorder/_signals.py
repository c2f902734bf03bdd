"""Death: every record is in the call log already; a signal only says why recording ended.

A rank's records reach its call log, a file mapped into memory, as they happen (format/
calllog.py): whatever kills the process, the kernel keeps them. SIGTERM/SIGINT end the
recording with a `recording_end` marker naming the signal, then do what the process would
have done; SIGSEGV, SIGABRT, SIGBUS, SIGFPE and SIGILL leave every thread's Python stack
in the rank's crash file (faulthandler).

A hung rank sits in C++ (a gloo or NCCL wait) and Python runs its signal handlers only
when the main thread comes back to the interpreter, which a hung rank never does. So a
thread also watches the signal wake-up fd: it ends the recording, and where the previous
disposition was the default (terminate) it terminates the process itself once the main
thread has had a moment to do so.
"""

from __future__ import annotations

import ctypes
import faulthandler
import os
import signal
import threading
import time

from prism_rr.format.names import rank_file

__all__ = ["crash_path", "install", "on_usr1"]

_SIGNALS = (signal.SIGTERM, signal.SIGINT)
_previous: dict[int, object] = {}
_rec = None
_GRACE_S = 1.0


def install(rec) -> None:
    """Install handlers once per process; later recordings reuse them. Also, per
    recording: the crash file."""
    global _rec
    _rec = rec
    try:
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


# --- crash file ----------------------------------------------------------------------

CRASH_HEADER = "prism-rr crash file: rank {rank}, pid {pid}, main thread 0x{thread:016x}\n"
_crash_file = None  # kept open for the process's life: faulthandler writes to its fd


def crash_path(spool_dir, rank: int, attempt: int = 0):
    return rank_file(spool_dir, rank, attempt, "crash")


def _enable_faulthandler(rec) -> None:
    """On SIGSEGV, SIGABRT, SIGBUS, SIGFPE or SIGILL, faulthandler writes every thread's
    Python stack to the rank's crash file, which `pack` carries into the bundle. A
    program (or PYTHONFAULTHANDLER) that enabled faulthandler itself keeps its own file."""
    global _crash_file
    if _crash_file is not None:
        if _crash_file.name == str(crash_path(rec.spool_dir, rec.rank, rec.attempt)):
            return
    elif faulthandler.is_enabled():
        return
    f = open(crash_path(rec.spool_dir, rec.rank, rec.attempt), "w", encoding="utf-8")
    f.write(CRASH_HEADER.format(rank=rec.rank, pid=os.getpid(), thread=threading.main_thread().ident or 0))
    f.flush()
    faulthandler.enable(file=f, all_threads=True)
    old, _crash_file = _crash_file, f
    if old is not None:
        old.close()
