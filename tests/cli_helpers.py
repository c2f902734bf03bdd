"""Run the CLI as a user would, in a fresh interpreter."""

import subprocess
import sys


def run_cli(*args, **kw):
    """Run the installed CLI as a user would, in a fresh interpreter."""
    return subprocess.run(
        [sys.executable, "-m", "prism_rr.cli", *map(str, args)],
        capture_output=True, text=True, timeout=kw.pop("timeout", 120), **kw,
    )
