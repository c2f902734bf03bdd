"""What a replaying rank needs to know, carried to it as JSON in one environment variable."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass

from prism_rr.errors import UsageError

__all__ = ["ENV_VAR", "TIMINGS", "ReplayOptions"]

ENV_VAR = "PRISM_RR_REPLAY"
# live: a call completes when the modelled peers would let it; none: as soon as the data is there.
TIMINGS = ("live", "none")


@dataclass(frozen=True, slots=True, kw_only=True)
class ReplayOptions:
    """One replay's settings, the same on every real rank."""

    bundle: str
    ranks: tuple[int, ...]  # the real ranks, sorted
    work_dir: str  # where each real rank writes rank-NNNNN.json (stats, divergences)
    timing: str = "live"
    continue_on_divergence: bool = False
    real_port: int = 0  # TCPStore of the real ranks among themselves (2+ real ranks)

    def __post_init__(self):
        if self.timing not in TIMINGS:
            raise UsageError(f"timing must be one of {', '.join(TIMINGS)}, not {self.timing!r}")
        if not self.ranks:
            raise UsageError("a replay needs at least one real rank")

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> ReplayOptions:
        d = json.loads(text)
        if not isinstance(d, dict) or "bundle" not in d:
            raise UsageError(f"{ENV_VAR} must be a JSON object with a bundle")
        return cls(
            bundle=str(d["bundle"]),
            ranks=tuple(sorted(int(r) for r in d.get("ranks", ()))),
            work_dir=str(d["work_dir"]),
            timing=str(d.get("timing", "live")),
            continue_on_divergence=bool(d.get("continue_on_divergence", False)),
            real_port=int(d.get("real_port", 0)),
        )
