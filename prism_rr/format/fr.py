"""PyTorch Flight Recorder dumps as a bundle: `prism-rr import fr`.

Flight Recorder keeps, per rank, a ring of its last N collectives (TORCH_FR_BUFFER_SIZE)
and dumps it, one file per rank, as a pickle (`_dump_fr_trace`; what torch writes on a
watchdog timeout, `nccl_trace_rank_<r>`) or as JSON (`_dump_fr_trace_json`). Each entry
names its process group, its sequence number in that group, the op, input and output
sizes and dtypes, when it was created, its state and, in the pickle, its Python stack.

    note = import_fr(["dumps/"], "run.prism")

The dumps become one spool per rank (group records, then one record per entry, then a
`recording_end` marker: the rank was alive when it dumped), packed through `Rewrite`, so
`info`, `verify`, `diagnose`, `export` and `tui` read the bundle as they read a recording.
The manifest's `imported` says where it came from. `replay` runs the program the user
gives against it (the dump names no command and holds no payloads): `entry_views` says how
an entry of a dump stands for a call the program makes.

The pickle is a stranger's: it is read by `safe_loads`, an interpreter of the pickle
opcodes that build plain containers and scalars, and of nothing else. Every opcode that
names or calls an object (GLOBAL, STACK_GLOBAL, REDUCE, BUILD, INST, OBJ, NEWOBJ, EXT*,
PERSID, buffers) is refused before anything is looked up, so no dump runs code. Sizes are
bounded (a file of at most 256 MiB, containers, nesting, integers), and every field is
type-checked where it is read: a malformed dump is one FormatError naming file and field.
"""

from __future__ import annotations

import json
import math
import multiprocessing
import os
import re
import struct
from concurrent.futures import ProcessPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

from prism_rr.errors import FormatError, UsageError
from prism_rr.format import layout, ops
from prism_rr.format.records import Collective, GroupInfo, Marker, PointToPoint, Record
from prism_rr.format.rewrite import Rewrite
from prism_rr.format.spool import encode_frame, spool_header, spool_path

__all__ = ["MAX_DUMP_BYTES", "entry_views", "import_fr", "read_dump", "safe_loads"]

MAX_DUMP_BYTES = 256 << 20  # 2,000 entries: 0.3 MB of pickle (with stacks), 1 MB of JSON
MAX_DEPTH = 32  # open MARKs, and tuples in tuples: a dump nests 5 deep
MAX_TENSORS = 4096  # sizes or dtypes of one entry
MAX_DIMS = 64
MAX_FRAMES = 256  # frames of one entry read; the stack keeps the first user frames
STACK_DEPTH = 16
CHUNK_RECORDS = 2048
KEEP_ENTRIES = 1_000_000  # entries kept between import_fr's two readings (~250 MB)


# --- the restricted unpickler --------------------------------------------------------

# Opcodes that name, build or call objects, and protocol 0-1 byte strings (which torch
# never writes): refused wherever they appear.
_REFUSED = {
    ord("c"): "GLOBAL", 0x93: "STACK_GLOBAL", ord("R"): "REDUCE", ord("b"): "BUILD",
    ord("i"): "INST", ord("o"): "OBJ", 0x81: "NEWOBJ", 0x92: "NEWOBJ_EX", 0x82: "EXT1",
    0x83: "EXT2", 0x84: "EXT4", ord("P"): "PERSID", ord("Q"): "BINPERSID",
    0x97: "NEXT_BUFFER", 0x98: "READONLY_BUFFER", ord("S"): "STRING", ord("T"): "BINSTRING",
    ord("U"): "SHORT_BINSTRING",
}
_U32 = struct.Struct("<I")
_I32 = struct.Struct("<i")
_U64 = struct.Struct("<Q")
_F64 = struct.Struct(">d")


def safe_loads(data: bytes, where: str) -> Any:
    """The value a pickle builds, if it builds only None, bools, ints, floats, str, bytes,
    lists, tuples, dicts and sets; else FormatError naming the opcode and its offset.

    Containers (tuples too) are bounded by the input's size (one per 8 bytes, plus 65536) and
    integers by 64 bits, so the result costs a few times the input; open MARKs and tuples
    within tuples (what a dict key's hash recurses into) by MAX_DEPTH. Lists and dicts
    may still nest deep, or share parts, through the memo: what reads the result walks
    only the fields it knows, never the whole.
    """
    n = len(data)
    if n > MAX_DUMP_BYTES:
        raise FormatError(f"{where}: {n:,} bytes, more than the {MAX_DUMP_BYTES:,} a dump may have")
    return _Unpickler(data, where).load()


class _Unpickler:
    """One reading of a pickle: its stack, open MARKs, memo and what is left of the bounds.

    Only the opcodes in _RUN are run, each by the method named after it (mark_tuple:
    TUPLE, of the values above a MARK); every other is refused before anything is looked up.
    """

    __slots__ = ("containers_left", "data", "depth_of", "marks", "memo", "n", "pos", "stack", "where")

    def __init__(self, data: bytes, where: str) -> None:
        self.data = data
        self.n = len(data)
        self.where = where
        self.pos = 0
        self.containers_left = 65536 + self.n // 8
        self.stack: list = []
        self.marks: list[int] = []  # where each open MARK left the stack: a fence below it
        self.memo: dict[int, Any] = {}
        self.depth_of: dict[int, tuple[Any, int]] = {}  # a tuple or frozenset of such -> (it, its depth)

    def load(self) -> Any:
        """Run the opcodes up to STOP; the one value left on the stack."""
        data, opcodes = self.data, _BY_OPCODE
        while True:
            at = self.pos
            try:
                op = data[at]  # an IndexError past the end: no STOP
                self.pos = at + 1
                if op == 0x2E:  # STOP
                    if len(self.stack) != 1 or self.marks:
                        raise self.fail("STOP with a stack of other than one value", at)
                    return self.stack[0]
                opcodes[op](self, at)
            except FormatError:
                raise
            except IndexError:
                raise self.fail("truncated (data runs past the end of the file)", at) from None
            except KeyError:
                raise self.fail("a memo entry that was never stored", at) from None
            except TypeError:
                raise self.fail("an unhashable dict key or set member", at) from None
            except (ValueError, UnicodeDecodeError, struct.error) as exc:
                raise self.fail(f"malformed argument ({type(exc).__name__})", at) from None

    # --- what the opcodes share ---

    def fail(self, what: str, at: int) -> FormatError:
        """The error for the opcode at offset `at`."""
        return FormatError(f"{self.where}: pickle offset {at}: {what}")

    def refuse(self, at: int) -> None:
        """Any opcode not in _RUN: one that names or calls an object, or one not known."""
        op = self.data[at]
        if op in _REFUSED:
            raise self.fail(f"{_REFUSED[op]} opcode refused: a Flight Recorder dump holds only plain "
                            f"containers and scalars, and prism-rr never imports, builds or calls what a file names", at)
        raise self.fail(f"unknown opcode 0x{op:02x}", at)

    def take(self, size: int, at: int) -> bytes:
        """The next `size` bytes of the argument."""
        end = self.pos + size
        if size < 0 or end > self.n:
            raise self.fail("truncated (data runs past the end of the file)", at)
        piece = self.data[self.pos:end]
        self.pos = end
        return piece

    def line(self, at: int) -> bytes:
        """A protocol 0 argument: the text up to a newline, at most 64 bytes."""
        end = self.data.find(b"\n", self.pos, self.pos + 64)
        if end < 0:
            raise self.fail("a text argument longer than 64 bytes or unterminated", at)
        piece = self.data[self.pos:end]
        self.pos = end + 1
        return piece

    def pop_mark(self, at: int) -> list:
        """The values above the innermost MARK, taken off the stack with it."""
        if not self.marks:
            raise self.fail("no MARK before this opcode", at)
        start = self.marks.pop()
        items = self.stack[start:]
        del self.stack[start:]
        return items

    def top(self, at: int, depth: int = 1):
        """The top value, once `depth` values lie above the innermost MARK."""
        if len(self.stack) - (self.marks[-1] if self.marks else 0) < depth:
            raise self.fail("stack underflow", at)
        return self.stack[-1]

    def container(self, at: int) -> None:
        """Count one more container against the bound."""
        self.containers_left -= 1
        if self.containers_left < 0:
            raise self.fail("more containers than a file of this size can hold", at)

    def nested(self, items, make, at: int):
        """tuple(items) or frozenset(items), refused if tuples nest more than MAX_DEPTH deep."""
        depth = 1
        for x in items:
            t = type(x)
            if t is tuple or t is frozenset:
                inner = self.depth_of.get(id(x))
                depth = max(depth, 2 if inner is None else inner[1] + 1)
        if depth > MAX_DEPTH:
            raise self.fail(f"tuples nested more than {MAX_DEPTH} deep", at)
        value = make(items)
        if depth > 1:
            self.depth_of[id(value)] = (value, depth)
        return value

    # --- the opcodes: the memo and the stack ---

    def binget(self, at: int) -> None:
        self.stack.append(self.memo[self.data[self.pos]])
        self.pos += 1

    def long_binget(self, at: int) -> None:
        self.stack.append(self.memo[_U32.unpack(self.take(4, at))[0]])

    def get(self, at: int) -> None:
        self.stack.append(self.memo[int(self.line(at))])

    def binput(self, at: int) -> None:
        self.memo[self.data[self.pos]] = self.top(at)
        self.pos += 1

    def long_binput(self, at: int) -> None:
        self.memo[_U32.unpack(self.take(4, at))[0]] = self.top(at)

    def put(self, at: int) -> None:
        self.memo[int(self.line(at))] = self.top(at)

    def memoize(self, at: int) -> None:
        self.memo[len(self.memo)] = self.top(at)

    def mark(self, at: int) -> None:
        self.marks.append(len(self.stack))
        if len(self.marks) > MAX_DEPTH:
            raise self.fail(f"nested more than {MAX_DEPTH} deep", at)

    def pop(self, at: int) -> None:
        """The top value, or the MARK when nothing lies above it."""
        if len(self.stack) > (self.marks[-1] if self.marks else 0):
            self.stack.pop()
        else:
            self.pop_mark(at)

    def dup(self, at: int) -> None:
        self.stack.append(self.top(at))

    def proto(self, at: int) -> None:
        if self.take(1, at)[0] > 5:
            raise self.fail("a pickle protocol above 5", at)

    def frame(self, at: int) -> None:
        """A hint of the next frame's size, skipped."""
        self.take(8, at)

    # --- scalars ---

    def none(self, at: int) -> None:
        self.stack.append(None)

    def newtrue(self, at: int) -> None:
        self.stack.append(True)

    def newfalse(self, at: int) -> None:
        self.stack.append(False)

    def binint1(self, at: int) -> None:
        self.stack.append(self.data[self.pos])
        self.pos += 1

    def binint2(self, at: int) -> None:
        self.stack.append(int.from_bytes(self.take(2, at), "little"))

    def binint(self, at: int) -> None:
        self.stack.append(_I32.unpack(self.take(4, at))[0])

    def long(self, at: int) -> None:
        """LONG1 or LONG4: at most 64 bits (9 bytes with the sign) are read."""
        size = self.take(1, at)[0] if self.data[at] == 0x8A else _U32.unpack(self.take(4, at))[0]
        if size > 9:
            raise self.fail(f"an integer of {size} bytes (at most 64 bits are read)", at)
        self.stack.append(int.from_bytes(self.take(size, at), "little", signed=True))

    def binfloat(self, at: int) -> None:
        self.stack.append(_F64.unpack(self.take(8, at))[0])

    def text_int(self, at: int) -> None:
        """INT or LONG (protocol 0); INT's 01 and 00 are True and False."""
        text = self.line(at).rstrip(b"L")
        is_int = self.data[at] == 0x49
        self.stack.append(True if text == b"01" and is_int else False if text == b"00" and is_int else int(text))

    def text_float(self, at: int) -> None:
        self.stack.append(float(self.line(at)))

    def binunicode(self, at: int) -> None:
        pos = self.pos
        end = pos + 4 + _U32.unpack_from(self.data, pos)[0]
        if end > self.n:
            raise self.fail("truncated (data runs past the end of the file)", at)
        self.stack.append(str(self.data[pos + 4:end], "utf-8", "surrogatepass"))
        self.pos = end

    def short_binunicode(self, at: int) -> None:
        self.stack.append(str(self.take(self.take(1, at)[0], at), "utf-8", "surrogatepass"))

    def binunicode8(self, at: int) -> None:
        self.stack.append(str(self.take(_U64.unpack(self.take(8, at))[0], at), "utf-8", "surrogatepass"))

    def unicode(self, at: int) -> None:
        """UNICODE (protocol 0): raw-unicode-escape text up to a newline."""
        end = self.data.find(b"\n", self.pos)
        if end < 0:
            raise self.fail("unterminated UNICODE", at)
        self.stack.append(self.data[self.pos:end].decode("raw-unicode-escape"))
        self.pos = end + 1

    def binbytes(self, at: int) -> None:
        """BINBYTES, SHORT_BINBYTES, BINBYTES8 or BYTEARRAY8, all read as bytes."""
        op = self.data[at]
        size = (_U32.unpack(self.take(4, at))[0] if op == 0x42 else self.take(1, at)[0] if op == 0x43
                else _U64.unpack(self.take(8, at))[0])
        self.stack.append(bytes(self.take(size, at)))

    # --- containers ---

    def empty_tuple(self, at: int) -> None:
        self.stack.append(())

    def empty_list(self, at: int) -> None:
        self.container(at)
        self.stack.append([])

    def empty_dict(self, at: int) -> None:
        self.container(at)
        self.stack.append({})

    def empty_set(self, at: int) -> None:
        self.container(at)
        self.stack.append(set())

    def small_tuple(self, at: int) -> None:
        """TUPLE1, TUPLE2 or TUPLE3: of the top one, two or three values."""
        k = self.data[at] - 0x84
        self.top(at, k)
        self.container(at)
        items = self.nested(self.stack[-k:], tuple, at)
        del self.stack[-k:]
        self.stack.append(items)

    def mark_tuple(self, at: int) -> None:
        self.container(at)
        self.stack.append(self.nested(self.pop_mark(at), tuple, at))

    def mark_frozenset(self, at: int) -> None:
        self.container(at)
        self.stack.append(self.nested(self.pop_mark(at), frozenset, at))

    def mark_list(self, at: int) -> None:
        self.container(at)
        self.stack.append(self.pop_mark(at))

    def mark_dict(self, at: int) -> None:
        self.container(at)
        items = self.pop_mark(at)
        if len(items) % 2:
            raise self.fail("DICT needs pairs", at)
        self.stack.append({items[i]: items[i + 1] for i in range(0, len(items), 2)})

    def append(self, at: int) -> None:
        self.top(at, 2)
        item = self.stack.pop()
        target = self.stack[-1]
        if type(target) is not list:
            raise self.fail(f"APPEND to a {type(target).__name__}", at)
        target.append(item)

    def appends(self, at: int) -> None:
        items = self.pop_mark(at)
        target = self.top(at)
        if type(target) is not list:
            raise self.fail(f"APPENDS to a {type(target).__name__}", at)
        target.extend(items)

    def setitem(self, at: int) -> None:
        self.top(at, 3)
        value, key = self.stack.pop(), self.stack.pop()
        target = self.stack[-1]
        if type(target) is not dict:
            raise self.fail(f"SETITEM on a {type(target).__name__}", at)
        target[key] = value

    def setitems(self, at: int) -> None:
        items = self.pop_mark(at)
        target = self.top(at)
        if type(target) is not dict or len(items) % 2:
            raise self.fail("SETITEMS needs a dict and pairs", at)
        for i in range(0, len(items), 2):
            target[items[i]] = items[i + 1]

    def additems(self, at: int) -> None:
        items = self.pop_mark(at)
        target = self.top(at)
        if type(target) is not set:
            raise self.fail("ADDITEMS needs a set", at)
        target.update(items)


# The opcodes safe_loads runs: plain containers and scalars, nothing that names an object.
_RUN: dict[int, Callable[[_Unpickler, int], None]] = {
    0x68: _Unpickler.binget, 0x6A: _Unpickler.long_binget, 0x67: _Unpickler.get,
    0x71: _Unpickler.binput, 0x72: _Unpickler.long_binput, 0x70: _Unpickler.put, 0x94: _Unpickler.memoize,
    0x28: _Unpickler.mark, 0x30: _Unpickler.pop, 0x31: _Unpickler.pop_mark, 0x32: _Unpickler.dup,
    0x80: _Unpickler.proto, 0x95: _Unpickler.frame,
    0x4E: _Unpickler.none, 0x88: _Unpickler.newtrue, 0x89: _Unpickler.newfalse,
    0x4B: _Unpickler.binint1, 0x4D: _Unpickler.binint2, 0x4A: _Unpickler.binint,
    0x8A: _Unpickler.long, 0x8B: _Unpickler.long, 0x47: _Unpickler.binfloat,
    0x49: _Unpickler.text_int, 0x4C: _Unpickler.text_int, 0x46: _Unpickler.text_float,
    0x58: _Unpickler.binunicode, 0x8C: _Unpickler.short_binunicode, 0x8D: _Unpickler.binunicode8,
    0x56: _Unpickler.unicode,
    0x42: _Unpickler.binbytes, 0x43: _Unpickler.binbytes, 0x8E: _Unpickler.binbytes, 0x96: _Unpickler.binbytes,
    0x29: _Unpickler.empty_tuple, 0x5D: _Unpickler.empty_list, 0x7D: _Unpickler.empty_dict,
    0x8F: _Unpickler.empty_set,
    0x85: _Unpickler.small_tuple, 0x86: _Unpickler.small_tuple, 0x87: _Unpickler.small_tuple,
    0x74: _Unpickler.mark_tuple, 0x91: _Unpickler.mark_frozenset, 0x6C: _Unpickler.mark_list,
    0x64: _Unpickler.mark_dict,
    0x61: _Unpickler.append, 0x65: _Unpickler.appends, 0x73: _Unpickler.setitem, 0x75: _Unpickler.setitems,
    0x90: _Unpickler.additems,
}
_BY_OPCODE = tuple(_RUN.get(op, _Unpickler.refuse) for op in range(256))


def _loads_json(data: bytes, where: str) -> Any:
    """A JSON dump's value: no NaN or Infinity, containers bounded as a pickle's are."""
    if len(data) > MAX_DUMP_BYTES:
        raise FormatError(f"{where}: {len(data):,} bytes, more than the {MAX_DUMP_BYTES:,} a dump may have")

    def refuse(name: str):
        raise FormatError(f"{where}: JSON constant {name} is not a number")

    # JSON's containers cost Python up to 20 times their text: bounded as a pickle's are
    # (counting brackets inside strings too, which only makes the bound stricter).
    if data.count(b"{") + data.count(b"[") > 65536 + len(data) // 8:
        raise FormatError(f"{where}: more containers than a file of this size can hold")

    try:
        value = json.loads(data, parse_constant=refuse)
    except RecursionError:
        raise FormatError(f"{where}: JSON nested too deep") from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise FormatError(f"{where}: not JSON ({str(exc)[:120]})") from None
    return value


# --- one dump ------------------------------------------------------------------------

# c10's ScalarType names (what a dump says) -> torch's dtype names (what records say), bytes.
_DTYPES = {
    "Byte": ("uint8", 1), "Char": ("int8", 1), "Short": ("int16", 2), "Int": ("int32", 4),
    "Long": ("int64", 8), "Half": ("float16", 2), "Float": ("float32", 4), "Double": ("float64", 8),
    "ComplexHalf": ("complex32", 4), "ComplexFloat": ("complex64", 8), "ComplexDouble": ("complex128", 16),
    "Bool": ("bool", 1), "QInt8": ("qint8", 1), "QUInt8": ("quint8", 1), "QInt32": ("qint32", 4),
    "BFloat16": ("bfloat16", 2), "UInt16": ("uint16", 2), "UInt32": ("uint32", 4), "UInt64": ("uint64", 8),
    "Float8_e5m2": ("float8_e5m2", 1), "Float8_e4m3fn": ("float8_e4m3fn", 1),
    "Float8_e5m2fnuz": ("float8_e5m2fnuz", 1), "Float8_e4m3fnuz": ("float8_e4m3fnuz", 1),
    "Float8_e8m0fnu": ("float8_e8m0fnu", 1),
}
_ITEMSIZE = dict(_DTYPES.values())  # dtype name -> bytes per element
_DTYPE_NAMES: dict[tuple[str, ...], tuple[str, ...]] = {}  # a dump's dtype lists, mapped once
_P2P_NAME = re.compile(r"(send|recv) (\d{1,7})(->|<-)(\d{1,7})")
_RANK_IN_NAME = re.compile(r"(\d{1,7})(?:\.json|\.pkl|\.pickle)?")
_TORCH_FRAME = re.compile(r"[/\\]torch[/\\]|[/\\]lib[/\\]python3\.\d+[/\\](?!site-packages|dist-packages)")


@dataclass(frozen=True, slots=True)
class Entry:
    """One Flight Recorder entry, its fields checked and its names mapped."""

    record_id: int
    pg_id: int
    pg_name: str
    pg_desc: str
    backend: str  # the profiling name's prefix: nccl, gloo, ...
    op: str
    seq: int  # collective_seq_id, or p2p_seq_id for a p2p entry
    p2p: tuple[str, int, int] | None  # (send | recv, src, dst) in group ranks
    in_sizes: tuple[tuple[int, ...], ...]
    in_dtypes: tuple[str, ...]
    out_sizes: tuple[tuple[int, ...], ...]
    out_dtypes: tuple[str, ...]
    created_ns: int
    started_ns: int | None
    completed_ns: int | None
    duration_ms: float | None
    state: str
    retired: bool
    stack: tuple[str, ...] | None


@dataclass(slots=True)
class Dump:
    """One rank's dump: its entries in recording order and what the dump says of groups."""

    rank: int
    path: Path
    form: str  # "pickle" or "json"
    version: str
    entries: list[Entry]
    pg_ranks: dict[str, tuple[int, ...]]  # pg_config: group name -> global ranks, where given
    completed: dict[tuple[int, bool], int]  # pg_status: (pg_id, p2p) -> last completed seq
    comm_lib_version: str = ""
    unread: int = 0  # entries of a kind this reader cannot place (e.g. coalesced p2p)


def rank_of(path: Path) -> int | None:
    """The rank a dump file's name ends with (`nccl_trace_rank_3`, `rank_3.json`), as
    torch's own reader finds it."""
    m = _RANK_IN_NAME.search(path.name)
    return int(m.group(1)) if m and m.end() == len(path.name) else None


def read_dump(path: str | os.PathLike, rank: int | None = None) -> Dump:
    """One rank's dump, pickle or JSON (which starts with { or [)."""
    path = Path(path)
    rank = rank_of(path) if rank is None else rank
    where = path.name
    if rank is None:
        raise UsageError(f"{path}: no rank at the end of its name (torch names dumps <prefix><rank>)")
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_DUMP_BYTES + 1)
    except OSError as exc:
        raise UsageError(f"{path}: {exc.strerror or exc}") from None
    if len(data) > MAX_DUMP_BYTES:
        raise FormatError(f"{where}: more than the {MAX_DUMP_BYTES:,} bytes a dump may have")
    if not data.strip():
        raise FormatError(f"{where}: empty")
    if data.lstrip()[:1] in (b"{", b"["):
        form, value = "json", _loads_json(data, where)
    else:  # torch writes protocol 2; older protocols start with any opcode
        form, value = "pickle", safe_loads(data, where)
    if type(value) is not dict:
        raise FormatError(f"{where}: the dump is a {type(value).__name__}, not a map")
    return _dump(value, rank, path, form)


class _Fields:
    """Type-checked reads of one map of a dump; errors name the file, the entry and the field."""

    def __init__(self, value: Any, where: str):
        if type(value) is not dict:
            raise FormatError(f"{where}: a {type(value).__name__} where a map belongs")
        self.value, self.where = value, where

    def bad(self, key: str, what: str) -> FormatError:
        return FormatError(f"{self.where}: field {key!r} {what}")

    def int(self, key: str, default: Any = ..., *, low: int = 0, high: int = 1 << 63) -> Any:
        v = self.value.get(key, default)
        if v is ...:
            raise self.bad(key, "is missing")
        if v is None or v is default:
            return default
        if type(v) is str and re.fullmatch(r"-?\d{1,19}", v):  # JSON dumps write some ints as text
            v = int(v)
        if type(v) is not int or not low <= v < high:
            raise self.bad(key, f"is not an integer in [{low}, {high})")
        return v

    def str(self, key: str, default: Any = ..., limit: int = 4096) -> Any:
        v = self.value.get(key, default)
        if v is ...:
            raise self.bad(key, "is missing")
        if v is default:
            return v
        if type(v) is not str or len(v) > limit:
            raise self.bad(key, f"is not a string of at most {limit} characters")
        return v

    def bool(self, key: str, default: bool) -> bool:
        v = self.value.get(key, default)
        if type(v) is not bool:
            raise self.bad(key, "is not a boolean")
        return v

    def sizes(self, key: str) -> tuple[tuple[int, ...], ...]:
        v = self.value.get(key, [])
        if type(v) not in (list, tuple) or len(v) > MAX_TENSORS:
            raise self.bad(key, f"is not a list of at most {MAX_TENSORS} shapes")
        out = []
        for shape in v:
            if (type(shape) not in (list, tuple) or len(shape) > MAX_DIMS
                    or not all(type(d) is int and 0 <= d < 1 << 48 for d in shape)):
                raise self.bad(key, "holds a shape that is not a list of sizes")
            out.append(tuple(shape))
        return tuple(out)

    def dtypes(self, key: str) -> tuple[str, ...]:
        v = self.value.get(key, [])
        if type(v) not in (list, tuple) or len(v) > MAX_TENSORS:
            raise self.bad(key, f"is not a list of at most {MAX_TENSORS} dtype names")
        names = _DTYPE_NAMES.get(tuple(v)) if len(v) < 4 and all(type(d) is str for d in v) else None
        if names is None:
            if not all(type(d) is str and len(d) <= 64 for d in v):
                raise self.bad(key, f"is not a list of at most {MAX_TENSORS} dtype names")
            names = tuple(_DTYPES[d][0] if d in _DTYPES else d.lower() for d in v)
            if len(v) < 4 and len(_DTYPE_NAMES) < 4096:
                _DTYPE_NAMES[tuple(v)] = names
        return names


def _dump(value: dict, rank: int, path: Path, form: str) -> Dump:
    where = path.name
    top = _Fields(value, where)
    version = value.get("version", "")
    version = version[:32] if type(version) is str else ""
    raw = value.get("entries", [])
    if type(raw) not in (list, tuple):
        raise top.bad("entries", "is not a list")
    pg_ranks = {}
    config = value.get("pg_config", {})
    if type(config) is not dict:
        raise top.bad("pg_config", "is not a map")
    for name, cfg in config.items():
        if type(name) is str and type(cfg) is dict:
            ranks = _ranks(cfg.get("ranks"))
            if ranks:
                pg_ranks[name] = ranks
    completed: dict[tuple[int, bool], int] = {}
    status = value.get("pg_status", {})
    if type(status) is not dict:
        raise top.bad("pg_status", "is not a map")
    for pg, st in status.items():
        if type(pg) is not str or not pg.isdigit() or len(pg) >= 10:  # pg ids: text in both forms
            continue
        f = _Fields(st, f"{where}: pg_status {pg}")
        pg = int(pg)
        for key, p2p in (("last_completed_collective", False), ("last_completed_p2p", True)):
            done = f.int(key, None, low=-1)
            if done is not None:
                completed[(pg, p2p)] = done
    lib = value.get("comm_lib_version", "")
    dump = Dump(rank=rank, path=path, form=form, version=version, entries=[], pg_ranks=pg_ranks,
                completed=completed, comm_lib_version=lib[:200] if type(lib) is str else "")
    seen: dict = {}
    for i, e in enumerate(raw):
        entry = _entry(_Fields(e, f"{where}: entry {i}"), seen)
        if entry is None:
            dump.unread += 1
        else:
            dump.entries.append(entry)
    dump.entries.sort(key=lambda e: e.record_id)
    return dump


def _ranks(v: Any) -> tuple[int, ...] | None:
    """pg_config's ranks: a list of ints, or its text ("[0, 1, 2]", as dumps write it)."""
    if type(v) is str and len(v) <= 16 << 20 and re.fullmatch(r"\[\s*(\d+\s*(,\s*\d+\s*)*)?\]", v):
        v = [int(x) for x in re.findall(r"\d+", v)]
    if type(v) in (list, tuple) and v and all(type(r) is int and 0 <= r < 1 << 20 for r in v):
        return tuple(sorted(set(v)))
    return None


def _entry(f: _Fields, seen: dict) -> Entry | None:
    pg = f.value.get("process_group")
    if type(pg) not in (list, tuple) or len(pg) != 2 or not all(type(x) is str and len(x) <= 512 for x in pg):
        raise f.bad("process_group", "is not [name, description]")
    name = f.str("profiling_name", limit=512)
    backend, _, op = name.partition(":")
    if not op:
        backend, op = "", backend
    is_p2p = f.bool("is_p2p", False)
    p2p = None
    if is_p2p:
        m = _P2P_NAME.fullmatch(op)
        if m is None:
            return None  # a coalesced or unnamed p2p: which peer is unknown
        kind, a, arrow, b = m.group(1), int(m.group(2)), m.group(3), int(m.group(4))
        src, dst = (a, b) if arrow == "->" else (b, a)
        p2p, op = (kind, src, dst), kind
    else:
        op = ops.from_backend(op)
    frames = f.value.get("frames")
    stack = None
    if frames is not None:
        if type(frames) not in (list, tuple):
            raise f.bad("frames", "is not a list")
        stack = _stack(frames[:MAX_FRAMES], f, seen)
    duration = f.value.get("duration_ms")
    if duration is not None and (type(duration) not in (int, float) or not 0 <= duration < 1e12):
        raise f.bad("duration_ms", "is not a duration")
    return Entry(
        record_id=f.int("record_id", 0), pg_id=f.int("pg_id", 0, high=1 << 31),
        pg_name=pg[0], pg_desc=pg[1], backend=backend[:32], op=op[:64],
        seq=f.int("p2p_seq_id" if is_p2p else "collective_seq_id", 0, high=1 << 62),
        p2p=p2p, in_sizes=f.sizes("input_sizes"), in_dtypes=f.dtypes("input_dtypes"),
        out_sizes=f.sizes("output_sizes"), out_dtypes=f.dtypes("output_dtypes"),
        created_ns=f.int("time_created_ns", high=1 << 62),
        started_ns=f.int("time_discovered_started_ns", None, high=1 << 62) or None,
        completed_ns=f.int("time_discovered_completed_ns", None, high=1 << 62) or None,
        duration_ms=duration, state=f.str("state", "", limit=32), retired=f.bool("retired", False),
        stack=stack,
    )


def _stack(frames, f: _Fields, seen: dict) -> tuple[str, ...] | None:
    """Innermost-first "file:line in function" of the user's frames (torch's own and the
    standard library's left out), as a recording's stacks are. `seen` caches each frame's
    text: a dump repeats a few frames thousands of times."""
    out = []
    for fr in frames:
        if type(fr) is not dict:
            raise f.bad("frames", "holds a frame that is not a map")
        file, line, name = fr.get("filename"), fr.get("line"), fr.get("name")
        if type(file) is not str or type(name) is not str or type(line) is not int:
            raise f.bad("frames", "holds a frame without filename, line and name")
        key = (file, line, name)
        text = seen.get(key, "")
        if text == "":
            user = file and not file.startswith("<") and not _TORCH_FRAME.search(file)
            text = seen[key] = f"{os.path.basename(file)[:200]}:{line} in {name[:200]}" if user else None
        if text is not None:
            out.append(text)
            if len(out) >= STACK_DEPTH:
                break
    return tuple(out) or None


# --- many dumps, one bundle ------------------------------------------------------------


def find_dumps(paths: Iterable[str | os.PathLike]) -> dict[int, Path]:
    """The dump of each rank among `paths` (files, or directories whose files are dumps:
    names that end in a rank, `.json` allowed). A rank with two dumps is an error."""
    found: dict[int, Path] = {}
    for p in map(Path, paths):
        if p.is_dir():
            files = sorted(q for q in p.iterdir() if q.is_file() and rank_of(q) is not None)
            if not files:
                raise UsageError(f"{p}: no Flight Recorder dumps in it (files named <prefix><rank>)")
        elif p.is_file():
            files = [p]
        elif p.exists():
            raise UsageError(f"{p}: not a regular file or a directory")
        else:
            raise UsageError(f"{p}: no such file or directory")
        for q in files:
            rank = rank_of(q)
            if rank is None:
                raise UsageError(f"{q}: no rank at the end of its name (torch names dumps <prefix><rank>)")
            if rank in found and found[rank].resolve() != q.resolve():
                raise UsageError(f"rank {rank} has two dumps: {found[rank]} and {q}; import one of them")
            found[rank] = q
    if not found:
        raise UsageError("no Flight Recorder dumps given")
    return dict(sorted(found.items()))


@dataclass(slots=True)
class _Plan:
    """What every dump says about the world, its groups and the window they all cover."""

    world: int = 0
    names: dict[str, str] = field(default_factory=dict)  # group name -> description
    members: dict[str, set[int]] = field(default_factory=dict)  # ranks seen with entries in it
    configured: dict[str, tuple[int, ...]] = field(default_factory=dict)  # from pg_config
    cut: dict[str, int] = field(default_factory=dict)  # group -> first seq every window holds
    backend: dict[str, str] = field(default_factory=dict)  # group name -> nccl, gloo, ...
    zero_based: bool = False  # a collective seq of 0: the backend counts from 0, not 1
    ids: dict[str, int] = field(default_factory=dict)
    ranks: dict[str, tuple[int, ...]] = field(default_factory=dict)
    groups_of: dict[int, list[str]] = field(default_factory=dict)  # rank -> its groups, by id
    versions: set[str] = field(default_factory=set)
    forms: set[str] = field(default_factory=set)

    def learn(self, dump: Dump) -> None:
        self.world = max(self.world, dump.rank + 1)
        self.versions.add(dump.version)
        self.forms.add(dump.form)
        for name, ranks in dump.pg_ranks.items():
            self.configured[name] = tuple(sorted(set(self.configured.get(name, ())) | set(ranks)))
        wrapped = bool(dump.entries) and dump.entries[0].record_id > 0
        first: dict[str, int] = {}
        for e in dump.entries:
            self.names.setdefault(e.pg_name, e.pg_desc)
            self.members.setdefault(e.pg_name, set()).add(dump.rank)
            if e.backend:
                self.backend.setdefault(e.pg_name, e.backend)
            if e.p2p is None:
                first.setdefault(e.pg_name, e.seq)
                self.zero_based = self.zero_based or e.seq == 0
        if wrapped:  # its ring lost older entries: calls before its window are unknown
            for name, seq in first.items():
                self.cut[name] = max(self.cut.get(name, 0), seq)

    def merge(self, other: _Plan) -> None:
        """Fold in what another reading learned (a worker's dump), as `learn` would have."""
        self.world = max(self.world, other.world)
        self.versions |= other.versions
        self.forms |= other.forms
        self.zero_based = self.zero_based or other.zero_based
        for name, ranks in other.configured.items():
            self.configured[name] = tuple(sorted(set(self.configured.get(name, ())) | set(ranks)))
        for name, desc in other.names.items():
            self.names.setdefault(name, desc)
        for name, ranks in other.members.items():
            self.members.setdefault(name, set()).update(ranks)
        for name, backend in other.backend.items():
            self.backend.setdefault(name, backend)
        for name, seq in other.cut.items():
            self.cut[name] = max(self.cut.get(name, 0), seq)

    def settle(self) -> None:
        """Group ids and members, once every dump is read."""
        for ranks in self.configured.values():
            self.world = max(self.world, ranks[-1] + 1)
        names = sorted(self.names, key=lambda s: (not _is_world(s, self.names[s]), _number(s), s))
        numbered = all(s.isdigit() and len(s) < 9 for s in names) and len({int(s) for s in names}) == len(names)
        for i, name in enumerate(names):
            self.ids[name] = int(name) if numbered else i
            if name in self.configured:
                self.ranks[name] = self.configured[name]
            elif _is_world(name, self.names[name]):
                self.ranks[name] = tuple(range(self.world))
            else:
                self.ranks[name] = tuple(sorted(self.members[name]))
            for r in self.ranks[name]:
                self.groups_of.setdefault(r, []).append(name)


def _is_world(name: str, desc: str) -> bool:
    return desc == "default_pg" or name == "0"


def _number(name: str) -> int:
    return int(name) if name.isdigit() and len(name) < 18 else 1 << 62


def _bytes(sizes, dtypes) -> int:
    total = 0
    for i, shape in enumerate(sizes):
        dtype = dtypes[i] if i < len(dtypes) else (dtypes[-1] if dtypes else None)
        size = _ITEMSIZE.get(dtype, 0)
        total += math.prod(shape) * size
    return total


def _records(dump: Dump, plan: _Plan, note: dict) -> Iterator[Record]:
    """A rank's records: its groups, one record per entry inside the common window, and
    `recording_end` (it was alive to dump)."""
    rank = dump.rank
    t0 = min((e.created_ns for e in dump.entries), default=0)
    for name in sorted(plan.groups_of.get(rank, ()), key=plan.ids.__getitem__):
        yield GroupInfo(start_ns=t0, end_ns=t0, step=0, group=plan.ids[name], ranks=plan.ranks[name], name=name,
                        text=plan.names[name], backend=plan.backend.get(name, ""))
    tracks_state = any(e.state in ("started", "completed") or e.completed_ns for e in dump.entries)
    seen: set[tuple[str, int]] = set()
    messages: dict[tuple[int, int, int], int] = {}
    last = t0
    open_calls = 0
    for e in dump.entries:
        if e.p2p is None:
            if e.seq < plan.cut.get(e.pg_name, 0):
                note["trimmed"] += 1
                continue
            if (e.pg_name, e.seq) in seen:  # the later ops of a coalesced call share its seq
                note["coalesced"] += 1
                continue
            seen.add((e.pg_name, e.seq))
        start, end = _span(e, dump, tracks_state)
        if end is None:
            open_calls += 1
        last = max(last, start if end is None else end)
        gid = plan.ids[e.pg_name]
        if e.p2p is None:
            yield Collective(
                start_ns=start, end_ns=end, step=0, op=e.op, group=gid, seq=e.seq if plan.zero_based else e.seq - 1,
                in_shapes=e.in_sizes, in_dtypes=e.in_dtypes, in_bytes=_bytes(e.in_sizes, e.in_dtypes),
                out_shapes=e.out_sizes, out_dtypes=e.out_dtypes, out_bytes=_bytes(e.out_sizes, e.out_dtypes),
                stack=e.stack,
            )
            continue
        message = _message(e, plan, gid, start, end, messages)
        if message is None:
            note["unplaced"] += 1  # group ranks to global ranks: unknown
            continue
        yield message
    yield Marker(start_ns=last, end_ns=last, step=0, name="recording_end", value=open_calls,
                 text=f"Flight Recorder dump {dump.path.name}")


def _span(e: Entry, dump: Dump, tracks_state: bool) -> tuple[int, int | None]:
    """(start, end) of an entry; end None where it never completed.

    pg_status counts what completed only where the backend tracks states (nccl): gloo's
    counter also counts sends and receives, which its collective seqs do not."""
    done = (e.state == "completed" or e.completed_ns is not None
            or (tracks_state and e.seq <= dump.completed.get((e.pg_id, e.p2p is not None), -1))
            or (e.retired and not tracks_state))
    start = e.created_ns
    if not done:
        return start, None
    begun = e.started_ns or start
    end = (e.completed_ns if e.completed_ns and e.completed_ns >= start
           else begun + int(e.duration_ms * 1e6) if e.duration_ms is not None else start)
    return start, end


def _message(e: Entry, plan: _Plan, gid: int, start: int, end: int | None,
             messages: dict[tuple[int, int, int], int]) -> PointToPoint | None:
    """A p2p entry's record, numbered in `messages` by (group, src, dst); None where its
    group's ranks cannot be placed among the global ranks."""
    kind, src, dst = e.p2p
    members = plan.ranks[e.pg_name]
    if e.pg_name not in plan.configured and not _is_world(e.pg_name, plan.names[e.pg_name]) \
            or max(src, dst) >= len(members):
        return None
    src, dst = members[src], members[dst]
    peer = src if ops.receives(kind) else dst
    key = (gid, src, dst)
    seq = messages[key] = messages.get(key, -1) + 1
    sizes, dtypes = (e.out_sizes or e.in_sizes, e.out_dtypes or e.in_dtypes) if ops.receives(kind) else \
        (e.in_sizes, e.in_dtypes)
    return PointToPoint(start_ns=start, end_ns=end, step=0, op=kind, group=gid, seq=seq, peer=peer,
                        shapes=sizes, dtypes=dtypes, nbytes=_bytes(sizes, dtypes), stack=e.stack)


def entry_views(call: Collective, group_size: int) -> list[Collective]:
    """The entries torch's Flight Recorder may have written for `call` (a call as a replay
    sees the program make it), each as `import fr` reads an entry: the call itself, then
    under each name a backend records it by (ops.FR_ALIASES), and a reduce_scatter's list
    of equal inputs as the one stacked tensor nccl flattens it into. A dump holds neither
    a reduce op nor a root, so no view has them."""
    plain = replace(call, reduce_op=None, root=None)
    views = [plain] + [replace(plain, op=name) for name in ops.FR_ALIASES.get(call.op, ())]
    ins = call.in_shapes
    op = ops.lookup(call.op)
    if op is not None and op.form == "reduce_scatter_list" and len(ins) == group_size and ins and len(set(ins)) == 1:
        views.append(replace(plain, in_shapes=((group_size, *ins[0]),), in_dtypes=call.in_dtypes[:1]))
    return views


def import_fr(paths: Iterable[str | os.PathLike], out: str | os.PathLike, *, jobs: int | None = None,
              progress: Callable[[int, int], None] | None = None) -> dict[str, Any]:
    """Write the bundle `out` from the Flight Recorder dumps among `paths` (files or
    directories); returns what the manifest's `imported` says.

    The groups and the window every rank covers are known once every dump is read, and
    records are written after, so each dump is read twice, and never all at once: 8192
    ranks' dumps do not sit in memory together. In one process, dumps are kept from the
    first reading to the second up to KEEP_ENTRIES entries in all; `jobs` processes read
    every dump twice (default: one per CPU, up to 32, for 64 dumps or more on 4 CPUs or
    more, where that is still faster).
    """
    dumps = find_dumps(paths)
    out = Path(out)
    if any(out.resolve() == p.resolve() for p in dumps.values()):
        raise UsageError(f"{out}: import writes a new bundle; give another output path")
    if jobs is None:
        cpus = os.cpu_count() or 1
        jobs = min(cpus, 32) if len(dumps) >= 64 and cpus >= 4 else 1
    items = list(dumps.items())
    steps = 2 * len(items)
    plan = _Plan()
    kept: dict[int, Dump] = {}
    with _pool(jobs) as pool:
        if pool is None:
            room = KEEP_ENTRIES
            for i, (rank, path) in enumerate(items):
                dump = read_dump(path, rank)
                plan.learn(dump)
                if len(dump.entries) <= room:
                    kept[rank] = dump
                    room -= len(dump.entries)
                if progress:
                    progress(i + 1, steps)
        else:
            for i, part in enumerate(pool.map(_learn_one, items, chunksize=_chunk(items, jobs))):
                plan.merge(part)
                if progress:
                    progress(i + 1, steps)
        plan.settle()
        totals = {"entries": 0, "trimmed": 0, "coalesced": 0, "unplaced": 0, "unread": 0}
        with Rewrite(out, prefix=".import-fr-") as new:
            write = partial(_write_one, plan=plan, spool_dir=new.spool_dir)
            if pool is None:
                notes = (write(item, dump=kept.pop(item[0], None)) for item in items)
            else:
                notes = pool.map(write, items, chunksize=_chunk(items, jobs))
            for i, note in enumerate(notes):
                for k in totals:
                    totals[k] += note[k]
                if progress:
                    progress(len(items) + i + 1, steps)
            imported = {
                "from": "flight_recorder", "forms": sorted(plan.forms), "versions": sorted(plan.versions),
                "ranks": len(dumps), "replayable": True, **totals,
            }
            new.pack({"command": ["prism-rr", "import", "fr"], "imported": "flight_recorder"},
                     manifest_extra={"imported": imported})
    return imported


@contextmanager
def _pool(jobs: int) -> Iterator[ProcessPoolExecutor | None]:
    """Worker processes, started fresh (spawn: the caller may have threads), or None for one."""
    if jobs <= 1:
        yield None
        return
    with ProcessPoolExecutor(max_workers=jobs, mp_context=multiprocessing.get_context("spawn")) as pool:
        yield pool


def _chunk(items: list, jobs: int) -> int:
    return max(1, len(items) // (jobs * 4))


def _learn_one(item: tuple[int, Path]) -> _Plan:
    """What one dump says of the world (a worker's part of the first reading)."""
    plan = _Plan()
    plan.learn(read_dump(item[1], item[0]))
    return plan


def _write_one(item: tuple[int, Path], *, plan: _Plan, spool_dir: Path, dump: Dump | None = None) -> dict[str, int]:
    """One rank's spool in `spool_dir`, from its dump (read again unless given); returns
    how many entries it had and what was left out."""
    rank, path = item
    dump = dump or read_dump(path, rank)
    note = {"entries": len(dump.entries) + dump.unread, "unread": dump.unread,
            "trimmed": 0, "coalesced": 0, "unplaced": 0}
    records = list(_records(dump, plan, note))
    info = {
        "rank": rank, "world_size": plan.world, "backend": ",".join(sorted(set(plan.backend.values()))),
        "imported": {"from": "flight_recorder", "file": path.name[:200], "form": dump.form, "version": dump.version,
                     "comm_lib_version": dump.comm_lib_version, **note},
    }
    frames = [spool_header(rank), encode_frame(layout.FRAME_RANK_INFO, rank, 0, info=info)]
    for i in range(0, len(records), CHUNK_RECORDS):
        frames.append(encode_frame(layout.FRAME_EVENTS, rank, 1 + i // CHUNK_RECORDS,
                                   records=records[i:i + CHUNK_RECORDS]))
    spool_path(spool_dir, rank).write_bytes(b"".join(frames))
    return note
