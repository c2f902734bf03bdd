"""`prism-rr record` says what went wrong with the recording, never hides the program's
exit code, and leaves no half-written file (issue 11: a recorder that turned itself off,
a full disk)."""

import errno
import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from typer.testing import CliRunner

from recorder_helpers import SCRIPTS

FILL = SCRIPTS / "fill.py"
ENV = dict(os.environ, PYTHONWARNINGS="ignore", OMP_NUM_THREADS="1")


def _cli(*args, timeout=120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "prism_rr.cli", *map(str, args)], capture_output=True,
                          text=True, timeout=timeout, env=ENV)


def _record(out: Path, *script_args, timeout=120) -> subprocess.CompletedProcess:
    return _cli("record", "-o", out, "--payload", "full", "--nproc", "2", "--timeout", timeout - 30, "--",
                sys.executable, FILL, *script_args, timeout=timeout)


def _left_over(root: Path) -> list[Path]:
    return [p for p in root.rglob("*") if p.name.endswith((".tmp", ".partial"))]


@pytest.mark.timeout(150)
def test_a_recorder_that_turned_itself_off_is_reported(tmp_path):
    out = tmp_path / "run.prism"
    got = _record(out, 0, "--break-recorder", 1)
    assert got.returncode == 0, got.stderr[-3000:]
    assert "rank 1 total" in got.stdout and "rank 0 total" in got.stdout  # the training went on
    lines = [ln for ln in got.stderr.splitlines() if "recorder turned itself off" in ln]
    assert len(lines) == 1 and "rank 1" in lines[0] and "step 2" in lines[0] and "planted failure" in lines[0], got.stderr
    facts = json.loads(_cli("info", out, "--json").stdout)
    assert facts["recorder_failed_ranks"] == [1]
    assert facts["recorder_failures"] == [{"rank": 1, "step": 2, "reason": "RuntimeError: planted failure"}]
    text = _cli("info", out).stdout
    assert "recorder off    rank 1 from step 2: RuntimeError: planted failure" in text


def test_a_full_disk_at_packing_keeps_the_exit_code_and_the_spools(tmp_path, monkeypatch):
    """Simulated at the write path: the program's code comes through, the user learns
    where the spools are and how to pack them, and no .partial is left."""
    import prism_rr.format
    import prism_rr.recorder.launch
    from prism_rr.cli import app

    out = tmp_path / "run.prism"
    spools = tmp_path / "run.prism.d"

    def fake_record(cmd, output, **kw):
        spools.mkdir()
        (spools / "rank-00000.spool").write_bytes(b"x")
        return int(cmd[-1])

    def full_disk(spool_dir, output, **kw):
        Path(output).with_name(Path(output).name + ".partial").write_bytes(b"half")
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(prism_rr.recorder.launch, "record_command", fake_record)
    monkeypatch.setattr(prism_rr.api, "pack_spools", full_disk)
    for code, expected in ((0, 1), (3, 3)):
        if spools.exists():
            (spools / "rank-00000.spool").unlink()
            spools.rmdir()
        got = CliRunner().invoke(app, ["record", "-o", str(out), "--", "train", str(code)])
        assert got.exit_code == expected, got.output
        assert "No space left on device" in got.output
        assert ("succeeded (exit code 0)" if code == 0 else f"exited with code {code}") in got.output
        assert f"the spools are in {spools}/" in got.output
        assert f"prism-rr pack {spools} -o ELSEWHERE/run.prism" in got.output
        assert _left_over(tmp_path) == [] and not out.exists()


def test_spools_that_stay_are_said_where(tmp_path, monkeypatch):
    """`record` removes OUTPUT.d/ once OUTPUT reads back with what the spools held; where
    it does not (here pack miscounts: the check compares the two), the user learns that,
    where the spools are and how to pack them again. --keep-spools keeps them, said once."""
    import dataclasses

    import prism_rr.format
    import prism_rr.recorder.launch
    from prism_rr.cli import app
    from prism_rr.format.synthetic import write_synthetic

    assert "--keep-spools" in CliRunner().invoke(app, ["record", "--help"]).output
    out = tmp_path / "run.prism"
    spools = tmp_path / "run.prism.d"

    def fake_record(cmd, output, **kw):
        write_synthetic(spools, 2, 100)
        return 0

    monkeypatch.setattr(prism_rr.recorder.launch, "record_command", fake_record)
    got = CliRunner().invoke(app, ["record", "-o", str(out), "--keep-spools", "--", "train"])
    assert got.exit_code == 0 and f"the spools stay in {spools}/\n" in got.output, got.output
    assert out.exists() and sorted(p.name for p in spools.iterdir()) == ["rank-00000.spool", "rank-00001.spool"]

    real = prism_rr.format.pack
    monkeypatch.setattr(prism_rr.api, "pack_spools",
                        lambda *a, **kw: dataclasses.replace(got := real(*a, **kw), events=got.events + 1))
    got = CliRunner().invoke(app, ["record", "-o", str(out), "--", "train"])
    assert got.exit_code == 0, got.output
    assert f"warning: could not read back {out}: run.prism holds 2 ranks" in got.output, got.output
    assert f"the spools stay in {spools}/; pack them again with: prism-rr pack {spools} -o {out}" in got.output
    assert out.exists() and sorted(p.name for p in spools.iterdir()) == ["rank-00000.spool", "rank-00001.spool"]


@pytest.fixture
def small_disk():
    """A 2 MiB tmpfs (root only; skipped where mounting is not allowed)."""
    where = Path(f"/tmp/prism-small-{uuid.uuid4().hex[:8]}")
    where.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(where)], capture_output=True)
    if done.returncode != 0:
        where.rmdir()
        pytest.skip("cannot mount a small tmpfs here")
    try:
        yield where
    finally:
        subprocess.run(["umount", str(where)], check=False)
        where.rmdir()


@pytest.mark.timeout(200)
def test_a_full_disk_while_recording(small_disk, tmp_path):
    out = small_disk / "run.prism"
    spools = small_disk / "run.prism.d"
    for code in (0, 3):
        got = _record(out, code)
        assert got.returncode == (code or 1), got.stderr[-3000:]
        assert "rank 0 total" in got.stdout and "rank 1 total" in got.stdout  # the training is unharmed
        err = got.stderr
        assert "No space left on device" in err
        assert ("succeeded (exit code 0)" if code == 0 else f"exited with code {code}") in err, err
        assert f"prism-rr pack {spools} -o ELSEWHERE/run.prism" in err, err
        assert _left_over(small_disk) == [] and not out.exists()
    # The printed command packs the spools elsewhere; the bundle says why it ends early.
    elsewhere = tmp_path / "run.prism"
    packed = _cli("pack", spools, "-o", elsewhere)
    assert packed.returncode == 0, packed.stderr
    facts = json.loads(_cli("info", elsewhere, "--json").stdout)
    assert facts["recorder_failed_ranks"] == [0, 1]
    assert all("No space left on device" in f["reason"] for f in facts["recorder_failures"])


@pytest.mark.timeout(200)
def test_info_says_when_ranks_shared_cores(tmp_path):
    """Each rank records the CPUs it could run on and torch's threads, as the program left
    them; info says whether the ranks computed on cores of their own. steps.py sets one
    thread per rank: 2 ranks fit this machine's cores, twice as many CPUs' worth do not."""
    cpus = len(os.sched_getaffinity(0))
    for nproc, shared in ((cpus, False), (2 * cpus, True)):
        out = tmp_path / f"w{nproc}.prism"
        got = _cli("record", "-o", out, "--nproc", nproc, "--timeout", 150, "--", sys.executable,
                   SCRIPTS / "steps.py", timeout=180)
        assert got.returncode == 0, got.stderr[-3000:]
        facts = json.loads(_cli("info", out, "--json").stdout)
        cpu = facts["cpu"]
        assert cpu["shared"] is shared and cpu["hosts"][0]["ranks"] == nproc, cpu
        assert cpu["hosts"][0]["threads"] == nproc and cpu["hosts"][0]["cpus"] == cpus, cpu
        text = _cli("info", out).stdout
        assert ("the ranks shared cores" in text) is shared, text
