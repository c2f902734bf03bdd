"""Tensor facts for records: shapes, dtypes, bytes, content digests and payload blobs.

A digest is one 64-bit number per tensor. Small tensors are hashed with BLAKE2b on
their bytes; larger ones with two int64 sums over the bytes (one over all words, one
over every 61st word), which run near memory bandwidth (about 60 GB/s on one core for
a 4 MB tensor, against 1.3 GB/s for BLAKE2b) and stay on the tensor's device until
two numbers come back.
"""

from __future__ import annotations

import errno
import hashlib
import os
import struct

import torch

from prism_rr.format.blobs import KEEP_SMALL, BlobWriter

__all__ = ["KEEP_SMALL", "alive", "blobs", "describe", "digests", "host_bytes", "small"]

_SMALL = 4096  # bytes; below this BLAKE2b on the host bytes is as cheap as a torch call
_PACK = struct.Struct("<qqQ")
_MASK = (1 << 64) - 1


def describe(tensors) -> tuple[tuple[tuple[int, ...], ...], tuple[str, ...], int]:
    shapes = tuple(tuple(t.shape) for t in tensors)
    dtypes = tuple(str(t.dtype)[6:] for t in tensors)  # "torch.float32" -> "float32"
    nbytes = sum(t.numel() * t.element_size() for t in tensors)
    return shapes, dtypes, nbytes


def alive(tensors) -> bool:
    """Whether every tensor's storage still holds all of its elements: false once the
    program freed it under the tensor (FSDP2's `untyped_storage().resize_(0)`)."""
    for t in tensors:
        n = t.numel()
        if n == 0:
            continue
        try:
            st = t.untyped_storage()
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


def _digest(t: torch.Tensor) -> int:
    nbytes = t.numel() * t.element_size()
    if nbytes <= _SMALL:
        return int.from_bytes(hashlib.blake2b(host_bytes(t), digest_size=8).digest(), "little")
    flat = t.detach().contiguous().reshape(-1).view(torch.uint8)
    words = nbytes // 8
    try:
        v = flat[: words * 8].view(torch.int64)
    except RuntimeError:  # storage offset not 8-aligned: copy once
        v = flat[: words * 8].clone().view(torch.int64)
    sums = torch.stack((v.sum(), v[::61].sum())).tolist()
    tail = bytes(host_bytes(flat[words * 8 :])) if nbytes % 8 else b""
    h = hashlib.blake2b(_PACK.pack(sums[0], sums[1], nbytes) + tail, digest_size=8)
    return int.from_bytes(h.digest(), "little")


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


def blobs(writer: BlobWriter, tensors) -> tuple[bytes, ...]:
    """The tensors' bytes, copied now (on the program's thread, while they are alive
    and final), stored by the writer's thread; their ids."""
    if writer.error is not None:
        raise writer.error
    _check_room(writer.spool_dir, sum(t.numel() * t.element_size() for t in tensors) + writer.pending)
    return tuple(writer.put(bytes(host_bytes(t))) for t in tensors)


def _check_room(spool_dir, nbytes: int) -> None:
    """Payloads are what fills a disk. Stop them (the recorder turns itself off) while
    the spool's file system still has room for the records that close each spool and
    for the launcher's notes: a reserve of 5% of its size, at least 128 KiB, at most
    64 MiB."""
    try:
        st = os.statvfs(spool_dir)
    except OSError:
        return
    reserve = min(64 << 20, max(128 << 10, st.f_blocks * st.f_frsize // 20))
    free = st.f_bavail * st.f_frsize
    if free - nbytes < reserve:
        raise OSError(errno.ENOSPC, f"{os.strerror(errno.ENOSPC)}: {free:,} bytes free on the file system of "
                      f"{spool_dir}, and payloads leave {reserve:,} for the records")
