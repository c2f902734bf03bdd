"""Tensor facts for records: shapes, dtypes, bytes, content digests and payload blobs.

A digest is one 64-bit number per tensor. Small tensors are hashed with BLAKE2b on
their bytes; larger ones with two int64 sums over the bytes (one over all words, one
over every 61st word), which run near memory bandwidth (about 60 GB/s on one core for
a 4 MB tensor, against 1.3 GB/s for BLAKE2b) and stay on the tensor's device until
two numbers come back.
"""

from __future__ import annotations

import ctypes
import errno
import hashlib
import os
import struct
import time

import torch

from prism_rr.format.blobs import KEEP_SMALL, BlobWriter
from prism_rr.format.calllog import P_BLOBS, P_BYTES, P_DIGEST_BYTES, P_DIGESTS, ONE_BYTES, payload_tail

__all__ = ["FULL", "KEEP_SMALL", "MODES", "NONE", "PLAIN_LAYOUT", "PLAIN_TENSOR", "SMALL", "alive", "blobs", "describe",
           "digests", "host_bytes", "log_payload", "small", "small_bytes_what"]

# Payload modes (`--payload`), as numbers for the recorder's path.
NONE, SMALL, DIGEST, FULL = 0, 1, 2, 3
MODES = {"none": NONE, "small": SMALL, "digest": DIGEST, "full": FULL}
# A `full` recording keeps payloads up to this size in the call log itself (written as the
# call happens); larger ones go to the blob writer's thread, compressed.
INLINE_MAX = 64 << 10

_SMALL = 4096  # bytes; below this BLAKE2b on the host bytes is as cheap as a torch call
_PACK = struct.Struct("<qqQ")
_MASK = (1 << 64) - 1


_DTYPE_NAMES: dict = {}  # torch.float32 -> "float32"
# (shape, dtype) -> describe([tensor]): one tuple of each for all calls alike, not new
# ones that a spool's pending records would hold until its writer encodes them (new
# objects the garbage collector counts and sweeps while they wait)
_ONE: dict = {}
_ONE_MAX = 4096


def describe(tensors) -> tuple[tuple[tuple[int, ...], ...], tuple[str, ...], int]:
    if len(tensors) == 1:  # most calls: one tensor
        t = tensors[0]
        key = (t.shape, t.dtype)
        desc = _ONE.get(key)
        if desc is None:
            dt = t.dtype
            name = _DTYPE_NAMES.get(dt)
            if name is None:
                name = _DTYPE_NAMES[dt] = str(dt)[6:]
            if len(_ONE) >= _ONE_MAX:
                _ONE.clear()
            desc = _ONE[key] = (tuple(t.shape),), (name,), t.numel() * t.element_size()  # nbytes: not sparse
        return desc
    shapes = []
    dtypes = []
    nbytes = 0
    names = _DTYPE_NAMES
    for t in tensors:
        shapes.append(tuple(t.shape))
        dt = t.dtype
        name = names.get(dt)
        if name is None:
            name = names[dt] = str(dt)[6:]  # "torch.float32" -> "float32"
        dtypes.append(name)
        nbytes += t.numel() * t.element_size()
    return tuple(shapes), tuple(dtypes), nbytes


def alive(tensors) -> bool:
    """Whether every tensor's storage still holds all of its elements: false once the
    program freed it under the tensor (FSDP2's `untyped_storage().resize_(0)`)."""
    for t in tensors:
        n = t.numel()
        if n == 0:
            continue
        try:
            st = t.untyped_storage()
            if t.is_contiguous():  # most calls' tensors: no walk over the strides
                last = t.storage_offset() + n
            else:
                last = t.storage_offset() + 1 + sum((size - 1) * abs(stride) for size, stride in zip(t.shape, t.stride()))
            if st.nbytes() < last * t.element_size() or st.data_ptr() == 0:
                return False
        except (RuntimeError, NotImplementedError):
            return False
    return True


def host_bytes(t: torch.Tensor):
    """The tensor's bytes in host memory, as a flat uint8 array (a view where it can be)."""
    t = t.detach()
    if t.device.type != "cpu":
        t = t.cpu()
    t = t.contiguous()
    if t.numel() == 0:
        return b""
    return t.reshape(-1).view(torch.uint8).numpy()


def _small_bytes(t: torch.Tensor) -> bytes:
    """bytes(host_bytes(t)) of a small tensor (a copy of its bytes): read straight from
    memory for a plain contiguous CPU tensor whose storage holds all of it, four times
    faster than through torch's views and numpy."""
    # (is_cpu, nbytes and the storage's own pointer: each a few hundred ns cheaper than
    # device.type, numel x element_size and the tensor's data_ptr; a call reads two)
    if type(t) is torch.Tensor and t.is_cpu and t.layout is torch.strided and t.is_contiguous():
        n = t.nbytes
        if n:
            st = t.untyped_storage()
            ptr = st.data_ptr()
            offset = t.storage_offset() * t.element_size()
            if ptr and st.nbytes() >= offset + n:
                return _string_at(ptr + offset, n)
    return bytes(host_bytes(t))


_string_at = ctypes.string_at
# A tensor whose bytes log_payload has the call log copy from memory is of exactly this type
# and layout, on the CPU and contiguous (the C path tests it as log_payload does).
PLAIN_TENSOR = torch.Tensor
PLAIN_LAYOUT = torch.strided
_one_bytes = ONE_BYTES.pack


def small_bytes_what(mode: int) -> int:
    """The payload flags of small tensors' bytes kept whole under payload mode `mode`."""
    return P_BYTES if mode == FULL else P_BYTES | P_DIGEST_BYTES


def log_payload(tensors, mode: int, writer: BlobWriter | None = None, checked: bool = False,
                inline_max: int = INLINE_MAX):
    """The call log's payload part (format/calllog.py, PAYLOAD_HEAD) for a call's tensors
    under payload mode `mode`, or None when it keeps none of them; for one plain CPU
    tensor, (its address, its length, what) for the log to copy from, and for several,
    [what, address, length, address, length, ...]. Small calls (at most
    KEEP_SMALL bytes in all) keep their bytes in every mode but none: the compactor makes
    their blob ids and digests. `checked`: the tensors may have lost their storage since
    the call (outputs read after the program could free them): read only whole ones.
    `writer`: where `full` stores payloads above `inline_max` (none: they are not kept)."""
    if len(tensors) == 1:
        t = tensors[0]
        # a plain contiguous CPU tensor: its address, for the call log to copy its bytes
        if not checked and type(t) is PLAIN_TENSOR and t.layout is PLAIN_LAYOUT and t.is_cpu and t.is_contiguous():
            n = t.nbytes
            if n <= KEEP_SMALL:
                return t.data_ptr(), n, small_bytes_what(mode)
        else:
            n = t.numel() * t.element_size()  # (a sparse tensor has no nbytes)
            if n <= KEEP_SMALL:
                return _one_bytes(1, small_bytes_what(mode), 0, n, n) + _small_bytes(t)
    elif not tensors:  # a barrier: digest and full say so, with nothing in it
        if mode == DIGEST:
            return payload_tail(0, P_DIGESTS, digests=())
        return payload_tail(0, P_BLOBS, blobs=()) if mode == FULL else None
    if not checked:  # plain contiguous CPU tensors: their addresses, for the log to copy their bytes
        spec = [small_bytes_what(mode)]
        total = 0
        for t in tensors:
            if type(t) is not PLAIN_TENSOR or t.layout is not PLAIN_LAYOUT or not t.is_cpu or not t.is_contiguous():
                break
            k = t.nbytes
            total += k
            if total > KEEP_SMALL:
                break
            spec.append(t.data_ptr())
            spec.append(k)
        else:
            return spec
    n = len(tensors)
    sizes = [t.numel() * t.element_size() for t in tensors]
    total = sum(sizes)
    if total <= KEEP_SMALL:
        return payload_tail(n, small_bytes_what(mode),
                            datas=[_small_bytes(t) for t in tensors])
    if mode == SMALL:
        return None
    if mode == DIGEST:
        return payload_tail(n, P_DIGESTS, digests=digests(tensors))
    if total <= inline_max:
        return payload_tail(n, P_BYTES, datas=[_small_bytes(t) if k <= _SMALL else bytes(host_bytes(t))
                                               for t, k in zip(tensors, sizes)])
    if writer is None:
        return None
    return payload_tail(n, P_BLOBS, blobs=blobs(writer, tensors))


def _digest(t: torch.Tensor) -> int:
    nbytes = t.numel() * t.element_size()
    if nbytes <= _SMALL:
        return _small_digest(_small_bytes(t))
    sums, tail = digest_parts(t)
    s0, s1 = sums.tolist()
    return digest_of(s0, s1, nbytes, bytes(host_bytes(tail)) if tail is not None else b"")


def digest_parts(t: torch.Tensor):
    """What the digest of a tensor above _SMALL bytes reads, left on its device: its two
    int64 sums (one tensor of 2) and its last nbytes % 8 bytes (None when there are none)."""
    nbytes = t.numel() * t.element_size()
    flat = t.detach().contiguous().reshape(-1).view(torch.uint8)
    words = nbytes // 8
    try:
        v = flat[: words * 8].view(torch.int64)
    except RuntimeError:  # storage offset not 8-aligned: copy once
        v = flat[: words * 8].clone().view(torch.int64)
    return torch.stack((v.sum(), v[::61].sum())), (flat[words * 8 :] if nbytes % 8 else None)


def digest_of(s0: int, s1: int, nbytes: int, tail: bytes) -> int:
    """A larger tensor's digest from its sums, size and last bytes (digest_parts)."""
    h = hashlib.blake2b(_PACK.pack(s0, s1, nbytes) + tail, digest_size=8)
    return int.from_bytes(h.digest(), "little")


def _small_digest(data: bytes) -> int:
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little")


def digests(tensors) -> tuple[int, ...]:
    return tuple(_digest(t) for t in tensors)


def small(tensors) -> bool:
    """At most KEEP_SMALL bytes in all (and at least one tensor)."""
    total = 0
    for t in tensors:
        total += t.numel() * t.element_size()
        if total > KEEP_SMALL:
            return False
    return bool(tensors)


def blobs(writer: BlobWriter, tensors, digest: bool = False):
    """The tensors' bytes, copied now (on the program's thread, while they are alive
    and final), stored by the writer's thread; their ids. With `digest` (a small call,
    see `small`): (digests, ids) from one copy of each tensor's bytes, where `digests`
    and `blobs` would each take their own."""
    if writer.error is not None:
        raise writer.error
    if digest:
        datas = [_small_bytes(t) for t in tensors]
        _check_room(writer.spool_dir, sum(map(len, datas)) + writer.pending)
        return tuple(map(_small_digest, datas)), tuple(map(writer.put, datas))
    _check_room(writer.spool_dir, sum(t.numel() * t.element_size() for t in tensors) + writer.pending)
    return tuple(writer.put(_small_bytes(t) if t.numel() * t.element_size() <= _SMALL else bytes(host_bytes(t)))
                 for t in tensors)


# spool_dir -> (when statvfs was read, bytes free then, bytes asked for since): a file
# system's free space is read at most every _ROOM_TTL_S or _ROOM_BYTES of payloads, and
# always before payloads are refused.
_room: dict = {}
_ROOM_TTL_S = 0.05
_ROOM_BYTES = 1 << 20


def _check_room(spool_dir, nbytes: int) -> None:
    """Payloads are what fills a disk. Stop them (the recorder turns itself off) while
    the spool's file system still has room for the records that close each spool and
    for the launcher's notes: a reserve of 5% of its size, at least 128 KiB, at most
    64 MiB."""
    now = time.monotonic()
    seen = _room.get(spool_dir)
    if seen is not None:
        at, free, reserve, asked = seen
        asked += nbytes
        if now - at < _ROOM_TTL_S and asked < _ROOM_BYTES and free - asked >= reserve:
            _room[spool_dir] = (at, free, reserve, asked)
            return
    try:
        st = os.statvfs(spool_dir)
    except OSError:
        return
    reserve = min(64 << 20, max(128 << 10, st.f_blocks * st.f_frsize // 20))
    free = st.f_bavail * st.f_frsize
    if free - nbytes < reserve:
        _room.pop(spool_dir, None)
        raise OSError(errno.ENOSPC, f"{os.strerror(errno.ENOSPC)}: {free:,} bytes free on the file system of "
                      f"{spool_dir}, and payloads leave {reserve:,} for the records")
    _room[spool_dir] = (now, free, reserve, nbytes)
