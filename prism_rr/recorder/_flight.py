"""Flight mode: every rank keeps its last steps in a ring, and a trigger dumps them all.

`record --flight K` (or `"flight": K` in PRISM_RR_RECORD) records as usual into the rank's
call log (format/calllog.py), whose ring then holds the newest records and small payloads
(the `small` payload by default) and overwrites the oldest: a file of fixed size mapped
into memory, no spool, no compactor. Nothing else is written until one of these fires on
any rank:

- hang: a call pending longer than `flight_hang` seconds (a watchdog thread; the
  backend's own timeout, 30 minutes for gloo and NCCL by default, comes much later);
- exception: an unhandled exception in the program's main thread;
- SIGUSR1 sent to any rank, or the file `dump-now` created in the spool directory;
- slow_step: a step slower than `flight_slow` times the median of the steps before it;
- exit: the end of the run, with `flight_at_exit`.

The rank that sees it sets a key in the job's store (its own connections, cloned from
torch's default store: one waits for the key, one writes); every rank's listener thread
wakes, copies its call log's mapped bytes and writes their last K steps, with the calls
open at that moment, as a spool under `flight-<n>/` in its spool directory; rank 0 waits
(bounded) for the others and packs `flight-<n>/` into the bundle (`OUTPUT`, then
`OUTPUT.<n>` stem for later dumps), with the trigger in the manifest (`flight`). A rank
that died meanwhile (SIGKILL, a crash) left its call log: rank 0 reads that instead. A
crash of the whole job, or of rank 0, leaves logs that `record` turns into a bundle at the
end (`finish_flight`).
"""

from __future__ import annotations

import json
import logging
import os
import socket
import sys
import threading
import time
from collections import deque
from pathlib import Path
from statistics import median

from prism_rr.format import codec, layout, pack
from prism_rr.format.calllog import PREFAULT_AHEAD, decode_log, log_path, read_log
from prism_rr.format.compactor import POLL_S, log_info, log_to_spool
from prism_rr.format.names import parse_rank_file
from prism_rr.format.records import Marker
from prism_rr.format.spool import frame_info, read_spool
from prism_rr.recorder import _exits, _signals

# Deferred imports: torch.distributed, on a rank's dump only (the launcher packs without torch).

__all__ = ["DUMP_FILE", "Flight", "dump_bundle_path", "finish_flight", "finish_logs", "flight_bundles",
           "flight_steps"]

log = logging.getLogger("prism_rr.recorder")

DUMP_FILE = "dump-now"  # created in the spool directory: every rank dumps
PACK_WAIT_S = 15.0  # how long rank 0 waits for the other ranks' dumps before packing
COOLDOWN_S = 5.0  # triggers within this of a dump are the same moment
LISTEN_S = 1.0  # how often a rank looks for a dump another rank started (as torch's NCCL monitor)


def dump_bundle_path(output: Path, n: int) -> Path:
    """The bundle of dump `n`: OUTPUT for the first, OUTPUT's stem + `.n` after."""
    return output if n == 1 else output.with_name(f"{output.stem}.{n}{output.suffix}")


def _output_of(options) -> Path:
    if options.output:
        return Path(options.output)
    spool_dir = Path(options.spool_dir)
    if spool_dir.name.endswith(".d"):
        return spool_dir.with_name(spool_dir.name[:-2])
    return spool_dir.with_name(spool_dir.name + ".prism")


class Flight:
    """One rank's flight mode: the watchdog, the store listener, the triggers, the dumps."""

    def __init__(self, rec):
        self.rec = rec
        self.options = rec.options
        self.spool_dir = Path(self.options.spool_dir)
        # dumps written (or seen): numbered on from the dumps of the attempts before this one
        # in the same directory (a restarted job), so none is written over
        self.generation = max((n for n, d in _dumps(self.spool_dir) if d.name != "flight-end"), default=0)
        self.dumped = threading.Event()  # set after each dump of this rank
        self._lock = threading.Lock()
        self._dump_lock = threading.Lock()
        self._stop = threading.Event()
        self._last = -COOLDOWN_S  # monotonic seconds of the last trigger or dump
        self._hung: set = set()  # calls a hang trigger named already
        self._steps: deque = deque(maxlen=64)
        self.keep_log = True  # a death leaves the log; a clean close removes it (closing)
        self._store = None
        self._prefix = "prism_rr/flight/{}/{}/{}/".format(os.environ.get("TORCHELASTIC_RUN_ID", ""),
                                                          os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"),
                                                          rec.attempt)

    # --- life cycle -------------------------------------------------------------------

    def start(self) -> None:
        for target, name in ((self._watch, "watchdog"), (self._listen, "listener")):
            threading.Thread(target=target, name=f"prism-rr-flight-{name}", daemon=True).start()

        _signals.on_usr1(lambda: self.trigger("SIGUSR1"))
        previous = sys.excepthook

        def excepthook(kind, value, tb):
            try:
                if self.rec.on and not issubclass(kind, KeyboardInterrupt):
                    self.trigger("exception", text=f"{kind.__name__}: {value}"[:500])
                    self.dumped.wait(10.0)
            except BaseException:
                pass
            previous(kind, value, tb)

        sys.excepthook = excepthook

        def failing_exit(how: dict) -> None:  # sys.exit with a code other than 0: this attempt fails
            if self.rec.on:
                self.trigger("exit_code", code=how.get("code"), how=how.get("how"))
                self.dumped.wait(10.0)

        _exits.on_failing_exit(failing_exit)

    def closing(self, reason: str) -> None:
        """The recording closes: with `flight_at_exit`, dump this rank (a run's end on
        every rank at once, without the store); a clean end removes the ring, another
        (a signal) leaves it for `record` to pack should a rank have crashed."""
        self._stop.set()
        clean = not reason.startswith("SIG")  # a signal's name: the run was stopped
        if clean and self.options.flight_at_exit:
            try:
                # at the end the current step has just begun: the last K whole steps
                self._write_dump("end", {"trigger": "exit", "rank": self.rec.rank,
                                         "first_step": max(0, self.rec.step - self.options.flight)})
            except BaseException as exc:
                log.warning("prism-rr: flight dump at exit failed on rank %d: %s", self.rec.rank, exc)
        self.keep_log = not clean

    # --- triggers -----------------------------------------------------------------------

    def step_ended(self, step: int, duration_ns: int) -> None:
        slow = self.options.flight_slow
        steps = self._steps
        if slow is not None and len(steps) >= 5:
            typical = median(steps)
            if duration_ns > slow * typical:
                self.trigger("slow_step", step=step, ms=round(duration_ns / 1e6, 3),
                             median_ms=round(typical / 1e6, 3))
        steps.append(duration_ns)

    def trigger(self, why: str, **details) -> None:
        """Make every rank dump its ring (at most once per COOLDOWN_S)."""
        now = time.monotonic()
        with self._lock:
            if now - self._last < COOLDOWN_S:
                return
            self._last = now
        rec = self.rec
        # every rank keeps the same steps, from the trigger's step back: their calls pair up
        facts = {"trigger": why, "rank": rec.rank, "step": rec.step,
                 "first_step": max(0, rec.step - self.options.flight + 1), "hostname": socket.gethostname(),
                 "wall_ns": time.time_ns(), "monotonic_ns": time.monotonic_ns(), "details": details}
        log.warning("prism-rr: flight trigger on rank %d: %s %s", rec.rank, why,
                    json.dumps(details, sort_keys=True) if details else "")
        store = self._store
        n = self.generation + 1
        if store is None:  # no store (yet): this rank alone
            threading.Thread(target=self._dump, args=(n, facts), daemon=True).start()
            return
        try:
            # the first trigger of dump n wins; the others (and every listener) take its facts
            facts = json.loads(store.compare_set(self._prefix + f"go/{n}", "", json.dumps(facts)))
        except Exception as exc:
            log.warning("prism-rr: flight trigger could not reach the store (%s); dumping rank %d alone", exc, rec.rank)
        threading.Thread(target=self._dump, args=(n, facts), daemon=True).start()

    def _watch(self) -> None:
        """Hangs (a call pending past flight_hang) and the trigger file."""
        hang_ns = int(self.options.flight_hang * 1e9)
        poll = min(1.0, max(0.05, self.options.flight_hang / 10))
        trigger_file = self.spool_dir / DUMP_FILE
        rec = self.rec
        ahead = PREFAULT_AHEAD * max(1, round(poll / POLL_S))  # as the compactor's, per its poll
        while not self._stop.wait(poll):
            try:
                now = time.monotonic_ns()
                late = [c for c in rec.calls.pending() if now - c[0] >= hang_ns and c[5] not in self._hung]
                if late:
                    start, op, group, seq, step, _ = late[0]
                    self._hung.update(c[5] for c in late)
                    self.trigger("hang", op=op, group=group, seq=seq, call_step=step,
                                 pending_s=round((now - start) / 1e9, 3))
                if trigger_file.exists():
                    trigger_file.unlink(missing_ok=True)
                    self.trigger("file", path=str(trigger_file))
                rec.log.prefault(ahead)  # the ring's next pages, off the program's path (its first lap)
            except Exception as exc:  # the watchdog never ends a training run
                log.warning("prism-rr: flight watchdog: %s: %s", type(exc).__name__, exc)

    # --- the store ----------------------------------------------------------------------

    def _listen(self) -> None:
        """Wait for torch's default store, then look for the next dump's key once every
        LISTEN_S (as torch's own NCCL monitor looks for its dump signal): a thread blocked
        in a store wait would be in C++ when the interpreter ends, which aborts it."""
        store = None
        while not self._stop.is_set() and store is None:
            store = self._default_store()
            if store is None:
                time.sleep(0.05)
        if store is None:
            return
        try:
            self._store = _clone(store)
        except Exception as exc:
            log.warning("prism-rr: flight mode: no store of its own (%s); triggers stay on their rank", exc)
            return
        while not self._stop.wait(LISTEN_S):
            n = self.generation + 1
            key = self._prefix + f"go/{n}"
            try:
                if not self._store.check([key]):
                    continue
                facts = json.loads(self._store.get(key))
            except Exception:
                return  # the store is gone: the job ends
            self._dump(n, facts)

    @staticmethod
    def _default_store():
        try:
            import torch.distributed as dist

            if not dist.is_initialized():
                return None
            return dist.distributed_c10d._get_default_store()
        except Exception:
            return None

    # --- dumps --------------------------------------------------------------------------

    def _dump(self, n: int, facts: dict) -> None:
        with self._dump_lock:
            if n <= self.generation:
                return
            self.generation = n
            self._last = time.monotonic()
            try:
                out_dir = self._write_dump(n, facts)
            except BaseException as exc:
                log.warning("prism-rr: flight dump %d failed on rank %d: %s: %s", n, self.rec.rank,
                            type(exc).__name__, exc)
                return
            finally:
                self.dumped.set()
            store = self._store
            if store is not None:
                try:
                    store.add(self._prefix + f"done/{n}", 1)
                except Exception:
                    store = None
            if self.rec.rank == 0:
                self._pack(n, facts, out_dir, store)

    def _write_dump(self, n, facts: dict) -> Path:
        """This rank's call log (its last K steps and the calls open now) as a spool in
        `flight-<n>/`."""
        rec = self.rec
        if rec.on:
            rec.read_device()  # the payloads and device times the device has passed, into the dump
        contents = rec.log.snapshot()  # a copy of the mapped bytes, taken under the log's lock
        # This rank's records are whole up to now: the dump is its recording's proper end
        # (analysis then knows it did nothing more, unlike a rank that died).
        t = time.monotonic_ns()
        end = Marker(start_ns=t, end_ns=t, step=rec.step, name="recording_end", value=len(rec.calls.pending()),
                     text=f"flight dump {n}: {facts.get('trigger')} on rank {facts.get('rank')}")
        out_dir = self.spool_dir / f"flight-{n}"
        t0 = time.monotonic()
        done = log_to_spool(contents, out_dir, first_step=facts.get("first_step"),
                            ring={"dump": n, "trigger": facts}, extra_records=[end])
        log.info("prism-rr: rank %d wrote flight dump %s (%d records, first step %s) in %.0f ms", rec.rank,
                 out_dir, done["records"], done["first_step"], 1000 * (time.monotonic() - t0))
        return out_dir

    def _pack(self, n: int, facts: dict, out_dir: Path, store) -> None:
        """Rank 0: wait for every recording rank's dump (bounded), read the rings of the
        ranks that did not dump (dead ones), pack."""
        rec = self.rec
        expected = [r for r in range(rec.world_size) if self.options.ranks is None or r in self.options.ranks]
        deadline = time.monotonic() + min(PACK_WAIT_S, max(5.0, 2 * self.options.flight_hang))
        while store is not None and time.monotonic() < deadline:
            try:
                if store.add(self._prefix + f"done/{n}", 0) >= len(expected):
                    break
            except Exception:
                break
            time.sleep(0.05)
        from_rings = _from_logs(self.spool_dir, out_dir, expected, facts.get("first_step"), rec.attempt)
        output = dump_bundle_path(_output_of(self.options), n)
        _pack_dump(out_dir, output, {**facts, "steps_kept": self.options.flight}, n, expected, from_rings)


def _clone(store):
    try:
        return store.clone()
    except Exception:
        return store  # a HashStore or FileStore: safe to share between threads


def _from_logs(spool_dir: Path, out_dir: Path, expected, first_step, attempt: int = 0) -> list[int]:
    """Ranks of `expected` with no spool in `out_dir` whose call log (of `attempt`) is in
    `spool_dir` (they died, or are too slow): their logs, as spools."""
    got = []
    for r in expected:
        if (out_dir / f"rank-{r:05d}.spool").exists():
            continue
        path = log_path(spool_dir, r, attempt)
        if not path.exists():
            continue
        try:
            log_to_spool(read_log(path), out_dir, first_step=first_step, ring={"from_ring": True})
            got.append(r)
        except Exception as exc:
            log.warning("prism-rr: the call log of rank %d cannot be read: %s", r, exc)
    return got


def _pack_dump(out_dir: Path, output: Path, facts: dict, n, expected, from_rings):

    present = sorted(int(p.name[5:10]) for p in out_dir.glob("rank-*.spool"))
    entry = {**facts, "dump": n, "ranks_dumped": present,
             "ranks_from_ring": sorted(from_rings), "ranks_missing": sorted(set(expected) - set(present))}
    try:
        result = pack(out_dir, output, manifest_extra={"flight": entry})
    except Exception as exc:
        log.warning("prism-rr: packing flight dump %s failed: %s", out_dir, exc)
        return None
    missing = entry["ranks_missing"]
    log.warning("prism-rr: flight dump %s (%s on rank %s): wrote %s, %d ranks%s", n, facts.get("trigger"),
                facts.get("rank"), output, result.ranks,
                f"; ranks {missing} are not in it (another node's spool directory?)" if missing else "")
    return result


def finish_logs(spool_dir, output, last_steps: int, world_size: int | None = None) -> list[Path]:
    """After a flight run (from `record`): a dump that rank 0 did not pack (it died, or the
    job ended first) is packed now, with the logs of the ranks missing from it. Logs left
    behind mean a rank died or was stopped by a signal: if one of them died (its log has
    no `recording_end`), the logs are packed as a dump of their own (trigger "crash"). Then
    the logs are removed. Returns the bundles written."""
    spool_dir = Path(spool_dir)
    output = Path(output)
    logs = sorted(spool_dir.glob("rank-*.log"))
    named_logs = [(p, named) for p in logs if (named := parse_rank_file(p.name)) is not None]  # (path, (rank, attempt, kind))
    written = _pack_dumps(spool_dir, output, named_logs, last_steps, world_size)
    written += _pack_crashes(spool_dir, output, named_logs, last_steps)
    for p in logs:
        p.unlink(missing_ok=True)
    return written


def _pack_dumps(spool_dir: Path, output: Path, named_logs: list, last_steps: int, world_size: int | None) -> list[Path]:
    """Pack each dump that has spools and no bundle yet, with the logs of the ranks missing
    from it; the bundles written."""
    written = []
    for n, d in _dumps(spool_dir):
        target = dump_bundle_path(output, n)
        spools = sorted(d.glob("rank-*.spool"))
        if target.exists() or not spools:
            continue
        facts, info = _dump_facts(spools[0])
        first = facts.get("first_step")
        ranks = sorted(int(p.name[5:10]) for p in spools)
        incarnation = info.get("incarnation")
        attempt = incarnation.get("file_attempt") if isinstance(incarnation, dict) else None
        attempt = attempt if type(attempt) is int and attempt >= 0 else 0
        # A rank whose log was left behind and whose spool is not in the dump was ended
        # (the launcher's SIGTERM once another rank failed) or died before it dumped: its
        # ring holds what the dump wants of it.
        left = [named[0] for _, named in named_logs if named[1] == attempt]
        expected = range(world_size) if world_size else sorted({*ranks, *left})
        from_logs = _from_logs(spool_dir, d, expected, first, attempt)
        if _pack_dump(d, target, {**facts, "steps_kept": last_steps, "packed_by": "record"}, n, expected,
                      from_logs) is not None:
            written.append(target)
    return written


def _dump_facts(spool: Path) -> tuple[dict, dict]:
    """A dump's trigger facts and the rank info of one of its spools; ({}, {}) where the
    spool cannot be read."""
    try:

        scan = read_spool(spool)
        data = spool.read_bytes()
        info = {}
        for f in scan.frames:
            if f.kind == layout.FRAME_RANK_INFO:
                info.update(frame_info(data, f, spool.name))
        return dict(info.get("flight_ring", {}).get("trigger") or {}), info
    except Exception:
        return {}, {}


def _pack_crashes(spool_dir: Path, output: Path, named_logs: list, last_steps: int) -> list[Path]:
    """For each attempt whose logs say a rank died after the last dump, pack its logs as a
    dump of their own (trigger "crash"); the bundles written."""
    written = []
    by_attempt: dict[int, dict] = {}  # attempt -> {log: its records}
    for p, named in named_logs:
        try:
            by_attempt.setdefault(named[1], {})[p] = decode_log(read_log(p))[1]
        except Exception as exc:
            log.warning("prism-rr: the call log %s cannot be read: %s", p, exc)
    for attempt in sorted(by_attempt):
        decoded = by_attempt[attempt]
        dumps = _dumps(spool_dir)
        if not _a_rank_died(decoded, dumps[-1][1] if dumps else None):
            continue
        # The number after the last dump that became a bundle: a dump that never did (its
        # rank was killed while writing it) leaves its number, so run.prism is the logs'.
        n = max((m for m, _ in dumps if dump_bundle_path(output, m).exists()), default=0) + 1
        d = spool_dir / f"flight-{n}"
        if any(d.glob("rank-*.spool")):  # a dump's spools that did not pack: keep them apart
            d = spool_dir / f"flight-{n}-rings"
        ranks = [parse_rank_file(p.name)[0] for p in decoded]
        newest = [max((codec.row_start(r)[1] for r in records), default=None) for records in decoded.values()]
        known = [x for x in newest if x is not None]
        first = max(0, min(known) - last_steps + 1) if known else None
        from_logs = _from_logs(spool_dir, d, ranks, first, attempt)
        target = dump_bundle_path(output, n)
        if _pack_dump(d, target, {"trigger": "crash", "first_step": first, "steps_kept": last_steps}, n, ranks,
                      from_logs) is not None:
            written.append(target)
    return written


def _a_rank_died(decoded: dict, last_dump: Path | None) -> bool:
    """Whether a log's records end without a `recording_end` marker (its rank did not
    close) and are newer than the last dump holds of its rank (a dump read it already,
    or it died before the dump)."""
    for path, records in decoded.items():
        if not records:
            continue
        if any(type(r) is Marker and r.name == "recording_end" for r in records[-64:]):
            continue
        newest = max(codec.row_start(r)[0] for r in records)
        # a dump's spools are named by rank alone: one dump is one attempt
        dumped = last_dump / f"rank-{parse_rank_file(path.name)[0]:05d}.spool" if last_dump is not None else None
        try:
            held = max((f.t_last for f in read_spool(dumped).frames if f.kind == layout.FRAME_EVENTS), default=0)
        except Exception:
            held = None
        if held is None or newest > held:
            return True
    return False


def _dumps(spool_dir: Path) -> list[tuple[int, Path]]:
    """The dump directories, in order: flight-<n>/, then flight-end/ (the run's end, with
    flight_at_exit) as the number after them."""
    dumps = sorted((int(p.name[7:]), p) for p in spool_dir.glob("flight-*") if p.name[7:].isdigit())
    end = spool_dir / "flight-end"
    if end.is_dir():
        dumps.append(((dumps[-1][0] if dumps else 0) + 1, end))
    return dumps


def end_bundle(spool_dir, output) -> Path:
    """Where the dump at the run's end (flight-end/) is packed: after the others."""
    return dump_bundle_path(Path(output), _dumps(Path(spool_dir))[-1][0])


def flight_steps(spool_dir, default: int = 8) -> int:
    """The K of the flight recording whose logs are in `spool_dir` (from a log's rank
    info), else `default`."""
    for path in sorted(Path(spool_dir).glob("rank-*.log")):
        try:
            return int(log_info(path)["flight"]["steps"])
        except Exception:
            continue
    return default


def flight_bundles(spool_dir, output) -> list[Path]:
    """The bundles of the dumps in `spool_dir` (flight-<n>/) that exist."""
    spool_dir, output = Path(spool_dir), Path(output)
    return [b for n, _ in _dumps(spool_dir) if (b := dump_bundle_path(output, n)).exists()]


def finish_flight(spool_dir, output, steps: int | None = None, world_size: int | None = None) -> list[Path]:
    """After a flight run of `steps` (K; else read from a log left behind): pack what the
    triggers left unpacked (see finish_logs), and return every dump's bundle, oldest first."""
    finish_logs(spool_dir, output, steps if steps is not None else flight_steps(spool_dir), world_size)
    return flight_bundles(spool_dir, output)
