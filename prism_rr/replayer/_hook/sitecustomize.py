"""prism-rr replay start-up hook: the replay launcher puts this directory first on PYTHONPATH.

It runs any sitecustomize that was there before, then, only when PRISM_RR_REPLAY is set,
arms the replayer (torch is patched when the program imports torch.distributed).
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
    if not os.environ.get("PRISM_RR_REPLAY"):
        return
    import importlib.util

    if importlib.util.find_spec("prism_rr") is None:
        sys.path.append(os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))))
    from prism_rr.replayer._boot import arm

    arm()


try:
    _chain_previous()
except Exception as exc:
    print(f"prism-rr: the previous sitecustomize failed: {type(exc).__name__}: {exc}", file=sys.stderr)
try:
    _arm()
except Exception as exc:
    # Unlike recording, a replay that is not armed would hang waiting for absent ranks.
    hint = ""
    if isinstance(exc, ModuleNotFoundError):
        hint = f" (is {sys.executable} the Python where prism-rr and torch are installed?)"
    print(f"prism-rr: replay could not start: {type(exc).__name__}: {exc}{hint}", file=sys.stderr)
    os._exit(1)  # sys.exit here would end in a fatal error inside site's import
