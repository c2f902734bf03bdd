"""Reading a bundle needs neither torch nor a terminal UI (docs/layout.md): the
package, the format and `info`, imported in a fresh interpreter. The rules between
subpackages are tests/test_layering.py's."""

import json
import subprocess
import sys

import pytest


def _modules_after(statement: str) -> set[str]:
    code = f"import sys, json\n{statement}\nprint(json.dumps(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    return set(json.loads(out.stdout.strip().splitlines()[-1]))


def _top(mods: set[str]) -> set[str]:
    return {m.split(".")[0] for m in mods}


@pytest.mark.parametrize("statement", [
    "import prism_rr.format",
    "import prism_rr.format as f; b = f.open_bundle('tests/data/golden-v1.prism'); list(b.events(0)); f.verify(b)",
])
def test_format_needs_no_torch_or_ui(statement):
    assert not _top(_modules_after(statement)) & {"torch", "textual", "rich", "typer", "numpy"}


def test_top_level_package_is_light():
    assert not _top(_modules_after("import prism_rr")) & {"torch", "textual", "rich"}


def test_info_runs_without_torch():
    mods = _modules_after(
        "import sys; sys.argv=['prism-rr','info','tests/data/golden-v1.prism','--json']\n"
        "from prism_rr import cli\ntry:\n    cli.main()\nexcept SystemExit:\n    pass"
    )
    assert "torch" not in _top(mods)


@pytest.mark.parametrize("launcher", ["prism_rr.replayer.launch", "prism_rr.recorder.launch"])
def test_the_launchers_leave_torch_to_the_ranks(launcher):
    """`record` and `replay` start ranks; only the ranks need torch (about 3 s of CPU to
    import): the launching process imports none of it."""
    assert "torch" not in _top(_modules_after(f"import {launcher}"))
