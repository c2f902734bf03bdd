"""The start-up hook, options and launcher, without starting any rank."""

import json
import os
import subprocess
import sys

import pytest

from prism_rr.errors import UsageError
from prism_rr.recorder._manifest import safe_env
from prism_rr.recorder import RecordOptions
from prism_rr.specs import parse_ranks, parse_steps
from prism_rr.recorder.launch import HOOK_DIR, hook_env, record_command


def _python(code, env, timeout=60):
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=timeout)


@pytest.mark.timeout(60)
def test_hook_does_not_import_torch(tmp_path):
    env = dict(os.environ)
    env.update(hook_env(RecordOptions.make(tmp_path / "x.prism.d")))
    r = _python("import sys; print('torch' in sys.modules, 'prism_rr.intercept.hook' in sys.modules)", env)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["False", "True"]


@pytest.mark.timeout(60)
def test_hook_chains_the_previous_sitecustomize(tmp_path):
    other = tmp_path / "other"
    other.mkdir()
    (other / "sitecustomize.py").write_text("import os\nos.environ['CHAINED'] = 'yes'\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(HOOK_DIR), str(other)]))
    env.pop("PRISM_RR_RECORD", None)
    r = _python("import os; print(os.environ.get('CHAINED'))", env)
    assert r.stdout.strip() == "yes", r.stderr


def test_options_round_trip_and_parsing():
    o = RecordOptions.make("/x.d", payload="full", steps="2:5", ranks="0,2-3", ops=True)
    back = RecordOptions.from_json(o.to_json())
    assert back == o and back.steps == (2, 5) and back.ranks == (0, 2, 3)
    assert parse_steps("3") == (3, 4) and parse_steps(":4") == (None, 4) and parse_steps("2:") == (2, None)
    assert o.in_window(2) and not o.in_window(5) and not o.records_rank(1)
    assert parse_ranks([3, 1, 3]) == (1, 3)
    for bad in ("a:b", "5:2"):
        with pytest.raises(UsageError):
            parse_steps(bad)
    with pytest.raises(UsageError):
        RecordOptions.make("/x", payload="everything")


def test_manifest_env_is_allow_listed():
    env = safe_env({"RANK": "1", "TORCH_DISTRIBUTED_DEBUG": "INFO", "NCCL_IB_HCA": "mlx5", "HOME": "/root",
                    "AWS_SECRET_ACCESS_KEY": "s", "TORCH_HUB_TOKEN": "t", "MASTER_ADDR": "h", "PATH": "/bin"})
    assert env == {"MASTER_ADDR": "h", "NCCL_IB_HCA": "mlx5", "RANK": "1", "TORCH_DISTRIBUTED_DEBUG": "INFO"}


@pytest.mark.timeout(60)
def test_record_command_returns_exit_code_and_writes_run_json(tmp_path):
    out = tmp_path / "r.prism"
    code = record_command([sys.executable, "-c", "import os, sys; sys.exit(3 if os.environ['PRISM_RR_RECORD'] else 0)"],
                          out, steps="0:2")
    assert code == 3
    run = json.loads((tmp_path / "r.prism.d" / "run.json").read_text())
    assert run["exit_code"] == 3 and run["options"]["steps"] == [0, 2] and run["command"][0] == sys.executable


@pytest.mark.timeout(60)
def test_record_context_manager_packs_a_bundle(tmp_path):
    from prism_rr.localrun import free_port
    from prism_rr.format import open_bundle
    from prism_rr.format.records import Collective

    from recorder_helpers import SCRIPTS

    out = tmp_path / "in.prism"
    r = subprocess.run([sys.executable, str(SCRIPTS / "inprocess.py"), str(out), str(free_port())],
                       capture_output=True, text=True, timeout=50)
    assert r.returncode == 0 and "done True" in r.stdout, r.stderr
    bundle = open_bundle(out)
    try:
        colls = [e for e in bundle.events(0) if isinstance(e, Collective)]
        assert [(c.step, c.seq) for c in colls] == [(1, 1), (2, 2)]  # manual steps, window 1:
    finally:
        bundle.close()
