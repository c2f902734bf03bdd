"""Keep torch's own threads from aborting a process that already finished.

gloo's worker threads drop a finished collective's last references after the program has
its result; a tensor Python also knew needs the GIL for that (torch gives its Python object
back). A thread asking for the GIL once the interpreter is finalizing is ended with
pthread_exit, and inside that C++ destructor the unwinding is std::terminate: the process
prints "terminate called without an active exception" and dies of SIGABRT after the
program's last line. Measured on torch 2.13 with gloo, two ranks of a loop that ends in
`dist.barrier(); dist.destroy_process_group()` (tests/recorder/scripts/steps.py; the
barrier's work holds the last all_reduce's, and with it the all_reduced tensor): 6 runs
of 130 without prism-rr and 6 of 260 recorded ones ended so; recorded with settle, none
of 120 on a machine kept busy by two other processes (3 of 60 without it).

`settle()` runs at exit, before the interpreter starts finalizing: it lets go of the GIL
for a few milliseconds, then a millisecond at a time for as long as (up to a bound) a thread
that runs no Python code is runnable (on a loaded machine, a worker may not have been given
a core since it finished its call; a thread waiting for the GIL is woken when it is let go)
or the count of thread states held by threads without a Python frame (a native thread holds
one while it takes or holds the GIL; torch's autograd threads on a GPU hold one for good)
still changes. Importing this module imports nothing heavy.
"""

from __future__ import annotations

import atexit
import ctypes
import os
import sys
import threading
import time

__all__ = ["native_runnable", "native_thread_states", "register", "settle"]

FIRST_S = 0.002  # a worker that just finished a call is about to ask for the GIL
STEP_S = 0.001
LIMIT_S = 0.2  # past this, exit anyway: a native thread may be busy for good
_registered = False


def _thread_states():
    """A function counting the interpreter's thread states, or None where ctypes cannot."""
    try:
        api = ctypes.pythonapi
        head, nxt, get = api.PyInterpreterState_ThreadHead, api.PyThreadState_Next, api.PyInterpreterState_Get
    except (AttributeError, OSError):
        return None
    get.restype = ctypes.c_void_p
    head.restype, head.argtypes = ctypes.c_void_p, [ctypes.c_void_p]
    nxt.restype, nxt.argtypes = ctypes.c_void_p, [ctypes.c_void_p]

    def count() -> int:
        # With the GIL held (ctypes.pythonapi keeps it), no thread state is freed under us;
        # a native thread adds its own at the head of the list, which this walk may miss.
        n, ts = 0, head(get())
        while ts:
            n += 1
            ts = nxt(ts)
        return n

    return count


_count = None


def native_thread_states() -> int:
    """Thread states that belong to no running Python code: native threads taking or
    holding the GIL, or keeping a thread state to take it later (0 where they cannot be
    counted)."""
    global _count
    if _count is None:
        _count = _thread_states() or (lambda: 0)
    return max(0, _count() - len(sys._current_frames()))


def native_runnable() -> int:
    """This process's threads that run no Python code and are running or ready to run
    (Linux's /proc; 0 elsewhere)."""
    try:
        tids = os.listdir("/proc/self/task")
    except OSError:
        return 0
    python = {t.native_id for t in threading.enumerate()}
    n = 0
    for tid in tids:
        if int(tid) in python:
            continue
        try:
            with open(f"/proc/self/task/{tid}/stat", "rb") as f:
                stat = f.read()
        except OSError:  # ended meanwhile
            continue
        # "tid (name) S ...": the name may hold spaces and parentheses, the state follows the last ')'
        if stat[stat.rfind(b")") + 2:stat.rfind(b")") + 3] == b"R":
            n += 1
    return n


def settle(first_s: float = FIRST_S, limit_s: float = LIMIT_S) -> None:
    """Give the GIL to native threads still to take it, before finalization can kill them."""
    try:
        deadline = time.monotonic() + limit_s
        before = native_thread_states()
        time.sleep(first_s)
        while time.monotonic() < deadline:
            now = native_thread_states()
            if now == before and not native_runnable():
                return
            before = now
            time.sleep(STEP_S)
    except Exception:  # exiting: nothing here may raise
        pass


def register() -> None:
    """Run settle() at exit (idempotent). Registered from the start-up hook, before anything
    else registers, it runs after every other atexit function."""
    global _registered
    if not _registered:
        _registered = True
        atexit.register(settle)
