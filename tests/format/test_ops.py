"""format/ops.py is the one table of op names: it is consistent, every module that reads
records asks it, the interception groups write only names it knows, and no other module
keeps a list of its own."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from prism_rr.analysis import signature
from prism_rr.format import ops
from prism_rr.format.records import Collective
from prism_rr.tui import model

PACKAGE = Path(ops.__file__).resolve().parents[1]
SOURCES = sorted(p for p in PACKAGE.rglob("*.py") if "__pycache__" not in p.parts)
# torch's own method names for the same calls, which the old copies also listed
ALIASES = frozenset({"allreduce", "allgather", "_allgather_base", "_reduce_scatter_base", "alltoall", "alltoall_base"})
FORMS = frozenset(ops.FORMS)


def _rel(path: Path) -> str:
    return path.relative_to(PACKAGE.parent).as_posix()


def _parse(path: Path) -> ast.Module:
    return ast.parse(path.read_text(), filename=str(path))


# --- the table ----------------------------------------------------------------------------

def test_table_is_consistent():
    assert set(ops.FAMILIES) == set(ops.FAMILY_NAMES)
    for name, op in ops.OPS.items():
        assert op.name == name and ops.lookup(name) is op
        assert op.family in ops.FAMILIES and op.form in FORMS, op
        assert op.same in ("in", "out", None), op
        assert op.p2p == (op.family == "p2p") == (op.form == "p2p") == ops.is_p2p(name), op
        assert ops.family(name) == op.family
    assert {n for n in ops.OPS if ops.receives(n)} == {"recv", "irecv"}
    assert ops.lookup("frobnicate") is None and ops.family("frobnicate") == "frobnicate"
    assert not ops.is_p2p("frobnicate") and not ops.receives("frobnicate")
    assert {op.form for op in ops.OPS.values()} == FORMS  # every form is used
    assert all(f'"{form}"' in ops.__doc__ for form in ops.FORMS)  # and documented


# --- the modules that read records ask it ------------------------------------------------

def _collective(name: str) -> Collective:
    return Collective(start_ns=0, end_ns=1, step=0, op=name, group=0, seq=0,
                      in_shapes=((2, 3),), in_dtypes=("float32",), out_shapes=((5,),), out_dtypes=("float32",))


@pytest.mark.parametrize("name", [n for n, op in ops.OPS.items() if not op.p2p] + ["frobnicate"])
def test_signature_follows_same(name):
    sig = signature(_collective(name))
    same = ops.lookup(name).same if ops.lookup(name) else None
    want = {"in": ((2, 3),), "out": ((5,),)}.get(same)
    assert sig == (name, want, ("float32",), None, None)


def test_tui_paints_by_family():
    code_of = {}
    for name, op in ops.OPS.items():
        rec = _collective(name)
        if op.p2p:
            assert model.KIND_NAMES[model.P2P] == ops.FAMILY_NAMES["p2p"]
            continue
        code = model.span_code(rec)
        assert code_of.setdefault(op.family, code) == code, name  # one family, one colour
        assert ops.FAMILY_NAMES[op.family] in model.KIND_NAMES[code], (name, model.KIND_NAMES[code])
    bulk = [code_of[f] for f in ops.FAMILIES[:4]]
    assert len(set(bulk)) == 4 and model.OTHER_COLL not in bulk
    assert code_of["broadcast"] == code_of["gather_scatter"] == code_of["barrier"] == model.OTHER_COLL
    assert model.span_code(_collective("frobnicate")) == model.OTHER_COLL
    assert "broadcast/reduce" in model.KIND_NAMES[model.OTHER_COLL]


# --- the interception groups write only names it knows ----------------------------------

def _process_group_files() -> list[Path]:
    """Files defining a class that subclasses ProcessGroup, directly or through another."""
    classes: dict[str, tuple[Path, set[str]]] = {}
    for path in SOURCES:
        for node in ast.walk(_parse(path)):
            if isinstance(node, ast.ClassDef):
                bases = {b.attr if isinstance(b, ast.Attribute) else getattr(b, "id", "") for b in node.bases}
                classes[node.name] = (path, bases)
    groups = {"ProcessGroup"}
    while True:
        more = {name for name, (_, bases) in classes.items() if bases & groups} - groups
        if not more:
            break
        groups |= more
    return sorted({classes[name][0] for name in groups if name in classes})


def _op_params() -> dict[str, set]:
    """Every function of the package that takes an op name: its name -> the position and
    keyword of its parameter `op` (positions counted without self)."""
    out: dict[str, set] = {}
    for path in SOURCES:
        tree = _parse(path)
        methods = {id(f) for c in ast.walk(tree) if isinstance(c, ast.ClassDef)
                   for f in c.body if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))}
        for fn in ast.walk(tree):
            if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            args = [a.arg for a in fn.args.posonlyargs + fn.args.args]
            if id(fn) in methods and args and args[0] in ("self", "cls"):
                args = args[1:]
            kwonly = [a.arg for a in fn.args.kwonlyargs]
            if "op" in args:
                out.setdefault(fn.name, set()).add(args.index("op"))
            if "op" in args or "op" in kwonly:
                out.setdefault(fn.name, set()).add("op")
    return out


def _names_in(expr, assigned: dict, seen=frozenset()):
    """(line, name) for each op name `expr` can evaluate to, following local assignments;
    `"i" + op` or f"i{op}" (a non-blocking send or receive) counts as the names `op` may be."""
    if isinstance(expr, ast.Constant) and isinstance(expr.value, str):
        yield expr.lineno, expr.value
    elif isinstance(expr, ast.IfExp):
        yield from _names_in(expr.body, assigned, seen)
        yield from _names_in(expr.orelse, assigned, seen)
    elif isinstance(expr, ast.BinOp) and isinstance(expr.op, ast.Add) \
            and isinstance(expr.left, ast.Constant) and expr.left.value == "i":
        yield from (((line, "i" + name) for line, name in _names_in(expr.right, assigned, seen)))
    elif isinstance(expr, ast.JoinedStr) and len(expr.values) == 2 and isinstance(expr.values[1], ast.FormattedValue) \
            and getattr(expr.values[0], "value", None) == "i":  # f"i{op}"
        yield from (((line, "i" + name) for line, name in _names_in(expr.values[1].value, assigned, seen)))
    elif isinstance(expr, ast.Name) and expr.id not in seen:
        for value in assigned.get(expr.id, ()):
            yield from _names_in(value, assigned, seen | {expr.id})


def _written_op_names(path: Path, params: dict) -> list[tuple[int, str]]:
    found = []
    for fn in ast.walk(_parse(path)):
        if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        assigned: dict[str, list] = {}
        for node in ast.walk(fn):
            if isinstance(node, ast.Assign):
                for target in node.targets:
                    if isinstance(target, ast.Name):
                        assigned.setdefault(target.id, []).append(node.value)
        for call in (n for n in ast.walk(fn) if isinstance(n, ast.Call)):
            callee = call.func.attr if isinstance(call.func, ast.Attribute) else getattr(call.func, "id", None)
            where = params.get(callee, ())
            args = [a for i, a in enumerate(call.args) if i in where]
            args += [k.value for k in call.keywords if k.arg == "op" and "op" in where]
            for arg in args:
                found.extend(_names_in(arg, assigned))
    return sorted(set(found))


def test_interception_groups_write_only_table_names():
    files = _process_group_files()
    assert files, "no ProcessGroup subclass found in the package"
    params = _op_params()
    written, unknown = set(), []
    for path in files:
        for line, name in _written_op_names(path, params):
            written.add(name)
            if name not in ops.OPS:
                unknown.append(f"{_rel(path)}:{line}: {name!r}")
    assert not unknown, "op names not in format/ops.py:\n" + "\n".join(unknown)
    # the scan found the calls it is meant to check: the interception writes most of the table
    assert len(written) >= len(ops.OPS) // 2, sorted(written)


# --- no other module keeps its own list --------------------------------------------------

_NAMES = frozenset(ops.OPS) | ALIASES


def _is_name(node) -> bool:
    return isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in _NAMES


def _is_form(node) -> bool:
    """`form` or `x.form`: some forms share an op's name ("all_to_all"), and dispatching on
    a form is what the table is for."""
    name = node.attr if isinstance(node, ast.Attribute) else getattr(node, "id", None)
    return name == "form"


def _names_forms(elts) -> bool:
    """A literal of the table's forms or families (all its strings such, one at least no
    op's name): some share an op's name ("all_to_all"), as keys of a per-form rule."""
    strs = {e.value for e in elts if isinstance(e, ast.Constant) and isinstance(e.value, str)}
    return bool(strs) and strs <= FORMS | set(ops.FAMILIES) and not strs <= _NAMES


def op_lists(tree: ast.Module) -> list[tuple[int, str]]:
    """(line, name) of op names kept as data: in a set, list, tuple or dict literal, in a
    comparison, a `.startswith` or a `case` of a match on anything but a form.

    Not counted: `__all__` (exported names), a literal of forms or families, a comparison
    with or a match on a form, and a dict's values under string keys (a record's fields, such as
    {"method": "allgather"})."""
    exports = {id(n) for a in ast.walk(tree) if isinstance(a, ast.Assign)
               and any(getattr(t, "id", None) == "__all__" for t in a.targets) for n in ast.walk(a.value)}
    found = []
    for node in ast.walk(tree):
        if id(node) in exports:
            continue
        if isinstance(node, (ast.Set, ast.List, ast.Tuple)):
            if not _names_forms(node.elts):
                found += [(e.lineno, e.value) for e in node.elts if _is_name(e)]
        elif isinstance(node, ast.Dict):
            if not _names_forms(node.keys):
                found += [(k.lineno, k.value) for k in node.keys if _is_name(k)]
            found += [(v.lineno, v.value) for k, v in zip(node.keys, node.values)
                      if _is_name(v) and not (isinstance(k, ast.Constant) and isinstance(k.value, str))]
        elif isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            if not any(_is_form(e) for e in sides):
                found += [(e.lineno, e.value) for e in sides if _is_name(e)]
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "startswith":
            for a in node.args:
                found += [(e.lineno, e.value) for e in (a.elts if isinstance(a, ast.Tuple) else [a]) if _is_name(e)]
        elif isinstance(node, ast.Match) and not _is_form(node.subject):
            for case in node.cases:
                found += [(p.value.lineno, p.value.value) for p in ast.walk(case.pattern)
                          if isinstance(p, ast.MatchValue) and _is_name(p.value)]
    return sorted(set(found))


def test_the_rule_catches_lists_and_allows_calls():
    caught = op_lists(ast.parse(
        'A = {"all_reduce", "x"}\nB = ["send"]\nC = ("allgather",)\nD = {"reduce": 1}\nE = {1: "gather"}\n'
        'if op == "barrier" or op in ("x",) or "scatter" != op: pass\n'
        'op.startswith("reduce_scatter")\nop.startswith(("all_to_all", "x"))\n'
        'match op:\n    case "broadcast" | "x": pass\n'
        'F = {"reduce_scatter_tensor": 1, "all_to_all": 2}\nG = {CODE: "all_gather"}\n'
    ))
    assert caught == [(1, "all_reduce"), (2, "send"), (3, "allgather"), (4, "reduce"), (5, "gather"),
                      (6, "barrier"), (6, "scatter"), (7, "reduce_scatter"), (8, "all_to_all"), (10, "broadcast"),
                      (11, "all_to_all"), (11, "reduce_scatter_tensor"), (12, "all_gather")]
    allowed = op_lists(ast.parse(
        'f(op="all_reduce")\nf("all_reduce", 1)\nops.lookup("send")\n"""all_reduce"""\n'
        'match form:\n    case "all_to_all": pass\nmatch rec.form:\n    case "all_to_all_single": pass\n'
        'x = "recv"\n__all__ = ["reduce", "gather"]\nif form == "all_to_all": pass\n'
        'F = {"gather_tensor": 1, "reduce_scatter_tensor": 2}\nS = ("all_to_all", "gather_list")\n'
        'M = {"method": "allgather"}\nK = {"all_reduce": "2", "p2p": "1"}\n'
    ))
    assert allowed == []


@pytest.mark.parametrize("path", [p for p in SOURCES if p != Path(ops.__file__).resolve()], ids=_rel)
def test_no_module_keeps_its_own_op_list(path):
    found = op_lists(_parse(path))
    if found:
        pytest.fail("op names kept outside format/ops.py (ask the table instead):\n"
                    + "\n".join(f"{_rel(path)}:{line}: {name!r}" for line, name in found), pytrace=False)
