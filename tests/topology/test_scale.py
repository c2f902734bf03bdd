import json
import os
import subprocess
import sys

import pytest

from prism_rr.errors import UsageError
from prism_rr.format import Collective, GroupInfo, open_bundle, pack
from prism_rr.format.synthetic import write_synthetic
from prism_rr.topology.roles import Roles
from prism_rr.topology.scale import compare_transfers, scale


@pytest.fixture
def synthetic4(tmp_path):
    out = tmp_path / "w4.prism"
    pack(write_synthetic(tmp_path / "w4.d", 4, 400, tp=2), out)
    return out


@pytest.mark.timeout(60)
def test_scale_to_8192_writes_representatives_only(synthetic4, tmp_path):
    big = tmp_path / "big.prism"
    note = scale(synthetic4, big, dp=4096)
    assert note["to"]["world_size"] == 8192 and note["roles"] == 2
    assert set(note["model"]) >= {"params", "fit_error"} and "mape_pct" in note["model"]["fit_error"]
    assert big.stat().st_size < 2 << 20
    with open_bundle(big) as b:
        assert b.world_size == 8192 and b.recorded_ranks == [0, 1]
        roles = Roles.from_manifest(b.manifest["roles"])
        assert roles.rep(8191) == 1 and roles.rep(4096) == 0
        groups = {g["id"]: g["ranks"] for g in b.groups}
        # synthetic order: world, then the tp groups, then the dp groups
        assert len(groups) == 1 + 4096 + 2
        assert groups[1] == (0, 1) and groups[4096] == (8190, 8191)
        assert groups[4097] == tuple(range(0, 8192, 2)) and groups[4098] == tuple(range(1, 8192, 2))
        recs = list(b.events(1))
        gids = {r.group for r in recs if isinstance(r, Collective)}
        assert gids == {1, 4098}
        info = [r for r in recs if isinstance(r, GroupInfo)]
        assert {g.group for g in info} == {0, 1, 4098}
        ag = next(r for r in recs if isinstance(r, Collective) and r.op == "all_gather_into_tensor")
        assert ag.out_shapes[0][0] == ag.in_shapes[0][0] * 4096
        assert all(r.digest_in is None and r.blob_out is None for r in recs if isinstance(r, Collective))
        assert b.rank_info(1)["world_size"] == 8192
        assert b.manifest["scale"]["from"]["world_size"] == 4


@pytest.mark.timeout(60)
def test_scale_takes_the_targets_bandwidth(synthetic4, tmp_path):
    cmd = [sys.executable, "-m", "prism_rr.cli", "scale", str(synthetic4), "--dp", "8"]
    out = subprocess.run([*cmd, "-o", str(tmp_path / "a.prism"), "--bandwidth", "400Gb/s", "--json"],
                         capture_output=True, text=True, timeout=50)
    assert out.returncode == 0, out.stderr
    model = json.loads(out.stdout)["model"]
    assert model["given_bytes_per_s"] == 50e9 and model["bandwidth_unidentified"] == []
    assert {p["ns_per_byte"] for k, p in model["params"].items() if k != "barrier"} == {0.02}
    bad = subprocess.run([*cmd, "-o", str(tmp_path / "b.prism"), "--bandwidth", "fast"],
                         capture_output=True, text=True, timeout=50)
    assert bad.returncode == 2 and "50GB/s" in bad.stderr
    assert not (tmp_path / "b.prism").exists()


@pytest.mark.timeout(30)
def test_scale_keeps_steps_in_order_and_refuses_bad_input(synthetic4, tmp_path):
    out = tmp_path / "w8.prism"
    scale(synthetic4, out, dp=4)
    with open_bundle(out) as b:
        for rank in b.recorded_ranks:
            steps = [r for r in b.events(rank) if type(r).__name__ == "Step"]
            assert steps and all(s.end_ns >= s.start_ns for s in steps)
            assert all(a.end_ns <= b2.start_ns + 1 for a, b2 in zip(steps, steps[1:]))
    with pytest.raises(UsageError):
        scale(synthetic4, synthetic4, dp=8)
    with pytest.raises(UsageError):
        scale(synthetic4, tmp_path / "x.prism", dp=4, pp=2)


def _record(tmp_path, name, nproc, *args):
    out = tmp_path / f"{name}.prism"
    env = dict(os.environ, OMP_NUM_THREADS="1")
    r = subprocess.run(
        [sys.executable, "-m", "prism_rr.cli", "record", "-o", str(out), "--nproc", str(nproc), "--",
         sys.executable, "-m", "prism_rr.demo.train", "--steps", "2", "--quiet", *args],
        capture_output=True, text=True, timeout=80, env=env,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    return out


@pytest.mark.timeout(90)
def test_fit_quality_dp2_to_dp4_on_real_recordings(tmp_path):
    dp2 = _record(tmp_path, "dp2", 2)
    dp4 = _record(tmp_path, "dp4", 4)
    pred = tmp_path / "dp4-pred.prism"
    note = scale(dp2, pred, dp=4)
    assert note["to"]["world_size"] == 4
    report = compare_transfers(pred, dp4)
    assert report["calls"] > 0 and "total_error_pct" in report and "call_mape_pct" in report
    for fam, row in report["ops"].items():
        assert set(row) >= {"calls", "recorded_mean_us", "predicted_mean_us", "mean_error_pct"}
    with open_bundle(pred) as p, open_bundle(dp4) as r:
        assert {g["id"]: g["ranks"] for g in p.groups} == {g["id"]: g["ranks"] for g in r.groups}
    # The same from the command line, as a user checks the model on their cluster.
    cli = subprocess.run([sys.executable, "-m", "prism_rr.cli", "scale", str(dp2), "--dp", "4", "-o",
                          str(tmp_path / "cli.prism"), "--compare", str(dp4), "--latency", "steps", "--json"],
                         capture_output=True, text=True, timeout=60)
    assert cli.returncode == 0, cli.stderr
    got = json.loads(cli.stdout)["compare"]
    assert got["calls"] == report["calls"] and got["against"] == str(dp4)
    assert "compared with" in cli.stderr and "total transfer time" in cli.stderr


def test_fsdp_layout_gives_exact_sizes():
    """FSDP2 pads each parameter's dim 0 to a multiple of the group size on its own: the
    size at another size follows from the per-parameter layout, not from the total."""
    from prism_rr.topology.scale import _layout_size, _rescale_shapes

    layouts = {"ag": {"2:6": [[3, 1], [4, 2]]}, "rs": {"2:6": [[3, 1], [4, 2]]}}
    assert _layout_size(layouts, "ag", 2, 6, 3) == 1 * 1 + 2 * 2
    assert _layout_size(layouts, "ag", 2, 6, 8) == 1 + 2
    assert _layout_size(layouts, "ag", 2, 7, 8) is None  # no layout for that size
    assert _layout_size({"ag": {"2:6": [[5, 1]]}}, "ag", 2, 6, 8) is None  # inconsistent: ignored
    ag = Collective(start_ns=0, end_ns=1, step=0, op="all_gather_into_tensor", group=1, seq=0,
                    in_shapes=((6,),), in_dtypes=("float32",), in_bytes=24,
                    out_shapes=((12,),), out_dtypes=("float32",), out_bytes=48)
    fields, predicted = _rescale_shapes(ag, 2, 8, layouts)
    assert not predicted and fields["in_shapes"] == ((3,),) and fields["out_shapes"] == ((24,),)
    assert fields["in_bytes"] == 12 and fields["out_bytes"] == 96
    _, predicted = _rescale_shapes(ag, 2, 8, None)
    assert predicted
