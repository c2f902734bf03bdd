"""SIGTERM/SIGINT: get the spool onto the disk, then do what the process would have done.

A hung rank sits in C++ (a gloo or NCCL wait) and Python runs its signal handlers only
when the main thread comes back to the interpreter, which a hung rank never does. So a
thread also watches the signal wake-up fd: it flushes the spool, calls still open
included, and where the previous disposition was the default (terminate) it terminates
the process itself once the main thread has had a moment to do so.
"""

from __future__ import annotations

import ctypes
import os
import signal
import threading
import time

__all__ = ["install"]

_SIGNALS = (signal.SIGTERM, signal.SIGINT)
_previous: dict[int, object] = {}
_rec = None
_GRACE_S = 1.0


def install(rec) -> None:
    """Install handlers once per process; later recordings reuse them."""
    global _rec
    _rec = rec
    if _previous or threading.current_thread() is not threading.main_thread():
        return
    for sig in _SIGNALS:
        prev = signal.getsignal(sig)
        if prev is None:  # installed from C: leave it alone
            continue
        _previous[sig] = prev
        signal.signal(sig, _handler)
    _start_watcher()


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
