"""Content-addressed payload blobs: a spool directory keeps them as one file each."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from prism_rr.format import codec, layout

__all__ = ["KEEP_SMALL", "blob_id", "blob_path", "write_blob"]


# A `digest` recording keeps the payload of calls this small (in bytes, all tensors of
# the call together): control data such as sizes, flags and losses, which a replay must
# not make up.
KEEP_SMALL = 1024

def blob_id(data) -> bytes:
    """The 16-byte content id of a payload (BLAKE2b-128 of its raw bytes)."""
    return hashlib.blake2b(data, digest_size=layout.BLOB_ID_LEN).digest()


def blob_path(spool_dir: str | os.PathLike, ident: bytes) -> Path:
    """Where a spool directory keeps blob `ident`: always under `spool_dir/blobs`, since
    only a 16-byte id is taken (an id read from a bundle is anything a stranger wrote)."""
    if type(ident) is not bytes or len(ident) != layout.BLOB_ID_LEN:
        from prism_rr.errors import FormatError

        what = f"{len(ident)} bytes" if type(ident) is bytes else type(ident).__name__
        raise FormatError(f"a blob id is {layout.BLOB_ID_LEN} bytes, not {what}")
    h = ident.hex()
    return Path(spool_dir) / "blobs" / h[:2] / f"{h}.zst"


def write_blob(spool_dir: str | os.PathLike, data) -> bytes:
    """Store `data` once under its content id and return the id.

    Ranks that produce the same bytes (an all_reduce result) write the same file; the
    rename makes the write atomic, so a reader never sees half a blob.
    """
    ident = blob_id(data)
    path = blob_path(spool_dir, ident)
    if path.exists():
        return ident
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.{os.getpid()}.{id(data)}.tmp")
    try:
        tmp.write_bytes(codec.compress(bytes(data)))
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)  # a full disk leaves no half blob behind
        raise
    return ident
