"""Roles: ranks that do the same work, and the one rank that stands for each.

Two ranks share a role when they sit at the same coordinates on every mesh dimension
except the data-parallel ones (they are replicas). The mesh comes from, in order: an
explicit spec (`dp=2,tp=2`, dims in row-major order, the last varying fastest, as
`init_device_mesh` lays ranks out), the DeviceMesh the recorder saw (rank info
`device_mesh`), or the process groups: groups that DeviceMesh made for a dimension
carry the description `mesh_<dim>`; failing that, the family of translated groups
with the largest stride is taken for data parallel (the outermost dimension, where
torch and torchtitan put dp when pp is absent).

A role's representative is its member with every replica coordinate 0 (or the smallest
recorded member, for a bundle that recorded other ranks). The manifest key `roles`
(`Roles.to_manifest`) says which rank stands for which; a reader maps a rank with
`Roles.from_manifest(bundle.manifest["roles"]).rep(rank)`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from math import prod
from pathlib import Path
from typing import Any, Iterable

from prism_rr.errors import UsageError
from prism_rr.format import layout
from prism_rr.format.spool import frame_info, read_spool
from prism_rr.text import shown

__all__ = ["Mesh", "Roles", "derive_roles", "is_replica_dim", "parse_mesh", "roles_for_mesh", "slice_ranks"]

# Dimension names that mean "a replica of the same work" (DeviceMesh names in use).
_REPLICA_NAMES = frozenset({"dp", "ddp", "fsdp", "data", "dp_replicate", "dp_shard", "replicate", "shard", "hsdp"})
MAX_EXPLICIT = 1 << 16  # roles given rank by rank (no mesh): the manifest lists each rank's role


def is_replica_dim(name: str) -> bool:
    n = name.lower()
    return n in _REPLICA_NAMES or n.startswith("dp") or n.startswith("data")


@dataclass(frozen=True, slots=True)
class Mesh:
    """A DeviceMesh: named dims, their sizes, and the rank at each position (row-major)."""

    dim_names: tuple[str, ...]
    shape: tuple[int, ...]
    ranks: tuple[int, ...] | None = None  # None: ranks 0..world-1 in order
    _index: dict = field(default=None, compare=False, repr=False)  # rank -> position

    def __post_init__(self):
        if len(self.dim_names) != len(self.shape) or not self.shape or any(s < 1 for s in self.shape):
            raise UsageError(f"a mesh needs one positive size per named dim, not {shown(self.dim_names)} "
                             f"{shown(self.shape)}")
        if len(set(self.dim_names)) != len(self.dim_names):
            raise UsageError(f"mesh dims must have distinct names: {shown(self.dim_names)}")
        if self.ranks is not None:
            if list(self.ranks) == list(range(len(self.ranks))):
                object.__setattr__(self, "ranks", None)
            else:
                if len(self.ranks) != prod(self.shape) or sorted(self.ranks) != list(range(len(self.ranks))):
                    raise UsageError("mesh ranks must be a permutation of 0..world-1")
                object.__setattr__(self, "_index", {r: i for i, r in enumerate(self.ranks)})

    @property
    def world_size(self) -> int:
        return prod(self.shape)

    @property
    def replica_dims(self) -> tuple[int, ...]:
        """Dims whose coordinate does not change a rank's work; dim 0 when none is named so."""
        dims = tuple(i for i, n in enumerate(self.dim_names) if is_replica_dim(n))
        return dims or (0,)

    @property
    def dp_dim(self) -> int:
        """The data-parallel dim: the one named dp, else the first replica dim."""
        return next((i for i, n in enumerate(self.dim_names) if n == "dp"), self.replica_dims[0])

    def size(self, name: str) -> int:
        return self.shape[self.dim_names.index(name)] if name in self.dim_names else 1

    def coords(self, rank: int) -> tuple[int, ...]:
        pos = rank if self._index is None else self._index[rank]
        out = []
        for s in reversed(self.shape):
            out.append(pos % s)
            pos //= s
        return tuple(reversed(out))

    def rank_at(self, coords: Iterable[int]) -> int:
        pos = 0
        for c, s in zip(coords, self.shape):
            pos = pos * s + c
        return pos if self.ranks is None else self.ranks[pos]

    def resized(self, **sizes: int) -> "Mesh":
        """The same dims with some sizes changed (ranks laid out in order)."""
        shape = tuple(int(sizes.get(n) or s) for n, s in zip(self.dim_names, self.shape))
        return Mesh(self.dim_names, shape)

    def spec(self) -> str:
        return ",".join(f"{n}={s}" for n, s in zip(self.dim_names, self.shape))

    def to_dict(self) -> dict:
        d: dict[str, Any] = {"dim_names": list(self.dim_names), "shape": list(self.shape)}
        if self.ranks is not None:
            d["ranks"] = list(self.ranks)
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "Mesh":
        names = d.get("dim_names") or [f"dim_{i}" for i in range(len(d.get("shape", ())))]
        ranks = d.get("ranks")
        return cls(tuple(str(n) for n in names), tuple(int(s) for s in d["shape"]),
                   tuple(int(r) for r in ranks) if ranks is not None else None)


def parse_mesh(spec: str | Mesh | dict, world_size: int | None = None) -> Mesh:
    """`dp=2,tp=2` (row-major, last fastest). With `world_size`, one size may be `-1` or
    left out for dp (`tp=2` in a world of 8 is `dp=4,tp=2`)."""
    if isinstance(spec, Mesh):
        mesh = spec
    elif isinstance(spec, dict):
        mesh = Mesh.from_dict(spec)
    else:
        names, sizes = [], []
        for part in str(spec).replace(" ", "").split(","):
            if not part:
                continue
            name, eq, value = part.partition("=")
            try:
                size = int(value)
            except ValueError:
                raise UsageError(f"a mesh looks like dp=2,tp=2, not {spec!r}") from None
            if not eq or not name or size == 0 or size < -1:
                raise UsageError(f"a mesh looks like dp=2,tp=2, not {spec!r}")
            names.append(name)
            sizes.append(size)
        if world_size is not None and "dp" not in names and -1 not in sizes:
            names.insert(0, "dp")
            sizes.insert(0, -1)
        if sizes.count(-1) > 1:
            raise UsageError(f"mesh {spec!r}: at most one size may be -1")
        if -1 in sizes:
            if world_size is None:
                raise UsageError(f"mesh {spec!r}: a size of -1 needs the world size")
            rest = prod(s for s in sizes if s != -1)
            if world_size % rest:
                raise UsageError(f"mesh {spec!r} does not divide a world of {world_size}")
            sizes[sizes.index(-1)] = world_size // rest
        if not names:
            raise UsageError(f"a mesh looks like dp=2,tp=2, not {spec!r}")
        mesh = Mesh(tuple(names), tuple(sizes))
    if world_size is not None and mesh.world_size != world_size:
        raise UsageError(f"mesh {mesh.spec()} has {mesh.world_size} ranks; the world has {world_size}")
    return mesh


@dataclass(frozen=True, slots=True)
class Roles:
    """Every rank's role and each role's representative."""

    world_size: int
    representatives: tuple[int, ...]  # representative of role i
    by: str  # "mesh", "groups", "explicit" or "none" (every rank its own role)
    mesh: Mesh | None = None
    role_of: tuple[int, ...] | None = None  # without a mesh: role of each rank
    _rep_role: dict = field(default=None, compare=False, repr=False)
    _keep: tuple = field(default=None, compare=False, repr=False)  # mesh dims that make the role

    def __post_init__(self):
        object.__setattr__(self, "_rep_role", {r: i for i, r in enumerate(self.representatives)})
        if self.mesh is not None:
            replica = self.mesh.replica_dims
            object.__setattr__(self, "_keep", tuple(i for i in range(len(self.mesh.shape)) if i not in replica))

    @property
    def count(self) -> int:
        return len(self.representatives)

    def role(self, rank: int) -> int:
        if not 0 <= rank < self.world_size:
            raise IndexError(f"rank {rank} is outside a world of {self.world_size}")
        if self.mesh is not None:
            c = self.mesh.coords(rank)
            role = 0
            for i in self._keep:
                role = role * self.mesh.shape[i] + c[i]
            return role
        if self.role_of is not None:
            return self.role_of[rank]
        return rank

    def rep(self, rank: int) -> int:
        """The rank whose recording stands for `rank`."""
        return self.representatives[self.role(rank)]

    def is_rep(self, rank: int) -> bool:
        return rank in self._rep_role

    def members(self, role: int) -> list[int]:
        """Ranks of one role, in order (O(role size) with a mesh, O(world) without)."""
        if self.mesh is not None:
            m = self.mesh
            rep = m.coords(self.representatives[role])
            dims = m.replica_dims
            out = []
            for k in range(prod(m.shape[d] for d in dims)):
                c = list(rep)
                for d in reversed(dims):
                    c[d] = k % m.shape[d]
                    k //= m.shape[d]
                out.append(m.rank_at(c))
            return sorted(out)
        if self.role_of is not None:
            return [r for r, x in enumerate(self.role_of) if x == role]
        return [role]

    def size(self, role: int) -> int:
        if self.mesh is not None:
            return prod(self.mesh.shape[d] for d in self.mesh.replica_dims)
        if self.role_of is not None:
            return self.role_of.count(role)
        return 1

    def to_manifest(self) -> dict:
        """The manifest's `roles` entry (msgpack-friendly)."""
        d: dict[str, Any] = {"by": self.by, "world_size": self.world_size,
                             "representatives": list(self.representatives)}
        if self.mesh is not None:
            d["mesh"] = self.mesh.to_dict()
            d["replica_dims"] = [self.mesh.dim_names[i] for i in self.mesh.replica_dims]
        elif self.role_of is not None:
            d["role_of"] = list(self.role_of)
        return d

    @classmethod
    def from_manifest(cls, d: dict) -> "Roles":
        try:
            mesh = Mesh.from_dict(d["mesh"]) if d.get("mesh") else None
            role_of = tuple(int(x) for x in d["role_of"]) if d.get("role_of") is not None else None
            return cls(int(d["world_size"]), tuple(int(r) for r in d["representatives"]), str(d.get("by", "")),
                       mesh, role_of)
        except (KeyError, TypeError, ValueError) as exc:
            raise UsageError(f"the manifest's roles entry is malformed ({shown(exc)})") from None


def roles_for_mesh(world_size: int, mesh: str | Mesh | dict, prefer: Iterable[int] = ()) -> Roles:
    """Roles of a world laid out on `mesh`; a role's representative is its member in
    `prefer` with the smallest rank, else the member with replica coordinates 0."""
    m = parse_mesh(mesh, world_size)
    base = Roles(world_size, (), "mesh", m)
    keep = [i for i in range(len(m.shape)) if i not in m.replica_dims]
    reps = []
    for k in range(prod(m.shape[i] for i in keep)):
        c = [0] * len(m.shape)
        for i in reversed(keep):
            c[i] = k % m.shape[i]
            k //= m.shape[i]
        reps.append(m.rank_at(c))
    prefer = sorted(set(prefer))
    if prefer:
        best: dict[int, int] = {}
        for r in prefer:
            if 0 <= r < world_size:
                best.setdefault(base.role(r), r)
        reps = [best.get(i, r) for i, r in enumerate(reps)]
    return Roles(world_size, tuple(reps), "mesh", m)


def slice_ranks(world_size: int, mesh: str | Mesh | dict, extra: Iterable[int] = ()) -> tuple[int, ...]:
    """The ranks `record --slice roles` records: one representative per role, plus `extra`."""
    roles = roles_for_mesh(world_size, mesh)
    return tuple(sorted(set(roles.representatives) | {r for r in extra if 0 <= r < world_size}))


# --- from a bundle ------------------------------------------------------------------


def _facts(source) -> tuple[int, list[dict], dict | None, list[int]]:
    """(world size, groups, recorded DeviceMesh or None, recorded ranks) of a bundle or a dict."""
    if isinstance(source, dict):
        world = int(source["world_size"])
        groups = [dict(g, ranks=tuple(g["ranks"])) for g in source.get("groups", ())]
        mesh = source.get("device_mesh")
        recorded = list(source.get("recorded_ranks", range(world)))
        return world, groups, mesh, recorded
    world = source.world_size
    mesh = None
    for r in source.recorded_ranks:
        m = source.rank_info(r).get("device_mesh")
        if isinstance(m, dict) and m.get("shape"):
            mesh = m
            break
    return world, list(source.groups), mesh, source.recorded_ranks


def derive_roles(source, mesh: str | Mesh | dict | None = None) -> Roles:
    """Roles of a recorded run (a Bundle, or a dict with world_size, groups and optionally
    device_mesh and recorded_ranks): from `mesh` when given, else the recorded DeviceMesh,
    else the group structure. Representatives are recorded ranks where the role has one."""
    world, groups, recorded_mesh, recorded = _facts(source)
    if mesh is None and recorded_mesh is not None:
        try:
            mesh = Mesh.from_dict(recorded_mesh)
        except (KeyError, TypeError, ValueError, UsageError):
            mesh = None
        if mesh is not None and mesh.world_size != world:
            mesh = None
    if mesh is not None:
        return roles_for_mesh(world, mesh, prefer=recorded)
    found = mesh_from_groups(world, groups)
    if found is not None:
        roles = roles_for_mesh(world, found, prefer=recorded)
        return Roles(world, roles.representatives, "groups", roles.mesh)
    return Roles(world, tuple(range(world)), "none")


def _pattern(ranks: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(r - ranks[0] for r in ranks)


def mesh_from_groups(world: int, groups: list[dict]) -> Mesh | None:
    """A mesh that explains the groups: each family of translated groups that partitions
    the world is a dim; None when the groups do not form one."""
    families: dict[tuple[int, ...], dict] = {}
    for g in groups:
        ranks = tuple(sorted(g["ranks"]))
        if len(ranks) < 2 or len(ranks) == world:
            continue
        pat = _pattern(ranks)
        step = pat[1]
        if any(b - a != step for a, b in zip(pat, pat[1:])):
            continue  # not one mesh dim
        fam = families.setdefault(pat, {"starts": set(), "desc": str(g.get("desc") or "")})
        fam["starts"].add(ranks[0])
    dims = []  # (stride, size, name)
    for pat, fam in families.items():
        size, stride = len(pat), pat[1]
        covered = set()
        for s in fam["starts"]:
            covered.update(s + p for p in pat)
        if len(covered) != world and len(fam["starts"]) * size != world:
            continue  # only some groups recorded: accept if the starts fit a partition
        desc = fam["desc"]
        name = desc[5:] if desc.startswith("mesh_") and desc not in ("mesh_default",) else ""
        dims.append((stride, size, name))
    dims = sorted(set(dims), reverse=True)  # outermost (largest stride) first
    if not dims:
        # Only the world and single-rank groups: every rank a replica of every other.
        return Mesh(("dp",), (world,)) if world > 1 and groups else None
    expect = world
    for stride, size, _ in dims:
        if expect % size or expect // size != stride:
            return None  # not a row-major mesh
        expect = stride
    if expect != 1:
        dims.append((1, expect, ""))
    if not any(is_replica_dim(n) for _, _, n in dims if n):
        dims = [(s, z, n or ("dp" if i == 0 else f"dim_{i}")) for i, (s, z, n) in enumerate(dims)]
    names = [n or f"dim_{i}" for i, (_, _, n) in enumerate(dims)]
    return Mesh(tuple(names), tuple(z for _, z, _ in dims))


def spool_roles(spool_dir, mesh: str | Mesh | dict | None, extra: Iterable[int] = ()) -> dict | None:
    """The manifest `roles` entry for spools recorded with `--slice roles [--mesh MESH]`
    (what `record` passes to `pack(..., manifest_extra={"roles": ...})`). Without `mesh`,
    the layout the ranks found while recording (their `slice_mesh`); None when they found
    none (then every rank was recorded)."""
    world = 0
    recorded = []
    found, by = None, "mesh"
    for path in sorted(Path(spool_dir).glob("rank-*.spool")):
        data = path.read_bytes()
        scan = read_spool(path, data)
        recorded.append(scan.rank)
        for frame in scan.frames:
            if frame.kind == layout.FRAME_RANK_INFO:
                info = frame_info(data, frame, path.name)
                world = max(world, int(info.get("world_size", 0) or 0))
                if found is None and isinstance(info.get("slice_mesh"), dict):
                    found, by = info["slice_mesh"], str(info.get("slice_by") or "mesh")
    if not world:
        raise UsageError(f"{spool_dir}: no spool says its world size")
    if mesh is None:
        if found is None:
            return None
        mesh = found
    else:
        by = "mesh"
    roles = roles_for_mesh(world, mesh, prefer=recorded)
    entry = roles.to_manifest()
    entry["by"] = by
    entry["sliced"] = True
    entry["extra_ranks"] = sorted(set(extra))
    return entry
