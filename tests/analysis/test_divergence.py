"""One rule decides what a divergence is (issue 29): replay stops at it, `tui --compare`
names it, `diff` counts it. Data counts only where the replay ran on the recorded data,
which a replay's own recording says (`replay_of.data_made_up_from_ns`).

The replay's side is tested where replays run (tests/replayer/test_replay_ops.py stops at
an edited shape; tests/demo/test_divergence_verdict.py replays the demo); here the rule
itself, and `tui --compare` and `diff` reading the same two bundles alike.
"""

from __future__ import annotations

import dataclasses
import json
import random

import pytest

from prism_rr.analysis import call_divergence, call_divergences, call_structure, diff_bundles, replay_data
from prism_rr.format import Collective, PointToPoint, layout, open_bundle, pack
from prism_rr.format.spool import encode_frame, spool_header, spool_path
from prism_rr.format.synthetic import synthetic_records
from prism_rr.tui.analysis import compare_bundles


def _call(**change) -> Collective:
    base = dict(start_ns=0, end_ns=10, step=1, op="all_reduce", group=1, seq=4, in_shapes=((8, 4),),
                in_dtypes=("float32",), out_shapes=((8, 4),), out_dtypes=("float32",), reduce_op="sum",
                digest_in=(7,))
    return Collective(**{**base, **change})


def test_a_call_is_the_same_call_whatever_its_timing_and_step():
    assert call_divergence(_call(), _call(start_ns=99, end_ns=None, step=3, issued_ns=5)) is None


@pytest.mark.parametrize("change, field", [
    ({"op": "all_gather"}, "op"), ({"in_shapes": ((8, 5),)}, "in_shapes"), ({"in_dtypes": ("bfloat16",)}, "in_dtypes"),
    ({"reduce_op": "max"}, "reduce_op"), ({"root": 1}, "root"),
])
def test_what_members_agree_on_is_a_divergence(change, field):
    d = call_divergence(_call(), _call(**change))
    assert d is not None and d.field == field and d.expected == getattr(_call(), field)
    assert call_structure(_call()) != call_structure(_call(**change))


def test_the_side_members_agree_on_is_compared_and_all_to_all_both():
    """An all_reduce's outputs follow from its inputs; an all_to_all's splits do not."""
    assert call_divergence(_call(), _call(out_shapes=((9, 9),))) is None
    a2a = _call(op="all_to_all_single", reduce_op=None, in_shapes=((6, 4),), out_shapes=((6, 4),))
    d = call_divergence(a2a, dataclasses.replace(a2a, out_shapes=((5, 4),)))
    assert d.field == "out_shapes" and d.topic == "shapes"
    scatter = _call(op="scatter", reduce_op=None, root=0, in_shapes=(), out_shapes=((2,),))
    assert call_divergence(scatter, dataclasses.replace(scatter, out_shapes=((3,),))).field == "out_shapes"


def test_data_counts_only_when_asked_and_only_where_both_hold_it():
    other = _call(digest_in=(8,))
    assert call_divergence(_call(), other) is None
    d = call_divergence(_call(), other, data=True)
    assert (d.field, d.topic) == ("digest_in", "data") and d.text() == (
        "digest_in: recorded [0000000000000007], replayed [0000000000000008]")
    assert call_divergence(_call(), _call(digest_in=None), data=True) is None
    assert call_divergence(_call(), other, data=True, shapes=False).topic == "data"


def test_shapes_left_out_where_scale_predicted_them():
    assert call_divergence(_call(), _call(in_shapes=((9, 4),)), shapes=False) is None
    assert call_divergence(_call(), _call(in_shapes=((9, 4),), in_dtypes=("int8",)), shapes=False).field == "in_dtypes"


def test_point_to_point_calls_and_a_receives_data():
    send = PointToPoint(start_ns=0, end_ns=1, step=0, op="send", group=0, seq=2, peer=1, tag=3,
                        shapes=((4,),), dtypes=("float32",), digest=(1,))
    assert call_divergence(send, dataclasses.replace(send, tag=4)).field == "tag"
    assert call_divergence(send, dataclasses.replace(send, op="isend")).field == "op"
    assert call_divergence(send, dataclasses.replace(send, digest=(2,)), data=True).field == "digest"
    recv = dataclasses.replace(send, op="recv")
    assert call_divergence(recv, dataclasses.replace(recv, digest=(2,)), data=True) is None  # the sender checks it
    assert call_divergence(send, _call()).field == "kind"


def test_structure_is_equal_exactly_when_there_is_no_divergence():
    """What diff compares a million calls by (interned structures) says what the rule says."""
    rng = random.Random(29)
    calls = [r for r in synthetic_records(0, 4, 400) if type(r) in (Collective, PointToPoint)]
    fields = {Collective: {"op": ["all_reduce", "all_to_all_single", "frobnicate"], "in_shapes": [((1,),), ((2,),)],
                           "out_shapes": [((1,),), ((3,),)], "reduce_op": ["sum", None], "root": [None, 0]},
              PointToPoint: {"tag": [0, 1], "peer": [0, 1], "dtypes": [("float32",), ("int8",)]}}
    for _ in range(400):
        a = rng.choice(calls)
        b = rng.choice(calls) if rng.random() < 0.2 else a
        for name, values in fields[type(b)].items():
            if rng.random() < 0.3:
                b = dataclasses.replace(b, **{name: rng.choice(values)})
        if rng.random() < 0.3:
            a = dataclasses.replace(a, **{k: rng.choice(v) for k, v in list(fields[type(a)].items())[:1]})
        assert (call_structure(a) == call_structure(b)) == (call_divergence(a, b) is None), (a, b)
        assert (call_divergence(a, b) is None) == (call_divergences(a, b) == [])


# --- tui --compare and diff read a replay's own recording alike ----------------------------


def _write(spool_dir, world: int, ranks, edit=None, info=None, run=None):
    spool_dir.mkdir(parents=True, exist_ok=True)
    for rank in ranks:
        recs = list(synthetic_records(rank, world, 150, payload=True))
        if edit is not None:
            recs = edit(rank, recs)
        head = {"world_size": world, "rank": rank, "backend": "gloo", "argv": ["train.py"], **(info or {})}
        parts = [spool_header(rank), encode_frame(layout.FRAME_RANK_INFO, rank, 0, info=head)]
        for i in range(0, len(recs), 64):
            parts.append(encode_frame(layout.FRAME_EVENTS, rank, 1 + i // 64, records=recs[i : i + 64]))
        spool_path(spool_dir, rank).write_bytes(b"".join(parts))
    if run is not None:
        (spool_dir / "run.json").write_text(json.dumps(run))
    return spool_dir


@pytest.fixture(scope="module")
def recording(tmp_path_factory):
    d = tmp_path_factory.mktemp("verdict")
    out = d / "rec.prism"
    pack(_write(d / "rec.d", 4, range(4)), out, manifest_extra={"created_unix_ns": 0})
    return out


def _the_call(recording):
    """Rank 0's data-parallel all_gather of step 1 (recorded with a digest) that the replays
    below change."""
    with open_bundle(recording) as b:
        return next(r for r in b.events(0) if type(r) is Collective and r.op == "all_gather_into_tensor"
                    and r.step == 1 and r.digest_in)


def _replay(recording, name: str, made_up: dict | None, edit=None):
    """A replay's own recording of ranks 0 and 1, as `replay -o` packs it."""
    d = recording.parent / f"{name}.d"
    of = {"bundle": str(recording), "ranks": [0, 1], "timing": "live"}
    if made_up is not None:
        of["data_made_up_from_ns"] = made_up
    info = {"replay_of": {"bundle": str(recording), "ranks": [0, 1], "timing": "live"}}
    out = recording.parent / f"{name}.prism"
    pack(_write(d, 4, (0, 1), edit, info, run={"replay_of": of}), out)
    return out


def _other_data(target):
    def edit(rank, recs):
        return [dataclasses.replace(r, digest_in=(12345,)) if rank == 0 and type(r) is Collective
                and (r.group, r.seq) == (target.group, target.seq) else r for r in recs]
    return edit


def _verdicts(recording, replay):
    with open_bundle(recording) as a, open_bundle(replay) as b:
        compared = compare_bundles(a, b)["first_divergence"]
        diffed = diff_bundles(a, b)
        backwards = diff_bundles(b, a)
    return compared, diffed, backwards


def test_data_that_differs_where_the_replay_ran_on_the_recorded_data_is_a_divergence_to_both(recording):
    target = _the_call(recording)
    replay = _replay(recording, "followed", {"0": None, "1": None}, _other_data(target))
    compared, diffed, backwards = _verdicts(recording, replay)
    assert compared is not None and (compared["rank"], compared["group"], compared["seq"]) == (0, target.group, target.seq)
    assert compared["what"].startswith("digest_in: recorded")
    first = diffed.first
    assert not diffed.same and first.fields == ("data",) and (first.rank, first.group) == (0, target.group)
    assert first.a.seq == target.seq and backwards.first.fields == ("data",)


def test_data_made_up_before_the_call_is_no_divergence_to_either(recording):
    """The README demo's case: a digest recording replayed with virtual peers whose data was
    not recorded; the replay says 'diverged: no', and so do compare and diff."""
    target = _the_call(recording)
    replay = _replay(recording, "made-up", {"0": target.start_ns - 1, "1": None}, _other_data(target))
    compared, diffed, backwards = _verdicts(recording, replay)
    assert compared is None and diffed.same and backwards.same


def test_a_bundle_that_does_not_say_where_its_data_was_made_up_is_compared_without_data(recording):
    target = _the_call(recording)
    replay = _replay(recording, "silent", None, _other_data(target))
    compared, diffed, _ = _verdicts(recording, replay)
    assert compared is None and diffed.same
    with open_bundle(recording) as a, open_bundle(replay) as b:
        assert replay_data(a, b) == {} and compare_bundles(a, b)["data_compared"] is False


def test_a_shape_that_differs_is_a_divergence_to_both_whatever_the_data(recording):
    target = _the_call(recording)

    def edit(rank, recs):
        return [dataclasses.replace(r, in_shapes=((1, 2),)) if rank == 0 and type(r) is Collective
                and (r.group, r.seq) == (target.group, target.seq) else r for r in recs]

    replay = _replay(recording, "reshaped", {"0": 0, "1": 0}, edit)
    compared, diffed, _ = _verdicts(recording, replay)
    assert compared["what"].startswith(f"in_shapes: recorded {target.in_shapes}, replayed ((1, 2),)")
    assert diffed.first.fields == ("shapes",) and diffed.first.a.seq == target.seq
