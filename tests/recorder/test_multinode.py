"""Many nodes, one bundle: two torchrun agents on this machine stand for two nodes, each
wrapped in its own `prism-rr record`, then `prism-rr pack` makes one bundle of both."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from cli_helpers import run_cli
from prism_rr.format import open_bundle
from prism_rr.localrun import free_port

SCRIPT = Path(__file__).parent / "scripts" / "multinode.py"
TORCHRUN = Path(sys.executable).parent / "torchrun"


def record_two_nodes(tmp_path: Path, outputs: tuple[Path, Path], nproc: int) -> list[subprocess.CompletedProcess]:
    """Start `prism-rr record -o OUT_i -- torchrun --nnodes 2 --node-rank i ...` for i = 0, 1
    at once (a c10d rendezvous on 127.0.0.1) and wait for both."""
    port = free_port()
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore")
    procs = []
    for i, out in enumerate(outputs):
        launcher = [str(TORCHRUN)] if i == 0 else [sys.executable, "-m", "torch.distributed.run"]
        cmd = [sys.executable, "-m", "prism_rr.cli", "record", "-o", str(out), "--", *launcher,
               "--nnodes", "2", f"--node-rank={i}", "--nproc-per-node", str(nproc),
               "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", f"mn{port}",
               "--max-restarts", "0", str(SCRIPT)]
        procs.append(subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True, start_new_session=True))
    done = []
    try:
        for p in procs:
            out, err = p.communicate(timeout=150)
            done.append(subprocess.CompletedProcess(p.args, p.returncode, out, err))
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, 9)
                p.wait(timeout=10)
    for r in done:
        assert r.returncode == 0, r.stderr[-3000:]
    return done


def check_bundle(tmp_path: Path, bundle: Path, world: int, replay: bool) -> None:
    """The bundle of two nodes verifies, diagnoses (and replays) as one of a single node
    would, and keeps both nodes' run facts and the clock alignment."""
    with open_bundle(bundle) as b:
        assert b.world_size == world and b.recorded_ranks == list(range(world))
        m = b.manifest
        nodes = m["nodes"]
        assert sorted(n["node"] for n in nodes) == ["0", "1"]
        assert sorted(r for n in nodes for r in n["ranks"]) == list(range(world))
        assert all(n["run"]["exit_code"] == 0 and n["run"]["node"] == n["node"] for n in nodes)
        assert all(n["hostname"] and "torch" in " ".join(n["run"]["command"]) for n in nodes)
        assert m["run"] == nodes[0]["run"] and 0 in nodes[0]["ranks"]
        clock = m["clock"]
        assert clock["method"] == "store" and clock["ranks_without_offset"] == ()
        assert type(clock["max_error_ns"]) is int and clock["max_error_ns"] >= 0
        for r in range(world):
            off = b.rank_info(r)["clock_offset"]
            assert off["method"] == "store" and off["reference_rank"] == 0
            # One machine, one clock: the measured offset is within its error of zero.
            assert abs(off["offset_ns"]) <= off["error_ns"] + 1000
        print(f"clock: max error {clock['max_error_ns'] / 1e3:.0f} us over {world} ranks")
    got = run_cli("verify", bundle)
    assert got.returncode == 0, got.stderr
    got = run_cli("diagnose", bundle, "--json")
    assert got.returncode in (0, 5), got.stderr
    # Every call matched across the nodes: no hang, mismatch or lost record (a busy
    # machine may make a straggler).
    kinds = {f["kind"] for f in json.loads(got.stdout)["findings"]}
    assert kinds <= {"straggler"}, got.stdout
    if not replay:
        return
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore")
    got = run_cli("replay", bundle, "--ranks", "0", "--timeout", "100", "--", sys.executable, SCRIPT,
                  cwd=tmp_path, env=env, timeout=150)
    assert got.returncode == 0, got.stderr[-3000:]


@pytest.mark.timeout(400)
def test_two_nodes_separate_dirs_pack_into_one_bundle(tmp_path):
    """Each node writes its own OUTPUT.d/ (node-local disks); the two are packed by naming both."""
    outs = (tmp_path / "n0" / "run.prism", tmp_path / "n1" / "run.prism")
    results = record_two_nodes(tmp_path, outs, nproc=1)
    for i, (out, r) in enumerate(zip(outs, results)):
        node_dir = out.with_name("run.prism.d") / f"node-{i}"
        assert list(node_dir.glob("rank-*.spool")) and not out.exists()  # nothing packed on a node
        assert f"prism-rr pack {out.with_name('run.prism.d')} -o {out}" in r.stderr
    dirs = [out.with_name("run.prism.d") for out in outs]
    bundle = tmp_path / "run.prism"
    got = run_cli("pack", *dirs, "-o", bundle)
    assert got.returncode == 0, got.stderr
    check_bundle(tmp_path, bundle, world=2, replay=True)
    # A rank in two places (a directory copied twice) is refused, naming both.
    twin = tmp_path / "twin"
    shutil.copytree(dirs[0] / "node-0", twin)
    got = run_cli("pack", dirs[0] / "node-0", twin, "-o", tmp_path / "bad.prism")
    assert got.returncode == 2 and "in two places" in got.stderr
    assert str(dirs[0] / "node-0") in got.stderr and str(twin) in got.stderr


@pytest.mark.timeout(400)
def test_two_nodes_share_one_output_dir(tmp_path):
    """Both nodes record into one OUTPUT.d/ (a shared file system): each into its node-<i>/,
    neither clears the other's; `pack OUTPUT.d` packs both."""
    out = tmp_path / "run.prism"
    spool_dir = tmp_path / "run.prism.d"
    record_two_nodes(tmp_path, (out, out), nproc=2)
    assert sorted(p.name for p in spool_dir.iterdir()) == ["node-0", "node-1"]
    facts = [json.loads((spool_dir / f"node-{i}" / "run.json").read_text()) for i in (0, 1)]
    assert [f["node"] for f in facts] == ["0", "1"] and all(f["exit_code"] == 0 for f in facts)
    got = run_cli("pack", spool_dir, "-o", out)
    assert got.returncode == 0, got.stderr
    check_bundle(tmp_path, out, world=4, replay=False)  # the other test replays
    # A later record of node 1 clears node 1's directory, and only it.
    before = {p: p.read_bytes() for p in (spool_dir / "node-0").rglob("*") if p.is_file()}
    got = run_cli("record", "-o", out, "--node", "1", "--", sys.executable, "-c", "pass")
    assert got.returncode == 2 and "nothing was recorded" in got.stderr
    assert {p: p.read_bytes() for p in (spool_dir / "node-0").rglob("*") if p.is_file()} == before
    assert not list((spool_dir / "node-1").glob("rank-*.spool"))


def test_a_node_of_a_multi_node_launch_is_named_by_its_node_rank():
    from prism_rr.recorder.launch import launch_node

    env = {}
    assert launch_node(["torchrun", "--nnodes", "2", "--node-rank", "1", "train.py"], environ=env) == "1"
    assert launch_node(["python", "-m", "torch.distributed.run", "--nnodes=2", "--node_rank=0", "t.py"],
                       environ=env) == "0"
    assert launch_node(["torchrun", "--nnodes", "2", "t.py"], environ={"PET_NODE_RANK": "3"}) == "3"
    # One node, no torchrun, or the script's own options: the single-node layout.
    assert launch_node(["torchrun", "--nproc-per-node", "4", "t.py", "--nnodes", "2"], environ=env) is None
    assert launch_node(["torchrun", "--nnodes", "1:1", "t.py"], environ=env) is None
    assert launch_node(["python", "train.py", "--nnodes", "2", "--node-rank", "1"], environ=env) is None
    # An elastic range without a node rank is named by its host; --node names any launch.
    assert launch_node(["torchrun", "--nnodes", "1:4", "--standalone", "t.py"], environ=env)
    assert launch_node(["srun", "python", "t.py"], node="gpu-07/a") == "gpu-07_a"
