"""What replacing a rank mid-run costs: the downtime `replay --replace-rank R@STEP` puts
before virtual rank R's first call of step STEP (the timing model, _timing.py, does the rest:
its peers wait for it in their calls with it, as they would for a new process to rejoin).

The estimate, from the bundle alone (`replacement_cost`), is the sum of three terms:

- start-up: what R's process spent from its start (rank info `clock.process_start_ns`) to
  its first call, on its own clock: imports, `init_process_group` and its groups, building
  the model and a cold first step up to that call; less R's compute before its first call
  of STEP, which the replay's timing model adds anyway (so the new process's step is as
  long as a first step). Without `process_start_ns`, from `init_process_group`
  (`clock.monotonic_ns`), and imports are not counted; a recording of some steps only
  (`record --steps`) holds no first call of the program, so start-up ends there too.
- rejoin: the peers agree on the new membership: a rendezvous of the whole world, priced
  by the cost model as a barrier over the world size (an empty all_reduce where the
  recording has no barrier; 0 where it has neither). R's own group creations are within
  its start-up: the recorder marks them as instants (GroupInfo records).
- state: what the new process must receive before it can compute: R's allocated memory at
  the start of STEP (its earliest memory sample in the step: parameters, gradients,
  optimizer state), else, as a floor, the gradients it reduced in STEP (all_reduce inputs,
  reduce_scatter shards: the parameters it holds, no optimizer state); moved point to
  point at the cost model's bandwidth (the one `scale --bandwidth` gave, else the p2p fit,
  else the one pooled over all collectives). Where the recording cannot tell a bandwidth,
  0 s, and the estimate says so.

A bundle written by `scale` is priced at its world size with the model `scale` used, and a
rank that was not recorded by its role's representative's records and rank info.
"""

from __future__ import annotations

from dataclasses import dataclass

from prism_rr.errors import UsageError
from prism_rr.format.ops import lookup, shard_side
from prism_rr.format.records import Collective, PointToPoint
from prism_rr.text import shown
from prism_rr.specs import format_ranks, parse_replace_rank
from prism_rr.topology.costmodel import CostModel, Fit, fit, samples
from prism_rr.topology.roles import Roles

__all__ = ["cost_model", "note_lines", "plan_replacements", "replacement_cost", "words"]

def plan_replacements(bundle, spec, *, real, downtime: float | None = None) -> list[dict]:
    """Each replaced rank of `spec` ("R@STEP", pairs) checked against the bundle and the real
    ranks, with its downtime: `downtime` seconds where given, else `replacement_cost`'s.
    Entries already planned (dicts with downtime_s, as this returns) are checked and kept."""
    if not spec:
        if downtime is not None:
            raise UsageError("replace_downtime is the downtime of a replaced rank: give the rank with replace_rank "
                             "(--replace-rank R@STEP)")
        return []
    if downtime is not None and not (isinstance(downtime, (int, float)) and downtime >= 0):
        raise UsageError(f"replace_downtime must be a number of seconds, 0 or more, not {downtime!r}")
    planned = [e for e in spec if isinstance(e, dict)] if isinstance(spec, (list, tuple)) else []
    pairs = tuple((int(e["rank"]), int(e["step"])) for e in planned) if planned else parse_replace_rank(spec)
    world, steps = bundle.world_size, bundle.steps
    for rank, step in pairs:
        if not 0 <= rank < world:
            raise UsageError(f"replace_rank {rank}@{step}: rank {rank} is not a rank of the recorded world of {world}")
        if rank in real:
            raise UsageError(f"replace_rank {rank}@{step}: rank {rank} is a real rank of this replay; a replaced "
                             f"rank is a virtual one (replay other --ranks)")
        if step not in steps:
            held = format_ranks(steps) if steps else "none"
            raise UsageError(f"replace_rank {rank}@{step}: the bundle holds no step {step} (its steps: {held})")
    if planned:
        return [dict(e) for e in planned]
    model = None if downtime is not None else cost_model(bundle)
    out = []
    for rank, step in pairs:
        if downtime is not None:
            out.append({"rank": rank, "step": step, "downtime_s": float(downtime), "estimated": False,
                        "parts": None, "notes": []})
        else:
            out.append(replacement_cost(bundle, rank, step, model))
    return out


def cost_model(bundle) -> CostModel:
    """The model `scale` priced a scaled bundle with (its manifest's note), else one fitted
    to the recording's transfer times."""
    note = bundle.manifest.get("scale")
    if isinstance(note, dict) and isinstance(note.get("model"), dict):
        model = _from_note(note["model"])
        if model is not None:
            return model
    return fit(samples(bundle))


def _from_note(d: dict) -> CostModel | None:
    """A CostModel from its `to_dict` form (a bundle's: every value type-checked), or None."""

    def num(v) -> float | None:
        return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and v == v and v >= 0 else None

    params, latency = d.get("params"), d.get("latency", "constant")
    if not isinstance(params, dict) or latency not in ("constant", "steps"):
        return None
    fits = {}
    for fam, p in params.items():
        if not isinstance(fam, str) or not isinstance(p, dict):
            return None
        alpha, nspb = num(p.get("alpha_ns")), num(p.get("ns_per_byte"))
        if alpha is None or nspb is None:
            return None
        fits[fam] = Fit(fam, alpha, nspb, int(num(p.get("samples")) or 0), pooled=p.get("pooled_bandwidth") is True,
                        latency=latency, identified=p.get("bandwidth_identified") is not False)
    given = num(d.get("given_bytes_per_s"))
    return CostModel(fits, num(d.get("pooled_ns_per_byte")) or 0.0, latency=latency,
                     pooled_identified=d.get("pooled_bandwidth_identified") is True, given_bytes_per_s=given or None)


def _source(bundle, rank: int) -> int:
    """The rank whose records and rank info stand for `rank`: itself, or its role's representative."""
    if rank in bundle.recorded_ranks:
        return rank

    try:
        return int(Roles.from_manifest(bundle.manifest.get("roles")).rep(rank))
    except Exception:
        raise UsageError(f"replace_rank {rank}: rank {rank} was not recorded and the bundle names no role "
                         f"for it; recorded: {format_ranks(bundle.recorded_ranks)}") from None


def _int(v) -> int | None:
    return v if type(v) is int else None


def replacement_cost(bundle, rank: int, step: int, model: CostModel | None = None) -> dict:
    """The estimated downtime of replacing `rank` at `step` (see the module's doc): a dict of
    rank, step, downtime_s, estimated (True), parts and notes (what the estimate could not
    tell, in words)."""
    model = cost_model(bundle) if model is None else model
    src = _source(bundle, rank)
    notes: list[str] = []
    info = bundle.rank_info(src)
    info = info if isinstance(info, dict) else {}
    calls = _calls_at(bundle, src, step)
    if calls.first_s is None:
        notes.append(f"rank {rank} makes no call from step {step} on: no peer waits for it")
    start_up_ns, start_from = _start_up(info, src, calls, notes)
    world = bundle.world_size
    rejoin, rejoin_as = _rejoin(model, world, notes)
    state_bytes, state_from = _state_bytes(calls, src, step, notes)
    state_ns, bandwidth, by = _transfer(model, state_bytes)
    if bandwidth is None and state_bytes:
        notes.append("state transfer counted as 0 s: the recording does not tell the bandwidth (its transfer "
                     "times do not grow clearly with their bytes); give the downtime with --replace-downtime, or "
                     "scale with --bandwidth")
    parts = {
        "start_up_s": start_up_ns / 1e9,
        "start_up_from": start_from,
        "start_up_rank": src,
        "rejoin_s": rejoin / 1e9,
        "rejoin_world": world,
        "rejoin_as": rejoin_as,
        "state_bytes": state_bytes,
        "state_from": state_from,
        "bandwidth_bytes_per_s": bandwidth,
        "bandwidth_from": by,
        "state_s": state_ns / 1e9,
    }
    downtime = (start_up_ns + rejoin + state_ns) / 1e9
    return {"rank": rank, "step": step, "downtime_s": downtime, "estimated": True, "parts": parts, "notes": notes}


@dataclass(frozen=True, slots=True, kw_only=True)
class _Calls:
    """What the estimate reads of a rank's records around the step it is replaced at."""

    first: Collective | PointToPoint | None = None  # its first call
    first_s: Collective | PointToPoint | None = None  # its first call from the step on
    prev_s: Collective | PointToPoint | None = None  # its call before that
    mem: tuple[int, int] | None = None  # (start, allocated bytes) of the step's earliest memory sample
    grads: int = 0  # the bytes of the gradients it reduced in the step


def _calls_at(bundle, src: int, step: int) -> _Calls:
    """Rank `src`'s first call, its first from `step` on and the one before that, its
    earliest memory sample in `step`, and the gradients it reduced in `step`."""
    first = first_s = prev_s = mem = None
    grads = 0
    for rec in bundle.events(src):
        alloc = getattr(rec, "mem_alloc", None)
        if rec.step == step and type(alloc) is int and (mem is None or rec.start_ns < mem[0]):
            mem = (rec.start_ns, alloc)
        if not isinstance(rec, (Collective, PointToPoint)):
            continue
        if first is None or rec.start_ns < first.start_ns:
            first = rec
        if rec.step >= step and (first_s is None or rec.start_ns < first_s.start_ns):
            first_s = rec
        if isinstance(rec, Collective) and rec.step == step:
            op = lookup(rec.op)
            if op is None:
                continue
            if op.form == "reduce_all":  # the whole gradient, reduced
                grads += max(0, rec.in_bytes)
            elif shard_side(op.form) == "out" and op.same == "in":  # a reduce-scatter: this rank's shard
                grads += max(0, rec.out_bytes)
    if first_s is not None:
        for rec in bundle.events(src):
            if isinstance(rec, (Collective, PointToPoint)) and rec.start_ns < first_s.start_ns and \
                    (prev_s is None or rec.start_ns > prev_s.start_ns):
                prev_s = rec
    return _Calls(first=first, first_s=first_s, prev_s=prev_s, mem=mem, grads=grads)


def _start_up(info: dict, src: int, calls: _Calls, notes: list[str]) -> tuple[int, str]:
    """The new process's start-up, ns, and where it is counted from (the module's doc)."""
    clock = info.get("clock") if isinstance(info.get("clock"), dict) else {}
    started, start_from = _int(clock.get("process_start_ns")), "process start"
    if started is None:
        started, start_from = _int(clock.get("monotonic_ns")), "init_process_group"
        if started is not None:
            notes.append("start-up counts from init_process_group: the recording does not say when the process "
                         "started (imports not counted)")
    start_up_ns = 0
    if started is None:
        notes.append(f"start-up counted as 0 s: rank {src}'s rank info has no clock")
    elif info.get("steps") is not None:  # a recording of some steps (windowed)
        init = _int(clock.get("monotonic_ns"))
        start_up_ns = max(0, init - started) if init is not None else 0
        start_from = f"{start_from} to init_process_group"
        notes.append("a recording of some steps holds no first call of the program: start-up ends at "
                     "init_process_group (model build and a cold first step not counted)")
    elif calls.first is not None:
        start_up_ns = max(0, calls.first.start_ns - started)
        prev_s, first_s = calls.prev_s, calls.first_s
        if prev_s is not None and first_s is not None:
            resume = prev_s.issued_ns if prev_s.async_op and type(prev_s.issued_ns) is int else prev_s.end_ns
            if resume is not None:
                start_up_ns = max(0, start_up_ns - max(0, first_s.start_ns - resume))
    return start_up_ns, start_from


def _rejoin(model: CostModel, world: int, notes: list[str]) -> tuple[float, str | None]:
    """The rendezvous of the world, ns, and what it is priced as (a barrier, else an empty
    all_reduce, else 0 and None)."""
    rejoin = model.predict_ns("barrier", 0, world)
    rejoin_as = "barrier"
    if rejoin is None:
        rejoin, rejoin_as = model.predict_ns("all_reduce", 0, world), "empty all_reduce"
        if rejoin is not None:
            notes.append("rejoin priced as an empty all_reduce of the world: the recording has no barrier")
    if rejoin is None:
        rejoin, rejoin_as = 0.0, None
        notes.append("rejoin counted as 0 s: the recording has no barrier or all_reduce to price a rendezvous by")
    return rejoin, rejoin_as


def _state_bytes(calls: _Calls, src: int, step: int, notes: list[str]) -> tuple[int, str]:
    """The bytes the new process must receive, and what stands for them: its allocated
    memory at the step's start, else (a floor) the gradients it reduced in the step."""
    if calls.mem is not None:
        return calls.mem[1], "allocated memory"
    notes.append(f"state: no memory recorded for rank {src} in step {step}; its gradients reduced in the step "
                 f"stand for it, a floor (no optimizer state)")
    return calls.grads, "gradients"


def _transfer(model: CostModel, nbytes: int) -> tuple[float, float | None, str | None]:
    """(ns, bytes/s, whence) of moving `nbytes` from one rank to another, by the model."""
    p2p = model.fits.get("p2p")
    if model.given_bytes_per_s:
        return nbytes * 1e9 / model.given_bytes_per_s, model.given_bytes_per_s, "given to scale"
    if p2p is not None and p2p.identified and p2p.ns_per_byte > 0:
        return p2p.predict_ns(nbytes, 2), 1e9 / p2p.ns_per_byte, "point-to-point fit"
    if model.pooled_identified and model.pooled_ns_per_byte > 0:
        return nbytes * model.pooled_ns_per_byte, 1e9 / model.pooled_ns_per_byte, "pooled over collectives"
    return 0.0, None, None


def words(entry: dict) -> str:
    """One replacement's downtime for people: 'downtime X s (start-up a s, rejoin b s, state
    c GiB at d GB/s: e s)', or 'downtime X s (given)'."""
    p = entry.get("parts")
    head = f"downtime {_s(entry['downtime_s'])}"
    if not entry.get("estimated") or not isinstance(p, dict):
        return f"{head} (given)"
    bw = p.get("bandwidth_bytes_per_s")
    at = f"at {bw / 1e9:.3g} GB/s" if bw else "at an unknown bandwidth"
    return (f"{head} (start-up {_s(p['start_up_s'])}, rejoin {_s(p['rejoin_s'])}, state "
            f"{_size(p['state_bytes'])} {at}: {_s(p['state_s'])})")


def _s(v: float) -> str:
    return f"{v * 1e3:.1f} ms" if v < 1 else f"{v:.2f} s"


def _size(n: int) -> str:
    for unit, k in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << k:
            return f"{n / (1 << k):.3g} {unit}"
    return f"{n} B"


def note_lines(entry: dict) -> list[str]:
    return [shown(n) for n in entry.get("notes") or ()]
