"""How a recorded process ended: what `info` and `diagnose` say of each rank of an attempt.

Python gives an atexit function no exit code, so the recorder notes what leads to one: a
call of `sys.exit(code)` (wrapped here; the real one runs), an exception no one caught
(the excepthook, chained: the process exits 1), a signal the recorder saw (SIGTERM,
SIGINT). A crash by a fatal signal is the crash file's to tell, a SIGKILL or an
`os._exit` leaves no note at all (its records end without a `recording_end`).
"""

from __future__ import annotations

import re
import sys
import threading

from prism_rr.intercept.stack import frame_stack

__all__ = ["how", "on_failing_exit", "watch"]

_seen: dict = {}  # {"code": ..., "how": ...} of the process's way out, once known
_installed = False
_on_failing: list = []
_SOURCE = re.compile(r"^\[[^\]\n]{1,300}\] ")  # called with _seen when sys.exit gets a code other than 0


def on_failing_exit(callback) -> None:
    """`callback(how)` before a `sys.exit` with a code other than 0 goes on (flight mode
    dumps the failing attempt then, before a launcher restarts it)."""
    _on_failing.append(callback)


def watch(rec) -> None:
    """Wrap sys.exit and chain the excepthook (once a process)."""
    global _installed
    if _installed or threading.current_thread() is not threading.main_thread():
        return
    _installed = True
    real_exit = sys.exit

    def exit(status=None):  # sys.exit's own signature
        if not _seen:
            code = 0 if status is None else status if type(status) is int else 1
            _seen.update(code=code, how=f"sys.exit({status!r})"[:200])
            if code:
                for callback in _on_failing:
                    try:
                        callback(dict(_seen))
                    except Exception:  # the recorder never changes how a program ends
                        pass
        real_exit(status)

    exit.__doc__ = real_exit.__doc__
    sys.exit = exit
    previous = sys.excepthook

    def excepthook(kind, value, tb):
        if not _seen and not issubclass(kind, SystemExit):
            # gloo's and c10d's messages begin with their source line: "[/path/pair.cc:553] ..."
            text = _SOURCE.sub("", str(value))
            _seen.update(code=1, how=f"an unhandled {kind.__name__}: {text}"[:500])
        previous(kind, value, tb)

    sys.excepthook = excepthook


def how(reason: str, depth: int = 0) -> dict:
    """What ended the recording: the process's way out as far as seen, or the reason. A
    signal's also says where the program's main thread was (`where`: up to `depth` of its
    own frames, innermost first), be it in Python or waiting in the backend."""
    if reason.startswith("SIG"):
        out = {"signal": reason, "how": f"stopped by {reason}"}
        where = _main_stack(depth)
        if where:
            out["where"] = list(where)
        return out
    if reason == "exit":
        return dict(_seen) if _seen else {"code": 0, "how": "the program ended"}
    return {"how": reason}


def _main_stack(depth: int) -> tuple[str, ...] | None:
    if depth <= 0:
        return None
    try:
        frame = sys._current_frames().get(threading.main_thread().ident)
        # a signal may come deep in an import or in torch: look past more than a call's 64 frames
        return frame_stack(frame, depth, hops=1000) if frame is not None else None
    except Exception:  # a missing line never costs the rest of the exit note
        return None
