"""The bundle is the program (issue 39): `replay --from-bundle` runs no command of the user's;
each real rank makes its recorded calls through torch.distributed (driver.py), against the
same virtual peers, divergence check and card as any replay. A bundle whose calls no
program could make is refused in one line before any rank starts.

The recordings are the session's: the demo (`make_demo`: FSDP2 x TP, digest payloads,
steps 1-3 of a windowed run), the demo trainer's DDP, FSDP2 x TP and pipelining layouts
recorded with full payloads (`demo_training`, rep 1, as test_replay_parallel reads them)
and DDP with digest payloads, and crashy.py's shape mismatch (`crashy_runs`). The Flight
Recorder hang's are test_fr_replay.py's."""

import json
import signal
import subprocess
import sys
from dataclasses import replace

import pytest

from prism_rr import api
from prism_rr.errors import FormatError, UsageError
from prism_rr.format.records import Collective, GroupInfo, Step
from prism_rr.format.rewrite import Rewrite
from prism_rr.replayer import replay

from replay_helpers import stderr_of

BIN = __import__("pathlib").Path(sys.executable).parent
PRISM = [str(BIN / "prism-rr")] if (BIN / "prism-rr").exists() else [sys.executable, "-m", "prism_rr.cli"]
TRAIN = ["--steps", "3", "--seed", "7"]
LAYOUTS = {  # test_replay_parallel's recordings
    "ddp": (2, [*TRAIN, "--dp-mode", "ddp"]),
    "fsdp_tp": (4, [*TRAIN, "--tp", "2"]),
    "pp": (2, [*TRAIN, "--pp", "2"]),
}
DDP = LAYOUTS["ddp"]


@pytest.mark.timeout(200)
def test_a_redacted_demo_replays_with_one_real_rank_and_no_code(make_demo, tmp_path):
    assert make_demo.result().returncode == 0, make_demo.result().stderr[-2000:]
    redacted = tmp_path / "public.prism"
    api.redact(make_demo.bundle, redacted)  # no command left in it: nothing else could run
    result = replay(redacted, ranks=(0,), from_bundle=True, timeout=150, log_dir=tmp_path / "logs")
    assert result.exit_code == 0, stderr_of(result, 0) + result.card
    rep = result.report
    assert rep["diverged"] is False and rep["stopped_early"] == []
    assert [s["step"] for s in rep["steps"]] == [1, 2, 3] and rep["scored_steps"] == [2, 3]
    assert rep["iteration_time_error_pct"] is not None
    assert all(s["replayed_s"] > 0 for s in rep["steps"])
    assert rep["steps"][-1]["peak_replayed_bytes"]  # the recorded memory is held
    assert rep["inputs_made_up_calls"] == 60  # a digest recording holds no bytes of rank 0's calls
    assert "iteration time error" in result.card and "made up" in result.card
    assert result.commands[0][1:] == ["-m", "prism_rr.replayer.driver"]


@pytest.mark.timeout(200)
def test_every_demo_rank_real_from_the_command_line(make_demo, tmp_path):
    assert make_demo.result().returncode == 0
    report = tmp_path / "fidelity.json"
    out = subprocess.run([*PRISM, "replay", str(make_demo.bundle), "--ranks", "all", "--from-bundle",
                          "--report", str(report), "--timeout", "150"],
                         capture_output=True, text=True, timeout=200, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "4 real rank(s) [0, 1, 2, 3], 0 virtual" in out.stderr and "diverged: no" in out.stderr
    rep = json.loads(report.read_text())
    assert rep["ranks"] == [0, 1, 2, 3] and rep["iteration_time_error_pct"] is not None
    assert [s["step"] for s in rep["steps"]] == [1, 2, 3]


@pytest.mark.timeout(300)
def test_full_payloads_are_the_inputs_and_are_checked(demo_training, tmp_path):
    world, args = DDP
    run = demo_training(world, args, 1)
    assert run.codes == [0] * world, run.codes
    result = replay(run.bundle, ranks=(1,), from_bundle=True, timeout=150, log_dir=tmp_path / "logs")
    assert result.exit_code == 0, stderr_of(result, 1) + result.card
    rep = result.report
    # every input is the recorded bytes, compared with the recording at every call
    assert rep["diverged"] is False and rep["inputs_made_up_calls"] == 0
    assert rep["synthetic_numerics"] is False and "numerics as recorded" in result.card
    assert [s["step"] for s in rep["steps"]] == [0, 1, 2]


def _bundle(path, calls, *, world=2, group=None):
    """A bundle of `world` ranks, each with the world group (and group id `group` of the
    world, where given) and `calls` (Collectives of group 0)."""
    with Rewrite(path) as rw:
        for rank in range(world):
            info = {"world_size": world, "rank": rank, "backend": "gloo", "device": "cpu"}
            head = [GroupInfo(start_ns=0, end_ns=0, step=0, group=g, ranks=tuple(range(world)), name=str(g),
                              text="default_pg" if g == 0 else "", backend="gloo")
                    for g in ((0,) if group is None else (0, group))]
            end = max(c.end_ns or c.start_ns for c in calls)
            rw.write_rank(rank, info, [head + list(calls) + [Step(start_ns=0, end_ns=end, step=0)]])
        rw.pack({}, manifest_extra={})
    return path


def _all_reduce(seq, start, end, shape=(4,)):
    return Collective(start_ns=start, end_ns=end, step=0, op="all_reduce", group=0, seq=seq, in_shapes=(shape,),
                      in_dtypes=("float32",), out_shapes=(shape,), out_dtypes=("float32",), reduce_op="SUM")


def test_a_bundle_no_program_could_be_is_refused_in_one_line(tmp_path):
    huge = _bundle(tmp_path / "huge.prism", [_all_reduce(0, 10, 20, shape=(1 << 40,))])
    backwards = _bundle(tmp_path / "backwards.prism", [_all_reduce(0, 10, 20), _all_reduce(1, 50, 30)])
    asleep = _bundle(tmp_path / "asleep.prism", [_all_reduce(0, 10, 20), _all_reduce(1, 2 * 3600 * 10**9, 2 * 3600 * 10**9 + 5)])
    million = _bundle(tmp_path / "million.prism", [_all_reduce(0, 10, 20)], group=10**6)  # a millionth group
    for path, said in ((huge, "over 8 GiB"), (backwards, "negative duration"), (asleep, "7200 s of compute"),
                       (million, r"group id 1000000 \(a program makes at most 65536 groups\)")):
        with pytest.raises(FormatError, match=said):
            replay(path, ranks="all", from_bundle=True, timeout=30)
    with pytest.raises(UsageError, match="runs no command"):
        replay(backwards, ranks=(0,), from_bundle=True, cmd=[sys.executable, "-c", "pass"])
    out = subprocess.run([*PRISM, "replay", str(huge), "--ranks", "0", "--from-bundle"], capture_output=True,
                         text=True, timeout=60, cwd=tmp_path)
    assert out.returncode == 4 and out.stderr.count("\n") == 1, out.stderr
    assert "rank 0's recording cannot be run as a program" in out.stderr
    helped = subprocess.run([*PRISM, "replay", "--help"], capture_output=True, text=True, timeout=60)
    assert "--from-bundle" in helped.stdout


def _recorded(demo_training, name, payload="full"):
    world, args = LAYOUTS[name]
    run = demo_training(world, args, 1, payload)
    assert run.codes == [0] * world, run.codes
    return run.bundle, world


def _program(result) -> dict:
    """The report's account of a bundle program, after checking the replay went as recorded."""
    rep = result.report
    assert result.exit_code == 0, stderr_of(result, rep["ranks"][0]) + result.card
    assert rep["diverged"] is False and rep["stopped_early"] == [] and rep["hang"] is None
    assert [s["step"] for s in rep["steps"]] == [0, 1, 2]
    assert rep["iteration_time_error_pct"] is not None and rep["recorded_step_spread_pct"] is not None
    return rep["bundle_program"]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("name,payload", [("ddp", "full"), ("fsdp_tp", "full"), ("ddp", "digest")])
def test_trainers_replay_with_one_rank_and_with_every_rank_real(demo_training, tmp_path, name, payload):
    """One real rank against virtual peers, then every rank real: no divergence; with every
    rank real, each call's time on this machine's gloo is tabled beside the recorded one,
    and every output whose inputs were all recorded bytes is the recorded one, bit for bit."""
    bundle, world = _recorded(demo_training, name, payload)
    one = replay(bundle, ranks=(world - 1,), from_bundle=True, timeout=150, log_dir=tmp_path / "one")
    program = _program(one)
    assert program["transfers"] == [] and program["outputs_checked"] == 0  # no group of real ranks
    assert (one.report["inputs_made_up_calls"] == 0) == (payload == "full")
    every = replay(bundle, ranks="all", from_bundle=True, timeout=150, log_dir=tmp_path / "all")
    program = _program(every)
    ops = {row["op"] for row in program["transfers"]}
    assert {"all_reduce" if name == "ddp" else "all_gather_into_tensor"} <= ops, program["transfers"]
    assert all(row["calls"] > 0 and row["recorded_us"] > 0 and row["replayed_us"] > 0 for row in program["transfers"])
    # full payloads: every call's outputs; digest: the small calls, whose bytes were kept
    assert program["outputs_checked"] > (100 if (name, payload) == ("fsdp_tp", "full") else 5), program
    assert program["torch_recorded"] == program["torch_here"]
    assert f"outputs of {program['outputs_checked']} calls among real ranks as recorded" in every.card
    assert "transfers on this machine's backend" in every.card


@pytest.mark.timeout(200)
def test_pipeline_stages_send_and_receive_as_recorded(demo_training, tmp_path):
    bundle, _ = _recorded(demo_training, "pp")
    last = replay(bundle, ranks=(1,), from_bundle=True, timeout=150, log_dir=tmp_path / "one")
    _program(last)
    both = replay(bundle, ranks="all", from_bundle=True, timeout=150, log_dir=tmp_path / "all")
    program = _program(both)
    assert {"isend", "irecv"} <= {row["op"] for row in program["transfers"]}
    assert program["outputs_checked"] > 0  # the activations and gradients received, as recorded


@pytest.mark.timeout(200)
def test_a_backend_that_computes_an_output_otherwise_is_a_divergence(demo_training, tmp_path):
    """The recording says one all_reduce of step 1 gave other bytes than this machine's gloo
    gives from the same inputs (as another gloo or NCCL version might): the replay with every
    rank real stops there, naming the call, the recorded stack and both torch versions."""
    from prism_rr.format import open_bundle
    from prism_rr.format.blobs import write_blob

    bundle, world = _recorded(demo_training, "ddp")
    other = tmp_path / "other.prism"
    with open_bundle(bundle) as b, Rewrite(other) as rw:
        target = next(r for r in b.events(0) if type(r) is Collective and r.op == "all_reduce" and r.step == 1)
        for rank in range(world):
            records = []
            for rec in b.events(rank):
                for name in ("blob_in", "blob_out", "blob"):
                    for ident in getattr(rec, name, None) or ():
                        write_blob(rw.spool_dir, b.blob(ident))
                if type(rec) is Collective and (rec.group, rec.seq) == (target.group, target.seq):
                    rec = replace(rec, blob_out=(write_blob(rw.spool_dir, b"another backend's sum"),))
                records.append(rec)
            rw.write_rank(rank, b.rank_info(rank), [records])
        rw.pack(b.manifest.get("run") or {}, manifest_extra={})
    result = replay(other, ranks="all", from_bundle=True, timeout=150, log_dir=tmp_path / "logs")
    assert result.exit_code == 3, result.card
    d = result.report["first_divergence"]
    assert (d["op"], d["group"], d["seq"], d["what"]) == ("all_reduce", target.group, target.seq, "payload_out"), d
    assert d["stack"] == list(target.stack)  # where the recorded program made it
    assert "this machine's backend computed it otherwise (torch " in result.card


@pytest.mark.timeout(200)
def test_a_recorded_shape_mismatch_reproduces(crashy_runs, tmp_path):
    """crashy.py abort: rank 1 all_reduces a tensor of another size in step 2 and gloo aborts.
    Replayed from the bundle, each rank stops at that call, as a program replay does (exit 7)."""
    run = crashy_runs("abort")
    for ranks in ((0,), (1,)):
        result = replay(run.bundle, ranks=ranks, from_bundle=True, timeout=60, log_dir=tmp_path / f"r{ranks[0]}")
        assert result.exit_code == 7, result.card
        assert "mismatch reproduced" in result.card and "rank 1 passed shapes [5] where rank 0 passed [3]" in result.card
    # Every rank real: gloo aborts rank 0 there, as it did in the recording (as a program
    # replay of crashy.py does; the launcher then ends rank 1, before or after rank 1 wrote
    # how far it got: the card says it either way)
    every = replay(run.bundle, ranks="all", from_bundle=True, timeout=60, log_dir=tmp_path / "all")
    assert every.rank_codes[0] == -signal.SIGABRT, every.card
    assert "stopped early: rank 0 was ended by signal 6" in every.card, every.card
