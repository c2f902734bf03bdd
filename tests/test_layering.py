"""The layering rules between the subpackages of `prism_rr`, read from every file's imports.

- No module imports another subpackage's private (`_name`) module: what two subpackages
  share is public in one of them. A top-level module (cli.py, api.py) is a subpackage of
  its own, so it imports no private module of any; the root's own private modules
  (`prism_rr._version`) are the root's to share.
- `format/`, `analysis/` and `topology/` import neither torch nor a UI library, neither
  in their source (anywhere in it, lazy imports too) nor in a fresh interpreter: a
  bundle is read, diagnosed and scaled on a laptop with no torch. numpy is allowed: it is
  a hard dependency of the package, brings neither torch nor a UI, and `analysis` holds
  the millions of calls of an 8192-rank bundle as its arrays (a Python object per call
  took minutes and gigabytes).

Each test lists every offender as file:line.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "prism_rr"
LIGHT = ("format", "analysis", "topology")  # the subpackages that read bundles anywhere
HEAVY = frozenset({"torch", "textual", "rich", "typer"})
# prism_rr's own modules that run torch or a UI: a light subpackage imports none of them.
HEAVY_OWN = frozenset({"api", "cli", "demo", "intercept", "localrun", "recorder", "replayer", "tui"})


def _module_name(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _files() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py") if "__pycache__" not in p.parts)


def _is_private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _imports(path: Path):
    """(line, module) for every module an import statement of `path` names, relative
    imports resolved; `from a import b` names a.b when a/b is a module here."""
    module = _module_name(path)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(base + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            yield node.lineno, base
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                where = REPO.joinpath(*sub.split("."))
                if where.with_suffix(".py").is_file() or (where / "__init__.py").is_file():
                    yield node.lineno, sub


def _subpackage(module: str) -> str:
    """The subpackage a module of prism_rr belongs to: `format` for prism_rr.format.spool,
    `cli` for prism_rr.cli; "" for the root package itself."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def _where(path: Path, line: int) -> str:
    return f"{path.relative_to(REPO)}:{line}"


def test_no_module_imports_another_subpackages_private_module():
    offenders = []
    for path in _files():
        own = _subpackage(_module_name(path))
        for line, target in _imports(path):
            parts = target.split(".")
            if parts[0] != "prism_rr" or len(parts) < 3:
                continue
            if any(_is_private(p) for p in parts[2:]) and parts[1] != own:
                offenders.append(f"{_where(path, line)}: imports {target} (private to prism_rr.{parts[1]})")
    assert not offenders, "private modules of another subpackage:\n" + "\n".join(offenders)


def test_light_subpackages_import_no_torch_or_ui_in_their_source():
    offenders = []
    for path in _files():
        module = _module_name(path)
        if _subpackage(module) not in LIGHT:
            continue
        for line, target in _imports(path):
            parts = target.split(".")
            if parts[0] in HEAVY or (parts[0] == "prism_rr" and len(parts) > 1 and parts[1] in HEAVY_OWN):
                offenders.append(f"{_where(path, line)}: imports {target}")
    assert not offenders, "torch or a UI in format/, analysis/ or topology/:\n" + "\n".join(offenders)


# Imports one module in a fresh interpreter; prints which heavy packages it loaded and,
# for each, the last line of prism_rr that was importing when it was first asked for.
_PROBE = r"""
import importlib, json, sys, traceback
heavy, found = set(sys.argv[2].split(",")), {}

class Probe:
    def find_spec(self, name, path=None, target=None):
        top = name.partition(".")[0]
        if top in heavy and top not in found:
            ours = [f for f in traceback.extract_stack() if "/prism_rr/" in f.filename.replace("\\", "/")]
            found[top] = f"{ours[-1].filename}:{ours[-1].lineno}" if ours else "?"
        return None

sys.meta_path.insert(0, Probe())
importlib.import_module(sys.argv[1])
print(json.dumps({m: found.get(m, "?") for m in heavy if m in sys.modules}))
"""


@pytest.mark.timeout(300)
def test_light_subpackages_load_no_torch_or_ui_in_a_fresh_interpreter():
    offenders = []
    for path in _files():
        module = _module_name(path)
        if _subpackage(module) not in LIGHT:
            continue
        out = subprocess.run([sys.executable, "-c", _PROBE, module, ",".join(sorted(HEAVY))], cwd=REPO,
                             capture_output=True, text=True, timeout=120)
        if out.returncode != 0:
            offenders.append(f"{path.relative_to(REPO)}: does not import: {out.stderr.strip().splitlines()[-1:]}")
            continue
        for heavy, where in sorted(json.loads(out.stdout.strip().splitlines()[-1]).items()):
            where = str(Path(where).relative_to(REPO)) if where.startswith(str(REPO)) else where
            offenders.append(f"{path.relative_to(REPO)}: loads {heavy} (imported at {where})")
    assert not offenders, "torch or a UI loaded by format/, analysis/ or topology/:\n" + "\n".join(offenders)
