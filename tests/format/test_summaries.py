"""The summaries section as tables of int64 columns (format 1.1, prism_rr/format/summaries.py).

Format 1.0 held the step summaries as one msgpack map, four values a rank and step: a
bundle of 8192 ranks and more than 128 steps passed the reader's decode budget (2^22
values a frame) and could not be opened at all. These tests open one, check that the
tables say what the 1.0 maps said, and that hostile tables end in exit 4.
"""

import json
import subprocess
import sys
from pathlib import Path

import msgpack
import pytest

from prism_rr.errors import FormatError, UnsupportedVersionError
from prism_rr.format import layout, open_bundle, pack
from prism_rr.format.records import Compute, Step
from prism_rr.format.spool import encode_frame, spool_header, spool_path
from prism_rr.format.summaries import NIL, RANK_TABLE, STEP_TABLE

sys.path.insert(0, str(Path(__file__).resolve().parent))

import fuzz  # noqa: E402

PRISM = Path(sys.executable).with_name("prism-rr")
BIG_WORLD, BIG_STEPS = 8192, 130  # 8192 x 130 x 4 values: past 1.0's 2^22


def _start(rank: int, step: int) -> int:
    return 10**12 + step * 10**7 + rank * 1000


def _write_spools(directory: Path, world: int, steps: int, ranks=None) -> Path:
    """Spools holding one Step record a step and nothing else: the least a bundle of
    that many steps needs (summaries come from the chunks' summaries)."""
    directory.mkdir(parents=True, exist_ok=True)
    for r in range(world) if ranks is None else ranks:
        recs = [Step(start_ns=_start(r, s), end_ns=_start(r, s) + 9_000_000 + r, step=s, mem_peak=r * 7 + s)
                for s in range(steps)]
        info = {"world_size": world, "rank": r}
        spool_path(directory, r).write_bytes(
            spool_header(r) + encode_frame(layout.FRAME_RANK_INFO, r, 0, info=info)
            + encode_frame(layout.FRAME_EVENTS, r, 1, records=recs))
    return directory


@pytest.fixture(scope="module")
def big(tmp_path_factory):
    d = tmp_path_factory.mktemp("big")
    out = d / "big.prism"
    pack(_write_spools(d / "big.prism.d", BIG_WORLD, BIG_STEPS), out)
    return out


def _cli(*args):
    return subprocess.run([str(PRISM), *map(str, args)], capture_output=True, text=True, timeout=120,
                          stdin=subprocess.DEVNULL)


def test_8192_ranks_of_more_than_128_steps_open(big):
    r = _cli("info", big, "--json")
    assert r.returncode == 0, r.stderr
    facts = json.loads(r.stdout)
    assert facts["format_version"] == f"{layout.MAJOR}.{layout.MINOR}" == "1.3"
    assert facts["steps"] == list(range(BIG_STEPS)) and facts["world_size"] == BIG_WORLD
    assert facts["event_count"] == BIG_WORLD * BIG_STEPS
    with open_bundle(big) as b:
        assert "columnar-summaries" in b.manifest["features_required"]
        assert b.steps == list(range(BIG_STEPS))
        table = b.summaries["steps"]
        for s in (0, 77, BIG_STEPS - 1):
            row = table[s]
            assert len(row) == BIG_WORLD and list(row) == list(range(BIG_WORLD))
            assert dict(row.items()) == {r: (_start(r, s), _start(r, s) + 9_000_000 + r, r * 7 + s)
                                         for r in range(BIG_WORLD)}
        assert table.get(5).get(8191) == (_start(8191, 5), _start(8191, 5) + 9_000_000 + 8191, 8191 * 7 + 5)
        assert table.get(BIG_STEPS) is None and table[3].get(BIG_WORLD) is None and 8192 not in table[3]
        assert b.step_times(2)[4] == (_start(4, 2), _start(4, 2) + 9_000_000 + 4)
        rs = b.rank_summary(4095)
        assert rs == {"events": BIG_STEPS, "chunks": 1, "kinds": {Step.KIND: BIG_STEPS},
                      "t_first": _start(4095, 0), "t_last": _start(4095, BIG_STEPS - 1) + 9_000_000 + 4095,
                      "dropped": 0, "open": 0, "mem_peak": 4095 * 7 + BIG_STEPS - 1, "truncated": False,
                      "lost_bytes": 0}
        assert all(type(v) is int for v in b.summaries["steps"][9][100])


def test_a_reader_without_the_feature_refuses_with_its_name(big, monkeypatch):
    monkeypatch.setattr(layout, "FEATURES_KNOWN", layout.FEATURES_KNOWN - {"columnar-summaries"})
    with pytest.raises(UnsupportedVersionError, match="columnar-summaries"):
        open_bundle(big)


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    """4 ranks: rank 1 records step 2 twice (the later counts), rank 3 leaves step 4 open
    with no mem_peak, rank 2 records no step at all; several chunks a rank."""
    d = tmp_path_factory.mktemp("small") / "s.prism.d"
    d.mkdir()
    for r in range(4):
        recs = []
        for s in range(5 if r != 2 else 0):
            t = _start(r, s)
            recs.append(Compute(start_ns=t, end_ns=t + 10, step=s, mem_alloc=1, mem_peak=2))
            end, peak = (None, None) if (r, s) == (3, 4) else (t + 100, s)
            recs.append(Step(start_ns=t, end_ns=end, step=s, mem_peak=peak))
        if r == 1:
            recs.append(Step(start_ns=_start(1, 9), end_ns=_start(1, 9) + 5, step=2, mem_peak=99))
        if r == 2:
            recs.append(Compute(start_ns=5, end_ns=6, step=0))
        frames = [encode_frame(layout.FRAME_RANK_INFO, r, 0, info={"world_size": 4, "rank": r})]
        frames += [encode_frame(layout.FRAME_EVENTS, r, i + 1, records=recs[i * 3 : i * 3 + 3])
                   for i in range(-(-len(recs) // 3))]
        spool_path(d, r).write_bytes(spool_header(r) + b"".join(frames))
    out = d.parent / "s.prism"
    pack(d, out)
    return out


def test_tables_say_what_the_1_0_maps_said(small, tmp_path):
    with open_bundle(small) as b:
        new = {"ranks": {r: dict(v) for r, v in b.summaries["ranks"].items()},
               "steps": {s: dict(per.items()) for s, per in b.summaries["steps"].items()}}
        steps, events = b.steps, b.event_count
        recorded = {}
        for r in b.recorded_ranks:
            for rec in b.events(r):
                if isinstance(rec, Step):
                    recorded.setdefault(rec.step, {})[r] = (rec.start_ns, rec.end_ns, rec.mem_peak)
    assert new["steps"] == recorded  # the later Step 2 of rank 1 too
    assert new["steps"][2][1] == (_start(1, 9), _start(1, 9) + 5, 99) and new["steps"][4][3] == (_start(3, 4), None, None)
    assert steps == [0, 1, 2, 3, 4] and 2 not in new["steps"][0]
    assert new["ranks"][2]["kinds"] == {Compute.KIND: 1} and new["ranks"][3]["open"] == 1
    # the same summaries as a 1.0 bundle holds them, read by the 1.0 path
    old = {"ranks": new["ranks"], "steps": {s: {r: list(v) for r, v in per.items()} for s, per in new["steps"].items()}}
    path = tmp_path / "old.prism"
    path.write_bytes(_with_summaries(small, old))
    with open_bundle(path) as b:
        assert {r: dict(v) for r, v in b.summaries["ranks"].items()} == new["ranks"]
        assert {s: dict(per) for s, per in b.summaries["steps"].items()} == new["steps"]
        assert (b.steps, b.event_count) == (steps, events)


def _with_summaries(base: Path, value) -> bytes:
    parts = fuzz.Parts(base.read_bytes())
    parts.get(layout.SEC_SUMMARIES).body = fuzz.zc(msgpack.packb(value, use_bin_type=True))
    return parts.build()


def _tables(base: Path) -> dict:
    parts = fuzz.Parts(base.read_bytes())
    return msgpack.unpackb(fuzz.zd(parts.get(layout.SEC_SUMMARIES).body), strict_map_key=False)


def _col(values) -> bytes:
    return b"".join(v.to_bytes(8, "little", signed=True) for v in values)


def _ints(raw: bytes) -> list[int]:
    return [int.from_bytes(raw[i : i + 8], "little", signed=True) for i in range(0, len(raw), 8)]


def _changed(column: str, edit, table: str = STEP_TABLE):
    def mutate(t):
        t[table][column] = edit(t[table][column])
    return mutate


def _set_row(column: str, i: int, value, table: str = STEP_TABLE):
    def edit(raw):
        vals = _ints(raw)
        vals[i] = value
        return _col(vals)
    return _changed(column, edit, table)


def _swap_rows(t):
    for name, raw in t[STEP_TABLE].items():
        t[STEP_TABLE][name] = raw[8:16] + raw[:8] + raw[16:]


HOSTILE = {
    "a column shorter than the others": _changed("end_ns", lambda raw: raw[:-8]),
    "a column of a partial int64": _changed("rank", lambda raw: raw + b"\0\0\0"),
    "a column missing": lambda t: t[STEP_TABLE].pop("start_ns"),
    "a column that is not bytes": _changed("step", lambda raw: _ints(raw)),
    "the table not a map": lambda t: t.update({STEP_TABLE: [1, 2]}),
    "a rank at the world size": _set_row("rank", 0, 4),
    "a negative rank": _set_row("rank", 0, -1),
    "a step beyond int32": _set_row("step", -1, 1 << 40),
    "rows out of order": _swap_rows,
    "a row twice": lambda t: t[STEP_TABLE].update({k: v[:8] + v[:-8] for k, v in t[STEP_TABLE].items()}),
    "a nil start": _set_row("start_ns", 3, NIL),
    "an end beyond 2^62": _set_row("end_ns", 3, (1 << 62) + 1),
    "a negative mem_peak": _set_row("mem_peak", 2, -5),
    "a negative event count": _set_row("events", 1, -1, RANK_TABLE),
    "truncated neither 0 nor 1": _set_row("truncated", 0, 2, RANK_TABLE),
    "a rank twice in the rank table": _set_row("rank", 1, 0, RANK_TABLE),
    "a kind's counts of another length": lambda t: t[RANK_TABLE]["kinds"].update({4: b"\0" * 8}),
    "a kind that is not an integer": lambda t: t[RANK_TABLE]["kinds"].update({"4": _col([0] * 4)}),
    "the rank table missing": lambda t: t.pop(RANK_TABLE),
    "bytes outside the tables": lambda t: t.update({"note": b"\0" * 16}),
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_hostile_tables_are_refused(small, tmp_path, case):
    t = _tables(small)
    HOSTILE[case](t)
    path = tmp_path / "bad.prism"
    path.write_bytes(_with_summaries(small, t))
    with open_bundle(path) as b, pytest.raises(FormatError, match="summaries section"):
        b.summaries


def test_hostile_tables_end_info_with_exit_4(small, tmp_path):
    for i, case in enumerate(("a column shorter than the others", "rows out of order", "a negative rank")):
        t = _tables(small)
        HOSTILE[case](t)
        path = tmp_path / f"bad{i}.prism"
        path.write_bytes(_with_summaries(small, t))
        r = _cli("info", path)
        lines = r.stderr.strip().splitlines()
        assert r.returncode == 4 and len(lines) == 1 and "summaries section" in lines[0], (case, r.stderr)


def test_a_table_of_zeros_is_a_zip_bomb_the_budget_refuses(small, tmp_path):
    """64 MiB of zero columns compress to a few KiB: the frame declares more than its
    stored length can justify, and is refused before it is decompressed."""
    t = _tables(small)
    t[STEP_TABLE] = {name: bytes(16 << 20) for name in ("step", "rank", "start_ns", "end_ns", "mem_peak")}
    path = tmp_path / "bomb.prism"
    path.write_bytes(_with_summaries(small, t))
    assert path.stat().st_size < 1 << 20
    with open_bundle(path) as b, pytest.raises(FormatError, match="more than its size can justify"):
        b.summaries


@pytest.mark.parametrize("rows", [[[0, "5", 1, 2]], [[0, 1.5, 2, 3]], [[0, 1, 2]], [[0, 2**64 - 1, 2, 3]],
                                  [[0, None, 1, 2]], [[0, 1, 2, -3]], [[2**40, 1, 2, 3]]])
def test_pack_refuses_step_rows_a_reader_would(tmp_path, rows):
    """A spool's chunk summary is a stranger's too: pack refuses what it cannot write as
    a 1.1 step table (it wrote 1.0's map whatever it held, for the reader to refuse)."""
    import zlib

    frame = encode_frame(layout.FRAME_EVENTS, 0, 1, records=[Step(start_ns=1, end_ns=2, step=0, mem_peak=3)])
    h = list(layout.FRAME_HEADER.unpack_from(frame, 0))
    payload = frame[layout.FRAME_HEADER.size + h[8]:]
    summary = msgpack.packb({0: {Step.KIND: 1}, 1: rows})
    h[8], h[13], h[14] = len(summary), zlib.crc32(summary + payload), 0
    head = layout.FRAME_HEADER.pack(*h)
    d = tmp_path / "x.prism.d"
    d.mkdir()
    spool_path(d, 0).write_bytes(spool_header(0) + head[:-4] + zlib.crc32(head[:-4]).to_bytes(4, "little")
                                 + summary + payload)
    with pytest.raises(FormatError, match="step"):
        pack(d, tmp_path / "x.prism")
