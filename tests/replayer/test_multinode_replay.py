"""Replay across nodes: torchrun's rendezvous makes the real ranks' world, here two local
torchrun agents as two "nodes", each under its own `prism-rr replay`."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from prism_rr.errors import UsageError
from prism_rr.localrun import free_port
from prism_rr.replayer import replay
from prism_rr.replayer._torchrun import is_launcher, launcher_shape

from replay_helpers import SCRIPTS, record

BIN = Path(sys.executable).parent
TORCHRUN = str(BIN / "torchrun")


def _torchrun(node: int, port: int, *args) -> list[str]:
    return [TORCHRUN, "--nnodes", "2", "--node-rank", str(node), "--nproc-per-node", "1",
            "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}", "--max-restarts", "0",
            "--monitor-interval", "0.1", *map(str, args)]


def test_launcher_is_known_by_its_command():
    assert is_launcher(["torchrun", "--nproc-per-node", "2", "train.py"])
    assert is_launcher([sys.executable, "-u", "-m", "torch.distributed.run", "train.py"])
    assert not is_launcher([sys.executable, "train.py", "-m", "torch.distributed.run"])
    assert not is_launcher(["python", "-m", "prism_rr.demo.train"])
    assert launcher_shape(_torchrun(0, 1, "train.py")) == (2, 1)
    assert launcher_shape(["torchrun", "--nnodes", "1:4", "--nproc_per_node=auto", "t.py"]) == (None, None)
    assert launcher_shape(["torchrun", "--standalone", "--nproc-per-node", "4", "t.py"]) == (1, 4)


@pytest.fixture(scope="module")
def bundle(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("two-nodes")
    return record(tmp, [SCRIPTS / "two_nodes.py", "3"], 4, payload="digest")


def test_launcher_workers_must_be_the_real_ranks(bundle):
    with pytest.raises(UsageError, match=r"2 node\(s\) x 1 process\(es\) per node = 2 workers; .* 3 real"):
        replay(bundle, ranks="0-2", cmd=_torchrun(0, 1, SCRIPTS / "two_nodes.py", "3"))


@pytest.mark.timeout(240)
def test_two_nodes_replay_and_each_reports_every_real_rank(bundle, tmp_path):
    port, out = free_port(), tmp_path / "env"
    out.mkdir()
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    nodes = []
    for node in (0, 1):
        cmd = [str(BIN / "prism-rr"), "replay", str(bundle), "--ranks", "0-1", "--report",
               str(tmp_path / f"r{node}.json"), "--timeout", "180", "--",
               *_torchrun(node, port, SCRIPTS / "two_nodes.py", "3", out)]
        nodes.append(subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True, start_new_session=True))
    try:
        logs = [p.communicate(timeout=200)[0] for p in nodes]
    finally:
        for p in nodes:
            if p.poll() is None:
                p.kill()
                p.wait()
    assert [p.returncode for p in nodes] == [0, 0], "\n---\n".join(logs)
    for node in (0, 1):
        rep = json.loads((tmp_path / f"r{node}.json").read_text())
        assert rep["ranks"] == [0, 1] and rep["world_size"] == 4
        assert rep["diverged"] is False and rep["unreported"] == []
        assert all(rep["progress"][r]["complete"] for r in ("0", "1")), rep["progress"]
        assert [s["step"] for s in rep["steps"]] == [0, 1, 2]
        assert "diverged: no" in logs[node]
    # The program saw the recorded world; its local rank stays the node's own.
    seen = sorted((json.loads(f.read_text()) for f in out.glob("env-*.json")), key=lambda e: e["rank"])
    assert [(e["RANK"], e["WORLD_SIZE"], e["rank"], e["world"]) for e in seen] == [
        ("0", "4", 0, 4), ("1", "4", 1, 4)]
    assert {(e["LOCAL_RANK"], e["LOCAL_WORLD_SIZE"]) for e in seen} == {("0", "1")}


@pytest.mark.timeout(120)
def test_a_launcher_world_that_is_not_the_real_ranks_is_refused(bundle, tmp_path):
    # Any launcher with torchrun's environment, when asked: here three local workers for
    # two real ranks, which each worker refuses before the program starts.
    cmd = [sys.executable, "-m", "prism_rr.localrun", "--nproc", "3", "--timeout", "100", "--",
           sys.executable, SCRIPTS / "two_nodes.py", "3"]
    with pytest.raises(UsageError, match="the launcher started 3 workers in all; the replay has 2 real ranks"):
        replay(bundle, ranks="0-1", cmd=list(map(str, cmd)), launcher=True, timeout=100)
