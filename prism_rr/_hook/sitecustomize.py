"""prism-rr start-up hook: `prism-rr record` and `prism-rr replay` put this directory first
on PYTHONPATH of the processes they start.

It runs any sitecustomize that was there before, then arms the recorder when
PRISM_RR_RECORD is set and the replayer when PRISM_RR_REPLAY is set. Arming imports
nothing heavy: torch is patched when the program itself imports torch.distributed.
"""

import importlib.machinery
import importlib.util
import os
import sys


def _chain_previous() -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    rest = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is None or spec.loader is None:
        return
    if os.path.dirname(os.path.abspath(spec.origin or "")) == here:
        return
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)


def _find_prism_rr() -> None:
    if importlib.util.find_spec("prism_rr") is None:
        # A launcher may start ranks with another sys.path: use the copy we ship in.
        sys.path.append(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def _hint(exc: BaseException) -> str:
    if isinstance(exc, ModuleNotFoundError):
        return f" (is {sys.executable} the Python where prism-rr and torch are installed?)"
    return ""


try:
    _chain_previous()
except Exception as exc:  # someone else's sitecustomize failed: say so, carry on
    print(f"prism-rr: the previous sitecustomize failed: {type(exc).__name__}: {exc}", file=sys.stderr)

if os.environ.get("PRISM_RR_REPLAY"):
    try:
        _find_prism_rr()
        from prism_rr.replayer import arm as _arm_replay

        _arm_replay()
    except Exception as exc:
        # Unlike recording, a replay that is not armed would hang waiting for absent ranks.
        print(f"prism-rr: replay could not start: {type(exc).__name__}: {exc}{_hint(exc)}", file=sys.stderr)
        os._exit(1)  # sys.exit here would end in a fatal error inside site's import

if os.environ.get("PRISM_RR_RECORD"):
    try:
        _find_prism_rr()
        from prism_rr.recorder import arm as _arm_record

        _arm_record()
    except Exception as exc:  # recording never ends a training run
        print(f"prism-rr: recording is off: {type(exc).__name__}: {exc}{_hint(exc)}", file=sys.stderr)
