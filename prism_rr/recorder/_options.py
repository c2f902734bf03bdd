"""What to record: payload mode, step window, ranks; carried to ranks as JSON in one env var."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path

from prism_rr.errors import UsageError
from prism_rr.specs import parse_ranks, parse_steps
from prism_rr.topology.roles import slice_ranks

__all__ = ["ENV_VAR", "PAYLOADS", "RecordOptions", "spool_dir_for"]

ENV_VAR = "PRISM_RR_RECORD"
PAYLOADS = ("none", "small", "digest", "full")
# What a recording keeps of the tensors when no --payload is given: flight mode, always on,
# keeps what a hang diagnosis and a replay need at the least cost.
DEFAULT_PAYLOAD, FLIGHT_PAYLOAD = "digest", "small"


@dataclass(frozen=True, slots=True, kw_only=True)
class RecordOptions:
    """One recording's settings, the same on every rank: the one definition of what the
    command line's `record`, `prism_rr.api.record` and the launcher carry to each rank
    (as JSON in ENV_VAR). Specs are taken as users write them ("1:4", "0,2-3") and kept
    parsed; the launcher places the options (`placed`) before a rank sees them."""

    spool_dir: str | None = None  # where the ranks write; None: not placed yet (see `placed`)
    payload: str | None = None  # None: DEFAULT_PAYLOAD, or FLIGHT_PAYLOAD in flight mode
    steps: tuple[int | None, int | None] | None = None  # [lo, hi) window; None: every step
    ranks: tuple[int, ...] | None = None  # None: every rank
    ops: bool = False  # per-operator Compute records
    memory: bool = False  # CPU storage tracker (CUDA statistics are always read)
    stack_depth: int = 4  # frames of user code kept per call; 0 turns stacks off
    slice: str | None = None  # "roles": record one representative per role (plus `ranks`)
    mesh: str | None = None  # "dp=2,tp=2": the layout that `slice` derives roles from
    # Flight mode (recorder/_flight.py): keep the last `flight` steps of each rank in a
    # bounded in-memory ring and write a bundle only when a trigger fires.
    flight: int | None = None  # steps kept; None: write every record (the spool)
    flight_hang: float = 30.0  # seconds a call may stay pending before it is a hang
    flight_slow: float | None = None  # a step this many times the running median triggers
    flight_budget: int = 32 << 20  # bytes of ring per rank
    flight_at_exit: bool = False  # also dump when the run ends
    output: str | None = None  # the bundle a flight dump is packed into (rank 0 packs)
    ring_size: int = 32 << 20  # bytes of each rank's call log ring (not flight: that is flight_budget)
    extra: dict = field(default_factory=dict)  # unknown keys from a newer launcher

    def __post_init__(self):
        self._normalise()
        if self.payload not in PAYLOADS:
            raise UsageError(f"payload must be one of {', '.join(PAYLOADS)}, not {self.payload!r}")
        if self.slice not in (None, "roles"):
            raise UsageError(f"slice must be roles, not {self.slice!r}")
        if self.flight is not None:
            self._check_flight()
        if not (1 << 16) <= self.ring_size <= (1 << 36):
            raise UsageError(f"the call log's ring must be 64 KiB to 64 GiB, not {self.ring_size} bytes")

    def _normalise(self) -> None:
        """Each field as its type says, whether it came from a user's spec or from JSON."""
        put = object.__setattr__
        if self.spool_dir is not None:
            put(self, "spool_dir", str(self.spool_dir))
        put(self, "steps", parse_steps(self.steps))
        put(self, "ranks", parse_ranks(self.ranks))
        for name, kind in _TYPES.items():
            value = getattr(self, name)
            if value is not None:
                put(self, name, kind(value))
        if self.payload is None:
            put(self, "payload", FLIGHT_PAYLOAD if self.flight is not None else DEFAULT_PAYLOAD)

    def _check_flight(self) -> None:
        if self.flight < 1:
            raise UsageError(f"--flight takes the number of steps to keep (1 or more), not {self.flight}")
        if self.steps is not None:
            raise UsageError("--flight keeps the last steps whenever a trigger fires: give it or --steps, not both")
        if not self.flight_hang > 0:
            raise UsageError(f"--flight-hang must be a number of seconds above 0, not {self.flight_hang}")
        if self.flight_slow is not None and not self.flight_slow > 1:
            raise UsageError(f"--flight-slow must be a factor above 1, not {self.flight_slow}")
        if self.flight_budget < (1 << 20):
            raise UsageError(f"--flight-budget must be at least 1 MiB, not {self.flight_budget} bytes")

    @classmethod
    def make(cls, spool_dir=None, **fields) -> RecordOptions:
        """The options of `fields` (specs as users write them), written into `spool_dir`."""
        return cls(spool_dir=spool_dir, **fields)

    def placed(self, spool_dir, output) -> RecordOptions:
        """These options for ranks writing into `spool_dir`, for the bundle `output` (where
        rank 0 packs a flight dump)."""
        flight_output = str(Path(output).resolve()) if self.flight is not None else self.output
        return replace(self, spool_dir=str(spool_dir), output=flight_output)

    @property
    def slice_later(self) -> bool:
        """--slice roles without --mesh: every rank starts recording, and the ranks that
        stand for no role stop once the program's layout is known (see Recording.settle_slice)."""
        return self.slice == "roles" and not self.mesh

    def records_rank(self, rank: int, world_size: int | None = None) -> bool:
        if self.slice == "roles" and self.mesh and world_size is not None:

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
        known = {f.name for f in fields(cls)} - {"extra"}
        return cls(**{k: v for k, v in d.items() if k in known}, extra={k: v for k, v in d.items() if k not in known})


# The fields that JSON or a command line may give as another type (a count as a float).
_TYPES = {"ops": bool, "memory": bool, "stack_depth": int, "flight": int, "flight_hang": float,
          "flight_slow": float, "flight_budget": int, "flight_at_exit": bool, "ring_size": int}


def spool_dir_for(out) -> Path:
    """Where the spools of bundle `out` are written while recording: `<out>.d/`."""
    out = Path(out)
    return out.with_name(out.name + ".d")
