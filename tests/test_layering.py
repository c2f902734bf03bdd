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
- Floors (ARCHITECTURE.md's layout, FLOORS below): a module imports from its own floor or
  those below, never up (`errors` and `text` under `format`, `demo` under `api`, a subpackage under
  the package's face `prism_rr/__init__.py`), and no modules import each other in a
  circle, lazy imports counted.
- Imports stand at the top of a module. One inside a function defers a heavy import on
  purpose: a module that loads torch, a UI library or numpy (itself, or through the
  modules it imports at their top), which a light path (`prism-rr info`, a bundle read on
  a laptop, a rank before it needs torch) must not pay for; a module that defers says so
  once, in a comment that starts `# Deferred imports:`.

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


# The floors, lowest first: what each subpackage (or top-level module) may import is on its
# own floor or below. "" is the package's face, prism_rr/__init__.py.
FLOORS = {
    "_version": 0, "errors": 0, "text": 0, "_speedups": 0,
    "specs": 1,
    "format": 2,
    "analysis": 3, "topology": 3,
    "intercept": 4,
    "recorder": 5, "localrun": 5,
    "replayer": 6, "tui": 6,
    "": 7, "_hook": 7, "demo": 7,
    "api": 8,
    "cli": 9,
}
# What a deferred import may be deferring: these, or a module of prism_rr that loads one.
DEFERRABLE = frozenset({"torch", "textual", "rich", "typer", "numpy", "pyarrow", "triton"})
DEFERRED_NOTE = "# Deferred imports:"


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


def _targets(node, package: str) -> list[str]:
    """The modules an import statement names, relative imports resolved: `from a import b`
    names a.b where that is a module here (a C extension's source counts), else a."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if node.level:
        base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1] + ([node.module] if node.module else []))
    else:
        base = node.module or ""
    modules, names = [], False
    for alias in node.names:
        where = REPO.joinpath(*f"{base}.{alias.name}".split("."))
        if where.with_suffix(".py").is_file() or (where / "__init__.py").is_file() or where.with_suffix(".c").is_file():
            modules.append(f"{base}.{alias.name}")
        else:
            names = True
    return ([base] if names else []) + modules


def _type_checking(node) -> bool:
    return isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)


def _import_sites(path: Path):
    """(line, modules, deferred) for each import statement of `path` outside `if
    TYPE_CHECKING:`; deferred: inside a function."""
    module = _module_name(path)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]

    def walk(node, deferred):
        for child in ast.iter_child_nodes(node):
            if _type_checking(child):
                continue
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                yield child.lineno, _targets(child, package), deferred
            yield from walk(child, deferred or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)))

    yield from walk(ast.parse(path.read_text(), str(path)), False)


def _graph() -> dict[str, dict[str, int]]:
    """module -> {module of prism_rr it imports (the most specific one named): line}."""
    graph = {}
    for path in _files():
        out = graph.setdefault(_module_name(path), {})
        for line, targets, _ in _import_sites(path):
            for target in targets:
                if target.split(".")[0] == "prism_rr":
                    out.setdefault(target, line)
    return graph


def _heavy_modules(graph) -> set[str]:
    """The modules of prism_rr that load a DEFERRABLE package when imported: through their
    own top-level imports, those of the modules these import, or their package's."""
    tops: dict[str, set[str]] = {}
    for path in _files():
        tops[_module_name(path)] = {t for _, targets, deferred in _import_sites(path) if not deferred for t in targets}
    heavy: set[str] = set()
    changed = True
    while changed:
        changed = False
        for module, targets in tops.items():
            if module in heavy:
                continue
            parent = module.rpartition(".")[0]
            if parent in heavy or any(t.split(".")[0] in DEFERRABLE or (t in heavy and t != module) for t in targets):
                heavy.add(module)
                changed = True
    return heavy


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


def test_no_import_runs_up_the_floors():
    offenders = []
    for path in _files():
        module = _module_name(path)
        mine = FLOORS[_subpackage(module)]
        for line, targets, _ in _import_sites(path):
            for target in targets:
                if target.split(".")[0] != "prism_rr":
                    continue
                theirs = FLOORS.get(_subpackage(target))
                if theirs is not None and theirs > mine:
                    offenders.append(f"{_where(path, line)}: {module} (floor {mine}) imports {target} (floor {theirs})")
    assert not offenders, "imports that run up the floors:\n" + "\n".join(sorted(set(offenders)))


def test_no_import_cycles_lazy_imports_counted():
    graph = _graph()
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles = []

    def visit(v):  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph.get(v, ()):
            if w not in graph or w == v:
                continue
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            members = []
            while True:
                w = stack.pop()
                members.append(w)
                if w == v:
                    break
            if len(members) > 1:
                cycles.append(sorted(members))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    lines = [f"{' <-> '.join(c)}: " + "; ".join(f"{a} imports {b} at line {graph[a][b]}" for a in c for b in graph[a]
                                                   if b in c and b != a) for c in cycles]
    assert not cycles, "modules that import each other:\n" + "\n".join(lines)


def test_deferred_imports_defer_something_heavy_and_say_so():
    graph = _graph()
    heavy = _heavy_modules(graph)
    offenders, unsaid = [], []
    for path in _files():
        deferred = [(line, targets) for line, targets, d in _import_sites(path) if d]
        for line, targets in deferred:
            if not any(t.split(".")[0] in DEFERRABLE or t in heavy for t in targets):
                offenders.append(f"{_where(path, line)}: imports {targets[-1]} inside a function (nothing heavy)")
        if deferred and DEFERRED_NOTE not in path.read_text():
            unsaid.append(f"{path.relative_to(REPO)}: defers {len(deferred)} import(s) without a '{DEFERRED_NOTE}' comment")
    assert not offenders and not unsaid, "\n".join(offenders + unsaid)
