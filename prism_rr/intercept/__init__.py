"""Interception: the start-up import hook, the group-creation patch, and the one process
group that turns every torch entry point into a call for a policy.

Both the recorder (`recorder/`, the recording policy) and the replayer (`replayer/`, the
replay policy) build on this package; so do the tensor facts they share (payload digests,
the caller's stack, the per-operator dispatch mode, the CPU memory tracker).

Modules: `hook` (on_import), `creation` (GroupCreation), `group` (InterceptGroup, Call,
Policy), `payload`, `stack`, `dispatch`, `memory`, `steps` (OptimizerSteps), `teardown`
(settle: torch's threads get the GIL they wait for before the interpreter ends). Importing
this package imports no torch; the names below load their module on first use.
"""

from __future__ import annotations

__all__ = [
    "Call",
    "CpuMemoryTracker",
    "ForwardingWork",
    "FromPeer",
    "GroupCreation",
    "InterceptGroup",
    "OpsMode",
    "OptimizerSteps",
    "Plan",
    "Policy",
    "completed_work",
    "on_import",
]

_HOME = {
    "Call": "group",
    "CpuMemoryTracker": "memory",
    "ForwardingWork": "group",
    "FromPeer": "group",
    "GroupCreation": "creation",
    "InterceptGroup": "group",
    "OpsMode": "dispatch",
    "OptimizerSteps": "steps",
    "Plan": "creation",
    "Policy": "group",
    "completed_work": "group",
    "on_import": "hook",
}


def __getattr__(name: str):
    home = _HOME.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    # each module by its own import statement: nothing here imports by a computed name
    if home == "creation":
        from prism_rr.intercept import creation as module
    elif home == "dispatch":
        from prism_rr.intercept import dispatch as module
    elif home == "group":
        from prism_rr.intercept import group as module
    elif home == "hook":
        from prism_rr.intercept import hook as module
    elif home == "memory":
        from prism_rr.intercept import memory as module
    else:
        from prism_rr.intercept import steps as module
    return getattr(module, name)
