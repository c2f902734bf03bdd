"""Flight rings (format/ring.py): what survives laps, deaths and garbage."""

import os
import random

import pytest

from prism_rr.errors import FormatError
from prism_rr.format import layout, pack
from prism_rr.format.blobs import blob_id
from prism_rr.format.reader import open_bundle
from prism_rr.format.records import Collective, GroupInfo, Marker, Step
from prism_rr.format.ring import E_BLOB, E_FRAME, E_GROUPS, E_INFO, E_OPEN, Ring, newest_step, read_ring, ring_path, ring_to_spool
from prism_rr.format.spool import encode_frame, frame_records, parse_frame, read_spool

import msgpack


SMALL_SLOTS = {E_INFO: 4096, E_GROUPS: 4096, E_OPEN: 4096}


def _call(step: int, seq: int, blob=None) -> Collective:
    t = 1_000_000 * (seq + 1)
    return Collective(start_ns=t, end_ns=t + 500, step=step, op="all_reduce", group=0, seq=seq,
                      in_shapes=((4,),), in_dtypes=("float32",), in_bytes=16, out_shapes=((4,),),
                      out_dtypes=("float32",), out_bytes=16, blob_in=blob)


def _fill(ring: Ring, steps: int, per_step: int = 3) -> None:
    seq = 0
    for step in range(steps):
        recs = []
        for _ in range(per_step):
            recs.append(_call(step, seq))
            seq += 1
        recs.append(Step(start_ns=recs[0].start_ns, end_ns=recs[-1].end_ns, step=step))
        ring.append(E_FRAME, encode_frame(layout.FRAME_EVENTS, ring.rank, step, records=recs))


def _steps_of(frames) -> list[int]:
    out = []
    for raw in frames:
        f = parse_frame(raw, 0, len(raw), "t")
        out += [r.step for r in frame_records(raw, f, "t") if isinstance(r, Step)]
    return out


def test_a_ring_keeps_the_newest_frames_in_order_lap_after_lap(tmp_path):
    ring = Ring(ring_path(tmp_path, 3), 3, capacity=4096)
    _fill(ring, 200)
    ring.set_slot(E_INFO, msgpack.packb({"rank": 3, "world_size": 4}))
    got = read_ring(ring.path)
    steps = _steps_of(got.frames)
    assert got.rank == 3 and got.info["world_size"] == 4
    assert steps == list(range(steps[0], 200)) and 0 < len(steps) < 200 and steps[0] > 100
    live = [p for h, p in ring.data_entries() if h.kind == E_FRAME]
    assert _steps_of(live) == steps  # what the writer knows is what a reader finds


def test_a_death_mid_write_loses_only_the_torn_entry(tmp_path):
    ring = Ring(ring_path(tmp_path, 0), 0, capacity=8192)
    _fill(ring, 40)
    data = bytearray(ring.path.read_bytes())
    newest = ring.held[-1]
    at = ring._data_at + newest.offset + newest.length - 5  # the newest entry's last bytes
    data[at:at + 5] = b"\xff" * 5
    ring.path.write_bytes(bytes(data))
    steps = _steps_of(read_ring(ring.path).frames)
    assert steps[-1] == 38 and steps == list(range(steps[0], 39))


def test_blobs_go_out_of_the_ring_and_their_records_say_so(tmp_path):
    ring = Ring(ring_path(tmp_path, 0), 0, capacity=6000)
    payload = os.urandom(64)
    ident = blob_id(payload)
    from prism_rr.format import codec

    ring.append(E_BLOB, ident + codec.compress(payload), meta=ident)
    assert ring.holds_recent(ident)
    recs = [_call(0, 0, blob=(ident,))]
    ring.append(E_FRAME, encode_frame(layout.FRAME_EVENTS, 0, 0, records=recs))
    _fill(ring, 15, per_step=1)
    assert not ring.holds_recent(ident)  # a record named now would outlive it
    ring.set_slot(E_GROUPS, encode_frame(layout.FRAME_EVENTS, 0, 0, records=[
        GroupInfo(start_ns=1, end_ns=1, step=0, group=0, ranks=(0, 1), name="0", text="default_pg",
                  backend="gloo")]))
    contents = read_ring(ring.path)
    contents.blobs.clear()  # as if the blob entry had been overwritten
    done = ring_to_spool(contents, tmp_path / "dump", first_step=None)
    scan = read_spool(tmp_path / "dump" / "rank-00000.spool")
    data = scan.path.read_bytes()
    recs = [r for f in scan.frames if f.kind == layout.FRAME_EVENTS for r in frame_records(data, f, "t")]
    assert done["payloads_lost"] == 1
    assert any(isinstance(r, Marker) and r.name == "payload_lost" for r in recs)
    assert all(getattr(r, "blob_in", None) is None for r in recs)
    assert any(isinstance(r, GroupInfo) for r in recs)  # groups outlive the ring's laps
    pack(tmp_path / "dump", tmp_path / "d.prism")
    with open_bundle(tmp_path / "d.prism") as b:
        assert b.recorded_ranks == [0]


def test_first_step_cuts_records_inside_frames(tmp_path):
    ring = Ring(ring_path(tmp_path, 1), 1, capacity=1 << 20)
    recs = [_call(s, s) for s in range(30)]  # one frame, 30 steps
    ring.append(E_FRAME, encode_frame(layout.FRAME_EVENTS, 1, 0, records=recs))
    contents = read_ring(ring.path)
    assert newest_step(contents) == 29
    done = ring_to_spool(contents, tmp_path / "dump", first_step=26)
    scan = read_spool(tmp_path / "dump" / "rank-00001.spool")
    data = scan.path.read_bytes()
    kept = [r.step for f in scan.frames if f.kind == layout.FRAME_EVENTS for r in frame_records(data, f, "t")]
    assert done["first_step"] == 26 and kept == [26, 27, 28, 29]


@pytest.mark.parametrize("seed", range(3))
def test_garbage_rings_are_refused_or_read_never_crash(tmp_path, seed):
    rnd = random.Random(seed)
    ring = Ring(ring_path(tmp_path, 0), 0, capacity=16384, slot_sizes=SMALL_SLOTS)
    _fill(ring, 30)
    ring.set_slot(E_INFO, msgpack.packb({"rank": 0}))
    good = ring.path.read_bytes()
    for _ in range(200):
        data = bytearray(good)
        for _ in range(rnd.randint(1, 40)):
            i = rnd.randrange(len(data))
            data[i] = rnd.randrange(256)
        if rnd.random() < 0.2:
            data = data[: rnd.randrange(len(data))]
        p = tmp_path / "g.ring"
        p.write_bytes(bytes(data))
        try:
            contents = read_ring(p)
            ring_to_spool(contents, tmp_path / "out", first_step=20)
        except FormatError:
            pass
