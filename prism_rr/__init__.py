"""prism-rr: record a window of a distributed PyTorch run, replay it on a few ranks.

Record in-process with `with prism_rr.record("run.prism"): ...` (or `prism-rr record`),
mark steps by hand with `prism_rr.step()`, read with `prism_rr.open(path)`; reading
bundles needs neither torch nor a terminal UI. What the CLI does (record a command, pack,
verify, export, replay, scale) is in `prism_rr.api`, without printing.
"""

from prism_rr._version import __version__
from prism_rr.errors import (
    DivergenceError,
    FormatError,
    PrismError,
    UnsupportedVersionError,
    UsageError,
)
from prism_rr.format.reader import Bundle
from prism_rr.format.reader import open_bundle as open
from prism_rr.recorder import record, step

__all__ = [
    "Bundle",
    "DivergenceError",
    "FormatError",
    "PrismError",
    "UnsupportedVersionError",
    "UsageError",
    "__version__",
    "open",
    "record",
    "step",
]
