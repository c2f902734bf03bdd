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
    tmp.write_bytes(codec.compress(bytes(data)))
    os.replace(tmp, path)
    return ident
