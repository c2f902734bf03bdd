"""The files of a spool directory, by rank and attempt (FORMAT.md, "Spool").

A rank's first incarnation writes `rank-NNNNN.spool` (and `.log`, `.crash`); a later one
in the same directory (a TorchElastic restart, a test harness's fresh process for the same
rank) writes `rank-NNNNN.aK.spool`, K its attempt, so none overwrites another.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

__all__ = ["KINDS", "claim_attempt", "parse_rank_file", "rank_file"]

KINDS = ("spool", "log", "crash")
_NAME = re.compile(r"rank-(\d{5,})(?:\.a(\d+))?\.(spool|log|crash)")
MAX_ATTEMPT = 1 << 20


def rank_file(directory, rank: int, attempt: int = 0, kind: str = "spool") -> Path:
    """The file of `kind` of one incarnation of a rank."""
    suffix = f".a{attempt}" if attempt else ""
    return Path(directory) / f"rank-{rank:05d}{suffix}.{kind}"


def parse_rank_file(name: str) -> tuple[int, int, str] | None:
    """(rank, attempt, kind) of a spool directory's file name, or None for another file."""
    m = _NAME.fullmatch(name)
    if m is None:
        return None
    attempt = int(m.group(2) or 0)
    if m.group(2) is not None and (attempt == 0 or m.group(2).startswith("0")):
        return None  # attempt 0 has no suffix; a name is written one way only
    return int(m.group(1)), attempt, m.group(3)


def claim_attempt(directory, rank: int, first: int = 0, kind: str = "spool") -> int:
    """The first attempt of `rank`, from `first` on, whose `kind` file does not exist yet,
    made now (empty, exclusively: two processes claiming at once get two attempts)."""
    Path(directory).mkdir(parents=True, exist_ok=True)
    for attempt in range(first, MAX_ATTEMPT):
        try:
            fd = os.open(rank_file(directory, rank, attempt, kind), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            continue
        os.close(fd)
        return attempt
    raise OSError(f"{directory}: no free attempt for rank {rank}")
