"""The bundle format: records, spools, pack, reader, verify, repair.

Imports neither torch nor textual nor rich: a bundle can be read anywhere.
"""

from prism_rr.format.blobs import blob_id, write_blob
from prism_rr.format.layout import MAJOR, MINOR
from prism_rr.format.pack import PackResult, pack
from prism_rr.format.reader import Bundle, ChunkRef, open_bundle
from prism_rr.format.records import (
    Collective,
    Compute,
    DeviceTime,
    GroupInfo,
    Marker,
    Memory,
    PointToPoint,
    Record,
    Step,
)
from prism_rr.format.spool import SpoolWriter, read_spool, repair_spool, spool_path
from prism_rr.format.verify import VerifyReport, verify

__all__ = [
    "Bundle",
    "ChunkRef",
    "Collective",
    "Compute",
    "DeviceTime",
    "GroupInfo",
    "MAJOR",
    "MINOR",
    "Marker",
    "Memory",
    "PackResult",
    "PointToPoint",
    "Record",
    "SpoolWriter",
    "Step",
    "VerifyReport",
    "blob_id",
    "open_bundle",
    "pack",
    "read_spool",
    "repair_spool",
    "spool_path",
    "verify",
    "write_blob",
]
