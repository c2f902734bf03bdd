"""Bundles for the TUI tests: a small run, one with a hang and a mismatch, a replay, and 8192 ranks."""

from __future__ import annotations

import dataclasses
import fcntl
import hashlib
import multiprocessing
import os
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import pytest

from prism_rr.format import Collective, layout, pack
from prism_rr.format.spool import encode_frame, spool_path
from prism_rr.format.synthetic import synthetic_records, write_synthetic

FIXED = {"created_unix_ns": 0}  # snapshots must not show the time of the test run


def _write_spools(spool_dir: Path, world: int, events: int, edit=None, seed: int = 0, info_extra=None) -> Path:
    """Spools of a synthetic run, each rank's records passed through `edit(rank, records)`."""
    spool_dir.mkdir(parents=True, exist_ok=True)
    for rank in range(world):
        recs = list(synthetic_records(rank, world, events, seed=seed))
        if edit is not None:
            recs = edit(rank, recs)
        info = {"world_size": world, "rank": rank, "backend": "gloo", "argv": ["train.py"], **(info_extra or {})}
        head = layout.SPOOL_HEADER.pack(layout.SPOOL_MAGIC, layout.MAJOR, layout.MINOR, rank, 0)
        parts = [head[:-4] + layout.crc32(head[:-4]).to_bytes(4, "little"),
                 encode_frame(layout.FRAME_RANK_INFO, rank, 0, info=info)]
        for i in range(0, len(recs), 64):
            parts.append(encode_frame(layout.FRAME_EVENTS, rank, 1 + i // 64, records=recs[i : i + 64]))
        spool_path(spool_dir, rank).write_bytes(b"".join(parts))
    return spool_dir


@pytest.fixture(scope="session")
def tui_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("tui")


@pytest.fixture(scope="session")
def small(tui_dir) -> Path:
    """8 ranks (tp=2), 3 steps."""
    out = tui_dir / "small.prism"
    pack(write_synthetic(tui_dir / "small.d", 8, 150, chunk_records=64), out, manifest_extra=FIXED)
    return out


from tui_helpers import FAILED_GROUP, FAILED_SEQ, HANG_GROUP, HANG_SEQ


@pytest.fixture(scope="session")
def hung(tui_dir) -> Path:
    """Rank 2 never completes dp call 3; rank 4 never enters it; rank 6 calls another op."""
    def edit(rank, recs):
        out = []
        for r in recs:
            if isinstance(r, Collective) and r.group == HANG_GROUP and r.seq == HANG_SEQ:
                if rank == 2:
                    out.append(dataclasses.replace(r, end_ns=None))
                    break  # a hung rank records nothing more
                if rank == 4:
                    continue
                if rank == 6:
                    r = dataclasses.replace(r, op="all_reduce")
            out.append(r)
        return out

    out = tui_dir / "hung.prism"
    pack(_write_spools(tui_dir / "hung.d", 8, 150, edit), out, manifest_extra=FIXED)
    return out


@pytest.fixture(scope="session")
def failed(tui_dir) -> Path:
    """Rank 3's tp call 7 failed (a gloo time-out: the recorder's `call_failed` marker)."""
    from prism_rr.format import Marker

    def edit(rank, recs):
        out = []
        for r in recs:
            out.append(r)
            if rank == 3 and isinstance(r, Collective) and r.group == FAILED_GROUP and r.seq == FAILED_SEQ:
                out.append(Marker(start_ns=r.end_ns, end_ns=r.end_ns, step=r.step, name="call_failed",
                                  value=r.seq, text=f"{r.op}: RuntimeError: Timed out waiting 5000ms for recv"))
        return out

    out = tui_dir / "failed.prism"
    pack(_write_spools(tui_dir / "failed.d", 8, 150, edit), out, manifest_extra=FIXED)
    return out


@pytest.fixture(scope="session")
def ahead(tui_dir) -> Path:
    """Rank 1 recorded tp call 10 (group 1, ranks 0 and 1) a step later than rank 0 did."""
    def edit(rank, recs):
        return [dataclasses.replace(r, step=r.step + 1)
                if rank == 1 and isinstance(r, Collective) and r.group == 1 and r.seq == 10 else r for r in recs]

    out = tui_dir / "ahead.prism"
    pack(_write_spools(tui_dir / "ahead.d", 8, 150, edit), out, manifest_extra=FIXED)
    return out


@pytest.fixture(scope="session")
def window_and_replay(tui_dir) -> tuple[Path, Path]:
    """A recording of steps 1 and 2 only (`--steps 1:2`), and a faithful replay of its ranks
    0 and 1, whose own recording holds the whole program: step 0 and its calls too."""
    window = tui_dir / "window.prism"
    pack(_write_spools(tui_dir / "window.d", 8, 150, lambda rank, recs: [r for r in recs if r.step >= 1]),
         window, manifest_extra=FIXED)
    d = tui_dir / "window-replay.d"
    _write_spools(d, 8, 150, info_extra={"replay_of": {"bundle": str(window), "ranks": [0, 1], "timing": "live"}})
    for rank in range(2, 8):
        spool_path(d, rank).unlink()
    out = tui_dir / "window-replay.prism"
    pack(d, out, manifest_extra=FIXED)
    return window, out


@pytest.fixture(scope="session")
def replay(tui_dir) -> Path:
    """A replay of ranks 0 and 1 of `small`, slower, whose rank 1 differs at tp call 5."""
    def edit(rank, recs):
        out = []
        for r in recs:
            if isinstance(r, Collective) and rank == 1 and r.group == 1 and r.seq == 5:
                r = dataclasses.replace(r, in_shapes=((4, 512, 1024),))
            out.append(r)
        return out

    d = tui_dir / "replay.d"
    _write_spools(d, 8, 150, edit, seed=3)
    for rank in range(2, 8):
        spool_path(d, rank).unlink()
    out = tui_dir / "replay.prism"
    pack(d, out, manifest_extra=FIXED)
    return out


@pytest.fixture(scope="session")
def straggler(tui_dir) -> Path:
    """8 ranks in step (tests/analysis/graph_sim.py: a collective ends at its last arrival);
    rank 5 computes 4 ms longer every step and the others wait for it."""
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "analysis"))
    from graph_sim import SimRun

    run = SimRun(8)
    run.train(6, slow={5: 4_000_000})
    return run.bundle(tui_dir, name="straggler")


def _format_digest() -> str:
    src = Path(layout.__file__).parent
    h = hashlib.sha256()
    for p in sorted(src.glob("*.py")):
        h.update(p.read_bytes())
    return h.hexdigest()[:12]


@pytest.fixture(scope="session")
def big(request, tui_dir) -> Path:
    """8192 ranks, one step each; kept in pytest's cache while the format code is unchanged."""
    cache = Path(request.config.cache.mkdir("prism-rr-tui"))
    out = cache / f"big-8192-{_format_digest()}.prism"
    with open(cache / "big.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # the other xdist worker waits for this one's bundle
        if not out.exists():
            for old in cache.glob("big-8192-*.prism"):
                old.unlink()
            tmp = out.with_suffix(".tmp")
            pack(_write_synthetic_in_parallel(tui_dir / "big.d", 8192, 30), tmp, manifest_extra=FIXED)
            tmp.rename(out)
    return out


def _write_synthetic_in_parallel(spool_dir: Path, world: int, events: int) -> Path:
    """write_synthetic's spools, the ranks shared among a few processes: at 8192 ranks
    encoding them takes most of the fixture's time, and the bytes do not depend on who
    writes them."""
    n = min(4, len(os.sched_getaffinity(0)))
    if n == 1:
        return write_synthetic(spool_dir, world, events)
    spool_dir.mkdir(parents=True, exist_ok=True)
    with ProcessPoolExecutor(n, mp_context=multiprocessing.get_context("spawn")) as pool:
        for f in [pool.submit(write_synthetic, spool_dir, world, events, ranks=range(i, world, n)) for i in range(n)]:
            f.result()
    return spool_dir
