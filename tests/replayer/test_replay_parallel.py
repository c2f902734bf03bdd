"""The demo's parallel layouts, recorded once with full payloads, replayed with one and with
two real ranks: each real rank's final parameters are bitwise those of the recorded run.

The recordings are the session's (conftest.demo_training, rep 1: full payloads and the
memory tracker), which the training and recorder tests check too."""

import sys

import pytest
import torch

from prism_rr.replayer import replay

from replay_helpers import stderr_of

TRAIN = ["--steps", "3", "--seed", "7"]  # as conftest.demo_training's runs are made
LAYOUTS = {
    "fsdp_tp": (4, ["--tp", "2"]),  # FSDP2 over dp=2 x DTensor TP over tp=2
    "pp": (2, ["--pp", "2"]),  # pipelining, 1F1B over two stages
    "ddp": (2, ["--dp-mode", "ddp"]),
}


@pytest.fixture(scope="module")
def recordings(tmp_path_factory, demo_training):
    made = {}

    def get(name):
        if name not in made:
            world, extra = LAYOUTS[name]
            run = demo_training(world, [*TRAIN, *extra], 1)
            assert run.codes == [0] * world, run.codes
            argv = ["-m", "prism_rr.demo.train", *TRAIN, *extra]
            made[name] = (tmp_path_factory.mktemp(name), run.bundle, argv, run.params)
        return made[name]

    return get


def _replayed_bitwise(recordings, name, ranks):
    tmp, bundle, argv, recorded = recordings(name)
    tag = "rep" + "".join(map(str, ranks))
    cmd = [sys.executable, *argv, "--save-params", str(tmp / tag)]
    result = replay(bundle, ranks=ranks, cmd=cmd, timeout=150, log_dir=tmp / f"logs-{tag}")
    assert result.exit_code == 0, stderr_of(result, ranks[0])
    world = LAYOUTS[name][0]
    for r in range(world):
        if r not in ranks:
            assert not (tmp / f"{tag}.rank{r}.pt").exists()  # a virtual rank runs nothing
            continue
        rec = torch.load(f"{recorded}.rank{r}.pt")
        got = torch.load(tmp / f"{tag}.rank{r}.pt")
        assert rec.keys() == got.keys()
        assert [k for k in rec if not torch.equal(rec[k], got[k])] == [], f"rank {r}"
    rep = result.report
    assert rep["diverged"] is False and rep["synthetic_numerics"] is False
    assert [s["step"] for s in rep["steps"]] == [0, 1, 2]
    # every step read recorded payloads for its virtual peers, and the report says how long
    assert all((s["replayer_s"] > 0) == (len(ranks) < world) for s in rep["steps"]), rep["steps"]
    assert rep["replayer_in_steps_s"] == max(s["replayer_s"] for s in rep["steps"][1:])
    # The program's CPU memory, counted alike while recording and replaying (a backend
    # thread's late frees placed at the program's last use): the same peak, to the byte.
    peaks = [(s["peak_recorded_bytes"], s["peak_replayed_bytes"]) for s in rep["steps"]]
    print(name, ranks, peaks)
    assert all(a and a == b for a, b in peaks[1:]), peaks
    return result


@pytest.mark.timeout(200)
@pytest.mark.parametrize(
    "name,ranks",
    [
        ("fsdp_tp", (0,)),
        ("fsdp_tp", (0, 1)),  # the tp group all real, the dp groups mixed
        ("pp", (1,)),  # the last stage: receives activations, sends gradients
        ("pp", (0, 1)),
        ("ddp", (0,)),
        ("ddp", (0, 1)),
    ],
    ids=["fsdp_tp-rank0", "fsdp_tp-ranks01", "pp-rank1", "pp-ranks01", "ddp-rank0", "ddp-ranks01"],
)
def test_replay_is_bitwise(recordings, name, ranks):
    _replayed_bitwise(recordings, name, ranks)
