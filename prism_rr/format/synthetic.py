"""Synthetic recordings with realistic fields, for benchmarks, tests and the TUI.

A dp x tp training job: per step, FSDP-style all_gathers and reduce_scatters on the dp
group, tensor-parallel all_reduces on the tp group, compute gaps between them, memory
samples and a step record. Seeded, so the same arguments give the same bytes.
"""

from __future__ import annotations

import os
import random
from functools import lru_cache
from pathlib import Path
from typing import Generator, Iterator

from prism_rr.format import layout
from prism_rr.format.blobs import write_blob
from prism_rr.format.records import (
    Collective,
    Compute,
    GroupInfo,
    Memory,
    PointToPoint,
    Record,
    Step,
)
from prism_rr.format.spool import encode_frame, spool_header, spool_path

__all__ = ["synthetic_records", "write_synthetic"]

_STACK = ("train.py:88 in train_step", "model.py:41 in forward")
_LAYERS = 8


@lru_cache(maxsize=8)
def _groups(world: int, tp: int) -> list[tuple[int, tuple[int, ...], str]]:
    """WORLD, then the tp groups, then the dp groups, as a DeviceMesh would create them."""
    out = [(0, tuple(range(world)), "default_pg")]
    dp = world // tp
    for i in range(dp):
        out.append((len(out), tuple(range(i * tp, (i + 1) * tp)), "mesh_tp"))
    for j in range(tp):
        out.append((len(out), tuple(range(j, world, tp)), "mesh_dp"))
    return out


def synthetic_records(
    rank: int, world: int, events: int, *, tp: int = 2, seed: int = 0, payload: bool = False,
    spool_dir: str | os.PathLike | None = None,
) -> Iterator[Record]:
    """About `events` records of one rank, deterministic in (rank, seed)."""
    rng = random.Random(seed * 1_000_003 + rank)
    tp = tp if world % tp == 0 else 1
    groups = _groups(world, tp)
    tp_group = 1 + rank // tp
    dp_group = 1 + world // tp + rank % tp
    t = 1_000_000_000_000 + rng.randrange(50_000)  # a monotonic clock some time after boot
    n = 0
    for gid, ranks, desc in groups:
        if rank in ranks:
            yield GroupInfo(start_ns=t, end_ns=t, step=0, group=gid, ranks=ranks, name=str(gid), text=desc, backend="gloo")
            n += 1
    seq = {0: 0, tp_group: 0, dp_group: 0}
    mesh = (dp_group, tp_group, world // tp)
    step = 0
    mem = 400 << 20
    while n < events:
        step_start = t
        t, mem, peak = yield from _forward(rng, t, step, mem, seq, mesh, payload)
        t, mem = yield from _backward(rng, t, step, mem, peak, seq, mesh, payload, spool_dir)
        n += 6 * _LAYERS
        if tp > 1:
            peer = rank + 1 if rank % tp == 0 else rank - 1
            op = "send" if rank % tp == 0 else "recv"
            yield PointToPoint(
                start_ns=t, end_ns=t + 20_000, step=step, op=op, group=0, seq=step, peer=peer,
                shapes=((16,),), dtypes=("float32",), nbytes=64, stack=_STACK,
            )
            t += 20_000
            n += 1
        yield Memory(start_ns=t, end_ns=t, step=step, mem_alloc=mem, mem_peak=peak, name="cuda:0")
        yield Step(start_ns=step_start, end_ns=t, step=step, mem_peak=peak)
        n += 2
        step += 1


def _forward(rng: random.Random, t: int, step: int, mem: int, seq: dict[int, int], mesh: tuple[int, int, int],
             payload: bool) -> Generator[Record, None, tuple[int, int, int]]:
    """A step's forward pass, layer by layer: an FSDP all_gather of the layer's parameters,
    compute, a tensor-parallel all_reduce of its activations, compute. Returns the clock,
    memory and peak after it."""
    dp_group, tp_group, dp_size = mesh
    peak = mem
    for _ in range(_LAYERS):
        shard = (4096 * 1024) // dp_size
        dur = 180_000 + rng.randrange(40_000)
        yield Collective(
            start_ns=t, end_ns=t + dur, step=step, op="all_gather_into_tensor", group=dp_group,
            seq=seq[dp_group], in_shapes=((shard,),), in_dtypes=("bfloat16",), in_bytes=shard * 2,
            out_shapes=((shard * dp_size,),), out_dtypes=("bfloat16",), out_bytes=shard * dp_size * 2,
            async_op=True, issued_ns=t + 3_000, digest_in=(rng.getrandbits(64),) if payload else None,
            mem_alloc=mem, mem_peak=peak, stack=_STACK,
        )
        seq[dp_group] += 1
        t += dur
        gap = 900_000 + rng.randrange(200_000)
        yield Compute(start_ns=t, end_ns=t + gap, step=step, mem_alloc=mem, mem_peak=peak)
        t += gap
        mem += 8 << 20
        peak = max(peak, mem)
        dur = 60_000 + rng.randrange(20_000)
        yield Collective(
            start_ns=t, end_ns=t + dur, step=step, op="all_reduce", group=tp_group, seq=seq[tp_group],
            in_shapes=((8, 512, 1024),), in_dtypes=("bfloat16",), in_bytes=8 * 512 * 1024 * 2,
            out_shapes=((8, 512, 1024),), out_dtypes=("bfloat16",), out_bytes=8 * 512 * 1024 * 2,
            reduce_op="sum", mem_alloc=mem, mem_peak=peak, stack=_STACK,
        )
        seq[tp_group] += 1
        t += dur
        gap = 400_000 + rng.randrange(100_000)
        yield Compute(start_ns=t, end_ns=t + gap, step=step, mem_alloc=mem, mem_peak=peak)
        t += gap
    return t, mem, peak


def _backward(rng: random.Random, t: int, step: int, mem: int, peak: int, seq: dict[int, int],
              mesh: tuple[int, int, int], payload: bool, spool_dir) -> Generator[Record, None, tuple[int, int]]:
    """A step's backward pass, layer by layer: an FSDP reduce_scatter of the layer's
    gradients (the first layer's output saved as a blob when payloads are asked for and
    there is a spool directory), then compute. Returns the clock and memory after it."""
    dp_group, _, dp_size = mesh
    for layer in range(_LAYERS):
        shard = (4096 * 1024) // dp_size
        dur = 200_000 + rng.randrange(50_000)
        blob = None
        if payload and spool_dir is not None and layer == 0:
            blob = (write_blob(spool_dir, rng.randbytes(256)),)
        yield Collective(
            start_ns=t, end_ns=t + dur, step=step, op="reduce_scatter_tensor", group=dp_group,
            seq=seq[dp_group], in_shapes=((shard * dp_size,),), in_dtypes=("float32",),
            in_bytes=shard * dp_size * 4, out_shapes=((shard,),), out_dtypes=("float32",),
            out_bytes=shard * 4, reduce_op="avg", async_op=True, issued_ns=t + 2_000,
            blob_out=blob, mem_alloc=mem, mem_peak=peak, stack=_STACK,
        )
        seq[dp_group] += 1
        t += dur
        gap = 1_500_000 + rng.randrange(300_000)
        yield Compute(start_ns=t, end_ns=t + gap, step=step, mem_alloc=mem, mem_peak=peak)
        t += gap
        mem -= 8 << 20
    return t, mem


def write_synthetic(
    spool_dir: str | os.PathLike, world: int, events: int, *, ranks=None, tp: int = 2,
    seed: int = 0, payload: bool = False, chunk_records: int = 2048,
) -> Path:
    """Write spools of a synthetic run (the same bytes a recorder would write)."""
    spool_dir = Path(spool_dir)
    spool_dir.mkdir(parents=True, exist_ok=True)
    for rank in range(world) if ranks is None else ranks:
        info = {"world_size": world, "rank": rank, "backend": "gloo", "argv": ["train.py"], "synthetic": True}
        parts = [spool_header(rank), encode_frame(layout.FRAME_RANK_INFO, rank, 0, info=info)]
        batch: list[Record] = []
        index = 1
        for rec in synthetic_records(rank, world, events, tp=tp, seed=seed, payload=payload, spool_dir=spool_dir):
            batch.append(rec)
            if len(batch) == chunk_records:
                parts.append(encode_frame(layout.FRAME_EVENTS, rank, index, records=batch))
                index += 1
                batch = []
        if batch:
            parts.append(encode_frame(layout.FRAME_EVENTS, rank, index, records=batch))
        spool_path(spool_dir, rank).write_bytes(b"".join(parts))
    return spool_dir
