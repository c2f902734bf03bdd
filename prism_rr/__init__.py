"""prism-rr: record a window of a distributed PyTorch run, replay it on a few ranks.

Reading bundles needs neither torch nor a terminal UI: `prism_rr.open(path)`.
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

__all__ = [
    "Bundle",
    "DivergenceError",
    "FormatError",
    "PrismError",
    "UnsupportedVersionError",
    "UsageError",
    "__version__",
    "open",
]
