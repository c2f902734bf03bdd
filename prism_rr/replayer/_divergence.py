"""Checking each call of a real rank against its recording, and saying where they part."""

from __future__ import annotations

from dataclasses import asdict, dataclass

from prism_rr.text import shown
from prism_rr.intercept.stack import caller_stack

__all__ = ["Divergence", "user_stack"]


@dataclass(frozen=True, slots=True, kw_only=True)
class Divergence:
    """The first (or a) difference between a replayed call and the recorded one."""

    rank: int
    group: int
    seq: int
    op: str
    what: str  # the field that differs: op, in_shapes, digest_in, ...
    expected: str
    got: str
    stack: tuple[str, ...] = ()

    def to_dict(self) -> dict:
        d = asdict(self)
        d["stack"] = list(self.stack)
        return d

    def paragraph(self) -> str:
        """For people (the rank's stderr): the recorded values are a stranger's, made safe."""
        where = "; ".join(shown(f) for f in self.stack) if self.stack else "unknown"
        return (
            f"prism-rr: replay diverged on rank {self.rank}, group {self.group}, seq {self.seq} "
            f"({shown(self.op)}): {self.what} expected {shown(self.expected)}, got {shown(self.got)}. "
            f"Called from {where}."
        )


# A program that is the bundle (driver.py) has no frames of the user's: it sets here the
# recorded stack of the call it makes, which stands for them.
recorded_stack: tuple[str, ...] = ()


def user_stack(depth: int = 6) -> tuple[str, ...]:
    """Innermost-first "file:line function" of the user's frames that made the call."""
    return caller_stack(depth, skip=2) or recorded_stack
