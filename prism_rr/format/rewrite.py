"""Rewrite: a new bundle from the records of another, through temporary spools and `pack`.

    with Rewrite(out_path, prefix=".redact-") as new:
        for rank in ranks:
            new.write_rank(rank, info, chunks)   # one spool: rank info, then one frame a chunk
        new.pack(run, manifest_extra={...})      # the spools, packed into out_path

`redact` (records cleaned) and `scale` (records mapped onto a larger world) write their
bundles this way. The spools lie in a temporary directory beside `out_path`, so that
`pack` moves the new bundle into place within one file system; the directory goes when
the block ends, whatever happens in it.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, Iterable, Sequence

from prism_rr.errors import UsageError
from prism_rr.format import layout
from prism_rr.format.pack import PackResult, pack
from prism_rr.format.records import Record
from prism_rr.format.spool import encode_frame, spool_header, spool_path

__all__ = ["Rewrite", "new_output"]


def new_output(in_path: str | os.PathLike, out_path: str | os.PathLike, what: str) -> tuple[Path, Path]:
    """(in_path, out_path) as paths; a UsageError when both name one file (`what` says
    which command writes the new bundle)."""
    in_path, out_path = Path(in_path), Path(out_path)
    if in_path.resolve() == out_path.resolve():
        raise UsageError(f"{out_path}: {what} writes a new bundle; give another output path")
    return in_path, out_path


class Rewrite:
    """A bundle in the making at `out_path`: spools in a temporary directory, then packed."""

    def __init__(self, out_path: str | os.PathLike, *, prefix: str = ".rewrite-"):
        self.out_path = Path(out_path)
        self.prefix = prefix
        self.spool_dir: Path | None = None  # where spools, blobs and run.json go

    def __enter__(self) -> Rewrite:
        self.out_path.parent.mkdir(parents=True, exist_ok=True)
        self.spool_dir = Path(tempfile.mkdtemp(prefix=self.prefix, dir=self.out_path.parent))
        return self

    def __exit__(self, *exc) -> None:
        if self.spool_dir is not None:
            shutil.rmtree(self.spool_dir, ignore_errors=True)

    def write_rank(self, rank: int, info: dict[str, Any], chunks: Iterable[Sequence[Record]], *,
                   torn: bool = False, attempt: int = 0) -> None:
        """The spool of `rank` (of `attempt`, whose number its info must carry too): its rank
        info, then one events frame per chunk. `torn` ends it with a torn frame header, so
        that the new bundle marks the rank truncated too."""
        with open(spool_path(self.spool_dir, rank, attempt), "wb") as f:
            f.write(spool_header(rank))
            f.write(encode_frame(layout.FRAME_RANK_INFO, rank, 0, info=info))
            for i, records in enumerate(chunks):
                f.write(encode_frame(layout.FRAME_EVENTS, rank, i + 1, records=records))
            if torn:
                f.write(layout.FRAME_MAGIC + b"\0" * 4)

    def pack(self, run: dict[str, Any], *, manifest_extra: dict[str, Any]) -> PackResult:
        """Pack the spools written into `out_path`, with `run` as the manifest's run."""
        (self.spool_dir / "run.json").write_text(json.dumps(run, default=str))
        return pack(self.spool_dir, self.out_path, manifest_extra=manifest_extra)
