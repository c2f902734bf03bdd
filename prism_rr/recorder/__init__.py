"""Capture: the recording policy, steps, memory, and the launcher hook.

Importing this package loads no torch and installs nothing: `record` and `step` load
the rest on use, and `clock_for` (the device clock) when asked for.
The replayer reaches the recorder only through this face: `record_replay` starts the
recording of a replayed rank (`replay -o`) and `current_observer` lets its groups record;
`clock_for` gives a replay the recorder's device clock to time its steps with.
"""

from __future__ import annotations

from prism_rr.recorder._flight import finish_flight, flight_bundles
from prism_rr.recorder._install import arm, current_observer, record_replay
from prism_rr.recorder._options import RecordOptions
from prism_rr.recorder._record import record, step

# Deferred imports: recorder._device (torch) until `clock_for` is asked for.

__all__ = ["RecordOptions", "arm", "clock_for", "current_observer", "finish_flight", "flight_bundles", "record",
           "record_replay", "step"]


def __getattr__(name: str):
    if name == "clock_for":
        from prism_rr.recorder import _device

        return _device.clock_for
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
