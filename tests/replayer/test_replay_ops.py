"""Replays of a script that makes every kind of call, recorded with full payloads at world 3."""

import sys

import pytest
import torch

from prism_rr.replayer import replay

from replay_helpers import SCRIPTS, record, stderr_of

WORLD = 3
ENV = {"PYTHONWARNINGS": "ignore"}


@pytest.fixture(scope="module")
def recording(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("ops")
    bundle = record(tmp, [SCRIPTS / "ops.py", tmp], WORLD, payload="full", memory=True)
    return tmp, bundle


def _replay(tmp, bundle, ranks, tag, **kw):
    result = replay(bundle, ranks=ranks, timeout=120, log_dir=tmp / f"logs-{tag}",
                    env={**ENV, "PRISM_TEST_TAG": tag}, run_recorded_command=True, **kw)
    return result


@pytest.fixture(scope="module")
def replayed01(recording):
    """Ranks 0 and 1 replayed together, with -o: the replay's own recording (digests). The
    same replay serves both checks that replay ranks 0 and 1: what they received, and
    what the replay recorded."""
    tmp, bundle = recording
    out = tmp / "replay01.prism"
    return _replay(tmp, bundle, (0, 1), "rep01", output=out, output_payload="digest"), out


def _line(code: str) -> int:
    """The line of ops.py that is `code`."""
    return next(i for i, text in enumerate((SCRIPTS / "ops.py").read_text().splitlines(), 1) if text.strip() == code)


def _same(tmp, rank, tag) -> list[str]:
    rec = torch.load(tmp / f"rec-{rank}.pt")
    got = torch.load(tmp / f"{tag}-{rank}.pt")
    assert rec.keys() == got.keys()
    return [k for k in rec if not torch.equal(rec[k], got[k])]


@pytest.mark.timeout(180)
@pytest.mark.parametrize("ranks", [(0,), (2,), (0, 1)], ids=["rank0", "rank2", "ranks01"])
def test_real_ranks_receive_what_they_received(recording, request, ranks):
    """Collectives with virtual members, a broadcast from a virtual root (rank 2 for rank 0),
    all_to_all with virtual members, send/recv with a virtual peer: bitwise as recorded."""
    tmp, bundle = recording
    tag = "rep" + "".join(map(str, ranks))
    if ranks == (0, 1):
        result, _ = request.getfixturevalue("replayed01")
    else:
        result = _replay(tmp, bundle, ranks, tag)
    assert result.exit_code == 0, stderr_of(result, ranks[0])
    for r in ranks:
        assert _same(tmp, r, tag) == []
    rep = result.report
    assert rep["diverged"] is False and rep["first_divergence"] is None
    assert rep["synthetic_numerics"] is False
    assert [s["step"] for s in rep["steps"]] == [0, 1, 2]
    assert all(s["recorded_s"] > 0 and s["replayed_s"] > 0 for s in rep["steps"])
    assert rep["iteration_time_error_pct"] is not None and rep["compute_ratio"] is not None
    assert rep["peak_memory_recorded_bytes"] and rep["peak_memory_replayed_bytes"]
    assert "iteration time error" in result.card


@pytest.mark.timeout(180)
def test_inputs_read_later_match_as_read_at_once(recording):
    """Every call's inputs compared once the device has passed them (the CUDA path, here on
    CPU tensors; small and large, full payloads: digests and bytes): no divergence, the
    same outputs, every call checked, the last at the end."""
    tmp, bundle = recording
    result = replay(bundle, ranks=(2,), timeout=120, log_dir=tmp / "logs-later2", run_recorded_command=True,
                    env={**ENV, "PRISM_TEST_TAG": "later2", "PRISM_RR_DEVICE_CHECKS": "cpu"})
    assert result.exit_code == 0, stderr_of(result, 2)
    assert _same(tmp, 2, "later2") == []
    rep = result.report
    assert rep["diverged"] is False and rep["inputs_checked_later"] >= 3 * 8


@pytest.mark.timeout(180)
def test_edited_shape_stops_at_the_right_call(recording, tmp_path):
    tmp, bundle = recording
    cmd = [sys.executable, str(SCRIPTS / "ops.py"), str(tmp), "edit"]
    result = replay(bundle, ranks=(0,), cmd=cmd, timeout=120, log_dir=tmp_path / "logs",
                    env={**ENV, "PRISM_TEST_TAG": "edit"}, report=tmp_path / "fidelity.json")
    assert result.exit_code == 3 and result.rank_codes == {0: 3}
    d = result.report["first_divergence"]
    # Step 1's all_gather: 8 world-group calls per step, all_gather second of them.
    assert (d["rank"], d["group"], d["seq"], d["op"], d["what"]) == (0, 0, 9, "all_gather", "in_shapes")
    assert (d["expected"], d["got"]) == ("((3,),)", "((4,),)")
    assert d["stack"][0].endswith(f"ops.py:{_line('dist.all_gather(outs, x(step, n))')} in <module>")
    assert "diverged: rank 0 group 0 seq 9 all_gather at ops.py:" in result.card  # said once, by the card
    assert "the replay stopped the program at ops.py:" in stderr_of(result, 0)  # not a traceback
    assert (tmp_path / "fidelity.json").exists()
    assert not (tmp / "edit-0.pt").exists()


@pytest.mark.timeout(180)
@pytest.mark.parametrize("checks", ["", "cpu", "cpu-late"], ids=["at-once", "read-later", "read-a-call-late"])
def test_edited_data_stops_at_the_right_call(recording, tmp_path, checks):
    """One element of step 1's all_reduce input changed, its shape kept, and the next
    call's shape changed too: the replay stops at the first, naming the call, the field
    and where the program made it. Read later (the path a CUDA replay takes: inputs read
    once the device passed them, here on CPU tensors; with "cpu-late" a call behind, as a
    device behind the host), the same call is named, found at the next one: a divergence
    found at once waits for the calls before it."""
    tmp, bundle = recording
    cmd = [sys.executable, str(SCRIPTS / "ops.py"), str(tmp), "both"]
    result = replay(bundle, ranks=(0,), cmd=cmd, timeout=120, log_dir=tmp_path / "logs",
                    env={**ENV, "PRISM_TEST_TAG": "data", "PRISM_RR_DEVICE_CHECKS": checks})
    assert result.exit_code == 3 and result.rank_codes == {0: 3}, stderr_of(result, 0)
    d = result.report["first_divergence"]
    # Step 1's all_reduce: the first of its 8 world-group calls. A full recording keeps
    # the inputs' bytes (and digests): their payload ids differ.
    assert (d["rank"], d["group"], d["seq"], d["op"], d["what"]) == (0, 0, 8, "all_reduce", "payload_in")
    assert d["expected"] != d["got"]
    assert d["stack"][0].endswith(f"ops.py:{_line('dist.all_reduce(t)')} in <module>"), d["stack"]
    assert "diverged: rank 0 group 0 seq 8 all_reduce at ops.py:" in result.card
    assert "Traceback" not in stderr_of(result, 0)
    assert not (tmp / "data-0.pt").exists()
    # read later: every call's inputs up to it
    checked = result.report["inputs_checked_later"]
    assert (checked >= 8) if checks else checked == 0, checked


@pytest.mark.timeout(180)
def test_continue_on_divergence_goes_on(recording, tmp_path):
    tmp, bundle = recording
    cmd = [sys.executable, str(SCRIPTS / "ops.py"), str(tmp), "both"]
    # (inputs read later would leave the recorded outputs standing for inputs that differ:
    # going on, they are compared at once, as here)
    result = replay(bundle, ranks=(0,), cmd=cmd, timeout=120, log_dir=tmp_path / "logs", continue_on_divergence=True,
                    env={**ENV, "PRISM_TEST_TAG": "cont", "PRISM_RR_DEVICE_CHECKS": "cpu"})
    assert result.exit_code == 0, stderr_of(result, 0)
    assert result.report["inputs_checked_later"] == 0
    assert result.report["diverged"] and result.report["first_divergence"]["seq"] == 8
    assert result.report["divergences"] >= 2
    assert (tmp / "cont-0.pt").exists()


def _calls(bundle, rank):
    from prism_rr.format.records import Collective, PointToPoint

    out = []
    for e in bundle.events(rank):
        if isinstance(e, Collective):
            out.append((e.op, e.group, e.seq, e.in_shapes, e.out_shapes, e.step))
        elif isinstance(e, PointToPoint):
            out.append((e.op, e.group, e.seq, e.peer, e.shapes, e.step))
    return sorted(out, key=lambda c: (c[1], c[0], c[2]))


@pytest.mark.timeout(180)
def test_replay_is_recorded_with_the_same_calls(recording, replayed01):
    """-o: the real ranks' calls as they happened in the replay, in the recording's format."""
    from prism_rr.format import open_bundle

    tmp, bundle = recording
    result, out = replayed01
    assert result.exit_code == 0, stderr_of(result, 0)
    assert result.output == out and result.report["output"] == str(out)
    with open_bundle(bundle) as rec, open_bundle(out) as rep:
        assert rep.world_size == WORLD and rep.recorded_ranks == [0, 1]
        assert [g["ranks"] for g in rep.groups] == [g["ranks"] for g in rec.groups]
        for r in (0, 1):
            assert _calls(rep, r) == _calls(rec, r)
            assert list(rep.rank_info(r)["replay_of"]["ranks"]) == [0, 1]
        assert rep.steps == rec.steps

