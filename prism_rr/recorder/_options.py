"""What to record: payload mode, step window, ranks; carried to ranks as JSON in one env var."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field

from prism_rr.errors import UsageError

__all__ = ["ENV_VAR", "PAYLOADS", "RecordOptions", "parse_ranks", "parse_steps", "spool_dir_for"]

ENV_VAR = "PRISM_RR_RECORD"
PAYLOADS = ("none", "digest", "full")


def parse_steps(spec) -> tuple[int | None, int | None] | None:
    """"A:B" (B excluded, either side may be empty), "A" (one step), or a pair."""
    if spec is None or spec == "":
        return None
    if isinstance(spec, (tuple, list)):
        lo, hi = spec
    elif isinstance(spec, int):
        lo, hi = spec, spec + 1
    else:
        text = str(spec).strip()
        try:
            if ":" in text:
                a, b = text.split(":", 1)
                lo = int(a) if a.strip() else None
                hi = int(b) if b.strip() else None
            else:
                lo = int(text)
                hi = lo + 1
        except ValueError:
            raise UsageError(f"steps must look like A:B, not {spec!r}") from None
    if lo is not None and lo < 0 or hi is not None and hi < 0:
        raise UsageError(f"steps must not be negative: {spec!r}")
    if lo is not None and hi is not None and hi <= lo:
        raise UsageError(f"empty step window {spec!r}")
    return (lo, hi)


def parse_ranks(spec) -> tuple[int, ...] | None:
    """"0,2,4-7" or an iterable of ints; None records every rank."""
    if spec is None or spec == "":
        return None
    if isinstance(spec, int):
        return (spec,)
    if not isinstance(spec, str):
        return tuple(sorted({int(r) for r in spec}))
    ranks: set[int] = set()
    try:
        for part in spec.split(","):
            part = part.strip()
            if not part:
                continue
            if "-" in part:
                a, b = part.split("-", 1)
                ranks.update(range(int(a), int(b) + 1))
            else:
                ranks.add(int(part))
    except ValueError:
        raise UsageError(f"ranks must look like 0,2,4-7, not {spec!r}") from None
    if any(r < 0 for r in ranks):
        raise UsageError(f"ranks must not be negative: {spec!r}")
    return tuple(sorted(ranks))


@dataclass(frozen=True, slots=True, kw_only=True)
class RecordOptions:
    """One recording's settings, the same on every rank."""

    spool_dir: str
    payload: str = "digest"
    steps: tuple[int | None, int | None] | None = None  # [lo, hi) window; None: every step
    ranks: tuple[int, ...] | None = None  # None: every rank
    ops: bool = False  # per-operator Compute records
    memory: bool = False  # CPU storage tracker (CUDA statistics are always read)
    stack_depth: int = 4  # frames of user code kept per call; 0 turns stacks off
    slice: str | None = None  # "roles": record one representative per role (plus `ranks`)
    mesh: str | None = None  # "dp=2,tp=2": the layout that `slice` derives roles from
    extra: dict = field(default_factory=dict)  # unknown keys from a newer launcher

    def __post_init__(self):
        if self.payload not in PAYLOADS:
            raise UsageError(f"payload must be one of {', '.join(PAYLOADS)}, not {self.payload!r}")
        if self.slice not in (None, "roles"):
            raise UsageError(f"slice must be roles, not {self.slice!r}")

    @classmethod
    def make(cls, spool_dir, *, payload="digest", steps=None, ranks=None, ops=False, memory=False, **extra):
        return cls(
            spool_dir=str(spool_dir), payload=payload, steps=parse_steps(steps),
            ranks=parse_ranks(ranks), ops=bool(ops), memory=bool(memory), **extra,
        )

    @property
    def slice_later(self) -> bool:
        """--slice roles without --mesh: every rank starts recording, and the ranks that
        stand for no role stop once the program's layout is known (see Recording.settle_slice)."""
        return self.slice == "roles" and not self.mesh

    def records_rank(self, rank: int, world_size: int | None = None) -> bool:
        if self.slice == "roles" and self.mesh and world_size is not None:
            from prism_rr.topology.roles import slice_ranks

            return rank in slice_ranks(world_size, self.mesh, self.ranks or ())
        return self.ranks is None or rank in self.ranks

    def in_window(self, step: int) -> bool:
        if self.steps is None:
            return True
        lo, hi = self.steps
        return (lo is None or step >= lo) and (hi is None or step < hi)

    def past_window(self, step: int) -> bool:
        return self.steps is not None and self.steps[1] is not None and step >= self.steps[1]

    def to_json(self) -> str:
        d = asdict(self)
        d.update(d.pop("extra"))
        return json.dumps(d, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> RecordOptions:
        d = json.loads(text)
        if not isinstance(d, dict) or "spool_dir" not in d:
            raise UsageError(f"{ENV_VAR} must be a JSON object with a spool_dir")
        known = {"spool_dir", "payload", "steps", "ranks", "ops", "memory", "stack_depth", "slice", "mesh"}
        extra = {k: v for k, v in d.items() if k not in known}
        return cls(
            spool_dir=str(d["spool_dir"]),
            payload=d.get("payload", "digest"),
            steps=parse_steps(d.get("steps")),
            ranks=parse_ranks(d.get("ranks")),
            ops=bool(d.get("ops", False)),
            memory=bool(d.get("memory", False)),
            stack_depth=int(d.get("stack_depth", 4)),
            slice=d.get("slice"),
            mesh=d.get("mesh"),
            extra=extra,
        )


def spool_dir_for(out) -> "Path":
    """Where the spools of bundle `out` are written while recording: `<out>.d/`."""
    from pathlib import Path

    out = Path(out)
    return out.with_name(out.name + ".d")
