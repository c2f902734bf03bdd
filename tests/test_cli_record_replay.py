"""record, replay and demo as a user runs them: real ranks, real bundles, exit codes."""

import json
import sys
import textwrap

import pytest

from cli_helpers import run_cli

SCRIPT = textwrap.dedent("""
    import sys, torch, torch.distributed as dist
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    x = torch.arange(4.0) + rank
    for step in range(3):
        dist.all_reduce(x)
        dist.broadcast(x, src=1)
        x = x / 8
    if len(sys.argv) > 1 and sys.argv[1] == "fail" and rank == 1:
        sys.exit(7)
    dist.barrier()
    dist.destroy_process_group()
    print("final", rank, x.tolist())
""")


@pytest.fixture
def script(tmp_path):
    path = tmp_path / "train.py"
    path.write_text(SCRIPT)
    return path


@pytest.mark.timeout(180)
def test_record_then_replay(tmp_path, script):
    out = tmp_path / "run.prism"
    rec = run_cli("record", "-o", out, "--nproc", "2", "--payload", "full", "--", sys.executable, script, timeout=150)
    assert rec.returncode == 0, rec.stderr
    assert "wrote" in rec.stderr and out.exists()
    facts = json.loads(run_cli("info", out, "--json").stdout)
    assert facts["world_size"] == 2 and facts["recorded_ranks"] == [0, 1]
    assert run_cli("verify", out).returncode == 0

    report = tmp_path / "fidelity.json"
    rep = run_cli("replay", out, "--ranks", "1", "--report", report, timeout=150)
    assert rep.returncode == 0, rep.stderr
    data = json.loads(report.read_text())
    assert data["diverged"] is False and data["first_divergence"] is None
    assert "prism-rr replay" in rep.stderr  # the fidelity card

    edited = tmp_path / "edited.py"
    edited.write_text(SCRIPT.replace("torch.arange(4.0)", "torch.arange(5.0)"))
    div = run_cli("replay", out, "--ranks", "0", "--", sys.executable, edited, timeout=150)
    assert div.returncode == 3, div.stderr
    assert "group 0, seq 0" in div.stderr and "edited.py" in div.stderr


@pytest.mark.timeout(180)
def test_failed_run_still_yields_a_bundle(tmp_path, script):
    out = tmp_path / "run.prism"
    rec = run_cli("record", "-o", out, "--nproc", "2", "--", sys.executable, script, "fail", timeout=150)
    assert rec.returncode == 7, rec.stderr
    assert "packing what was recorded" in rec.stderr
    facts = json.loads(run_cli("info", out, "--json").stdout)
    assert facts["recorded_ranks"] == [0, 1] and facts["event_count"] > 0


@pytest.mark.timeout(60)
def test_record_usage_errors(tmp_path):
    out = run_cli("record", "-o", tmp_path / "x.prism")
    assert out.returncode == 2
    out = run_cli("record", "-o", tmp_path / "x.prism", "--", sys.executable, "-c", "print(1)")
    assert out.returncode == 2 and "nothing was recorded" in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1
    out = run_cli("record", "-o", tmp_path / "x.prism", "--payload", "all", "--", "true")
    assert out.returncode == 2 and "payload" in out.stderr


@pytest.mark.timeout(240)
def test_demo_records_and_replays(tmp_path):
    out = run_cli("demo", "--world", "2", "-o", tmp_path / "demo.prism", timeout=220, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert "diverged: no" in out.stderr and "prism-rr info" in out.stderr
    facts = json.loads(run_cli("info", tmp_path / "demo.prism", "--json").stdout)
    assert facts["steps"] == [1, 2, 3] and facts["world_size"] == 2


@pytest.mark.timeout(240)
def test_slice_roles_then_scale_to_8192(tmp_path, script):
    """Record one rank per role, scale to world 8192, and read the result back."""
    out = tmp_path / "slice.prism"
    rec = run_cli("record", "-o", out, "--nproc", "4", "--slice", "roles", "--mesh", "dp=2,tp=2",
                  "--", sys.executable, script, timeout=200)
    assert rec.returncode == 0, rec.stderr
    facts = json.loads(run_cli("info", out, "--json").stdout)
    assert facts["world_size"] == 4 and facts["recorded_ranks"] == [0, 1]  # rank 0 stands for 2, 1 for 3
    big = tmp_path / "big.prism"
    sc = run_cli("scale", out, "--dp", "4096", "--mesh", "dp=2,tp=2", "-o", big, "--json")
    assert sc.returncode == 0, sc.stderr
    note = json.loads(sc.stdout)
    assert note["to"]["world_size"] == 8192 and "fit_error" in note["model"]
    facts = json.loads(run_cli("info", big, "--json").stdout)
    assert facts["world_size"] == 8192 and facts["bytes"] < 1_000_000
    assert run_cli("verify", big).returncode == 0
