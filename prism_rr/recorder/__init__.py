"""Capture: the recording process group, steps, memory, and the launcher hook.

Importing this package is cheap (no torch): `record` and `step` load the rest on use.
"""

from __future__ import annotations

from prism_rr.recorder._options import RecordOptions
from prism_rr.recorder._record import record, step

__all__ = ["RecordOptions", "record", "step"]
