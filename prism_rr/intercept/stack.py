"""The stack of a call: a few frames of the user's code that led to it (cheaply, no traceback
module), and whether torch made it as a blocking send or recv."""

from __future__ import annotations

import os
import sys

__all__ = ["blocking_p2p", "caller_stack"]

_LIB_DIRS: tuple[str, ...] = ()
_is_user: dict[object, bool] = {}  # code object -> does it belong to user code
_text: dict[tuple[object, int], str] = {}  # (code, line) -> "file:line func"


_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep  # prism_rr/
_DEMO = _PACKAGE + "demo" + os.sep  # the embedded workload is user code


def _lib_dirs() -> tuple[str, ...]:
    global _LIB_DIRS
    if not _LIB_DIRS:
        dirs = [_PACKAGE[:-1]]
        torch = sys.modules.get("torch")
        if torch is not None and getattr(torch, "__file__", None):
            dirs.append(os.path.dirname(os.path.abspath(torch.__file__)))
        dirs.append(os.path.dirname(os.__file__))  # the standard library
        _LIB_DIRS = tuple(d + os.sep for d in dirs)
    return _LIB_DIRS


def _user(code) -> bool:
    v = _is_user.get(code)
    if v is None:
        name = code.co_filename
        v = name.startswith(_DEMO) or not (
            name.startswith("<") or name.startswith(_lib_dirs()) or "site-packages" in name
        )
        _is_user[code] = v
    return v


def caller_stack(depth: int, skip: int = 2) -> tuple[str, ...] | None:
    """Innermost-first "file:line function" of up to `depth` user frames."""
    if depth <= 0:
        return None
    try:
        frame = sys._getframe(skip)
    except ValueError:
        return None
    out = []
    hops = 0
    is_user = _is_user
    texts = _text
    while frame is not None and hops < 64:
        code = frame.f_code
        user = is_user.get(code)
        if user is None:
            user = _user(code)
        if user:
            line = frame.f_lineno
            text = texts.get((code, line))
            if text is None:
                text = f"{os.path.basename(code.co_filename)}:{line} in {code.co_name}"
                if len(texts) < 100_000:
                    texts[(code, line)] = text
            out.append(text)
            if len(out) >= depth:
                break
        frame = frame.f_back
        hops += 1
    return tuple(out) if out else None


_C10D_FILES = ("distributed_c10d.py", "c10d_logger.py")
_blocking: frozenset | None = None  # code objects of torch.distributed's send and recv


def _blocking_codes() -> frozenset:
    global _blocking
    if _blocking is None:
        import torch.distributed.distributed_c10d as c10d

        codes = set()
        for fn in (c10d.send, c10d.recv):
            while getattr(fn, "__wrapped__", None) is not None:  # c10d_logger's wrapper is shared
                fn = fn.__wrapped__
            code = getattr(fn, "__code__", None)
            if code is not None:
                codes.add(code)
        _blocking = frozenset(codes)
    return _blocking


def blocking_p2p(skip: int = 2) -> bool:
    """Whether torch.distributed's blocking send or recv made the call (they call isend and
    irecv, which reach the group): the frames from `skip` out, while they are torch's."""
    try:
        frame = sys._getframe(skip)
    except ValueError:
        return False
    codes = _blocking_codes()
    hops = 0
    while frame is not None and hops < 12 and frame.f_code.co_filename.endswith(_C10D_FILES):
        if frame.f_code in codes:
            return True
        frame = frame.f_back
        hops += 1
    return False
