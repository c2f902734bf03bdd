"""The in-process API: `with record(path): train()` and `step()`."""

from __future__ import annotations

import logging
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path

from prism_rr.format.pack import pack as pack_spools  # record()'s `pack` is its flag
from prism_rr.intercept.steps import by_hand
from prism_rr.recorder._flight import end_bundle
from prism_rr.recorder._options import RecordOptions, spool_dir_for

# Deferred imports: torch.distributed and the recording (recorder._install, _session: torch)
# until a block is entered: `import prism_rr` reaches this module, and a laptop reading
# bundles does not load torch.

__all__ = ["record", "step"]

log = logging.getLogger("prism_rr.recorder")
_PACK_WAIT_S = 60.0


def step() -> None:
    """Mark a training step boundary by hand (optimizer steps then no longer do). Under
    `prism-rr replay` the replayer follows the same boundaries (and so does the replay's
    own recording, with `-o`)."""
    by_hand()


@contextmanager
def record(path, *, payload=None, steps=None, ranks=None, ops=False, memory=False, pack=True,
           flight: int | None = None, flight_hang: float = 30.0, flight_slow: float | None = None,
           flight_budget: int = 32 << 20, flight_at_exit: bool = False):
    """Record the process groups this process creates inside the block into `path`.

    Enter before `init_process_group`. Every rank enters it; on exit each rank closes
    its spool in `<path>.d/`, and rank 0 packs the spools into `path` once all ranks
    have closed theirs (or after a minute).

    `flight=K`: flight mode (see `prism-rr record --help`): nothing is written unless a
    trigger fires (a call pending `flight_hang` seconds, an unhandled exception, SIGUSR1,
    `<path>.d/dump-now`, a step `flight_slow` times the median), when every rank dumps its
    last K steps and rank 0 packs them into `path`; `flight_at_exit` also dumps at the
    block's end (into `<path>.d/flight-end/`, packed into `path`).
    """
    flight_args = {} if flight is None else dict(
        flight=flight, flight_hang=flight_hang, flight_slow=flight_slow, flight_budget=flight_budget,
        flight_at_exit=flight_at_exit, output=str(Path(path).resolve()))
    options = RecordOptions.make(spool_dir_for(path), payload=payload, steps=steps, ranks=ranks,
                                 ops=ops, memory=memory, **flight_args)
    import torch.distributed as dist

    from prism_rr.recorder import _install, _session

    if dist.is_available() and dist.is_initialized():
        log.warning("prism-rr: record() entered after init_process_group; "
                    "groups made before it are not recorded")
    _install.install(options)
    try:
        yield Path(options.spool_dir)
    finally:
        rec = _session.current()
        _install.uninstall()
        if rec is not None:
            rec.close("record() exit")  # and the process holds no current recording
        if options.flight is not None:  # the triggers wrote what there is to write
            if pack and options.flight_at_exit:
                spool_dir = Path(options.spool_dir)
                _pack_when_all_closed(spool_dir / "flight-end", end_bundle(spool_dir, path))
        elif pack:
            _pack_when_all_closed(Path(options.spool_dir), Path(path))


def _pack_when_all_closed(spool_dir: Path, out: Path) -> None:
    import torch.distributed as dist

    rank = 0
    try:
        if dist.is_initialized():
            import torch.distributed.distributed_c10d as c10d

            rank, world = dist.get_rank(), dist.get_world_size()
            store = c10d._world.pg_map[c10d._get_default_group()][1]
            store.set(f"prism_rr/closed/{rank}", b"1")
            if rank == 0:
                store.wait([f"prism_rr/closed/{r}" for r in range(world)], timedelta(seconds=_PACK_WAIT_S))
    except Exception as exc:
        log.warning("prism-rr: could not wait for every rank's spool: %s", exc)
    if rank != 0:
        return
    try:
        pack_spools(spool_dir, out)
    except Exception as exc:
        log.warning("prism-rr: packing %s failed: %s", out, exc)
