"""The start-up import hook: run a function right after a module is imported.

The start-up hook (sitecustomize) arms the recorder or the replayer before the program
imports torch; they patch torch.distributed from here once the program imports it.
Importing this module imports nothing heavy.
"""

from __future__ import annotations

import logging
import sys
from importlib.abc import Loader, MetaPathFinder

__all__ = ["on_import"]

log = logging.getLogger("prism_rr")
_callbacks: dict[str, list] = {}


class _Loader(Loader):
    def __init__(self, inner, name):
        self._inner = inner
        self._name = name

    def create_module(self, spec):
        return self._inner.create_module(spec)

    def exec_module(self, module):
        self._inner.exec_module(module)
        for fn in _callbacks.pop(self._name, ()):
            try:
                fn(module)
            except Exception as exc:
                log.warning("prism-rr: could not patch %s: %s: %s", self._name, type(exc).__name__, exc)


class _Finder(MetaPathFinder):
    """Runs callbacks right after a watched module has executed."""

    def find_spec(self, name, path, target=None):
        if name not in _callbacks:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None:
                if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                    spec.loader = _Loader(spec.loader, name)
                return spec
        return None


_finder = _Finder()


def on_import(name: str, fn) -> None:
    """Call fn(module) once `name` is imported (now, if it already is)."""
    module = sys.modules.get(name)
    if module is not None and getattr(module, "__spec__", None) is not None and not _initializing(module):
        fn(module)
        return
    _callbacks.setdefault(name, []).append(fn)
    if _finder not in sys.meta_path:
        sys.meta_path.insert(0, _finder)


def _initializing(module) -> bool:
    return bool(getattr(module.__spec__, "_initializing", False))

