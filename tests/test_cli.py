"""The CLI as a user meets it: exit codes, one-line errors, JSON on stdout."""

import json
from pathlib import Path

from cli_helpers import run_cli

GOLDEN = Path(__file__).parent / "data" / "golden-v1.prism"


def test_version():
    out = run_cli("--version")
    assert out.returncode == 0 and out.stdout.startswith("prism-rr ")


def test_info_json_on_golden():
    out = run_cli("info", GOLDEN, "--json")
    assert out.returncode == 0, out.stderr
    facts = json.loads(out.stdout)
    assert facts["format_version"] == "1.0"
    assert facts["world_size"] == 4 and facts["recorded_ranks"] == [0, 1, 2, 3]
    assert facts["steps"] == [0, 1] and facts["event_count"] == 420
    assert facts["bytes"] == GOLDEN.stat().st_size


def test_info_for_people():
    out = run_cli("info", GOLDEN)
    assert out.returncode == 0 and "world size      4" in out.stdout


def test_verify_ok_and_damaged(tmp_path):
    assert run_cli("verify", GOLDEN).returncode == 0
    data = bytearray(GOLDEN.read_bytes())
    data[len(data) // 2] ^= 0x10
    bad = tmp_path / "bad.prism"
    bad.write_bytes(bytes(data))
    out = run_cli("verify", bad)
    assert out.returncode == 4
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "offset" in lines[0] and "Traceback" not in out.stderr


def test_unsupported_version_exits_4(tmp_path):
    data = bytearray(GOLDEN.read_bytes())
    data[8] = 9
    bad = tmp_path / "v9.prism"
    bad.write_bytes(bytes(data))
    out = run_cli("info", bad)
    assert out.returncode == 4 and "9.0" in out.stderr


def test_usage_errors_exit_2(tmp_path):
    assert run_cli("info").returncode == 2
    assert run_cli("no-such-command").returncode == 2
    out = run_cli("info", tmp_path / "missing.prism")
    assert out.returncode == 2 and len(out.stderr.strip().splitlines()) == 1


def test_pack_and_repair(tmp_path):
    from prism_rr.format.spool import spool_path
    from prism_rr.format.synthetic import write_synthetic

    spools = write_synthetic(tmp_path / "run.prism.d", 2, 200, chunk_records=40)
    torn = spool_path(spools, 1)
    torn.write_bytes(torn.read_bytes()[:-5])
    out = run_cli("repair", spools)
    assert out.returncode == 0 and "1 repaired" in out.stderr
    out = run_cli("pack", spools, "-o", tmp_path / "run.prism")
    assert out.returncode == 0, out.stderr
    facts = json.loads(run_cli("info", tmp_path / "run.prism", "--json").stdout)
    assert facts["recorded_ranks"] == [0, 1]
    assert run_cli("verify", tmp_path / "run.prism").returncode == 0


def test_help_lists_exit_codes():
    out = run_cli("--help")
    assert out.returncode == 0 and "Exit codes" in out.stdout


def test_diagnose_clean_and_with_findings(tmp_path):
    from prism_rr.format import Collective, GroupInfo, SpoolWriter, pack, spool_path

    out = run_cli("diagnose", GOLDEN)
    assert out.returncode == 0 and "no problems found" in out.stdout
    spools = tmp_path / "hang.prism.d"
    for rank in (0, 1):
        w = SpoolWriter(spool_path(spools, rank), rank, info={"world_size": 2})
        w.append(GroupInfo(start_ns=0, end_ns=0, step=0, group=0, ranks=(0, 1), name="0", backend="gloo"))
        for seq in range(3 if rank == 0 else 2):  # rank 1 never enters seq 2
            w.append(Collective(start_ns=1000 * seq, end_ns=None if seq == 2 else 1000 * seq + 10, step=0,
                                op="all_reduce", group=0, seq=seq, in_shapes=((4,),), in_dtypes=("float32",),
                                in_bytes=16, out_shapes=((4,),), out_dtypes=("float32",), out_bytes=16))
        w.close()
    pack(spools, tmp_path / "hang.prism")
    out = run_cli("diagnose", tmp_path / "hang.prism", "--json")
    assert out.returncode == 5
    findings = json.loads(out.stdout)["findings"]
    assert findings[0]["kind"] == "hang" and findings[0]["group"] == 0 and findings[0]["seq"] == 2
    assert 1 in findings[0]["ranks"]


def test_export_and_redact(tmp_path):
    out = run_cli("export", GOLDEN, "--format", "chrome", "-o", tmp_path / "trace.json", "--ranks", "0,1")
    assert out.returncode == 0, out.stderr
    trace = json.loads((tmp_path / "trace.json").read_text())
    events = trace["traceEvents"] if isinstance(trace, dict) else trace
    assert {e["pid"] for e in events if "pid" in e} <= {0, 1}
    out = run_cli("redact", GOLDEN, "-o", tmp_path / "public.prism", "--no-stacks")
    assert out.returncode == 0, out.stderr
    assert run_cli("verify", tmp_path / "public.prism").returncode == 0
    assert run_cli("diagnose", tmp_path / "public.prism").returncode == 0


_ALL_HELP = r"""
import contextlib, io, sys
import typer
from prism_rr.cli import _tidy, app
command = typer.main.get_command(app)
_tidy(command, typer.Context)
paths = [[]] + [[n] for n in command.commands] + [["import", n] for n in command.commands["import"].commands]
for path in paths:
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.suppress(SystemExit):
        command.main([*path, "--help"], prog_name="prism-rr")
    print("=== " + " ".join(path) + "\n" + out.getvalue())
"""


def test_every_help_reads_as_prose_at_80_and_160_columns():
    """No typer type labels (`<bool>`, `<str>`) beside options; docstring paragraphs reflow
    to the terminal (a line break inside a sentence was kept, mid-line at 160 columns)."""
    import inspect
    import os
    import subprocess
    import sys

    import typer

    from prism_rr.cli import app

    command = typer.main.get_command(app)
    for columns in (80, 160):
        env = {**os.environ, "COLUMNS": str(columns), "TERM": "dumb", "NO_COLOR": "1"}
        out = subprocess.run([sys.executable, "-c", _ALL_HELP], capture_output=True, text=True, env=env, timeout=60)
        assert out.returncode == 0, out.stderr
        helps = {h.split("\n", 1)[0]: h for h in out.stdout.split("=== ")[1:]}
        assert len(helps) == 1 + len(command.commands) + 1  # every command, `import fr` and the top level
        for name, text in helps.items():
            assert "<bool>" not in text and "<str>" not in text and "<float>" not in text, (columns, name)
            assert max(len(line) for line in text.splitlines()) <= columns, (columns, name)
        # A docstring's paragraph reads on as one text: its words follow each other across
        # the help's own line breaks, and no line ends short when the next one goes on it.
        doc = inspect.cleandoc(command.commands["replay"].help or "")
        paragraph = " ".join(doc.split("\n\n")[1].split())
        body = " ".join(helps["replay"].split())
        assert paragraph in body, columns
        if columns == 160:
            line = next(x for x in helps["replay"].splitlines() if "Each real rank runs CMD" in x)
            assert len(line.strip()) > 120, line
