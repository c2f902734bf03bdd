"""graph/ and format/redact.py read bundles without torch or a UI library."""

import json
import subprocess
import sys


def test_graph_and_redact_import_no_torch_or_ui():
    code = ("import sys, json\nimport prism_rr.analysis, prism_rr.format.redact\n"
            "print(json.dumps(sorted({m.split('.')[0] for m in sys.modules})))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert not set(json.loads(out.stdout.strip().splitlines()[-1])) & {"torch", "textual", "rich", "typer", "numpy"}
