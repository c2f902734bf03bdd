"""redact(): no host name, home path, environment value or payload survives; diagnosis does."""

import dataclasses
import sys
from pathlib import Path

import pytest
import zstandard

sys.path.insert(0, str(Path(__file__).parents[1] / "analysis"))  # graph_sim: runs with planted problems
from graph_sim import HOME, HOST, SECRET, SimRun  # noqa: E402
from prism_rr.format import Collective, layout, open_bundle, pack, verify, write_blob
from prism_rr.format.spool import encode_frame, spool_path
from prism_rr.format.redact import redact
from prism_rr.analysis import diagnose

IP = "10.77.3.141"


def _all_bytes(path) -> bytes:
    """The file's bytes followed by the decompressed content of every zstd frame in it."""
    data = path.read_bytes()
    out = [data]
    magic = b"\x28\xb5\x2f\xfd"
    at = data.find(magic)
    while at >= 0:
        try:
            out.append(zstandard.ZstdDecompressor().decompress(data[at:], max_output_size=1 << 28))
        except zstandard.ZstdError:
            pass
        at = data.find(magic, at + 1)
    return b"\n".join(out)


def _planted_run(tmp_path, payload: bytes):
    run = SimRun(4)  # stacks hold full home paths
    run.train(3)
    run.marker(2, "call_failed", 3, f"all_reduce: RuntimeError: [{HOME}/gloo/pair.cc:534] peer {HOST} ({IP}) closed")
    run.compute(1000)
    run.collective(0, skip=(1,))
    spools = run.write(tmp_path / "run.prism.d", truncated=(3,))
    blob = write_blob(spools, payload)
    # a payload blob referenced from a record, as --payload full records it
    recs = [dataclasses.replace(r, blob_out=(blob,)) if isinstance(r, Collective) else r for r in run.recs[0]]
    spool = spool_path(spools, 0).read_bytes()
    head = spool[: layout.SPOOL_HEADER.size]
    info_len = layout.FRAME_HEADER.size + layout.FRAME_HEADER.unpack_from(spool, len(head))[7]
    parts = [spool[: len(head) + info_len]]
    parts += [encode_frame(layout.FRAME_EVENTS, 0, 1 + i, records=recs[i:i + 64]) for i in range(0, len(recs), 64)]
    spool_path(spools, 0).write_bytes(b"".join(parts))
    (spools / "run.json").write_text(
        '{"command": ["torchrun", "--master-addr=%s", "%s/project/train.py"], "cwd": "%s/project",'
        ' "hostname": "%s", "options": {"spool_dir": "%s/runs/x.d"}}' % (HOST, HOME, HOME, HOST, HOME))
    out = tmp_path / "run.prism"
    pack(spools, out)
    return out


def test_redacted_bundle_leaks_nothing_and_still_diagnoses(tmp_path):
    payload = b"PAYLOAD-" + b"q9z7" * 64
    src = _planted_run(tmp_path, payload)
    raw = _all_bytes(src)
    for planted in (HOST.encode(), HOME.encode(), SECRET.encode(), IP.encode(), payload):
        assert planted in raw  # the test plants what it looks for
    with open_bundle(src) as b:
        before = [(f.kind, f.ranks, f.group, f.seq) for f in diagnose(b)]
    out = tmp_path / "public.prism"
    note = redact(src, out)
    raw = _all_bytes(out)
    for leaked in (HOST.encode(), b"gpu-node-17", HOME.encode(), b"alice", SECRET.encode(), IP.encode(),
                   payload, b"q9z7q9z7"):
        assert leaked not in raw, leaked
    assert note["blob_refs_removed"] > 0 and note["truncated_ranks"] == [3]
    with open_bundle(out) as b:
        assert verify(b).blobs == 0  # raises on any damage
        assert "redacted" in b.manifest["features_optional"]
        assert "blobs" not in b.manifest["features_optional"]
        assert b.manifest["redacted"]["stacks"] == "base name and line"
        info = b.rank_info(0)
        assert info["hostname"] == "<host0>" and info["env"]["MASTER_ADDR"] == "<host0>"
        assert info["env"]["MASTER_PORT"] == "29500" and info["env"]["NCCL_SOCKET_IFNAME"] == "<redacted>"
        assert info["argv"][0].endswith("/train.py") and info["argv"][0].startswith("<path")
        assert "--lr" in info["argv"] and "0.1" in info["argv"]
        findings = diagnose(b)
        assert [(f.kind, f.ranks, f.group, f.seq) for f in findings] == before
        hang = findings[0]
        assert hang.kind == "hang" and hang.stack == ("train.py:88", "model.py:41")
        # shapes, timings, groups survive
        recs = list(b.events(0))
    with open_bundle(src) as b0:
        orig = list(b0.events(0))
    assert [(r.start_ns, r.end_ns, getattr(r, "in_shapes", None)) for r in recs] == \
           [(r.start_ns, r.end_ns, getattr(r, "in_shapes", None)) for r in orig]
    assert all(getattr(r, "blob_out", None) is None for r in recs)


def test_redact_without_stacks(tmp_path):
    run = SimRun(2)
    run.train(2)
    src = run.bundle(tmp_path)
    out = tmp_path / "nostack.prism"
    note = redact(src, out, stacks=False)
    assert note["stacks"] == "removed"
    with open_bundle(out) as b:
        assert all(getattr(r, "stack", None) is None for r in b.events(0))
    assert b"model.py:41" not in _all_bytes(out)


def test_a_redacted_bundle_s_command_is_not_run(small_bundle, tmp_path):
    """Its argv is placeholders (`python -u '<arg>'`): --run-recorded-command refuses in one
    line that says to give the program, before anything is shown or run; with a program
    given, the check lets it through."""
    import subprocess

    from prism_rr import api
    from prism_rr.errors import UsageError

    out = tmp_path / "public.prism"
    redact(small_bundle, out)
    r = subprocess.run([sys.executable, "-m", "prism_rr.cli", "replay", str(out), "--ranks", "0",
                        "--run-recorded-command"], capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert r.returncode == 2, r.stderr
    assert r.stderr.count("\n") == 1 and "redacted copy" in r.stderr and "-- python train.py" in r.stderr, r.stderr
    assert "<arg>" not in r.stderr and r.stdout == "", r
    api.check_replayable(out, cmd=["python", "train.py"])  # a program given: replayable
    with pytest.raises(UsageError, match="redacted copy"):
        api.recorded_commands(out)
