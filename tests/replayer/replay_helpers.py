"""Helpers for replayer tests: record a command with the real recorder, then pack it."""

import sys
from pathlib import Path

from prism_rr.format import pack
from prism_rr.recorder.launch import record_command, spool_dir_for

SCRIPTS = Path(__file__).parent / "scripts"
# Starts N ranks the way torchrun would (without torchrun's own start-up cost).
_LOCAL = ("import sys; from prism_rr.localrun import run_local; "
          "sys.exit(max(run_local(sys.argv[2:], int(sys.argv[1]), timeout=150)))")


def record(tmp: Path, argv: list, world: int, *, payload="full", timeout=150, **options) -> Path:
    """Record `python argv...` as `world` ranks into tmp/run.prism; fail on a non-zero exit."""
    out = tmp / "run.prism"
    cmd = [sys.executable, "-c", _LOCAL, str(world), sys.executable, *map(str, argv)]
    code = record_command(cmd, out, payload=payload, timeout=timeout, **options)
    assert code == 0, f"recording exited {code}"
    pack(spool_dir_for(out), out)
    return out


def stderr_of(result, rank: int) -> str:
    if result.log_dir is None:
        return ""
    path = result.log_dir / f"rank{rank}.stderr"
    return path.read_text()[-4000:] if path.exists() else ""
