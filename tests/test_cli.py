"""The CLI as a user meets it: exit codes, one-line errors, JSON on stdout."""

import json
from pathlib import Path

from conftest import run_cli

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
