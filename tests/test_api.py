"""prism_rr.api as a library user calls it: results and errors, nothing printed."""

import errno
import json
import os
import sys
from pathlib import Path

import pytest

from prism_rr import api
from prism_rr.errors import FormatError, UsageError
from prism_rr.format import open_bundle
from prism_rr.format.spool import spool_path
from prism_rr.format.synthetic import write_synthetic
from prism_rr.specs import format_ranks, parse_bandwidth, parse_ranks

GOLDEN = Path(__file__).parent / "data" / "golden-v1.prism"


def test_ranks_round_trip_and_bandwidth():
    assert format_ranks(parse_ranks("7,0-3")) == "0-3,7"
    assert parse_ranks(" ") == () and parse_ranks(None) is None
    assert parse_bandwidth("400Gb/s") == parse_bandwidth("50GB/s") == 50e9
    with pytest.raises(UsageError):
        parse_bandwidth("fast")


def test_facts_of_a_bundle():
    with open_bundle(GOLDEN) as b:
        facts = b.facts()
    assert facts["world_size"] == 4 and facts["recorded_ranks"] == [0, 1, 2, 3]
    assert facts["recorder_failures"] == [] and json.loads(json.dumps(facts)) == facts


def test_repair_pack_verify_export(tmp_path):
    spools = write_synthetic(tmp_path / "run.prism.d", 2, 200, chunk_records=40)
    torn = spool_path(spools, 1)
    torn.write_bytes(torn.read_bytes()[:-5])
    scans = api.repair(spools)
    assert [p.name for p, _ in scans] == ["rank-00000.spool", "rank-00001.spool"]
    assert [scan.torn for _, scan in scans] == [False, True]
    packed = api.pack(spools, tmp_path / "run.prism")
    assert packed.ranks == 2 and packed.bytes == (tmp_path / "run.prism").stat().st_size
    assert api.verify(tmp_path / "run.prism").events == packed.events
    stats = api.export(tmp_path / "run.prism", tmp_path / "trace.json", ranks="1", steps="0:2")
    assert stats["ranks"] == 1 and stats["events"] > 0
    with pytest.raises(UsageError):
        api.repair(tmp_path / "trace.json")


def test_pack_redacted_leaves_one_file(tmp_path):
    spools = write_synthetic(tmp_path / "run.prism.d", 2, 100)
    packed = api.pack(spools, tmp_path / "public.prism", redact=True, stacks=False)
    assert packed.path == tmp_path / "public.prism"
    assert packed.bytes == (tmp_path / "public.prism").stat().st_size
    assert sorted(p.name for p in tmp_path.iterdir()) == ["public.prism", "run.prism.d"]
    with open_bundle(tmp_path / "public.prism") as b:
        assert "redacted" in b.manifest


def test_verify_damaged_raises(tmp_path):
    bad = tmp_path / "bad.prism"
    data = bytearray(GOLDEN.read_bytes())
    data[len(data) // 2] ^= 0xFF
    bad.write_bytes(bytes(data))
    with pytest.raises(FormatError):
        api.verify(bad)


@pytest.mark.timeout(60)
def test_scale_takes_a_bandwidth_spec(tmp_path):
    src = tmp_path / "w4.prism"
    api.pack(write_synthetic(tmp_path / "w4.d", 4, 200, tp=2), src)
    note = api.scale(src, tmp_path / "big.prism", dp=8, bandwidth="400Gb/s")
    assert note["to"]["world_size"] == 16 and note["model"]["given_bytes_per_s"] == 50e9
    with pytest.raises(UsageError):
        api.scale(src, tmp_path / "x.prism", dp=8, compare=tmp_path / "missing.prism")
    assert not (tmp_path / "x.prism").exists()


def test_record_refuses_bad_arguments(tmp_path):
    with pytest.raises(UsageError):
        api.record([], tmp_path / "run.prism")
    with pytest.raises(UsageError):
        api.record(["python"], tmp_path / "run.prism", nproc=-1)


@pytest.mark.timeout(60)
def test_record_of_a_program_that_records_nothing(tmp_path, capfd):
    heard = []
    with pytest.raises(UsageError, match="nothing was recorded"):
        api.record([sys.executable, "-c", "raise SystemExit(3)"], tmp_path / "run.prism", warn=heard.append)
    assert heard == ["the command exited with code 3"]  # not "packing": there is nothing to pack
    assert capfd.readouterr().err == ""  # the library says nothing itself


@pytest.mark.timeout(60)
def test_record_of_a_command_that_cannot_start(tmp_path):
    result = api.record([str(tmp_path / "no-such-program")], tmp_path / "run.prism")
    assert result.exit_code is None and result.packed is None
    assert isinstance(result.error, OSError) and not result.spools_left
    assert result.spool_dir == api.spool_dir_for(tmp_path / "run.prism")


def test_record_on_a_full_disk_keeps_the_code_and_the_spools(tmp_path, monkeypatch):
    import prism_rr.format
    import prism_rr.recorder.launch

    out = tmp_path / "run.prism"
    spools = tmp_path / "run.prism.d"

    def fake_record(cmd, output, **kw):
        spools.mkdir()
        (spools / "rank-00000.spool").write_bytes(b"x")
        (spools / "half.tmp").write_bytes(b"x")
        return 3

    def full_disk(spool_dir, output, **kw):
        Path(output).with_name(Path(output).name + ".partial").write_bytes(b"half")
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(prism_rr.recorder.launch, "record_command", fake_record)
    monkeypatch.setattr(prism_rr.api, "pack_spools", full_disk)
    heard = []
    result = api.record(["train"], out, warn=heard.append)
    assert result.exit_code == 3 and result.packed is None and result.spools_left and not result.spools_removed
    assert result.error.errno == errno.ENOSPC and result.spool_dir == spools
    assert result.warnings == tuple(heard) == ("the command exited with code 3; packing what was recorded",)
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["rank-00000.spool", "run.prism.d"]


def _recording(monkeypatch, *, torn: bool = False, notes: bool = False):
    """record_command replaced by one that leaves in OUTPUT.d/ what a recording of 2 ranks
    leaves there: spools, payload blobs, crash files, run.json (with `torn`, rank 1's
    spool ends in a torn frame; with `notes`, a file of the user's lies among them)."""
    import prism_rr.recorder.launch

    def fake_record(cmd, output, **kw):
        spools = api.spool_dir_for(output)
        write_synthetic(spools, 2, 200, payload=True, chunk_records=40)
        for rank in (0, 1):
            (spools / f"rank-{rank:05d}.crash").write_text("")
        (spools / "run.json").write_text("{}")
        if torn:
            with open(spool_path(spools, 1), "ab") as f:
                f.write(b"PRF1 half a frame")
        if notes:
            (spools / "notes.txt").write_text("the user's")
        return 0

    monkeypatch.setattr(prism_rr.recorder.launch, "record_command", fake_record)


def _files(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


def test_record_leaves_one_file(tmp_path, monkeypatch):
    """Once the bundle is written and reads back with everything the spools held, what the
    recording wrote into OUTPUT.d/ is removed; a file of the user's there stays, and so
    does the directory that holds it."""
    _recording(monkeypatch)
    out = tmp_path / "run.prism"
    result = api.record(["train"], out)
    assert result.exit_code == 0 and result.packed.events > 0 and result.packed.blobs > 0
    assert result.spools_removed and not result.spools_left and result.readback_error is None
    assert _files(tmp_path) == ["run.prism"]
    with open_bundle(out) as b:
        assert b.recorded_ranks == [0, 1] and sum(1 for r in (0, 1) for _ in b.events(r)) == result.packed.events

    _recording(monkeypatch, notes=True)
    result = api.record(["train"], out)
    assert result.spools_removed and _files(tmp_path) == ["run.prism", "run.prism.d", "run.prism.d/notes.txt"]


def test_record_keeps_the_spools_when_asked_or_when_the_bundle_lacks_them(tmp_path, monkeypatch):
    """The spools stay with keep_spools; where a rank's spool could not be packed whole
    (the lost tail is only there); and where the bundle does not read back with what the
    spools held (here, pack miscounting: the check compares the two)."""
    import dataclasses

    import prism_rr.format

    _recording(monkeypatch)
    asked = tmp_path / "asked" / "run.prism"
    result = api.record(["train"], asked, keep_spools=True)
    assert result.packed is not None and result.spools_left and not result.spools_removed
    assert "run.prism.d/rank-00001.spool" in _files(asked.parent) and "run.prism.d/run.json" in _files(asked.parent)

    _recording(monkeypatch, torn=True)
    torn = tmp_path / "torn" / "run.prism"
    result = api.record(["train"], torn)
    assert list(result.packed.torn) == [1] and result.spools_left and not result.spools_removed
    assert (torn.parent / "run.prism.d" / "rank-00001.spool").read_bytes().endswith(b"half a frame")

    _recording(monkeypatch)
    real = prism_rr.format.pack
    monkeypatch.setattr(prism_rr.api, "pack_spools",
                        lambda *a, **kw: dataclasses.replace(got := real(*a, **kw), events=got.events + 1))
    miscounted = tmp_path / "miscounted" / "run.prism"
    result = api.record(["train"], miscounted)
    assert result.packed is not None and result.spools_left and not result.spools_removed
    n = result.packed.events
    assert f" {n - 1} records" in result.readback_error and f", {n} and " in result.readback_error, result.readback_error


def test_a_spool_that_cannot_be_removed_is_a_warning(tmp_path, monkeypatch):
    """Removing the spools is tidying up: one that will not go is said, and the rest go;
    the recording is whole."""
    _recording(monkeypatch)
    out = tmp_path / "run.prism"
    unlink = Path.unlink

    def refuse(self, missing_ok=False):
        if self.name == "rank-00001.spool":
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(self))
        return unlink(self, missing_ok=missing_ok)

    monkeypatch.setattr(Path, "unlink", refuse)
    heard = []
    result = api.record(["train"], out, warn=heard.append)
    assert result.exit_code == 0 and result.packed.events > 0 and result.readback_error is None
    assert result.spools_left and not result.spools_removed
    assert _files(tmp_path) == ["run.prism", "run.prism.d", "run.prism.d/rank-00001.spool"]
    assert heard == list(result.warnings) and len(heard) == 1, heard
    assert heard[0].startswith(f"could not remove the spools in {out}.d/ (") and "Permission denied" in heard[0]


def test_demo_plan():
    import prism_rr.demo as demo

    plan = demo.plan(4)
    assert plan.layout == "dp2 x tp2 (FSDP2 x DTensor TP)" and plan.train[-2:] == ["--tp", "2"]
    assert demo.plan(4, pp=2).layout == "pp2 x dp2"
    with pytest.raises(UsageError):
        demo.plan(3, pp=2)


# --- every command goes through the api: a script gets what the command line prints ----


@pytest.fixture(scope="module")
def hung(tmp_path_factory):
    """A 2-rank bundle whose rank 1 never enters its all_reduce seq 2: a hang."""
    from prism_rr.format import Collective, GroupInfo, SpoolWriter, pack

    d = tmp_path_factory.mktemp("api")
    for rank in (0, 1):
        w = SpoolWriter(spool_path(d / "hang.prism.d", rank), rank, info={"world_size": 2})
        w.append(GroupInfo(start_ns=0, end_ns=0, step=0, group=0, ranks=(0, 1), name="0", backend="gloo"))
        for seq in range(3 if rank == 0 else 2):
            w.append(Collective(start_ns=1000 * seq, end_ns=None if seq == 2 else 1000 * seq + 10, step=0,
                                op="all_reduce", group=0, seq=seq, in_shapes=((4,),), in_dtypes=("float32",),
                                in_bytes=16, out_shapes=((4,),), out_dtypes=("float32",), out_bytes=16,
                                stack=("train.py:9 in step",)))
        w.close()
    pack(d / "hang.prism.d", d / "hang.prism")
    return d / "hang.prism"


def _cli(*args):
    from cli_helpers import run_cli

    return run_cli(*args)


def test_info_as_the_command_line_gives_it():
    got = api.info(GOLDEN)
    assert got.json() == json.loads(_cli("info", GOLDEN, "--json").stdout)
    assert "\n".join(got.lines()) + "\n" == _cli("info", GOLDEN).stdout
    assert got.facts["nodes"] is None and got.facts["imported"] is None


def test_diagnose_as_the_command_line_gives_it(hung):
    found = api.diagnose(hung)
    assert found.found and found.findings[0].kind == "hang" and found.findings[0].seq == 2
    assert found.json() == json.loads(_cli("diagnose", hung, "--json").stdout)
    out = _cli("diagnose", hung)
    assert out.returncode == 5 and "\n".join(found.lines()) + "\n" == out.stdout
    assert found.lines()[-1] == "   at train.py:9 in step"
    clean = api.diagnose(GOLDEN)
    assert not clean.found and clean.lines() == ["no problems found"] and clean.json()["findings"] == []


def test_analyze_as_the_command_line_gives_it():
    lines = list(api.analysis_lines(api.analyze(GOLDEN, steps="0:1")))
    assert lines[0].startswith("step 0: ") and "\n".join(lines) + "\n" == _cli("analyze", GOLDEN, "--steps", "0:1").stdout
    text = "".join(api.analysis_json_text(api.analyze(GOLDEN)))
    assert json.loads(text) == json.loads(_cli("analyze", GOLDEN, "--json").stdout)
    with pytest.raises(UsageError, match="none of ranks 9"):
        api.analyze(GOLDEN, ranks="9")  # at once, not when first read


def test_diff_as_the_command_line_gives_it(hung):
    d = api.diff(GOLDEN, hung)
    assert not d.same and d.json() == json.loads(_cli("diff", GOLDEN, hung, "--json").stdout)
    assert "\n".join(d.lines()) + "\n" == _cli("diff", GOLDEN, hung).stdout
    assert api.diff(GOLDEN, GOLDEN).same


def test_redact_import_and_scale_lines(tmp_path):
    note = api.redact(GOLDEN, tmp_path / "public.prism", stacks=False)
    assert note["stacks"] == "removed" and api.verify(tmp_path / "public.prism").events > 0
    fr = Path(__file__).parent / "data" / "fr" / "skip" / "json"
    imported = api.import_fr(fr, tmp_path / "fr.prism")
    assert imported.json()["ranks"] == 3 and imported.json()["from"] == "flight_recorder"
    assert imported.lines()[0].startswith(f"wrote {tmp_path / 'fr.prism'}: 3 ranks")
    assert api.info(tmp_path / "fr.prism").facts["imported"]["forms"] == ["json"]
    env = api.record_env(tmp_path / "run.prism", steps="1:3")
    assert set(env) == {"PRISM_RR_RECORD", "PYTHONPATH"} and "1" in env["PRISM_RR_RECORD"]


def test_the_command_line_reaches_the_library_only_through_the_api():
    """cli.py parses and prints: of prism_rr it imports the api, the errors (their exit
    codes), the version and the specs it formats ranks with; no subpackage."""
    import ast

    tree = ast.parse((Path(__file__).parent.parent / "prism_rr" / "cli.py").read_text())
    named = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("prism_rr"):
            named |= {f"{node.module}.{a.name}" if node.module == "prism_rr" else node.module for a in node.names}
        elif isinstance(node, ast.Import):
            named |= {a.name for a in node.names if a.name.startswith("prism_rr")}
    assert named == {"prism_rr.api", "prism_rr._version", "prism_rr.errors", "prism_rr.specs"}, named
