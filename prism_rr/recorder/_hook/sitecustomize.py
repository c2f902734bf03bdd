"""prism-rr start-up hook: the recording launcher puts this directory first on PYTHONPATH.

It runs any sitecustomize that was there before, then, only when PRISM_RR_RECORD is set,
arms the recorder. Arming imports nothing heavy: torch is patched when the program itself
imports torch.distributed.
"""

import os
import sys


def _chain_previous() -> None:
    import importlib.machinery
    import importlib.util

    here = os.path.dirname(os.path.abspath(__file__))
    rest = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is None or spec.loader is None:
        return
    if os.path.dirname(os.path.abspath(spec.origin or "")) == here:
        return
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)


def _arm() -> None:
    if not os.environ.get("PRISM_RR_RECORD"):
        return
    import importlib.util

    if importlib.util.find_spec("prism_rr") is None:
        # A launcher may start ranks with another sys.path: use the copy we ship in.
        sys.path.append(os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))))
    from prism_rr.recorder._boot import arm

    arm()


try:
    _chain_previous()
except Exception as exc:  # someone else's sitecustomize failed: say so, carry on
    print(f"prism-rr: the previous sitecustomize failed: {type(exc).__name__}: {exc}", file=sys.stderr)
try:
    _arm()
except Exception as exc:
    print(f"prism-rr: recording is off: {type(exc).__name__}: {exc}", file=sys.stderr)
