"""The hang from production, reproduced on one machine (issue 30): a Flight Recorder dump,
or prism-rr's own recording of the hang, replayed with the program that made it.

The hang is real: fr_hang.py on two gloo ranks, rank 1 skipping an all_reduce of a second
group (`row`) that rank 0 makes. torch's own Flight Recorder dumps both rings
(scripts/fr_job.py, fr_watchdog.py: gloo's watchdog does not dump on a timeout as NCCL's
does), and `prism-rr import fr` reads both of its encodings; `prism-rr record --flight`
records the same hang. Every replay runs the program as a user would, through the CLI.
"""

import json
import os
import pickle
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from prism_rr.format.fr import import_fr

from tests.cli_helpers import run_cli

SCRIPTS = Path(__file__).parent / "scripts"
HANG = SCRIPTS / "fr_hang.py"
ENV = dict(os.environ, OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore")


def _line(text: str) -> int:
    """The line of fr_hang.py that holds `text`: where its stacks point."""
    return next(n for n, line in enumerate(HANG.read_text().splitlines(), 1) if text in line)


LOSS = _line("dist.all_reduce(loss")  # rank 1's last call: the loss, on row, in step 2
SKIPPED = _line("dist.all_reduce(last, group=row)")  # the call rank 1 skips


def dumps(out: Path, script: Path, *args) -> Path:
    """Run `script` as a 2-rank gloo job with Flight Recorder on until both ranks dumped."""
    r = subprocess.run([sys.executable, SCRIPTS / "fr_job.py", out, script, *args], capture_output=True,
                       text=True, timeout=200, env=ENV)
    assert r.returncode == 0, r.stderr[-3000:]
    return out


def _flight(d: Path) -> Path:
    """fr_hang.py recorded by flight mode, which dumps every rank on the hang."""
    return _recorded(d / "flight.prism", "--flight", "2", "--flight-hang", "2", "--timeout", "150")


def _windowed(d: Path) -> Path:
    """fr_hang.py recorded from step 1 on, the hung job ended by record's timeout."""
    return _recorded(d / "windowed.prism", "--steps", "1:10", "--timeout", "15")


def _recorded(out: Path, *options: str) -> Path:
    """fr_hang.py under `prism-rr record OPTIONS`, ended once the bundle is written."""
    cmd = [sys.executable, "-m", "prism_rr.cli", "record", *options, "-o", out, "--nproc", "2", "--",
           sys.executable, HANG]
    job = subprocess.Popen(list(map(str, cmd)), env=dict(ENV, JOB_HOLD="1"), cwd=out.parent,
                           start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
        while not out.exists():
            assert time.monotonic() < deadline, f"no {out.name} of the hang"
            assert job.poll() is None or out.exists(), f"record ended without writing {out.name}"
            time.sleep(0.1)
    finally:
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(job.pid, sig)
                job.wait(20)
                break
            except (ProcessLookupError, subprocess.TimeoutExpired):
                continue
    return out


@pytest.fixture(scope="module")
def hung(tmp_path_factory) -> dict[str, Path]:
    """The one hang four ways: the dumps imported from torch's pickle and from its JSON,
    flight mode's recording, and a windowed recording that ran until record's timeout."""
    d = tmp_path_factory.mktemp("hang")
    made = dumps(d / "dumps", HANG)
    out = {}
    for form in ("pickle", "json"):
        out[form] = d / f"fr-{form}.prism"
        import_fr([made / form], out[form])
    out["flight"] = _flight(d)
    out["windowed"] = _windowed(d)
    out["dumps"] = made
    return out


def replay(bundle: Path, rank: int, *args, tmp: Path, env=None, script: Path = HANG):
    """`prism-rr replay BUNDLE --ranks RANK -- python SCRIPT ARGS`: the result and the report."""
    report = tmp / f"report-{bundle.stem}-{rank}-{'-'.join(args) or 'as-hung'}.json"
    r = run_cli("replay", bundle, "--ranks", rank, "--timeout", 90, "--report", report, "--", sys.executable,
                script, *args, timeout=150, env=dict(ENV, **(env or {})))
    assert report.exists(), r.stderr[-3000:]
    return r, json.loads(report.read_text())


def _card_line(stderr: str, start: str) -> str:
    """The fidelity card's line that starts with `start` (the card's lines are indented)."""
    return next(line.strip() for line in stderr.splitlines() if line.strip().startswith(start))


def _at(kind: str, line: int) -> str:
    """How a call's stack is shown: the JSON dump has no stacks."""
    return f" at fr_hang.py:{line} in <module>" if kind != "json" else ""


# --- the four replays, on a dump and on flight mode's recording ----------------------------


@pytest.mark.timeout(400)
@pytest.mark.parametrize("kind", ["pickle", "json", "flight", "windowed"])
def test_rank_0_as_it_ran_stops_at_the_hang_naming_who_never_joined(hung, kind, tmp_path):
    r, rep = replay(hung[kind], 0, tmp=tmp_path)
    assert r.returncode == 7, r.stderr[-3000:]
    h = rep["hang"]
    assert (h["kind"], h["rank"]) == ("never_joined", 0)
    assert (h["call"]["op"], h["call"]["group"], h["call"]["seq"]) == ("all_reduce", 1, 3)
    [peer] = h["peers"]
    assert peer["rank"] == 1 and not peer["waits_for_this_rank"]
    last = peer["last"]
    assert (last["op"], last["group"], last["seq"], last["completed"]) == ("all_reduce", 1, 2, True)
    assert last["stack"][:1] == ([f"fr_hang.py:{LOSS} in <module>"] if kind != "json" else [])
    assert not rep["diverged"]
    # record's timeout ended the windowed recording's hung job: how rank 1 ended, where its
    # recording says (its SIGTERM, which it may not have lived to note), is said too
    assert peer["exit"] in ((None, "stopped by SIGTERM") if kind == "windowed" else (None,))
    ended = f", and then its program ended ({peer['exit']})" if peer["exit"] else ""
    said = _card_line(r.stderr, "hang:")
    assert said == (f"hang: rank 0's all_reduce (group 1 'row', seq 3) at fr_hang.py:{SKIPPED} in <module> waits "
                    f"for rank 1, which never joined it in the recording; rank 1's last call was all_reduce "
                    f"(group 1 'row', seq 2){_at(kind, LOSS)}, completed{ended}.")
    assert "Traceback" not in r.stderr.split("prism-rr replay ·")[-1]  # the card says it in one sentence


@pytest.mark.timeout(400)
@pytest.mark.parametrize("kind", ["pickle", "flight"])
def test_rank_1_as_it_ran_is_the_rank_they_wait_for(hung, kind, tmp_path):
    r, rep = replay(hung[kind], 1, tmp=tmp_path)
    assert r.returncode == 7, r.stderr[-3000:]
    h = rep["hang"]
    assert (h["kind"], h["rank"]) == ("waited_for", 1)
    [peer] = h["peers"]
    [call] = peer["calls"]
    assert peer["rank"] == 0 and (call["op"], call["group"], call["seq"], call["completed"]) == ("all_reduce", 1, 3,
                                                                                                 False)
    assert _card_line(r.stderr, "hang:") == (
        f"hang: rank 1 is the rank they wait for: its program ended without all_reduce (group 1 'row', seq 3) at "
        f"fr_hang.py:{SKIPPED} in <module>, which rank 0 entered and never completed in the recording.")
    assert not rep["diverged"] and not rep["stopped_early"]  # it made every call it had made


@pytest.mark.timeout(400)
@pytest.mark.parametrize("kind", ["pickle", "json", "flight", "windowed"])
def test_rank_1_fixed_resolves_the_hang(hung, kind, tmp_path):
    r, rep = replay(hung[kind], 1, "fixed", tmp=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    assert rep["hang"] is None and not rep["diverged"]
    [fix] = rep["resolved"]
    assert (fix["kind"], fix["rank"], fix["call"]["group"], fix["call"]["seq"]) == ("resolved", 1, 1, 3)
    assert [(p["rank"], p["call"]["seq"], p["call"]["completed"]) for p in fix["peers"]] == [(0, 3, False)]
    assert _card_line(r.stderr, "hang resolved:").startswith(
        f"hang resolved: rank 1's all_reduce (group 1 'row', seq 3) at fr_hang.py:{SKIPPED} in <module> completes "
        f"the call rank 0 entered and never completed in the recording")


@pytest.mark.timeout(400)
@pytest.mark.parametrize("kind", ["pickle", "flight"])
def test_rank_0_passing_another_shape_there_diverges(hung, kind, tmp_path):
    r, rep = replay(hung[kind], 0, "shape", tmp=tmp_path)
    assert r.returncode == 3, r.stderr[-3000:]
    d = rep["first_divergence"]
    assert (d["group"], d["seq"], d["op"], d["what"]) == (1, 3, "all_reduce", "in_shapes")
    assert (d["expected"], d["got"]) == ("((4,),)", "((5,),)")
    assert rep["hang"] is None


# --- a ring that wrapped, nccl's entries, every call gloo's recorder writes ------------------


def _wrapped(dumps_dir: Path, out: Path, lost: int) -> Path:
    """The pickle dumps as if each ring had lost its `lost` oldest entries."""
    out.mkdir()
    for r in (0, 1):
        dump = pickle.loads((dumps_dir / "pickle" / f"nccl_trace_rank_{r}").read_bytes())
        dump["entries"] = dump["entries"][lost:]
        (out / f"nccl_trace_rank_{r}").write_bytes(pickle.dumps(dump, protocol=2))
    return out


@pytest.mark.timeout(400)
def test_a_ring_begins_mid_run_calls_before_it_are_not_checked(hung, tmp_path):
    """Each ring lost its 3 oldest entries (the first two gradients and the first loss):
    a program that differs there (rank 0's first loss all_reduce of 6 values, not 4) reaches
    the hang all the same; against the whole dump, it diverges there."""
    bundle = tmp_path / "wrapped.prism"
    note = import_fr([_wrapped(hung["dumps"], tmp_path / "wrapped", 3)], bundle)
    assert note["trimmed"] == 0  # every rank lost the same calls
    r, rep = replay(bundle, 0, "early", tmp=tmp_path)
    assert r.returncode == 7, r.stderr[-3000:]
    assert rep["hang"]["call"]["seq"] == 3 and not rep["diverged"]
    r, rep = replay(hung["pickle"], 0, "early", tmp=tmp_path)
    assert r.returncode == 3, r.stderr[-3000:]
    assert (rep["first_divergence"]["group"], rep["first_divergence"]["seq"]) == (1, 0)


def _nccl_entry(record_id: int, pg: tuple, seq: int, size: list, t_ms: int, *, done=True) -> dict:
    """An entry as ProcessGroupNCCL writes it with timing on (the fields torch's fr_trace
    analyzer reads): its state, when the kernel started, and how long it ran (40 ms)."""
    created = 1_700_000_000_000_000_000 + t_ms * 1_000_000
    return {"record_id": record_id, "pg_id": int(pg[0]), "process_group": pg, "collective_seq_id": seq,
            "p2p_seq_id": 0, "op_id": record_id + 1, "profiling_name": "nccl:all_reduce", "time_created_ns": created,
            "input_sizes": [size], "input_dtypes": ["Float"], "output_sizes": [size], "output_dtypes": ["Float"],
            "state": "completed" if done else "started", "retired": done, "is_p2p": False,
            "timeout_ms": 600000,
            "time_discovered_started_ns": created, "time_discovered_completed_ns": None,
            "duration_ms": 40.0 if done else None, "frames": []}


def _nccl_dumps(out: Path) -> Path:
    """fr_hang.py's calls as nccl's Flight Recorder records them: three steps of two
    gradients on WORLD and a loss on `row`, then rank 0's last all_reduce on row, started
    and never completed; rank 1 has none."""
    world, row = ("0", "default_pg"), ("1", "row")
    out.mkdir()
    for rank in (0, 1):
        entries, t = [], 0
        for step in range(3):
            for pg, seq, size in ((world, 2 * step + 1, [4, 4]), (world, 2 * step + 2, [4]), (row, step + 1, [4])):
                entries.append(_nccl_entry(len(entries), pg, seq, size, t))
                t += 100
        if rank == 0:
            entries.append(_nccl_entry(len(entries), row, 4, [4], t, done=False))
        dump = {"version": "2.10", "comm_lib_version": "2.21.5", "entries": entries,
                "pg_config": {"0": {"name": "0", "desc": "default_pg", "ranks": "[0, 1]"},
                              "1": {"name": "1", "desc": "row", "ranks": "[0, 1]"}},
                "pg_status": {"0": {"last_enqueued_collective": 6, "last_started_collective": 6,
                                    "last_completed_collective": 6},
                              "1": {"last_enqueued_collective": 3 + (rank == 0),
                                    "last_started_collective": 3 + (rank == 0), "last_completed_collective": 3}}}
        (out / f"nccl_trace_rank_{rank}").write_bytes(pickle.dumps(dump, protocol=2))
    return out


@pytest.mark.timeout(300)
def test_nccl_entries_replay_with_their_durations(tmp_path):
    """nccl's dumps time each call: the virtual peer's calls last what they lasted (each
    completes 40 ms after its last member entered, as the entries say), and the hang is
    the same."""
    bundle = tmp_path / "nccl.prism"
    import_fr([_nccl_dumps(tmp_path / "nccl")], bundle)
    r, rep = replay(bundle, 0, tmp=tmp_path, env={"PRISM_RR_REPLAY_TRACE": "1"})
    assert r.returncode == 7, r.stderr[-3000:]
    assert rep["hang"]["peers"][0]["rank"] == 1 and rep["hang"]["call"]["seq"] == 3
    traced = rep["trace"]["0"]
    assert [(gid, seq) for gid, seq, *_ in traced] == [(0, 0), (0, 1), (1, 0), (0, 2), (0, 3), (1, 1), (0, 4),
                                                       (0, 5), (1, 2)]
    for gid, seq, entries, ventry, done in traced:
        assert done - max([*entries, *ventry.values()]) == 40_000_000, (gid, seq)


@pytest.mark.timeout(400)
def test_every_call_gloos_recorder_writes_matches_its_entry(tmp_path):
    """fr_ops.py makes every collective twice (tensor and list gathers, reduce_scatter,
    all_to_all both ways, gather, scatter, coalesced, object collectives, a send,
    monitored_barrier), dumps and ends; rank 0 replayed against each encoding matches every
    entry, though gloo's recorder writes some calls under other names and shapes, and
    others not at all."""
    made = dumps(tmp_path / "dumps", SCRIPTS / "fr_ops.py")
    for form in ("pickle", "json"):
        bundle = tmp_path / f"ops-{form}.prism"
        import_fr([made / form], bundle)
        r, rep = replay(bundle, 0, tmp=tmp_path, script=SCRIPTS / "fr_ops.py")
        assert r.returncode == 0, r.stderr[-3000:]
        assert not rep["diverged"] and rep["hang"] is None and rep["progress"]["0"]["complete"]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("kind", ["pickle", "flight"])
def test_the_dump_alone_reproduces_the_hang(hung, kind, tmp_path):
    """No program at all (issue 39): the bundle is the program. Rank 0 stops at the call
    rank 1 never joined, at the stack the dump recorded (exit 7); rank 1 is the rank they
    wait for."""
    for rank, said in ((0, f"hang: rank 0's all_reduce (group 1 'row', seq 3) at fr_hang.py:{SKIPPED} in <module> "
                           "waits for rank 1, which never joined it in the recording; rank 1's last call was "
                           f"all_reduce (group 1 'row', seq 2) at fr_hang.py:{LOSS} in <module>"),
                       (1, "hang: rank 1 is the rank they wait for: its program ended without all_reduce "
                           f"(group 1 'row', seq 3) at fr_hang.py:{SKIPPED} in <module>")):
        r = run_cli("replay", hung[kind], "--ranks", rank, "--from-bundle", "--timeout", 90, timeout=150, env=ENV)
        assert r.returncode == 7, r.stderr[-3000:]
        assert _card_line(r.stderr, "hang:").startswith(said), r.stderr[-3000:]


def test_replay_without_a_command_is_refused_for_a_dump(hung):
    """A dump names no command: the program must be given."""
    r = run_cli("replay", hung["pickle"], "--ranks", "0", "--run-recorded-command")
    assert r.returncode == 2 and "name no command" in r.stderr and "Traceback" not in r.stderr


def _call(op, ins, outs=None, dtype="float32", reduce_op=None):
    """A collective record: an entry as `import fr` reads it (no reduce op), or, with one,
    a call as the replay sees the program make it."""
    from prism_rr.format.records import Collective

    outs = ins if outs is None else outs
    return Collective(start_ns=0, end_ns=0, step=0, op=op, group=0, seq=0, in_shapes=ins,
                      in_dtypes=(dtype,) * len(ins), out_shapes=outs, out_dtypes=(dtype,) * len(outs),
                      reduce_op=reduce_op, root=None)


def _live(op, ins, outs=None, dtype="float32"):
    return _call(op, ins, outs, dtype, reduce_op="SUM")


def test_a_call_matches_the_entry_its_backend_writes():
    """An entry names and shapes a call as its backend ran it (torch's fr_trace analyzer
    reads them so): gloo's all_gather for an all_gather_into_tensor, nccl's one stacked
    input of a reduce_scatter list and its barrier's one-element all_reduce; another shape
    or op is still a divergence, named against the entry of the same name."""
    from prism_rr.replayer._policy import _dump_divergence

    matches = [
        (_call("all_gather", ((2, 3),), ((2, 2, 3),)), _live("all_gather_into_tensor", ((2, 3),), ((4, 3),))),
        (_call("all_reduce", ((2, 3),)), _live("reduce_scatter_tensor", ((2, 3),), ((1, 3),))),
        (_call("all_to_all", ((4,),)), _live("all_to_all_single", ((4,),))),
        (_call("reduce_scatter", ((2, 2, 3),), ((2, 3),)), _live("reduce_scatter", ((2, 3), (2, 3)), ((2, 3),))),
        (_call("barrier", ((1,),)), _live("barrier", ())),
        (_call("all_gather_into_tensor", ((2, 3),), ((4, 3),)), _live("all_gather_into_tensor", ((2, 3),), ((4, 3),))),
    ]
    for entry, live in matches:
        assert _dump_divergence(entry, live, 2) is None, (entry.op, live.op)
    d = _dump_divergence(_call("all_reduce", ((4,),)), _live("all_reduce", ((5,),)), 2)
    assert (d.field, d.expected, d.got) == ("in_shapes", ((4,),), ((5,),))
    d = _dump_divergence(_call("all_reduce", ((2, 4),)), _live("reduce_scatter_tensor", ((2, 3),), ((1, 3),)), 2)
    assert (d.field, d.expected, d.got) == ("in_shapes", ((2, 4),), ((2, 3),))
    d = _dump_divergence(_call("broadcast", ((4,),)), _live("all_reduce", ((4,),)), 2)
    assert (d.field, d.expected, d.got) == ("op", "broadcast", "all_reduce")
    d = _dump_divergence(_call("all_reduce", ((4,),)), _live("all_reduce", ((4,),), dtype="bfloat16"), 2)
    assert d.field == "in_dtypes"
