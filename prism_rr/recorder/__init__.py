"""Capture: the recording policy, steps, memory, and the launcher hook.

Importing this package is cheap (no torch, no interception): `record` and `step` load
the rest on use, and so do the names below that `_install` holds.
The replayer reaches the recorder only through this face: `record_replay` starts the
recording of a replayed rank (`replay -o`) and `current_observer` lets its groups record;
`clock_for` gives a replay the recorder's device clock to time its steps with.
"""

from __future__ import annotations

from prism_rr.recorder._options import RecordOptions
from prism_rr.recorder._record import record, step

# Deferred imports: recorder._device (torch) until `clock_for` is asked for; recorder._install
# and recorder._flight (no torch, but the import hook, the manifest and statistics: some 20
# modules) until their names are: `import prism_rr` and `prism-rr info` pass through here,
# and only a flight recording needs _flight.

__all__ = ["RecordOptions", "arm", "clock_for", "current_observer", "finish_flight", "flight_bundles", "record",
           "record_replay", "step"]


def __getattr__(name: str):
    if name in ("arm", "current_observer", "record_replay"):
        from prism_rr.recorder import _install

        return getattr(_install, name)
    if name == "clock_for":
        from prism_rr.recorder import _device

        return _device.clock_for
    if name in ("finish_flight", "flight_bundles"):
        from prism_rr.recorder import _flight

        return getattr(_flight, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
