#!/usr/bin/env python
"""Benchmark of the bundle format on a synthetic RANKS x EVENTS recording.

Builds spools of a realistic dp x tp run (prism_rr.format.synthetic) in a temporary
directory, packs them, and prints:

  1. encode+compress throughput on one core (spool.encode_frame over 2048-record batches)
  2. bundle size and bytes per event
  3. compression ratio against the same events as naive row-wise msgpack
  4. pack time beside a plain file copy of the same bytes
  5. open-and-read-one-rank latency, and open-only latency
  6. verify time for the whole bundle

Targets are printed beside each figure; nothing here asserts a timing. Generating
records (and writing the spools) is never part of a timed figure.

    python bench/format_bench.py                 # 8192 ranks x 1000 events
    python bench/format_bench.py --ranks 64      # quick check
    python bench/format_bench.py --json          # one JSON object on stdout
"""

from __future__ import annotations

import argparse
import gc
import json
import multiprocessing
import operator
import os
import platform
import random
import shutil
import statistics
import sys
import tempfile
import time
from dataclasses import MISSING, fields
from pathlib import Path

import msgpack

from prism_rr.format import layout, open_bundle, pack, verify
from prism_rr.format.records import GroupInfo
from prism_rr.format.spool import encode_frame, spool_path
from prism_rr.format.synthetic import synthetic_records, write_synthetic

BATCH = 2048  # records per chunk, as SpoolWriter and write_synthetic use

TARGET_READ_MS = 10.0
TARGET_RATIO = 10.0
TARGET_ENCODE = 1_000_000
TARGET_PACK_VS_COPY = 2.0  # "bound by copying": pack within 2x of a plain copy

RAW_DEFINITION = (
    "raw msgpack = every record as its own msgpack map {field_name: value} holding the "
    "record's non-default fields (required fields always), maps concatenated, uncompressed; "
    "what a naive row-wise encoder writes"
)


# --- building the recording (untimed) ----------------------------------------------

_ROW_SPEC: dict[type, tuple] = {}


def _row_spec(cls) -> tuple:
    fs = fields(cls)
    return (
        tuple(f.name for f in fs),
        tuple(f.default for f in fs),
        operator.attrgetter(*(f.name for f in fs)),
    )


def raw_msgpack_size(records) -> int:
    """Bytes of the records as naive row-wise msgpack (see RAW_DEFINITION)."""
    pack_row = msgpack.Packer(use_bin_type=True).pack
    total = 0
    for rec in records:
        spec = _ROW_SPEC.get(rec.__class__)
        if spec is None:
            spec = _ROW_SPEC[rec.__class__] = _row_spec(rec.__class__)
        names, defaults, get = spec
        total += len(pack_row({
            n: v for n, v, d in zip(names, get(rec), defaults) if d is MISSING or v != d
        }))
    return total


def _write_ranks(args) -> tuple[int, int, int, int, int]:
    """Write the spools of `ranks` exactly as write_synthetic does; count raw msgpack too.

    Returns (events, raw msgpack bytes, raw msgpack bytes of GroupInfo records, spool
    bytes, event-frame bytes the same records would take without their GroupInfo records).
    """
    spool_dir, world, events, tp, seed, ranks = args
    n_events = raw = raw_groups = spool_bytes = no_groups = 0
    for rank in ranks:
        info = {"world_size": world, "rank": rank, "backend": "gloo", "argv": ["train.py"], "synthetic": True}
        head = layout.SPOOL_HEADER.pack(layout.SPOOL_MAGIC, layout.MAJOR, layout.MINOR, rank, 0)
        parts = [head[:-4] + layout.crc32(head[:-4]).to_bytes(4, "little")]
        parts.append(encode_frame(layout.FRAME_RANK_INFO, rank, 0, info=info))
        records = list(synthetic_records(rank, world, events, tp=tp, seed=seed))
        n_events += len(records)
        raw += raw_msgpack_size(records)
        raw_groups += raw_msgpack_size([r for r in records if type(r) is GroupInfo])
        for index, i in enumerate(range(0, len(records), BATCH), start=1):
            parts.append(encode_frame(layout.FRAME_EVENTS, rank, index, records=records[i : i + BATCH]))
        data = b"".join(parts)
        spool_path(spool_dir, rank).write_bytes(data)
        spool_bytes += len(data)
        rest = [r for r in records if type(r) is not GroupInfo]
        for i in range(0, len(rest), BATCH):
            no_groups += len(encode_frame(layout.FRAME_EVENTS, rank, 1, records=rest[i : i + BATCH]))
    return n_events, raw, raw_groups, spool_bytes, no_groups


def build_spools(spool_dir: Path, world: int, events: int, tp: int, seed: int, jobs: int):
    spool_dir.mkdir(parents=True, exist_ok=True)
    # Check once, on a small world, that the loop above writes write_synthetic's bytes.
    with tempfile.TemporaryDirectory(prefix="prism-bench-check-") as check:
        write_synthetic(check, world, min(events, 300), ranks=[0], tp=tp, seed=seed)
        mine = Path(check) / "mine"
        mine.mkdir()
        _write_ranks((mine, world, min(events, 300), tp, seed, [0]))
        same = spool_path(check, 0).read_bytes() == spool_path(mine, 0).read_bytes()
    step = max(1, min(256, world // (4 * max(jobs, 1)) or 1))
    work = [(spool_dir, world, events, tp, seed, list(range(a, min(a + step, world))))
            for a in range(0, world, step)]
    totals = [0, 0, 0, 0, 0]
    if jobs > 1 and len(work) > 1:
        ctx = multiprocessing.get_context("fork" if "fork" in multiprocessing.get_all_start_methods() else None)
        with ctx.Pool(jobs) as pool:
            for res in pool.imap_unordered(_write_ranks, work):
                totals = [a + b for a, b in zip(totals, res)]
    else:
        for item in work:
            totals = [a + b for a, b in zip(totals, _write_ranks(item))]
    return (*totals, same)


# --- timed parts ---------------------------------------------------------------------

def _median_time(fn, repeats: int) -> tuple[float, list[float]]:
    times = []
    for _ in range(repeats):
        gc.collect()
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), times


def bench_encode(world, events, tp, seed, n_ranks, batches_per_rank, repeats, rng):
    """encode_frame on prepared batches of BATCH records, one core.

    Each sampled rank's stream is generated long enough for `batches_per_rank` full
    batches; its first batch holds the rank's GroupInfo records (one per process group,
    with the group's member list), the others are steady-state training records.
    """
    ranks = sorted(rng.sample(range(world), min(n_ranks, world)))
    n = max(events, batches_per_rank * BATCH)
    first, steady = [], []
    for rank in ranks:
        recs = list(synthetic_records(rank, world, n, tp=tp, seed=seed))
        cut = [recs[i : i + BATCH] for i in range(0, batches_per_rank * BATCH, BATCH)]
        first.append(cut[0])
        steady.extend(cut[1:])
    everything = first + steady
    del recs
    ev = layout.FRAME_EVENTS

    def run(batches):
        for i, b in enumerate(batches):
            encode_frame(ev, 0, i, records=b)

    out = {"ranks_sampled": len(ranks), "batch": BATCH, "batches": len(everything)}
    total_n = total_t = 0
    for name, batches in (("first_chunk", first), ("steady", steady)):
        if not batches:
            continue
        count = sum(map(len, batches))
        med, _ = _median_time(lambda: run(batches), repeats)
        out[f"{name}_events_per_s"] = count / med
        total_n += count
        total_t += med
    # All batches: first chunks and steady chunks in the proportion they were prepared.
    out["all_events_per_s"] = total_n / total_t
    return out


def _settle() -> None:
    """Untimed: collect garbage and write back dirty pages so no timed step pays for them."""
    gc.collect()
    if hasattr(os, "sync"):
        os.sync()


def bench_pack(spool_dir: Path, bundle: Path, spool_bytes: int, work: Path, repeats: int):
    """pack() beside shutil.copyfile of one file as large as all spools together."""
    pack_times = []
    result = None
    for _ in range(repeats):
        if bundle.exists():
            bundle.unlink()
        _settle()
        t0 = time.perf_counter()
        result = pack(spool_dir, bundle)
        pack_times.append(time.perf_counter() - t0)
    # One file holding the spools' bytes (built untimed), so the copy moves the same bytes.
    src = work / "copy-src.bin"
    dst = work / "copy-dst.bin"
    with open(src, "wb") as f:
        for p in sorted(spool_dir.glob("rank-*.spool")):
            f.write(p.read_bytes())

    def copy():
        shutil.copyfile(src, dst)

    def copy_fsync():  # pack fsyncs its output, so compare with a copy that does too
        shutil.copyfile(src, dst)
        with open(dst, "rb+") as f:
            os.fsync(f.fileno())

    def timed(fn):
        times = []
        for _ in range(repeats):
            if dst.exists():
                dst.unlink()
            _settle()
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
        return statistics.median(times)

    copy_s = timed(copy)
    copy_fsync_s = timed(copy_fsync)
    src.unlink()
    dst.unlink()
    pack_s = statistics.median(pack_times)
    return result, {
        "pack_s": pack_s,
        "copy_s": copy_s,
        "copy_fsync_s": copy_fsync_s,
        "pack_over_copy": pack_s / copy_s if copy_s else None,
        "pack_over_copy_fsync": pack_s / copy_fsync_s if copy_fsync_s else None,
        "copied_bytes": spool_bytes,
    }


def bench_read(bundle: Path, world: int, rng, n: int = 20):
    ranks = rng.sample(range(world), min(n, world))

    def read(rank):
        b = open_bundle(bundle)
        recs = list(b.events(rank))
        b.close()
        return len(recs)

    read(ranks[0])  # warm the page cache and imports once
    read_ms, open_ms = [], []
    events = 0
    for rank in ranks:
        gc.collect()
        t0 = time.perf_counter()
        events += read(rank)
        read_ms.append((time.perf_counter() - t0) * 1e3)
    for rank in ranks:
        gc.collect()
        t0 = time.perf_counter()
        open_bundle(bundle).close()
        open_ms.append((time.perf_counter() - t0) * 1e3)
    return {
        "ranks_sampled": len(ranks),
        "events_per_rank": events / len(ranks),
        "read_ms_median": statistics.median(read_ms),
        "read_ms_max": max(read_ms),
        "open_ms_median": statistics.median(open_ms),
        "open_ms_max": max(open_ms),
    }


def bench_verify(bundle: Path):
    gc.collect()
    t0 = time.perf_counter()
    with open_bundle(bundle) as b:
        report = verify(b)
    dt = time.perf_counter() - t0
    return {"verify_s": dt, "events": report.events, "chunks": report.chunks,
            "events_per_s": report.events / dt if dt else None}


def size_breakdown(bundle: Path) -> dict:
    """Bytes of the bundle by what they hold."""
    out = {"file": bundle.stat().st_size}
    with open_bundle(bundle) as b:
        for sid, sec in b.sections.items():
            out[f"section_{sec.name.replace(' ', '_')}"] = sec.length
        heads = summaries = payloads = 0
        buf = b._map
        chunks_at = b.sections[layout.SEC_CHUNKS].offset
        for rank in b.recorded_ranks:
            for ref in b.chunks(rank):
                h = layout.FRAME_HEADER.unpack_from(buf, chunks_at + ref.offset)
                heads += layout.FRAME_HEADER.size
                payloads += h[7]
                summaries += h[8]
        out["chunk_frame_headers"] = heads
        out["chunk_summaries_uncompressed"] = summaries
        out["chunk_payloads_zstd"] = payloads
    return out


# --- output ---------------------------------------------------------------------------

def _load() -> str:
    try:
        return "/".join(f"{v:.1f}" for v in os.getloadavg())
    except (AttributeError, OSError):
        return "n/a"


def _mark(ok: bool | None) -> str:
    return "n/a " if ok is None else ("ok  " if ok else "MISS")


def _fmt_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024
    return str(n)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ranks", type=int, default=8192, help="world size / spools written (default 8192)")
    ap.add_argument("--events", type=int, default=1000, help="events per rank (default 1000)")
    ap.add_argument("--repeats", type=int, default=5, help="repeats of the encode figure (median; default 5)")
    ap.add_argument("--pack-repeats", type=int, default=3,
                    help="repeats of pack and of the reference copies (median; default 3)")
    ap.add_argument("--json", action="store_true", help="one JSON object on stdout; the table goes to stderr")
    ap.add_argument("--keep", metavar="DIR", help="build in DIR and keep spools and bundle there")
    ap.add_argument("--tp", type=int, default=2, help="tensor-parallel size of the synthetic run")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--encode-ranks", type=int, default=64,
                    help="ranks whose records are held in memory for the encode figure (default 64)")
    ap.add_argument("--encode-batches", type=int, default=4,
                    help="batches of 2048 per sampled rank for the encode figure (default 4)")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1,
                    help="processes writing spools (untimed set-up only)")
    args = ap.parse_args(argv)
    if min(args.ranks, args.events, args.repeats, args.pack_repeats) < 1:
        ap.error("--ranks, --events, --repeats and --pack-repeats must be positive")

    out_stream = sys.stderr if args.json else sys.stdout

    def say(*a):
        print(*a, file=out_stream, flush=True)

    rng = random.Random(args.seed)
    t_start = time.perf_counter()
    if args.keep:
        work = Path(args.keep)
        work.mkdir(parents=True, exist_ok=True)
        cleanup = None
    else:
        cleanup = tempfile.TemporaryDirectory(prefix="prism-bench-")
        work = Path(cleanup.name)
    spool_dir = work / "spools"
    bundle = work / "bench.prism"
    if spool_dir.exists():
        shutil.rmtree(spool_dir)
    phases: dict[str, float] = {}
    try:
        say(f"prism_rr format bench: {args.ranks} ranks x {args.events} events, tp={args.tp}, "
            f"seed={args.seed}, repeats={args.repeats}, python {platform.python_version()}, "
            f"{os.cpu_count()} cpus, load average {_load()}, work dir {work}")
        t0 = time.perf_counter()
        events, raw, raw_groups, spool_bytes, frames_no_groups, same = build_spools(
            spool_dir, args.ranks, args.events, args.tp, args.seed, args.jobs)
        phases["build_spools_untimed"] = time.perf_counter() - t0
        say(f"  built {events:,} records in {args.ranks} spools ({_fmt_bytes(spool_bytes)}) in "
            f"{phases['build_spools_untimed']:.1f} s with {args.jobs} processes (untimed set-up); "
            f"bytes identical to write_synthetic: {same}")

        t0 = time.perf_counter()
        enc = bench_encode(args.ranks, args.events, args.tp, args.seed, args.encode_ranks,
                           args.encode_batches, args.repeats, rng)
        phases["encode"] = time.perf_counter() - t0

        t0 = time.perf_counter()
        result, pk = bench_pack(spool_dir, bundle, spool_bytes, work, args.pack_repeats)
        phases["pack_and_copy"] = time.perf_counter() - t0

        sizes = size_breakdown(bundle)
        bundle_bytes = sizes["file"]

        t0 = time.perf_counter()
        rd = bench_read(bundle, args.ranks, rng)
        phases["read"] = time.perf_counter() - t0

        t0 = time.perf_counter()
        vf = bench_verify(bundle)
        phases["verify"] = time.perf_counter() - t0
    finally:
        if cleanup is not None:
            cleanup.cleanup()
    phases["total"] = time.perf_counter() - t_start
    load_end = _load()

    ratio = raw / bundle_bytes
    chunk_bytes = sizes["chunk_frame_headers"] + sizes["chunk_summaries_uncompressed"] + sizes["chunk_payloads_zstd"]
    # The same bundle if no rank recorded GroupInfo records (the other sections unchanged).
    bundle_no_groups = bundle_bytes - chunk_bytes + frames_no_groups
    ratio_no_groups = (raw - raw_groups) / bundle_no_groups
    res = {
        "ranks": args.ranks,
        "events_per_rank_requested": args.events,
        "events": events,
        "tp": args.tp,
        "seed": args.seed,
        "repeats": args.repeats,
        "pack_repeats": args.pack_repeats,
        "encode": enc,
        "bundle_bytes": bundle_bytes,
        "bytes_per_event": bundle_bytes / events,
        "size_breakdown": sizes,
        "raw_msgpack_bytes": raw,
        "raw_msgpack_groupinfo_bytes": raw_groups,
        "raw_msgpack_definition": RAW_DEFINITION,
        "compression_ratio": ratio,
        "event_frame_bytes_without_groupinfo": frames_no_groups,
        "compression_ratio_without_groupinfo": ratio_no_groups,
        "pack": pk,
        "pack_result": {"chunks": result.chunks, "events": result.events, "bytes": result.bytes},
        "read": rd,
        "verify": vf,
        "phases_s": phases,
        "load_average_at_end": load_end,
        "spools_match_write_synthetic": same,
        "targets": {
            "read_ms_median_max": TARGET_READ_MS,
            "compression_ratio_min": TARGET_RATIO,
            "encode_events_per_s_min": TARGET_ENCODE,
            "pack_over_copy_max": TARGET_PACK_VS_COPY,
        },
        "met": {
            "read": rd["read_ms_median"] <= TARGET_READ_MS,
            "ratio": ratio >= TARGET_RATIO,
            "encode": enc["all_events_per_s"] >= TARGET_ENCODE,
            "pack_bound_by_copy": pk["pack_over_copy_fsync"] <= TARGET_PACK_VS_COPY,
        },
    }
    met = res["met"]

    say("")
    say(f"{'figure':<44} {'value':>16}  {'target':<22} met")
    say("-" * 92)
    say(f"{'1. encode+compress, 1 core (events/s)':<44} {enc['all_events_per_s']:>16,.0f}  "
        f"{'>= 1,000,000':<22} {_mark(met['encode'])}")
    say(f"{'     first chunk of a rank (has GroupInfo)':<44} {enc.get('first_chunk_events_per_s', 0):>16,.0f}")
    say(f"{'     steady-state chunks':<44} {enc.get('steady_events_per_s', 0):>16,.0f}")
    say(f"     ({enc['batches']} batches of {BATCH}: {enc['ranks_sampled']} sampled ranks x "
        f"{args.encode_batches}, records prepared in memory; median of {args.repeats})")
    say(f"{'2. bundle size':<44} {_fmt_bytes(bundle_bytes):>16}")
    say(f"{'   bytes per event':<44} {bundle_bytes / events:>16.2f}")
    say(f"     chunk payloads (zstd) {_fmt_bytes(sizes['chunk_payloads_zstd'])}, chunk summaries "
        f"(uncompressed) {_fmt_bytes(sizes['chunk_summaries_uncompressed'])}, frame headers "
        f"{_fmt_bytes(sizes['chunk_frame_headers'])}, manifest {_fmt_bytes(sizes.get('section_manifest', 0))}, "
        f"summaries {_fmt_bytes(sizes.get('section_summaries', 0))}, indexes "
        f"{_fmt_bytes(sizes.get('section_rank_index', 0) + sizes.get('section_chunk_index', 0))}")
    say(f"{'3. compression ratio vs raw msgpack':<44} {ratio:>15.1f}x  {'>= 10x':<22} {_mark(met['ratio'])}")
    say(f"     raw msgpack {_fmt_bytes(raw)} ({raw / events:.1f} B/event), of which GroupInfo records "
        f"{_fmt_bytes(raw_groups)}")
    say(f"     without GroupInfo records: chunks {_fmt_bytes(chunk_bytes)} -> {_fmt_bytes(frames_no_groups)}, "
        f"ratio {ratio_no_groups:.1f}x")
    say(f"     {RAW_DEFINITION}")
    say(f"{'4. pack (spools -> bundle, incl. fsync) s':<44} {pk['pack_s']:>16.3f}  "
        f"{'<= 2x copy+fsync':<22} {_mark(met['pack_bound_by_copy'])}")
    say(f"     (median of {args.pack_repeats}; dirty pages are written back, untimed, before each run)")
    say(f"{'   shutil.copyfile same bytes, s':<44} {pk['copy_s']:>16.3f}  pack/copy = {pk['pack_over_copy']:.1f}x")
    say(f"{'   copyfile + fsync, s':<44} {pk['copy_fsync_s']:>16.3f}  pack/(copy+fsync) = "
        f"{pk['pack_over_copy_fsync']:.1f}x")
    say(f"{'5. open + read one rank + close, median ms':<44} {rd['read_ms_median']:>16.2f}  "
        f"{'<= 10 ms':<22} {_mark(met['read'])}")
    say(f"     ({rd['ranks_sampled']} random ranks, {rd['events_per_rank']:.0f} events each, "
        f"max {rd['read_ms_max']:.2f} ms)")
    say(f"{'   open + close only, median ms':<44} {rd['open_ms_median']:>16.2f}  (max {rd['open_ms_max']:.2f})")
    say(f"{'6. verify whole bundle, s':<44} {vf['verify_s']:>16.2f}  ({vf['events_per_s']:,.0f} events/s, "
        f"{vf['chunks']} chunks)")
    say("-" * 92)
    say("phases (s): " + ", ".join(f"{k} {v:.1f}" for k, v in phases.items())
        + f"; load average at end {load_end} (timings on a loaded machine are noisy)")
    if args.json:
        print(json.dumps(res, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
