"""Interception: the start-up import hook, the group-creation patch, and the one process
group that turns every torch entry point into a call for a policy.

Both the recorder (`recorder/`, the recording policy) and the replayer (`replayer/`, the
replay policy) build on this package; so do the tensor facts they share (payload digests,
the caller's stack, the per-operator dispatch mode, the CPU memory tracker).

Modules, each imported by its own name (this package imports none of them, so a light one
such as `steps` or `stack` costs only itself): `hook` (on_import), `creation`
(GroupCreation, Plan), `group` (InterceptGroup, Call, Policy, completed_work), `payload`,
`stack`, `dispatch` (OpsMode), `memory` (CpuMemoryTracker), `steps` (OptimizerSteps),
`teardown` (settle: torch's threads get the GIL they wait for before the interpreter
ends). `group`, `payload`, `dispatch`, `memory` and `device_reads` import torch; the
others import nothing heavy.
"""
