"""Capture: the recording policy, steps, memory, and the launcher hook.

Importing this package is cheap (no torch): `record` and `step` load the rest on use.
The replayer reaches the recorder only through this face: `record_replay` starts the
recording of a replayed rank (`replay -o`) and `current_observer` lets its groups record.
"""

from __future__ import annotations

from prism_rr.recorder._install import arm, current_observer, record_replay
from prism_rr.recorder._options import RecordOptions
from prism_rr.recorder._record import record, step

__all__ = ["RecordOptions", "arm", "current_observer", "record", "record_replay", "step"]
