"""The stack of a call: a few frames of the user's code that led to it (cheaply, no traceback
module), and whether torch made it as a blocking send or recv."""

from __future__ import annotations

import os
import sys

# Deferred imports: torch.distributed (heavy) until blocking_p2p is first asked; the walk
# itself needs only os and sys.

__all__ = ["WALK_CACHES", "blocking_p2p", "caller_stack", "fast_walk", "frame_stack", "user_code"]

# The walk below in C, from the same caches (prism_rr/_speedups.c), or None: optional.
# fast_walk(depth, skip, *WALK_CACHES) is caller_stack from `skip` frames above its caller,
# or False where a frame or a line was not seen yet (the Python walk learns it).
try:
    if os.environ.get("PRISM_RR_PURE_PYTHON"):
        raise ImportError("PRISM_RR_PURE_PYTHON is set")
    from prism_rr._speedups import stack as fast_walk
except ImportError:
    fast_walk = None

_LIB_DIRS: tuple[str, ...] = ()
# Keyed by id(code), not by the code object: a code object's hash is worked out anew at
# each use, from its constants and names (microseconds for a long function). The code
# objects are held in _is_user's values: alive, so no id is reused while it is a key.
_is_user: dict[int, tuple[object, bool]] = {}  # id(code) -> (code, does it belong to user code)
_text: dict[tuple[int, int], str] = {}  # (id(code), instruction offset) -> "file:line func"


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
    known = _is_user.get(id(code))
    if known is not None:
        return known[1]
    name = code.co_filename
    v = name.startswith(_DEMO) or not (
        name.startswith("<") or name.startswith(_lib_dirs()) or "site-packages" in name
    )
    _is_user[id(code)] = (code, v)
    return v


def user_code(code) -> bool:
    """Whether a code object is the program's (not prism_rr's but its demo, torch's, the
    standard library's or an installed package's): the frames a call's stack names."""
    known = _is_user.get(id(code))
    return known[1] if known is not None else _user(code)


def caller_stack(depth: int, skip: int = 2) -> tuple[str, ...] | None:
    """Innermost-first "file:line function" of up to `depth` user frames."""
    if depth <= 0:
        return None
    if fast_walk is not None:
        got = fast_walk(depth, skip, _is_user, _text, _stacks)
        if got is not False:  # False: a frame or a line not seen before; the walk below learns it
            return got or None
    try:
        frame = sys._getframe(skip)
    except ValueError:
        return None
    return frame_stack(frame, depth)


def frame_stack(frame, depth: int, hops: int = 64) -> tuple[str, ...] | None:
    """Innermost-first "file:line function" of up to `depth` user frames from `frame` out
    (another thread's: `sys._current_frames()`), looking at most `hops` frames deep."""
    out = []
    is_user = _is_user
    texts = _text
    while frame is not None and hops > 0:
        code = frame.f_code
        known = is_user.get(id(code))
        user = known[1] if known is not None else _user(code)
        if user:
            # Keyed by the instruction, not the line: f_lineno is worked out from the
            # code's line table on each read, microseconds in a long function.
            key = (id(code), frame.f_lasti)
            text = texts.get(key)
            if text is None:
                text = f"{os.path.basename(code.co_filename)}:{frame.f_lineno} in {code.co_name}"
                if len(texts) < 100_000:
                    texts[key] = text
            out.append(text)
            if len(out) >= depth:
                break
        frame = frame.f_back
        hops -= 1
    if not out:
        return None
    # One tuple for each stack seen (as for its texts): the records that name it share it.
    stack = tuple(out)
    same = _stacks.get(stack)
    if same is not None:
        return same
    if len(_stacks) >= 100_000:
        _stacks.clear()
    _stacks[stack] = stack
    return stack


_stacks: dict[tuple[str, ...], tuple[str, ...]] = {}
# What the C walk reads (and the Python walk fills): is it user code, a frame's text, the
# stacks seen. Filled and cleared in place, never replaced: a reference stays good.
WALK_CACHES = (_is_user, _text, _stacks)

_C10D_FILES = ("distributed_c10d.py", "c10d_logger.py")
_blocking: frozenset | None = None  # ids of the code of torch.distributed's send and recv (alive with torch)


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
                codes.add(id(code))
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
        if id(frame.f_code) in codes:
            return True
        frame = frame.f_back
        hops += 1
    return False
