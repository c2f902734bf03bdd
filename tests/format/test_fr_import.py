"""`prism-rr import fr`: PyTorch Flight Recorder dumps become a bundle that info, verify,
diagnose and export read, and a stranger's dump never runs code.

The dumps in tests/data/fr are real: torch 2.13 on gloo wrote them, run by
tests/format/scripts/fr_dumps.py (`python tests/format/scripts/fr_dumps.py tests/data/fr`
makes them again); one test runs that script's skip scenario live.
"""

import json
import os
import pickle
import subprocess
import sys
from pathlib import Path

import pytest

from prism_rr.errors import FormatError, UsageError
from prism_rr.format import open_bundle, verify
from prism_rr.format.fr import import_fr, read_dump, safe_loads
from prism_rr.format.records import Collective, GroupInfo, Marker, PointToPoint
from prism_rr.analysis import diagnose

from tests.cli_helpers import run_cli

FR = Path(__file__).parent.parent / "data" / "fr"
SCRIPT = Path(__file__).parent / "scripts" / "fr_dumps.py"
WORLDS = {"normal": 2, "skip": 3, "groups": 4}


def _records(bundle, rank, kind):
    with open_bundle(bundle) as b:
        return [r for r in b.events(rank) if type(r) is kind]


@pytest.fixture(scope="module")
def imported(tmp_path_factory):
    """Every fixture, imported once: {(scenario, form): bundle path}."""
    d = tmp_path_factory.mktemp("fr")
    out = {}
    for scenario in WORLDS:
        for form in ("pickle", "json"):
            out[scenario, form] = d / f"{scenario}-{form}.prism"
            import_fr([FR / scenario / form], out[scenario, form])
    return out


@pytest.mark.parametrize("scenario", sorted(WORLDS))
@pytest.mark.parametrize("form", ["pickle", "json"])
def test_imported_bundle_verifies_and_says_where_it_came_from(imported, scenario, form):
    with open_bundle(imported[scenario, form]) as b:
        verify(b)
        assert b.world_size == WORLDS[scenario]
        assert b.recorded_ranks == list(range(WORLDS[scenario]))
        note = b.manifest["imported"]
        assert note["from"] == "flight_recorder" and list(note["forms"]) == [form] and note["replayable"] is True
        assert b.rank_info(0)["imported"]["file"].startswith("nccl_trace_rank_0")


def test_entries_map_to_collectives(imported):
    """The normal run: 3 steps of all_reduce, all_gather, broadcast, all_reduce (gloo's
    reduce_scatter) and barrier on WORLD, each completed, in order, with sizes and dtypes;
    the pickle keeps the user's frames of each call's stack, the JSON has none."""
    for form in ("pickle", "json"):
        calls = _records(imported["normal", form], 1, Collective)
        assert [c.seq for c in calls] == list(range(15))
        assert [c.op for c in calls[:5]] == ["all_reduce", "all_gather", "broadcast", "all_reduce", "barrier"]
        assert all(c.group == 0 and c.end_ns is not None for c in calls)
        assert calls[0].in_shapes == ((2, 3),) and calls[0].in_dtypes == ("float32",) and calls[0].in_bytes == 24
        assert calls[1].out_shapes == ((2, 2, 3),) and calls[1].out_bytes == 48
        assert calls[0].start_ns < calls[1].start_ns < calls[14].start_ns
        if form == "pickle":
            assert calls[0].stack[0].startswith("fr_dumps.py:") and calls[0].stack[0].endswith("in _normal")
            assert not any("distributed_c10d" in f for c in calls for f in c.stack)
        else:
            assert calls[0].stack is None
        end = _records(imported["normal", form], 1, Marker)[-1]
        assert end.name == "recording_end" and end.value == 0 and "nccl_trace_rank_1" in end.text
    with open_bundle(imported["normal", "pickle"]) as b:
        assert diagnose(b) == []


def test_several_groups_get_their_members_and_fr_names(imported):
    """gloo's dumps say nothing of a group's ranks (pg_config is empty) and number groups
    per rank (pg_id): groups are told apart by name, their members are the ranks with
    entries in them, WORLD is every rank."""
    for form in ("pickle", "json"):
        with open_bundle(imported["groups", form]) as b:
            groups = {g["id"]: (tuple(g["ranks"]), g["name"], g["desc"]) for g in b.groups}
            assert groups == {0: ((0, 1, 2, 3), "0", "default_pg"), 1: ((0, 1), "1", "row0"), 2: ((2, 3), "2", "row1"),
                              3: ((0, 2), "3", "col0"), 4: ((1, 3), "4", "col1")}
            assert diagnose(b) == []
        assert {g.group for g in _records(imported["groups", form], 3, GroupInfo)} == {0, 2, 4}
        calls = _records(imported["groups", form], 3, Collective)
        assert [(c.op, c.group, c.seq) for c in calls] == [
            ("all_reduce", 2, 0), ("all_gather", 4, 0), ("all_reduce", 2, 1), ("all_gather", 4, 1), ("broadcast", 0, 0)]
        assert calls[0].in_dtypes == ("float64",)


def test_skipped_collective_is_diagnosed_as_hang_through_the_cli(imported, tmp_path):
    """Rank 1 skipped the all_reduce that ranks 0 and 2 wait in: `diagnose` names it."""
    out = tmp_path / "skip.prism"
    r = run_cli("import", "fr", FR / "skip" / "pickle", "-o", out, "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["ranks"] == 3 and str(out) in r.stderr
    r = run_cli("diagnose", out, "--json")
    assert r.returncode == 5, r.stderr
    hangs = [f for f in json.loads(r.stdout)["findings"] if f["kind"] == "hang"]
    assert [(f["ranks"], f["group"], f["seq"], f["details"]["op"]) for f in hangs] == [([1], 0, 2, "all_reduce")]
    assert hangs[0]["details"]["entered"] == [0, 2]
    r = run_cli("info", out)
    assert r.returncode == 0 and "Flight Recorder" in r.stdout
    r = run_cli("replay", out, "--ranks", "0", "--run-recorded-command")  # a dump names no command
    assert r.returncode == 2 and "Flight Recorder" in r.stderr and "Traceback" not in r.stderr


def test_help_teaches_the_command():
    r = run_cli("import", "fr", "-h")
    assert r.returncode == 0, r.stderr
    assert "Example: prism-rr import fr" in r.stdout and "Flight Recorder" in r.stdout


def test_skip_scenario_live(tmp_path):
    """torch as installed writes dumps that import: the skip scenario on 2 ranks, run now on gloo."""
    env = dict(os.environ, OMP_NUM_THREADS="1")
    r = subprocess.run([sys.executable, SCRIPT, tmp_path, "skip:2"], capture_output=True, text=True,
                       timeout=120, env=env)
    assert r.returncode == 0, r.stderr[-2000:]
    import_fr([tmp_path / "skip" / "json"], tmp_path / "live.prism")
    with open_bundle(tmp_path / "live.prism") as b:
        hangs = [f for f in diagnose(b) if f.kind == "hang"]
    assert [(f.ranks, f.group, f.seq, f.details["entered"]) for f in hangs] == [((1,), 0, 2, [0])]


def test_export_reads_an_imported_bundle(imported, tmp_path):
    from prism_rr import api

    stats = api.export(imported["groups", "pickle"], tmp_path / "trace.json")
    assert stats["ranks"] == 4 and stats["events"] > 20
    json.loads((tmp_path / "trace.json").read_text())


def test_diff_of_the_pickle_and_json_dumps_of_one_run(imported):
    """Both forms of the same run's dumps issue the same collectives; the skipped one does not."""
    from prism_rr.analysis import diff_bundles

    with open_bundle(imported["groups", "pickle"]) as a, open_bundle(imported["groups", "json"]) as b:
        assert diff_bundles(a, b).same
    with open_bundle(imported["skip", "pickle"]) as a, open_bundle(imported["normal", "pickle"]) as b:
        assert not diff_bundles(a, b).same


def test_tui_opens_an_imported_bundle(imported):
    """The overview, then the collectives screen with the skipped call, in the terminal UI."""
    import asyncio

    from prism_rr.tui.app import PrismApp
    from prism_rr.tui.screens.collectives import CollectivesScreen

    async def run():
        app = PrismApp(imported["skip", "pickle"], None)
        app.animation_level = "none"
        async with app.run_test(size=(120, 40)) as pilot:
            await pilot.pause()
            await app.workers.wait_for_complete()
            await pilot.pause()
            text = "\n".join(strip.text for strip in app.screen._compositor.render_strips())
            assert "3 ranks, 3 recorded" in text and "default_pg" in text
            await pilot.press("3")
            await app.workers.wait_for_complete()
            await pilot.pause()
            assert isinstance(app.screen, CollectivesScreen)
            text = "\n".join(strip.text for strip in app.screen._compositor.render_strips())
            assert "all_reduce" in text
        assert app.bundle_error is None

    asyncio.run(run())


def test_a_wrapped_ring_keeps_only_the_calls_every_rank_holds(tmp_path):
    """A rank whose ring lost its oldest entries (its first record_id is not 0) cannot show
    whether it made the calls before its window: those calls are left out on every rank,
    rather than reported as calls it never entered."""
    dumps = tmp_path / "dumps"
    dumps.mkdir()
    for r in range(2):
        dump = pickle.loads((FR / "normal" / "pickle" / f"nccl_trace_rank_{r}").read_bytes())
        if r == 1:
            dump["entries"] = dump["entries"][5:]  # the first 5 calls fell out of its ring
        (dumps / f"nccl_trace_rank_{r}").write_bytes(pickle.dumps(dump, protocol=2))
    note = import_fr([dumps], tmp_path / "w.prism")
    assert note["trimmed"] == 5
    assert [c.seq for c in _records(tmp_path / "w.prism", 0, Collective)] == list(range(5, 15))
    with open_bundle(tmp_path / "w.prism") as b:
        assert diagnose(b) == []


def test_a_gloo_call_left_open_stays_open_whatever_pg_status_counts(tmp_path):
    """gloo's pg_status counts sends and receives with its collectives, which its entries'
    collective seqs do not (tests/replayer/scripts/fr_ops.py shows both): the counter may
    pass the seq of a call still waiting. On gloo an entry completed when it retired."""
    dumps = tmp_path / "dumps"
    dumps.mkdir()
    for r in range(2):
        dump = pickle.loads((FR / "hang" / "pickle" / f"nccl_trace_rank_{r}").read_bytes())
        for st in dump["pg_status"].values():
            st["last_completed_collective"] = str(int(st["last_completed_collective"]) + 3)  # three sends
        (dumps / f"nccl_trace_rank_{r}").write_bytes(pickle.dumps(dump, protocol=2))
    import_fr([dumps], tmp_path / "h.prism")
    open_calls = [(c.group, c.seq) for c in _records(tmp_path / "h.prism", 0, Collective) if c.end_ns is None]
    assert open_calls == [(1, 3)]  # rank 0's all_reduce on the second group, which rank 1 skipped
    with open_bundle(tmp_path / "h.prism") as b:
        assert [(f.kind, f.ranks, f.group, f.seq) for f in diagnose(b)] == [("hang", (1,), 1, 3)]


def _nccl_entry(record_id, name, seq, *, p2p=False, state="completed", pg=("0", "default_pg"), t=0, **more):
    """An entry as ProcessGroupNCCL records it (the fields of torch's FlightRecorder.hpp):
    states, discovered start and end times, kernel durations and p2p names that gloo's
    dumps lack."""
    created = 1_700_000_000_000_000_000 + t * 1_000_000
    e = {"record_id": record_id, "pg_id": 0, "process_group": pg, "collective_seq_id": 0 if p2p else seq,
         "p2p_seq_id": seq if p2p else 0, "op_id": record_id + 1, "profiling_name": name, "time_created_ns": created,
         "input_sizes": [[1024]], "input_dtypes": ["BFloat16"], "output_sizes": [[1024]], "output_dtypes": ["BFloat16"],
         "state": state, "retired": state == "completed", "is_p2p": p2p, "timeout_ms": 600000,
         "time_discovered_started_ns": created + 1000 if state != "scheduled" else None,
         "time_discovered_completed_ns": created + 51000 if state == "completed" else None,
         "duration_ms": 0.05 if state == "completed" else None}
    e.update(more)
    return e


def test_nccl_fields_times_states_and_sends(tmp_path):
    """pg_config's ranks, completion times, a collective that started and never completed,
    sends and receives by group rank, and the ops of a coalesced call that share its seq."""
    row = ("5", "tp")
    dumps = tmp_path / "dumps"
    dumps.mkdir()
    for r in range(2):
        peer = 1 - r
        entries = [
            _nccl_entry(0, "nccl:all_reduce", 1, t=0),
            _nccl_entry(1, "nccl:_allgather_base", 1, pg=row, t=1),
            _nccl_entry(2, f"nccl:send {r}->{peer}" if r == 0 else f"nccl:recv {r}<-{peer}", 1, p2p=True, pg=row, t=2),
            _nccl_entry(3, "nccl:all_reduce", 2, t=3),
            _nccl_entry(4, "nccl:all_reduce", 2, t=3),  # a coalesced call's second op
            _nccl_entry(5, "nccl:broadcast", 3, state="started", t=4, retired=True),  # timed out
        ]
        dump = {"version": "2.4", "pg_config": {"0": {"name": "0", "desc": "default_pg", "ranks": "[0, 1]"},
                                                "5": {"name": "5", "desc": "tp", "ranks": "[0, 1]"}},
                "pg_status": {"0": {"last_completed_collective": 2}}, "entries": entries}
        (dumps / f"nccl_trace_rank_{r}").write_bytes(pickle.dumps(dump, protocol=2))
    note = import_fr([dumps], tmp_path / "n.prism")
    assert note["coalesced"] == 2 and note["unplaced"] == 0
    with open_bundle(tmp_path / "n.prism") as b:
        assert {g["id"]: (g["name"], tuple(g["ranks"])) for g in b.groups} == {0: ("0", (0, 1)), 5: ("5", (0, 1))}
        recs = [r for r in b.events(1) if type(r) in (Collective, PointToPoint)]
        findings = diagnose(b)
    ar, ag, recv, ar2, bc = recs
    assert (ag.op, ag.group, ag.seq, ag.in_dtypes, ag.in_bytes) == ("all_gather_into_tensor", 5, 0, ("bfloat16",), 2048)
    assert ar.end_ns - ar.start_ns == 51_000
    assert (recv.op, recv.peer, recv.group, recv.seq) == ("recv", 0, 5, 0)
    assert ar2.seq == 1 and bc.end_ns is None
    assert [(f.kind, f.seq) for f in findings] == [("incomplete", 2)]


def test_dumps_read_again_or_by_workers_make_the_same_bundle(imported, tmp_path, monkeypatch):
    """Past KEEP_ENTRIES entries, dumps are read a second time rather than kept, and with
    jobs > 1 worker processes read and write them: the same groups and records, and a
    malformed dump still ends in its one FormatError."""
    from prism_rr.format import fr

    monkeypatch.setattr(fr, "KEEP_ENTRIES", 0)
    import_fr([FR / "groups" / "pickle"], tmp_path / "again.prism")
    import_fr([FR / "groups" / "pickle"], tmp_path / "workers.prism", jobs=2)
    for other in ("again.prism", "workers.prism"):
        with open_bundle(imported["groups", "pickle"]) as a, open_bundle(tmp_path / other) as b:
            assert a.groups == b.groups
            assert all(list(a.events(r)) == list(b.events(r)) for r in range(4))
    bad = tmp_path / "bad"
    bad.mkdir()
    for r in range(2):
        (bad / f"nccl_trace_rank_{r}").write_bytes((FR / "normal" / "pickle" / f"nccl_trace_rank_{r}").read_bytes())
    (bad / "nccl_trace_rank_1").write_bytes(_dump(_entry(time_created_ns="soon")))
    with pytest.raises(FormatError, match="nccl_trace_rank_1: entry 0: field 'time_created_ns'"):
        import_fr([bad], tmp_path / "bad.prism", jobs=2)


# --- hostile input --------------------------------------------------------------------


class Evil:
    def __reduce__(self):
        return (os.system, ("touch /tmp/prism-rr-fr-pwned",))


def _evil_pickles():
    dump = {"version": "2.10", "pg_config": {}, "pg_status": {}, "entries": []}
    yield "reduce-os-system", pickle.dumps(dict(dump, entries=[Evil()]), protocol=2)
    yield "stack-global", pickle.dumps(dict(dump, x=os.system), protocol=4)
    yield "global", pickle.dumps(dict(dump, x=os.system), protocol=0)
    for name, op in (("build", b"b"), ("inst", b"i"), ("obj", b"o"), ("newobj", b"\x81"), ("ext1", b"\x82\x01"),
                     ("persid", b"P0\n"), ("next-buffer", b"\x97")):
        yield name, b"\x80\x02}q\x00(" + op + b"u."


@pytest.mark.parametrize("name,data", list(_evil_pickles()), ids=[n for n, _ in _evil_pickles()])
def test_a_pickle_that_names_or_calls_anything_is_refused(tmp_path, name, data):
    path = tmp_path / "nccl_trace_rank_0"
    path.write_bytes(data)
    with pytest.raises(FormatError, match="opcode refused|pickle offset"):
        read_dump(path)
    assert not Path("/tmp/prism-rr-fr-pwned").exists()


def test_a_pickle_with_a_global_is_refused_with_exit_4(tmp_path):
    """Through the real CLI: one line on stderr, exit 4, nothing run, no bundle."""
    dumps = tmp_path / "dumps"
    dumps.mkdir()
    (dumps / "nccl_trace_rank_0").write_bytes(next(_evil_pickles())[1])
    r = run_cli("import", "fr", dumps, "-o", tmp_path / "x.prism")
    assert r.returncode == 4, r.stderr
    assert "REDUCE opcode refused" in r.stderr or "GLOBAL opcode refused" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr
    assert not Path("/tmp/prism-rr-fr-pwned").exists() and not (tmp_path / "x.prism").exists()


def _nested_lists(depth):
    """[[[...]]] made without a MARK: harmless, for nothing walks a dump's values whole."""
    return b"\x80\x02" + b"]" * depth + b"a" * (depth - 1) + b"."


def _entry(**change):
    e = {"record_id": 0, "pg_id": 0, "process_group": ("0", "default_pg"), "collective_seq_id": 1,
         "p2p_seq_id": 0, "op_id": 1, "profiling_name": "nccl:all_reduce", "time_created_ns": 10,
         "input_sizes": [[4]], "input_dtypes": ["Float"], "output_sizes": [[4]], "output_dtypes": ["Float"],
         "state": "completed", "retired": True, "is_p2p": False}
    e.update(change)
    return e


def _dump(*entries, **change):
    d = {"version": "2.10", "pg_config": {}, "pg_status": {}, "entries": list(entries)}
    d.update(change)
    return pickle.dumps(d, protocol=2)


HOSTILE = {
    "deep-marks": (b"\x80\x02" + b"(" * 1000 + b"t" * 1000 + b".", "nested more than"),
    "deep-lists": (_nested_lists(50_000), "not a map"),
    "deep-tuples": (b"\x80\x02N" + b"\x85" * 100_000 + b".", "tuples nested more than"),
    "deep-tuple-key": (b"\x80\x02}N" + b"\x85" * 100_000 + b"Ns.", "tuples nested more than"),
    "huge-containers": (b"\x80\x02]" + b"}" * 300_000 + b".", "more containers"),
    "truncated": (None, "truncated"),
    "memo-miss": (b"\x80\x02h\x07.", "memo entry"),
    "long4-huge": (b"\x80\x02\x8b\x00\x00\x00\x10" + b"\x01" * 64 + b".", "integer of"),
    "not-a-map": (pickle.dumps([1, 2], protocol=2), "not a map"),
    "entries-not-list": (_dump(entries="x"), "'entries' is not a list"),
    "sizes-a-string": (_dump(_entry(input_sizes="[[4]]")), "'input_sizes'"),
    "time-a-word": (_dump(_entry(time_created_ns="soon")), "'time_created_ns'"),
    "process-group": (_dump(_entry(process_group=5)), "'process_group'"),
    "frames": (_dump(_entry(frames=[{"filename": 3}])), "'frames'"),
    "negative-size": (_dump(_entry(output_sizes=[[-1]])), "'output_sizes'"),
    "json-list": (b"[1, 2]", "not a map"),
    "text": (b"\x00hello", "unknown opcode"),
    "json-nan": (b'{"version": NaN}', "not a number"),
    "json-deep": (b'{"a":' + b"[" * 80_000 + b"]" * 80_000 + b"}", "nested"),
    "json-many-containers": (b'{"a":[' + b"[]," * 200_000 + b"[]]}", "more containers"),
    "many-tuples": (b"\x80\x02(" + b"N\x85" * 100_000 + b"l.", "more containers"),
    "json-broken": (b'{"version": "2.10", "entries": [', "not JSON"),
    "empty": (b"", "empty"),
}


def _shared_bomb():
    """Entries: a list of 64 references to a list of 64 references to ... 8 deep, 64**8
    values to whatever walks it whole."""
    out = b"\x80\x02}X\x07\x00\x00\x00entries]q\x000"
    for _ in range(8):
        out += b"](" + b"h\x00" * 64 + b"eq\x000"
    return out + b"h\x00s."


HOSTILE["shared-reference-bomb"] = (_shared_bomb(), "entry 0: a list where a map belongs")


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_hostile_dumps_end_in_one_format_error(tmp_path, case):
    data, message = HOSTILE[case]
    if data is None:  # truncated: a real dump cut short
        data = (FR / "normal" / "pickle" / "nccl_trace_rank_0").read_bytes()[:1500]
    path = tmp_path / ("nccl_trace_rank_0.json" if case.startswith("json") else "nccl_trace_rank_0")
    path.write_bytes(data)
    with pytest.raises(FormatError, match=message) as err:
        import_fr([path], tmp_path / "x.prism")
    assert "nccl_trace_rank_0" in str(err.value) and "\n" not in str(err.value)
    assert not (tmp_path / "x.prism").exists()


def test_safe_loads_reads_what_pickle_reads():
    """Every real dump, and plain values in each protocol that writes them without globals."""
    for path in sorted(FR.glob("*/pickle/*")):
        data = path.read_bytes()
        assert safe_loads(data, path.name) == pickle.loads(data)
    value = {"a": [1, -2, (3, 4.5)], "b": None, "c": True, "d": "ü" * 300, "e": 2**62, "f": -(2**63), "g": [[], {}]}
    for protocol in range(6):
        data = pickle.dumps(value, protocol=protocol)
        assert safe_loads(data, "x") == value


def test_usage_errors(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(UsageError, match="no Flight Recorder dumps"):
        import_fr([empty], tmp_path / "x.prism")
    with pytest.raises(UsageError, match="rank 0 has two dumps"):
        import_fr([FR / "normal" / "pickle", FR / "normal" / "json"], tmp_path / "x.prism")
    with pytest.raises(UsageError, match="no such file"):
        import_fr([tmp_path / "missing"], tmp_path / "x.prism")
