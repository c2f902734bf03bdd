"""Device time in the format (1.3): DeviceTime records, the summaries' device step table,
the feature "device-time" that a 1.2 reader refuses by name, and readers that say which
clock they used. The recorder's side is tests/recorder/test_device_clock.py."""

import sys
from pathlib import Path

import msgpack
import pytest

from prism_rr.analysis import step_durations
from prism_rr.errors import FormatError, UnsupportedVersionError
from prism_rr.format import DeviceTime, Step, layout, open_bundle, pack, verify
from prism_rr.format.facts import bundle_facts, info_lines
from prism_rr.format.redact import redact
from prism_rr.format.spool import encode_frame, spool_header, spool_path
from prism_rr.format.summaries import DEVICE_STEP_TABLE, NIL

sys.path.insert(0, str(Path(__file__).resolve().parent))

import fuzz  # noqa: E402

MS = 1_000_000


def _write(d: Path, rank: int, records: list, info: dict) -> None:
    frames = [encode_frame(layout.FRAME_RANK_INFO, rank, 0, info=info)]
    frames += [encode_frame(layout.FRAME_EVENTS, rank, i + 1, records=records[i * 4 : i * 4 + 4])
               for i in range(-(-len(records) // 4))]
    spool_path(d, rank).write_bytes(spool_header(rank) + b"".join(frames))


def _steps(rank: int, device: bool) -> list:
    """Steps 0-3 of `rank`, 10 ms apart on the host; with `device`, their device times (each
    step 1 ms shorter on the device, rank 1 a further 2 ms), written a step late as a
    recorder resolves them; step 3 has none, step 2's comes in two pieces."""
    out = []
    for s in range(4):
        t = 1_000 * MS + rank * 3 * MS + s * 10 * MS
        out.append(Step(start_ns=t, end_ns=t + 10 * MS, step=s))
        if device and 0 < s < 3:
            d0, d1 = (s - 1) * 10 * MS, (s - 1) * 10 * MS + 9 * MS - 2 * MS * rank
            if s - 1 == 1:
                out.append(DeviceTime(start_ns=t - 10 * MS, end_ns=t, step=s - 1, name="step", dev_start_ns=d0))
                out.append(DeviceTime(start_ns=t - 10 * MS, end_ns=t, step=s - 1, name="step", dev_end_ns=d1))
            else:
                out.append(DeviceTime(start_ns=t - 10 * MS, end_ns=t, step=s - 1, name="step", dev_start_ns=d0,
                                      dev_end_ns=d1))
            out.append(DeviceTime(start_ns=t - 9 * MS, end_ns=t - 8 * MS, step=s - 1, name="call", op="all_reduce",
                                  group=0, seq=s - 1, dev_start_ns=d0 + MS, dev_wait_ns=d0 + 2 * MS,
                                  dev_end_ns=d0 + 3 * MS, dev_duration_ns=MS // 2))
    return out


def _bundle(tmp_path: Path, device: bool) -> Path:
    d = tmp_path / ("dev.prism.d" if device else "host.prism.d")
    d.mkdir()
    for r in (0, 1):
        info = {"world_size": 2, "rank": r}
        if device:
            info["device_time"] = {"clock": "cuda-events", "epoch_host_ns": 1_000 * MS, "device": "cuda:0"}
        _write(d, r, _steps(r, device), info)
    out = d.parent / d.name[: -len(".d")]
    pack(d, out)
    return out


@pytest.fixture
def device_bundle(tmp_path):
    return _bundle(tmp_path, True)


@pytest.fixture
def host_bundle(tmp_path):
    return _bundle(tmp_path, False)


def test_device_times_round_trip_with_their_feature(device_bundle):
    with open_bundle(device_bundle) as b:
        assert b.format_version == "1.3"
        assert "device-time" in b.manifest["features_required"]
        assert [r for r in b.events(1) if type(r) is DeviceTime] == [r for r in _steps(1, True)
                                                                        if type(r) is DeviceTime]
        assert verify(b).events == sum(len(_steps(r, True)) for r in (0, 1))
        table = b.summaries["device_steps"]
        assert sorted(table) == [0, 1]
        assert dict(table[1].items()) == {0: (10 * MS, 19 * MS), 1: (10 * MS, 17 * MS)}  # two pieces, one row
        facts = bundle_facts(b)
        assert facts["device_time"] == {"records": 10, "ranks": [0, 1], "clocks": ["cuda-events"]}
        assert "device time     recorded (CUDA events) on ranks 0-1: 10 step and call times" in info_lines(facts)


def test_step_durations_say_which_clock(device_bundle):
    with open_bundle(device_bundle) as b:
        d = step_durations(b, 0)
        assert (d.clock, d) == ("device", {0: 9 * MS, 1: 7 * MS})
        host = step_durations(b, 0, clock="host")
        assert (host.clock, host) == ("host", {0: 10 * MS, 1: 10 * MS})
        # step 3 has no device time: the host's, and it says so; asked for the device's, none
        assert step_durations(b, 3).clock == "host" and step_durations(b, 3) == {0: 10 * MS, 1: 10 * MS}
        assert (step_durations(b, 3, clock="device").clock, step_durations(b, 3, clock="device")) == ("device", {})
        with pytest.raises(ValueError):
            step_durations(b, 0, clock="wall")


def test_a_bundle_without_device_time_needs_no_feature(host_bundle, monkeypatch):
    monkeypatch.setattr(layout, "FEATURES_KNOWN", layout.FEATURES_KNOWN - {"device-time"})
    with open_bundle(host_bundle) as b:  # what a 1.2 reader reads
        assert "device-time" not in b.manifest["features_required"]
        assert "device_steps" not in b.summaries
        d = step_durations(b, 1)
        assert (d.clock, d) == ("host", {0: 10 * MS, 1: 10 * MS})
        assert bundle_facts(b)["device_time"] is None
        assert not any(line.startswith("device time") for line in info_lines(bundle_facts(b)))


def test_a_reader_without_the_feature_refuses_it_by_name(device_bundle, monkeypatch):
    monkeypatch.setattr(layout, "FEATURES_KNOWN", layout.FEATURES_KNOWN - {"device-time"})
    with pytest.raises(UnsupportedVersionError, match="device-time"):
        open_bundle(device_bundle)


def test_the_golden_bundle_reads_on_the_host_clock():
    golden = Path(__file__).parent.parent / "data" / "golden-v1.prism"
    with open_bundle(golden) as b:
        d = step_durations(b, 1)
        assert d.clock == "host" and sorted(d) == [0, 1, 2, 3]


def test_redact_keeps_device_time(device_bundle, tmp_path):
    out = tmp_path / "redacted.prism"
    redact(device_bundle, out)
    with open_bundle(out) as b:
        assert "device-time" in b.manifest["features_required"]
        assert bundle_facts(b)["device_time"]["clocks"] == ["cuda-events"]
        assert step_durations(b, 0) == {0: 9 * MS, 1: 7 * MS}


def _tables(base: Path) -> dict:
    parts = fuzz.Parts(base.read_bytes())
    return msgpack.unpackb(fuzz.zd(parts.get(layout.SEC_SUMMARIES).body), strict_map_key=False)


def _with_summaries(base: Path, value) -> bytes:
    parts = fuzz.Parts(base.read_bytes())
    parts.get(layout.SEC_SUMMARIES).body = fuzz.zc(msgpack.packb(value, use_bin_type=True))
    return parts.build()


def _col(values) -> bytes:
    return b"".join(v.to_bytes(8, "little", signed=True) for v in values)


def _set(column: str, i: int, value):
    def edit(t):
        raw = t[DEVICE_STEP_TABLE][column]
        vals = [int.from_bytes(raw[k : k + 8], "little", signed=True) for k in range(0, len(raw), 8)]
        vals[i] = value
        t[DEVICE_STEP_TABLE][column] = _col(vals)
    return edit


HOSTILE = {
    "a column missing": lambda t: t[DEVICE_STEP_TABLE].pop("dev_end_ns"),
    "a column shorter": lambda t: t[DEVICE_STEP_TABLE].update(dev_start_ns=t[DEVICE_STEP_TABLE]["dev_start_ns"][8:]),
    "not a map": lambda t: t.update({DEVICE_STEP_TABLE: [1, 2]}),
    "a rank at the world size": _set("rank", 0, 2),
    "a time beyond 2^62": _set("dev_end_ns", 1, (1 << 62) + 1),
    "rows out of order": _set("step", 0, 7),
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_hostile_device_step_tables_are_refused(device_bundle, tmp_path, case):
    t = _tables(device_bundle)
    HOSTILE[case](t)
    path = tmp_path / "bad.prism"
    path.write_bytes(_with_summaries(device_bundle, t))
    with open_bundle(path) as b, pytest.raises(FormatError, match="summaries section"):
        b.summaries


def test_a_nil_device_time_is_none(device_bundle, tmp_path):
    t = _tables(device_bundle)
    _set("dev_start_ns", 0, NIL)(t)
    path = tmp_path / "nil.prism"
    path.write_bytes(_with_summaries(device_bundle, t))
    with open_bundle(path) as b:
        assert b.summaries["device_steps"][0][0] == (None, 9 * MS)
        assert step_durations(b, 0) == {1: 7 * MS}
