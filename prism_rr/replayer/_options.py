"""What a replaying rank needs to know, carried to it as JSON in one environment variable."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

from prism_rr.errors import UsageError

__all__ = ["ENV_VAR", "TIMINGS", "ReplayOptions", "stats_path"]

ENV_VAR = "PRISM_RR_REPLAY"
# live: a call completes when the modelled peers would let it, in real time; virtual: the
# same on a virtual clock, the real rank's compute calibrated against the recording on the
# first step (nobody waits); none: as soon as the data is there.
TIMINGS = ("live", "virtual", "none")


def stats_path(work_dir, rank: int) -> Path:
    """Where real rank `rank` writes what it saw (stats, divergences) for the launcher."""
    return Path(work_dir) / f"rank-{rank:05d}.json"


@dataclass(frozen=True, slots=True, kw_only=True)
class ReplayOptions:
    """One replay's settings, the same on every real rank."""

    bundle: str
    ranks: tuple[int, ...]  # the real ranks, sorted
    attempt: int | None = None  # the attempt of a restarted job replayed (None: the bundle's default)
    work_dir: str  # where each real rank writes rank-NNNNN.json (stats, divergences)
    timing: str = "live"
    continue_on_divergence: bool = False
    real_port: int = 0  # TCPStore of the real ranks among themselves (2+ real ranks)
    comm_scale: float = 1.0  # every transfer this many times as long
    compute_scale: float = 1.0  # every rank's compute this many times as long
    slow_rank: tuple[tuple[int, float], ...] = ()  # (virtual rank, factor on its compute)
    replace_rank: tuple[tuple[int, int, int], ...] = ()  # (virtual rank, step, downtime ns): _replace.py
    output: str | None = None  # spool directory of the replay's own recording (-o)
    payload: str = "none"  # what the replay's own recording keeps
    # Under a launcher (torchrun): worker RANK i of len(ranks) is recorded rank ranks[i] of
    # world_size; the real ranks meet on the launcher's store (_torchrun.py).
    launcher: bool = False
    world_size: int = 0  # the recorded world (launcher mode)
    # How the recording failed: diagnose's drifts and mismatches, each {"kind", "group",
    # "seq", "ranks", "reference", "step", "message"} (launch._recorded_endings)
    endings: tuple[dict, ...] = ()

    def __post_init__(self):
        if self.timing not in TIMINGS:
            raise UsageError(f"timing must be one of {', '.join(TIMINGS)}, not {self.timing!r}")
        if not self.ranks:
            raise UsageError("a replay needs at least one real rank")
        for name in ("comm_scale", "compute_scale"):
            if not getattr(self, name) > 0:
                raise UsageError(f"{name} must be positive, not {getattr(self, name)!r}")
        for rank, factor in self.slow_rank:
            if rank in self.ranks:
                raise UsageError(f"slow_rank {rank} is a real rank; slow_rank applies to virtual ranks")
            if not factor > 0:
                raise UsageError(f"slow_rank factor for rank {rank} must be positive, not {factor!r}")

        for rank, step, down in self.replace_rank:
            if rank in self.ranks:
                raise UsageError(f"replace_rank {rank}@{step}: rank {rank} is a real rank; a replaced rank is a "
                                 f"virtual one")
            if down < 0:
                raise UsageError(f"replace_rank {rank}@{step}: a downtime is 0 s or more, not {down / 1e9!r} s")

    def slow_rank_map(self) -> dict[int, float]:
        return dict(self.slow_rank)

    def replaced_map(self) -> dict[int, list[tuple[int, int]]]:
        """Virtual rank -> [(step, downtime ns)]: the timing model's form."""
        out: dict[int, list[tuple[int, int]]] = {}
        for rank, step, down in self.replace_rank:
            out.setdefault(rank, []).append((step, down))
        return out

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> ReplayOptions:
        d = json.loads(text)
        if not isinstance(d, dict) or "bundle" not in d:
            raise UsageError(f"{ENV_VAR} must be a JSON object with a bundle")
        return cls(
            bundle=str(d["bundle"]),
            attempt=None if d.get("attempt") is None else int(d["attempt"]),
            ranks=tuple(sorted(int(r) for r in d.get("ranks", ()))),
            work_dir=str(d["work_dir"]),
            timing=str(d.get("timing", "live")),
            continue_on_divergence=bool(d.get("continue_on_divergence", False)),
            real_port=int(d.get("real_port", 0)),
            comm_scale=float(d.get("comm_scale", 1.0)),
            compute_scale=float(d.get("compute_scale", 1.0)),
            slow_rank=tuple((int(r), float(f)) for r, f in d.get("slow_rank", ())),
            replace_rank=tuple((int(r), int(s), int(n)) for r, s, n in d.get("replace_rank", ())),
            output=d.get("output"),
            payload=str(d.get("payload", "none")),
            launcher=bool(d.get("launcher", False)),
            world_size=int(d.get("world_size", 0)),
            endings=tuple(e for e in d.get("endings", ()) if isinstance(e, dict)),
        )
