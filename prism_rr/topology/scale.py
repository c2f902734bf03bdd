"""Target scale: the bundle of a larger job, built from a recorded slice.

    note = scale("run.prism", "big.prism", dp=4096)   # world 4 (dp2 x tp2) -> 8192

The recorded mesh (recorded DeviceMesh, `mesh=`, or the group structure) grows to the
new sizes. The new bundle holds records for one representative per role only (the rank
with data-parallel coordinates 0); the manifest's `roles` entry maps every rank of the
new world to its representative, and `recorded_ranks` lists the representatives.

- Groups: every DeviceMesh group family of the recording is laid out again over the new
  mesh, in the order torch creates them (families by first id; within a family, groups
  by their fixed coordinates, row-major), so group ids are those the program will create
  at the new size. The manifest lists every group of the new world.
- Records of a representative are its source rank's (the recorded rank of the same role),
  with groups, roots and peers mapped into the new world. Collectives on a group that
  grows get shapes for the new size: FSDP2's all_gather / reduce_scatter from the
  per-parameter layout the recorder noted (each parameter's dim 0 padded to a multiple
  of the group size), exactly; other tensor forms keep the whole buffer (dim 0 rounded
  up: predicted, and the replay takes the live shapes there); list forms get one entry
  per member.
  Digests and payload blobs go (the numerics at scale are synthetic), but for small
  point-to-point messages (at most 1 KiB: control data such as pipelining's handshakes).
- Timing: a synchronous collective is entered at its recorded last arrival (its end
  minus its transfer time, the smallest end - start among recorded members) and lasts
  its transfer time, rescaled by the cost model for the new group size and bytes; an
  async one keeps its start and shifts its end. Every later time of the rank moves by
  the sum of the changes before it, so compute gaps are kept.
"""

from __future__ import annotations

import bisect
import dataclasses
import time
from math import ceil, prod
from pathlib import Path
from typing import Any, Callable

from prism_rr.errors import UsageError
from prism_rr.format import layout, ops
from prism_rr.format.blobs import KEEP_SMALL, write_blob
from prism_rr.format.codec import pack_ranks
from prism_rr.format.reader import open_bundle
from prism_rr.format.records import Collective, Compute, GroupInfo, PointToPoint
from prism_rr.format.rewrite import Rewrite, new_output
from prism_rr.topology.costmodel import CostModel, fit, message_bytes, samples
from prism_rr.topology.roles import Mesh, derive_roles, mesh_from_groups, parse_mesh, roles_for_mesh

__all__ = ["compare_transfers", "scale"]

_CHUNK = 2048


@dataclasses.dataclass(slots=True)
class _Family:
    """Groups DeviceMesh made for one set of dims, at consecutive ids from `base`."""

    dims: tuple[int, ...]  # mesh dims that vary within a group (all dims: the world)
    base: int  # id of the family's first group in the recording
    desc: str
    name_is_id: bool
    backend: str
    new_base: int = 0


def _fixed_index(mesh: Mesh, coords, dims) -> int:
    """Row-major index of `coords` over the mesh dims not in `dims`."""
    idx = 0
    for d, s in enumerate(mesh.shape):
        if d not in dims:
            idx = idx * s + coords[d]
    return idx


def _group_count(mesh: Mesh, dims) -> int:
    return prod(s for d, s in enumerate(mesh.shape) if d not in dims)


def _group_ranks(mesh: Mesh, dims, fixed_coords) -> list[int]:
    """Ranks of the group along `dims` through `fixed_coords`, in rank order."""
    out = []
    sizes = [mesh.shape[d] for d in dims]
    for k in range(prod(sizes)):
        c = list(fixed_coords)
        for d, s in zip(reversed(dims), reversed(sizes)):
            c[d] = k % s
            k //= s
        out.append(mesh.rank_at(c))
    return sorted(out)


def _families(mesh: Mesh, groups: list[dict]) -> tuple[dict[int, tuple[_Family, int]], list[_Family]]:
    """Each recorded group as (family, index in the family), and the families by id."""
    world = mesh.world_size
    all_dims = tuple(range(len(mesh.shape)))
    fams: dict[tuple, _Family] = {}
    where: dict[int, tuple[_Family, int]] = {}
    for g in sorted(groups, key=lambda g: g["id"]):
        ranks = tuple(sorted(g["ranks"]))
        desc = str(g.get("desc") or "")
        if len(ranks) == world:
            dims, idx = all_dims, 0
        else:
            coords = [mesh.coords(r) for r in ranks]
            dims = tuple(d for d in all_dims if len({c[d] for c in coords}) > 1)
            named = desc[5:] if desc.startswith("mesh_") else ""
            if named in mesh.dim_names:
                d = mesh.dim_names.index(named)
                if set(dims) <= {d}:
                    dims = (d,)
            if sorted(_group_ranks(mesh, dims, coords[0])) != list(ranks):
                raise UsageError(
                    f"group {g['id']} (ranks {list(ranks)[:8]}{'...' if len(ranks) > 8 else ''}) is not a slice "
                    f"of the mesh {mesh.spec()}; only DeviceMesh groups and the world can be scaled"
                )
            idx = _fixed_index(mesh, coords[0], dims)
        base = g["id"] - idx
        key = (dims, base)
        fam = fams.get(key)
        if fam is None:
            fam = fams[key] = _Family(dims, base, desc, str(g.get("name", "")) == str(g["id"]),
                                      str(g.get("backend") or ""))
        where[g["id"]] = (fam, idx)
    return where, sorted(fams.values(), key=lambda f: f.base)


def _old_mesh(bundle, mesh) -> Mesh:
    if mesh is not None:
        return parse_mesh(mesh, bundle.world_size)
    roles = derive_roles(bundle)
    if roles.mesh is not None:
        return roles.mesh
    found = mesh_from_groups(bundle.world_size, bundle.groups)
    if found is None:
        raise UsageError("the recording has no DeviceMesh and its groups form none; give mesh= (e.g. dp=2,tp=2)")
    return found


def _map_coord(c: int, old: int, new: int) -> int:
    return c if c < new and old <= new else c * new // old


def _layout_size(layouts, kind: str, n_old: int, size_old: int, n_new: int) -> int | None:
    """The size at group size n_new of an FSDP2 all-gather input ("ag") or reduce-scatter
    output ("rs") of size_old at n_old, from the recorded per-parameter layout; None
    when none was recorded for it."""
    rows = ((layouts or {}).get(kind) or {}).get(f"{n_old}:{size_old}")
    try:
        if not rows or sum(ceil(int(d) / n_old) * int(w) for d, w in rows) != size_old:
            return None
        return sum(ceil(int(d) / n_new) * int(w) for d, w in rows)
    except (TypeError, ValueError, ZeroDivisionError):
        return None


def _rescale_shapes(rec: Collective, n_old: int, n_new: int, layouts=None) -> tuple[dict, bool]:
    """New shape and byte fields for a collective whose group changes size; (changes,
    predicted). FSDP2's gathers and scatters are exact where the recording noted their
    per-parameter layout (`fsdp_layouts` in the rank info), predicted otherwise."""
    op = ops.lookup(rec.op)
    if n_old == n_new or op is None:
        return {}, False

    def esize(nbytes, shapes):
        numel = sum(prod(s) for s in shapes)
        return nbytes / numel if numel else 0

    side = ops.shard_side(op.form)  # "in": a gather's input; "out": a scatter's output
    gather = side == "in"
    if side is not None and ops.joined(op.form):
        # The shard side (a gather's input, a scatter's output) and the whole n_new times it.
        shards, nbytes = (rec.in_shapes, rec.in_bytes) if gather else (rec.out_shapes, rec.out_bytes)
        if len(shards) == 1 and shards[0]:
            shard = shards[0]
            e = esize(nbytes, shards)
            size = _layout_size(layouts, "ag" if gather else "rs", n_old, shard[0], n_new) if len(shard) == 1 else None
            predicted = size is None
            new = (ceil(shard[0] * n_old / n_new), *shard[1:]) if predicted else (size,)
            whole = (new[0] * n_new, *new[1:])
            ins, outs = ((new,), (whole,)) if gather else ((whole,), (new,))
            return {"in_shapes": ins, "out_shapes": outs, "in_bytes": round(prod(ins[0]) * e),
                    "out_bytes": round(prod(outs[0]) * e)}, predicted
    if side == "in" and rec.out_shapes and len(rec.out_shapes) == n_old:
        per = rec.out_bytes // max(1, n_old)
        return {"out_shapes": (rec.out_shapes[0],) * n_new, "out_dtypes": (rec.out_dtypes[0],) * n_new if rec.out_dtypes else (),
                "out_bytes": per * n_new}, False
    if side == "out" and rec.in_shapes and len(rec.in_shapes) == n_old:
        per = rec.in_bytes // max(1, n_old)
        return {"in_shapes": (rec.in_shapes[0],) * n_new, "in_dtypes": (rec.in_dtypes[0],) * n_new if rec.in_dtypes else (),
                "in_bytes": per * n_new}, False
    # all_to_all: splits differ by rank, and the recorded ones stand for the new size's
    return {}, op.same is None and not op.p2p


class _Shift:
    """Old time -> new time: later times move by the changes of the calls ended before them."""

    def __init__(self, changes: list[tuple[int, int]]):
        changes.sort()
        self.ends = [e for e, _ in changes]
        self.sums = []
        total = 0
        for _, d in changes:
            total += d
            self.sums.append(total)

    def __call__(self, t: int | None) -> int | None:
        if t is None:
            return None
        i = bisect.bisect_right(self.ends, t)
        return t + (self.sums[i - 1] if i else 0)

    def before(self, t: int) -> int:
        """The shift of a time just before `t` (a call's own change excluded)."""
        i = bisect.bisect_left(self.ends, t)
        return t + (self.sums[i - 1] if i else 0)


def scale(
    in_path,
    out_path,
    *,
    dp: int,
    tp: int | None = None,
    pp: int | None = None,
    mesh: str | Mesh | None = None,
    model: CostModel | None = None,
    latency: str = "constant",
    bandwidth: float | None = None,
    prefer=(),
    progress: Callable[[int, int], None] | None = None,
) -> dict:
    """Write `out_path`, the bundle of the recorded job at the new mesh sizes; returns the
    `scale` note stored in its manifest (meshes, roles, the cost model and its fit error).
    `bandwidth` (bytes/s): the target's, for every family, instead of the fitted ones.
    `prefer`: ranks to write as their roles' representatives (by default the member with
    data-parallel coordinate 0); at the recorded sizes this maps a representative's records
    onto another member of its role, which is how `replay` runs a rank that was not recorded."""
    t_start = time.perf_counter()
    in_path, out_path = new_output(in_path, out_path, "scale")
    for name, v in (("dp", dp), ("tp", tp), ("pp", pp)):
        if v is not None and int(v) < 1:
            raise UsageError(f"--{name} must be 1 or more")
    with open_bundle(in_path) as bundle:
        old = _old_mesh(bundle, mesh)
        new = old.resized(**_new_sizes(old, dp, tp, pp))
        layout.bounded(new.world_size, layout.MAX_WORLD, "world size", "scale")
        recorded = bundle.recorded_ranks
        old_roles = roles_for_mesh(old.world_size, old, prefer=recorded)
        new_roles = roles_for_mesh(new.world_size, new, prefer=prefer)
        where, fams = _families(old, bundle.groups)
        _renumber(fams, old, new)
        model = _model(bundle, model, latency, bandwidth)
        transfers = {s.key: s.transfer_ns for s in samples(bundle)}
        group_ranks = {g["id"]: tuple(g["ranks"]) for g in bundle.groups}
        infos = {r: bundle.raw_rank_info(r) for r in recorded}  # copied as recorded
        run = dict(bundle.manifest.get("run", {}))
        counts = {"records": 0, "rescaled_calls": 0, "predicted_shapes": 0}
        with Rewrite(out_path, prefix=".scale-") as rewrite:
            reps = new_roles.representatives
            for i, rep in enumerate(reps):
                rc = new.coords(rep)
                src_coords = [_map_coord(c, old.shape[d], new.shape[d]) for d, c in enumerate(rc)]
                src = old_roles.rep(old.rank_at(src_coords))
                if src not in set(recorded):
                    raise UsageError(f"rank {src} (the role of new rank {rep}) was not recorded")
                ctx = _RankMap(old, new, fams, where, group_ranks, src, rep)
                _write_rank(bundle, ctx, infos[src], model, transfers, rewrite, counts)
                if progress:
                    progress(i + 1, len(reps))
            note = _note(old, new, recorded, new_roles, model, fams, counts)
            rewrite.pack(run, manifest_extra={
                "groups": _new_groups(new, fams), "roles": new_roles.to_manifest(), "scale": note,
                "features_optional": _features(bundle, rewrite),
            })
    note["seconds"] = round(time.perf_counter() - t_start, 3)
    note["bytes"] = out_path.stat().st_size
    return note


def _new_sizes(old: Mesh, dp: int, tp: int | None, pp: int | None) -> dict[str, int]:
    """The new size of each dimension resized: dp always, tp and pp where given (1 for a
    dimension the recorded mesh lacks)."""
    sizes = {old.dim_names[old.dp_dim]: int(dp)}
    for name, v in (("tp", tp), ("pp", pp)):
        if v is None:
            continue
        if name not in old.dim_names:
            if int(v) != 1:
                raise UsageError(f"the recorded mesh {old.spec()} has no {name} dimension to resize")
            continue
        sizes[name] = int(v)
    return sizes


def _renumber(fams, old: Mesh, new: Mesh) -> None:
    """New ids: each family takes as many ids as it has groups at the new size; any ids
    the families do not explain keep their distance."""
    shift = 0
    for fam in fams:
        fam.new_base = fam.base + shift
        shift += _group_count(new, fam.dims) - _group_count(old, fam.dims)


def _model(bundle, model: CostModel | None, latency: str, bandwidth: float | None) -> CostModel:
    """The cost model given, else fitted to the bundle's calls; with the target's
    bandwidth for every family if given."""
    if model is None:
        model = fit(samples(bundle), latency=latency)
    if bandwidth is not None:
        try:
            model = model.with_bandwidth(float(bandwidth))
        except ValueError as exc:
            raise UsageError(str(exc)) from None
    return model


def _new_groups(new: Mesh, fams) -> list[dict]:
    """The groups section of the new world: every family's groups at the new size."""
    groups = []
    for fam in fams:
        n = _group_count(new, fam.dims)
        for k in range(n):
            fixed = [0] * len(new.shape)
            j = k
            for d in reversed(range(len(new.shape))):
                if d not in fam.dims:
                    fixed[d] = j % new.shape[d]
                    j //= new.shape[d]
            gid = fam.new_base + k
            groups.append({"id": gid, "ranks": pack_ranks(_group_ranks(new, fam.dims, fixed)),
                           "name": str(gid) if fam.name_is_id else fam.desc, "desc": fam.desc,
                           "backend": fam.backend})
    return groups


def _features(bundle, rewrite: Rewrite) -> list[str]:
    """The new bundle's optional features: the recording's, less its payloads (blobs if
    small messages' were carried), with roles and scaled."""
    features = set(bundle.manifest.get("features_optional", ())) - {"blobs", "digests"}
    if (rewrite.spool_dir / "blobs").exists():
        features.add("blobs")
    features |= {"summaries", "roles", "scaled"}
    return sorted(features)


def _note(old: Mesh, new: Mesh, recorded: list[int], new_roles, model: CostModel, fams, counts: dict) -> dict:
    """The manifest's `scale`: both meshes, the roles, the model, and what was changed."""
    return {
        "from": {"world_size": old.world_size, "mesh": old.to_dict(), "recorded_ranks": recorded},
        "to": {"world_size": new.world_size, "mesh": new.to_dict()},
        "roles": new_roles.count,
        "model": model.to_dict(),
        "rescaled_calls": counts["rescaled_calls"],
        "resized_groups": [
            {"desc": f.desc, "first_id": f.new_base, "count": _group_count(new, f.dims),
             "size_from": prod(old.shape[d] for d in f.dims), "size_to": prod(new.shape[d] for d in f.dims)}
            for f in fams if prod(old.shape[d] for d in f.dims) != prod(new.shape[d] for d in f.dims)
        ],
        # Only where some shape was predicted (no FSDP layout recorded for it).
        "predicted_shape_ops": sorted(o.name for o in ops.OPS.values() if ops.joined(o.form))
        if counts["predicted_shapes"] else [],
        "predicted_shapes": counts["predicted_shapes"],
        "timing": "sync collectives start at their recorded last arrival and last the modelled transfer",
        "numerics": "synthetic: digests and payloads removed but for small point-to-point messages",
        "batch": "per-rank batch as recorded: give the program a global batch that grows with dp",
    }


class _RankMap:
    """How one source rank's groups, roots and peers read for one new representative."""

    def __init__(self, old: Mesh, new: Mesh, fams, where, group_ranks, src: int, rep: int):
        self.old, self.new = old, new
        self.where = where
        self.group_ranks = group_ranks
        self.src, self.rep = src, rep
        self.src_c, self.rep_c = old.coords(src), new.coords(rep)
        self._gid: dict[int, int] = {}

    def gid(self, old_gid: int) -> int:
        g = self._gid.get(old_gid)
        if g is None:
            if old_gid not in self.where:
                raise UsageError(f"rank {self.src} uses group {old_gid}, which the recording does not describe")
            fam, _ = self.where[old_gid]
            g = self._gid[old_gid] = fam.new_base + _fixed_index(self.new, self.rep_c, fam.dims)
        return g

    def sizes(self, old_gid: int) -> tuple[int, int]:
        fam, _ = self.where[old_gid]
        return (prod(self.old.shape[d] for d in fam.dims), prod(self.new.shape[d] for d in fam.dims))

    def rank(self, old_rank: int | None, old_gid: int) -> int | None:
        """A global rank of the recording, as the member at the same place in the new group."""
        if old_rank is None or old_rank < 0:
            return old_rank
        fam, _ = self.where[old_gid]
        oc = self.old.coords(old_rank)
        c = list(self.rep_c)
        for d in fam.dims:
            if d in self.old.replica_dims:  # replicas: the same distance from this rank
                c[d] = (self.rep_c[d] + oc[d] - self.src_c[d]) % self.new.shape[d]
            else:
                c[d] = _map_coord(oc[d], self.old.shape[d], self.new.shape[d])
        return self.new.rank_at(c)


def _copy_blobs(bundle, ids, tmp: Path) -> bool:
    """Carry a small message's payload into the new bundle: point-to-point messages
    between the same stages say the same thing at any data-parallel size, and small ones
    steer control flow (pipelining's handshakes)."""
    if not ids:
        return False
    try:
        for ident in ids:
            write_blob(tmp, bundle.blob(ident))
    except Exception:
        return False
    return True


def _write_rank(bundle, ctx: _RankMap, info: dict, model: CostModel, transfers: dict, rewrite: Rewrite,
                counts) -> None:
    """Write the new representative `ctx.rep` from the records of `ctx.src`: collectives
    last the modelled transfer at their new size, and every later time moves with them."""
    records = list(bundle.events(ctx.src))
    plan, shift, moved = _plan(records, ctx, info, model, transfers, counts)
    out = []
    for i, rec in enumerate(records):
        ch = _changes(rec, plan.get(i), shift, moved, ctx, bundle, rewrite.spool_dir)
        if ch is not None:
            out.append(dataclasses.replace(rec, **ch))
    counts["records"] += len(out)
    new_info = _new_info(info, ctx)
    rewrite.write_rank(ctx.rep, new_info, (out[k : k + _CHUNK] for k in range(0, len(out), _CHUNK)))


def _plan(records: list, ctx: _RankMap, info: dict, model: CostModel, transfers: dict,
          counts) -> tuple[dict[int, tuple[int, int | None, dict]], _Shift, dict[int, int]]:
    """Pass 1: each collective's new start, end and field changes, on the old clock, by
    its index; the time shift its changes make; {old start: new start} of the calls that
    now start later."""
    plan: dict[int, tuple[int, int | None, dict]] = {}
    changes: list[tuple[int, int]] = []
    moved: dict[int, int] = {}
    for i, rec in enumerate(records):
        if type(rec) is not Collective:
            continue
        n_old, n_new = ctx.sizes(rec.group) if rec.group in ctx.where else (1, 1)
        fields, predicted = _rescale_shapes(rec, n_old, n_new, info.get("fsdp_layouts"))
        if predicted:
            counts["predicted_shapes"] += 1
        if rec.end_ns is None:
            plan[i] = (rec.start_ns, None, fields)
            continue
        t_old = transfers.get((rec.group, rec.seq))
        dur = rec.end_ns - rec.start_ns
        if t_old is None or not 0 <= t_old <= dur:
            t_old = dur
        b_old = message_bytes(rec, n_old)
        b_new = message_bytes(dataclasses.replace(rec, **fields), n_new) if fields else b_old
        delta = model.delta_ns(rec.op, b_old, n_old, b_new, n_new) if (n_old, b_old) != (n_new, b_new) else 0
        delta = max(delta, -t_old)
        if delta:
            counts["rescaled_calls"] += 1
        if rec.async_op:
            start = rec.start_ns
        else:
            start = rec.end_ns - t_old
            if start != rec.start_ns:
                moved[rec.start_ns] = start
        plan[i] = (start, rec.end_ns + delta, fields)
        if delta:
            changes.append((rec.end_ns, delta))
    return plan, _Shift(changes), moved


def _changes(rec, planned, shift: _Shift, moved: dict[int, int], ctx: _RankMap, bundle,
             spool_dir: Path) -> dict[str, Any] | None:
    """Pass 2: the field changes that make `rec` a record of the new rank (`planned`: a
    collective's from pass 1), or None for a group the new world does not have."""
    cls = type(rec)
    ch: dict[str, Any] = {}
    if cls is Collective:
        start, end, fields = planned
        ch.update(fields)
        ch["start_ns"] = shift(start)
        ch["end_ns"] = None if end is None else shift.before(rec.end_ns) + (end - rec.end_ns)
        ch["group"] = ctx.gid(rec.group)
        if rec.root is not None:
            ch["root"] = ctx.rank(rec.root, rec.group)
        if rec.issued_ns is not None:  # a blocking call's start moved later: it returns after it
            ch["issued_ns"] = max(shift(rec.issued_ns), ch["start_ns"])
        ch.update(digest_in=None, digest_out=None, blob_in=None, blob_out=None)
    elif cls is PointToPoint:
        ch["start_ns"] = shift(rec.start_ns)
        ch["end_ns"] = shift(rec.end_ns)
        ch["group"] = ctx.gid(rec.group)
        ch["peer"] = ctx.rank(rec.peer, rec.group)
        if rec.issued_ns is not None:
            ch["issued_ns"] = shift(rec.issued_ns)
        if rec.nbytes is None or rec.nbytes > KEEP_SMALL or not _copy_blobs(bundle, rec.blob, spool_dir):
            ch.update(digest=None, blob=None)
    elif cls is GroupInfo:
        if rec.group not in ctx.where:
            return None
        fam, _ = ctx.where[rec.group]
        gid = ctx.gid(rec.group)
        ranks = tuple(_group_ranks(ctx.new, fam.dims, ctx.rep_c))
        ch.update(group=gid, ranks=ranks, name=str(gid) if fam.name_is_id else rec.name,
                  start_ns=shift(rec.start_ns), end_ns=shift(rec.end_ns))
    else:
        ch["start_ns"] = shift(rec.start_ns)
        end = rec.end_ns
        if cls is Compute and end is not None and end in moved:
            end = moved[end]
        ch["end_ns"] = shift(end)
    return ch


def _new_info(info: dict, ctx: _RankMap) -> dict:
    """The source rank's info, as the new rank's: its rank, world size, environment and
    device mesh, and the rank it was scaled from."""
    new_info = dict(info)
    new_info.update(rank=ctx.rep, world_size=ctx.new.world_size, scaled_from=ctx.src)
    env = dict(new_info.get("env") or {})
    if env:
        env.update(RANK=str(ctx.rep), WORLD_SIZE=str(ctx.new.world_size))
        new_info["env"] = env
    dm = dict(info.get("device_mesh") or {})
    dm.update(shape=list(ctx.new.shape), dim_names=list(ctx.new.dim_names),
              ranks=list(range(ctx.new.world_size)))
    dm.setdefault("device_type", info.get("device", "cpu"))
    new_info["device_mesh"] = dm
    return new_info


def compare_transfers(predicted, recorded) -> dict:
    """Per cost family: predicted (a scaled bundle) vs recorded transfer times of the same
    calls, matched by (group, seq); errors of the mean and per call, in percent."""
    with open_bundle(predicted) as p, open_bundle(recorded) as r:
        pred = {s.key: s for s in samples(p)}
        rec = {s.key: s for s in samples(r)}
    by: dict[str, list[tuple[int, int]]] = {}
    for key, s in rec.items():
        q = pred.get(key)
        if q is None or q.fam != s.fam:
            continue
        by.setdefault(s.fam, []).append((q.transfer_ns, s.transfer_ns))
    out: dict[str, Any] = {"ops": {}}
    all_p = all_r = 0
    ape = []
    for fam, pairs in sorted(by.items()):
        sp = sum(p for p, _ in pairs)
        sr = sum(r for _, r in pairs)
        errs = [abs(p - r) / max(1, r) for p, r in pairs]
        out["ops"][fam] = {
            "calls": len(pairs),
            "recorded_mean_us": round(sr / len(pairs) / 1e3, 2),
            "predicted_mean_us": round(sp / len(pairs) / 1e3, 2),
            "mean_error_pct": round(100.0 * (sp - sr) / max(1, sr), 2),
            "call_mape_pct": round(100.0 * sum(errs) / len(errs), 2),
        }
        all_p += sp
        all_r += sr
        ape += errs
    out["calls"] = len(ape)
    out["total_error_pct"] = round(100.0 * (all_p - all_r) / max(1, all_r), 2) if ape else None
    out["call_mape_pct"] = round(100.0 * sum(ape) / len(ape), 2) if ape else None
    return out
