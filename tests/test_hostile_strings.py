"""A stranger's bundle never drives the terminal (issue 29).

Every string field of the format (the manifest, the rank info, the groups, every record's
string fields, markers, stacks, a crash report, and the entries of imported Flight
Recorder dumps) carries terminal escape sequences (OSC title, clear screen, the 8-bit CSI),
bidi overrides, Rich/Textual markup (`[reverse]`, `[blink]`, `[@click=app.quit]`) and, in
places, a value far too long for a line; every checksum is valid. Every inspecting command
runs as a user runs it, in a fresh interpreter, and the TUI under `run_test()` visits every
screen, the details pane, the palette and a screenshot. No raw control or bidi character
reaches stdout, stderr or the screen, markup is shown as text, and `--json` gives the
values whole, escaped as `format/` hands them out (prism_rr.text.safe).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import pty
import select
import subprocess
import sys
import time
from pathlib import Path
from typing import get_type_hints

import pytest

from cli_helpers import run_cli
from prism_rr.format import layout, pack
from prism_rr.format.records import RECORD_TYPES, Collective, Compute, GroupInfo, Marker, Memory, PointToPoint
from prism_rr.format.spool import encode_frame, spool_header, spool_path
from prism_rr.text import safe
from prism_rr.format.synthetic import synthetic_records

sys.path.insert(0, str(Path(__file__).parent / "tui"))
from tui_helpers import make_app, screen_text, settle  # noqa: E402

ESCAPES = "\x1b]0;PWNED\x07\x1b[2J\x9b31m"  # retitle the window, clear the screen, 8-bit CSI
BIDI = "\u202etxt.exe\u2066"  # right-to-left override, left-to-right isolate
MARKUP = "[reverse]MARKUP[/reverse][blink]BLINK[/blink][@click=app.quit]QUIT[/]"
LONG = "L" * 5000
WORLD = 4


def evil(where: str) -> str:
    """A payload that names the field it was put in."""
    return f"F:{where}{ESCAPES}{MARKUP}{BIDI}"


def raw_controls(text: str, allowed: str = "\n") -> list[str]:
    """The characters of `text` that would drive a terminal or reorder a line."""
    return sorted({repr(c) for c in text if not c.isprintable() and c not in allowed})


def _string_fields(cls) -> list[str]:
    """The record's fields that hold a string or strings (every one the format has)."""
    hints = get_type_hints(cls)
    return [f.name for f in dataclasses.fields(cls) if "str" in str(hints[f.name])]


def _hostile_record(rec, rank: int):
    """`rec` with every string field a payload (an op stays an op on rank 0 and 2, so that
    calls still match and rank 1's differ: a mismatch finding quotes both)."""
    changes = {}
    for name in _string_fields(type(rec)):
        value = getattr(rec, name)
        if name == "op" and (rank != 1 or type(rec) is PointToPoint):
            continue
        where = f"{type(rec).__name__}.{name}"
        if isinstance(value, tuple):
            changes[name] = tuple(evil(f"{where}[{i}]") for i in range(len(value) or 1))
        elif name == "op":
            changes[name] = value + evil(where)
        else:
            changes[name] = evil(where)
    return dataclasses.replace(rec, **changes)


CRASH = ("Fatal Python error: Segmentation fault" + ESCAPES + "\n\nCurrent thread 0x00007f0000000001 "
         "(most recent call first):\n  File \"/x/" + evil("crash.file") + ".py\", line 12 in "
         + evil("crash.function")[:150] + "\n")


def _hostile_info(rank: int) -> dict:
    info = {key: evil(f"info.{key}") for key in ("backend", "device", "device_name", "hostname", "cwd",
                                                  "executable", "payload", "slice_by")}
    info.update(world_size=WORLD, rank=rank, argv=["train.py", evil("info.argv"), LONG],
                orig_argv=["python", "train.py", evil("info.orig_argv"), LONG],
                env={evil("env.key"): evil("env.value"), "OMP_NUM_THREADS": evil("env.omp")},
                versions={"torch": evil("versions.torch"), evil("versions.key"): "1"},
                recorder_failed={"step": 1, "reason": evil("recorder_failed.reason")})
    if rank == 3:
        info["crash"] = {"text": CRASH, "bytes": len(CRASH)}
    return info


def _write_hostile(spool_dir: Path, ranks, *, seed: int = 0, info_extra: dict | None = None) -> Path:
    spool_dir.mkdir(parents=True, exist_ok=True)
    for rank in ranks:
        recs = [_hostile_record(r, rank) for r in synthetic_records(rank, WORLD, 160, seed=seed)]
        calls = [r for r in recs if type(r) is Collective]
        last = recs[-1]
        t, step = last.start_ns + 1000, last.step
        recs += [
            Compute(start_ns=t, end_ns=t + 10, step=step, name=evil("Compute.name")),
            Memory(start_ns=t, end_ns=t, step=step, mem_alloc=1, mem_peak=2, name=evil("Memory.name")),
            Marker(start_ns=t, end_ns=t, step=step, name=evil("Marker.name"), text=evil("Marker.text")),
            Marker(start_ns=t, end_ns=t, step=step, name="call_failed", value=calls[-1].seq,
                   text=evil("call_failed.text") + LONG),
        ]
        if rank == 1:  # (not in rank 2's data-parallel group, whose hang stays one)
            recs.append(Marker(start_ns=t, end_ns=t, step=step, name="recorder_failed", text=evil("recorder_failed.text")))
        if rank == 2:  # entered and never completed: a hang, quoting its op
            recs.append(dataclasses.replace(calls[-1], start_ns=t + 100, end_ns=None, seq=calls[-1].seq + 1,
                                            op="all_reduce" + evil("hung.op")))
        parts = [spool_header(rank), encode_frame(layout.FRAME_RANK_INFO, rank, 0,
                                                  info={**_hostile_info(rank), **(info_extra or {})})]
        for i in range(0, len(recs), 64):
            parts.append(encode_frame(layout.FRAME_EVENTS, rank, 1 + i // 64, records=recs[i : i + 64]))
        spool_path(spool_dir, rank).write_bytes(b"".join(parts))
    (spool_dir / "run.json").write_text(json.dumps({
        "hostname": evil("run.hostname"), "command": [evil("run.command")], "cwd": evil("run.cwd"),
        evil("run.key"): evil("run.value")}))
    return spool_dir


MANIFEST = {
    "tool": evil("manifest.tool") + LONG,
    "created_unix_ns": 0,
    "features_optional": ["summaries", evil("manifest.feature")],
    "nodes": [{"node": evil("nodes.node"), "hostname": evil("nodes.hostname"), "ranks": [0, 1, 2, 3]}],
    "clock": {"method": evil("clock.method"), "max_error_ns": 5, "ranks_without_offset": []},
    "flight": {"trigger": evil("flight.trigger"), "rank": 1, "step": 2, "hostname": evil("flight.hostname"),
               "details": {evil("flight.detail.key"): evil("flight.detail.value")}},
}


def _fr_dumps(d: Path) -> Path:
    """Flight Recorder dumps (JSON) whose every string is a payload (within the importer's
    bounds: dtype names of 64 characters, states of 32)."""
    d.mkdir(parents=True, exist_ok=True)
    pg = [evil("fr.pg.name"), evil("fr.pg.desc")]
    for r in range(2):
        entries = [{
            "record_id": i, "pg_id": 0, "process_group": pg, "collective_seq_id": i + 1, "p2p_seq_id": 0,
            "op_id": i + 1, "profiling_name": "gloo:" + evil("fr.op")[:50], "time_created_ns": 10 + i,
            "input_sizes": [[4]], "input_dtypes": [evil("fr.dtype")[:60]], "output_sizes": [[4]],
            "output_dtypes": ["Float"], "state": ESCAPES[:20], "retired": True, "is_p2p": False,
            "frames": [{"filename": "/u/" + evil("fr.frame.file") + ".py", "line": 3,
                        "name": evil("fr.frame.name")}],
        } for i in range(3 if r == 0 else 2)]  # rank 1 never enters the third: a hang
        dump = {"version": evil("fr.version"), "comm_lib_version": evil("fr.lib"),
                "pg_config": {pg[0]: {"name": pg[0], "desc": pg[1], "ranks": "[0, 1]"}},
                "pg_status": {}, "entries": entries}
        (d / f"nccl_trace_rank_{r}.json").write_text(json.dumps(dump))
    return d


@pytest.fixture(scope="module")
def hostile(tmp_path_factory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("hostile")
    out = {"bundle": d / "evil.prism", "other": d / "other.prism", "replay": d / "replay.prism"}
    pack(_write_hostile(d / "evil.d", range(WORLD)), out["bundle"], manifest_extra=MANIFEST)
    pack(_write_hostile(d / "other.d", range(WORLD), seed=5), out["other"], manifest_extra=MANIFEST)
    replay_of = {"replay_of": {"bundle": f"/x/{evil('replay_of.bundle')}.prism", "ranks": [0, 1], "timing": "live"}}
    pack(_write_hostile(d / "replay.d", (0, 1), seed=3, info_extra=replay_of), out["replay"], manifest_extra=MANIFEST)
    out["fr"] = _fr_dumps(d / "fr")
    return out


def test_every_string_field_of_every_record_is_swept():
    """The sweep covers every string field the records have, now and when one is added."""
    swept = {cls.__name__: _string_fields(cls) for cls in RECORD_TYPES.values()}
    assert swept["Collective"] == ["op", "in_dtypes", "out_dtypes", "reduce_op", "stack"]
    assert swept["PointToPoint"] == ["op", "dtypes", "stack"]
    assert swept["Marker"] == ["name", "text"] and swept["GroupInfo"] == ["name", "text", "backend"]
    assert swept["Compute"] == ["name"] and swept["Memory"] == ["name"] and swept["Step"] == []


def _commands(h: dict[str, Path], out: Path) -> list[tuple[str, ...]]:
    b, other, replay = (str(h[k]) for k in ("bundle", "other", "replay"))
    return [
        ("info", b), ("info", b, "--json"), ("verify", b), ("diagnose", b), ("diagnose", b, "--json"),
        ("diagnose", b, "--window", "100"), ("analyze", b), ("analyze", b, "--json"),
        ("diff", b, other), ("diff", b, other, "--json"), ("diff", b, replay), ("diff", replay, b),
        ("export", b, "-o", str(out / "t.json")), ("export", b, "--format", "chakra", "-o", str(out / "et")),
        ("export", b, "--format", "parquet", "-o", str(out / "pq")), ("redact", b, "-o", str(out / "r.prism")),
        ("scale", b, "--dp", "4", "--mesh", "dp=2,tp=2", "-o", str(out / "big.prism")),
        ("replay", b, "--ranks", "0"),  # no command, no terminal: refused before anything runs
        ("import", "fr", str(h["fr"]), "-o", str(out / "fr.prism"), "--json"),
        ("info", str(out / "fr.prism")), ("diagnose", str(out / "fr.prism")), ("diff", str(out / "fr.prism"), b),
    ]


@pytest.mark.timeout(600)
def test_no_command_puts_a_raw_control_character_on_the_terminal(hostile, tmp_path):
    seen = {}
    for cmd in _commands(hostile, tmp_path):
        r = run_cli(*cmd, timeout=240, stdin=subprocess.DEVNULL)
        shown = f"{' '.join(cmd[:3])}: exit {r.returncode}\nstdout: {r.stdout[-1500:]!r}\nstderr: {r.stderr[-1500:]!r}"
        assert r.returncode in (0, 2, 5, 6), shown
        assert "Traceback" not in r.stderr, shown
        assert raw_controls(r.stdout) == [] and raw_controls(r.stderr) == [], shown
        seen[cmd] = r
    b = str(hostile["bundle"])
    # what a person reads says what the bundle holds, escaped, and cuts what is too long
    info = seen[("info", b)].stdout
    assert "F:manifest.tool\\x1b]0;PWNED\\x07\\x1b[2J\\x9b31m[reverse]MARKUP" in info and "\\u202e" in info
    assert "more characters]" in info and max(map(len, info.splitlines())) < 600
    assert "F:recorder_failed.reason" in info and "F:nodes.node" in info
    people = seen[("diagnose", b)].stdout
    assert "[mismatch]" in people and "[hang]" in people and "[crashed]" in people
    assert "F:Collective.op\\x1b]0;PWNED" in people and "F:Collective.stack[0]" in people
    assert "F:hung.op" in people and "F:call_failed.text" in people and "more characters]" in people
    assert "F:Collective.op" in seen[("diff", b, str(hostile["other"]))].stdout or \
        "collective sequences match" in seen[("diff", b, str(hostile["other"]))].stdout
    assert "F:fr.version" in seen[("import", "fr", str(hostile["fr"]), "-o", str(tmp_path / "fr.prism"),
                                   "--json")].stderr
    # JSON gives the values as format/ hands them out: whole (never cut), escaped, so a
    # script that prints one cannot drive a terminal either
    facts = json.loads(seen[("info", b, "--json")].stdout)
    assert facts["tool"] == safe(MANIFEST["tool"]) and facts["nodes"][0]["node"] == safe(evil("nodes.node"))
    assert facts["recorder_failures"][0]["reason"] == safe(evil("recorder_failed.reason"))
    assert "\\x1b]0;PWNED" in facts["tool"] and len(facts["tool"]) > len(LONG)
    found = json.loads(seen[("diagnose", b, "--json")].stdout)["findings"]
    mismatch = next(f for f in found if f["kind"] == "mismatch")
    assert mismatch["stack"][0] == safe(evil("Collective.stack[0]"))


def test_errors_that_quote_a_bundle_quote_it_safely(hostile, tmp_path):
    """A required feature, a rank info keyed by a string, a dump's field: exit 4, one line,
    the offending value shown escaped."""
    sys.path.insert(0, str(Path(__file__).parent / "format"))
    import fuzz

    cases = {
        "feature": (layout.SEC_MANIFEST, {**_manifest(hostile["bundle"]),
                                          "features_required": ["columnar-chunks", evil("feature")]}),
        "rank-key": (layout.SEC_RANK_INFO, {evil("rank-key"): {}}),
    }
    for name, (sid, value) in cases.items():
        parts = fuzz.Parts(hostile["bundle"].read_bytes())
        parts.get(sid).body = fuzz.zc(fuzz.packb(value))
        path = tmp_path / f"{name}.prism"
        path.write_bytes(parts.build())
        for cmd in ("info", "verify", "diagnose", "tui"):
            r = run_cli(cmd, path, stdin=subprocess.DEVNULL)
            assert r.returncode == 4, (name, cmd, r.stderr)
            lines = r.stderr.strip().splitlines()
            assert len(lines) == 1 and lines[0].startswith("prism-rr: error: "), (name, cmd, r.stderr)
            assert raw_controls(r.stderr) == [] and f"F:{name}\\x1b]0;PWNED" in r.stderr, (name, cmd, r.stderr)


def _manifest(path: Path) -> dict:
    from prism_rr.format import open_bundle

    with open_bundle(path) as b:
        return dict(b.manifest)


def test_replay_shows_the_recorded_command_whole_and_escaped(hostile):
    """Before running the command a bundle names, replay shows it: every character that
    could draw on the terminal escaped, nothing cut (a cut command would hide what runs);
    the user says no, and nothing runs."""
    pid, fd = pty.fork()
    if pid == 0:
        os.environ["TERM"] = "dumb"
        os.execv(sys.executable, [sys.executable, "-m", "prism_rr.cli", "replay", str(hostile["bundle"]),
                                  "--ranks", "0"])
    out, sent, t0 = b"", False, time.monotonic()
    status = None
    try:
        while time.monotonic() - t0 < 120:
            if not sent and b"run it? [y/N]" in out:
                os.write(fd, b"n\n")
                sent = True
            ready, _, _ = select.select([fd], [], [], 0.5)
            if ready:
                try:
                    piece = os.read(fd, 65536)
                except OSError:
                    break
                if not piece:
                    break
                out += piece
    finally:
        done, status = os.waitpid(pid, os.WNOHANG)
        if not done:
            os.kill(pid, 9)
            _, status = os.waitpid(pid, 0)
    text = out.decode("utf-8", "replace")
    assert sent and os.waitstatus_to_exitcode(status) == 2, text[-3000:]
    assert raw_controls(text, allowed="\r\n") == [], text[-3000:]
    assert "F:info.orig_argv\\x1b]0;PWNED\\x07" in text and LONG in text  # whole


def test_flight_lines_and_api_lines_are_safe(hostile):
    from prism_rr import api

    result = api.RecordResult(output=hostile["bundle"], spool_dir=hostile["bundle"], exit_code=0,
                              flight=(hostile["bundle"],),
                              recorder_failures=({"rank": 1, "step": 2, "reason": evil("reason")},))
    lines = api.flight_lines(result) + result.failure_lines()
    assert "F:flight.trigger\\x1b]0;PWNED" in lines[0] and "F:reason\\x1b" in lines[1]
    assert raw_controls("\n".join(lines)) == []
    lines = api.info(hostile["bundle"]).lines() + api.diagnose(hostile["bundle"]).lines()
    lines += api.diff(hostile["bundle"], hostile["other"]).lines() + api.recorded_command_lines(hostile["bundle"])
    assert raw_controls("\n".join(lines)) == []


# --- the terminal UI ---------------------------------------------------------------------


def _styles_of(app, word: str) -> list:
    """The styles of every drawn segment whose text holds `word`."""
    out = []
    for strip in app.screen._compositor.render_strips():
        for seg in strip:
            if word in seg.text:
                out.append(seg.style)
    return out


def _pane_text(app) -> str:
    """The details pane's text, every line whole (the screen shows what fits its width)."""
    from prism_rr.tui.widgets.detail import SpanDetail

    return app.screen.query_one(SpanDetail).text(1000)


def _check_screen(app, where: str) -> str:
    text = screen_text(app)
    assert raw_controls(text) == [], (where, raw_controls(text))
    for word, attribute in (("MARKUP", "reverse"), ("BLINK", "blink")):
        for style in _styles_of(app, word):
            assert style is None or not getattr(style, attribute), (where, word, style)
    return text


def test_the_tui_shows_bundle_strings_as_text_on_every_screen(hostile):
    from textual.command import CommandList, CommandPalette

    from prism_rr.tui.screens.compare import CompareScreen
    from prism_rr.tui.screens.overview import OverviewScreen

    async def browse():
        app = make_app(hostile["bundle"], hostile["replay"])
        async with app.run_test(size=(200, 60)) as pilot:
            await settle(pilot)
            await pilot.pause(0.2)
            await settle(pilot)
            text = _check_screen(app, "overview")
            assert isinstance(app.screen, OverviewScreen)
            # the two cases the issue names: a group description and a tool line, as text
            assert "[reverse]MARKUP" in text and "F:GroupInfo.text" in text
            assert "F:manifest.tool\\x1b]0;PWNED\\x07\\x1b[2J\\x9b31m[reverse]MARKUP[/reverse][blink]BLINK" in text
            assert "F:versions.torch" in text and "F:info.argv" in text
            assert app.findings, "the diagnosis ran"
            # a click on the text [@click=app.quit] is a click on text: the app goes on
            lines = text.splitlines()
            row = next(i for i, line in enumerate(lines) if "F:manifest.tool" in line and "QUIT" in line)
            await pilot.click(offset=(lines[row].index("QUIT") + 1, row))
            await pilot.pause()
            assert app.return_code is None and app.is_running
            # every finding's sentence, highlighted in turn
            table = app.screen.query_one("#findings")
            table.focus()
            for _ in range(len(app.findings)):
                await pilot.press("down")
                await pilot.pause()
                _check_screen(app, "findings")
            # the timeline and the details of a call whose op, dtypes and stack are payloads
            await pilot.press("2")
            await settle(pilot, app.screen.timeline)
            app.screen.goto(1, 1, 0)
            await settle(pilot, app.screen.timeline)
            _check_screen(app, "details")
            text = _pane_text(app)  # the pane whole, as its copy key (c) takes it
            assert raw_controls(text) == [], raw_controls(text)
            assert "F:Collective.stack[0]\\x1b]0;PWNED\\x07\\x1b[2J\\x9b31m[reverse]MARKUP" in text
            assert "[@click=app.quit]QUIT[/]" in text and "F:GroupInfo.text" in text
            hung = next(r for r in app.model.load(2).records if type(r) is Collective and r.end_ns is None)
            app.screen.goto(2, hung.group, hung.seq)  # the call rank 2 never completed
            await settle(pilot, app.screen.timeline)
            _check_screen(app, "details of the hang")
            # the collectives of a group whose name, description and backend are payloads
            await pilot.press("3")
            await settle(pilot)
            for _ in range(4):
                text = _check_screen(app, "collectives")
                assert "F:GroupInfo.text" in text and "[blink]BLINK[/blink]" in text
                await pilot.press("right_square_bracket")
                await settle(pilot)
            # recorded against a replay that names a hostile bundle
            await pilot.press("4")
            await settle(pilot)
            assert isinstance(app.screen, CompareScreen)
            text = _check_screen(app, "compare")
            # (the bundle it names, by its file name: after the last / of the payload's markup)
            assert "is a replay of" in text and "\\u202etxt.exe\\u2066.prism" in text
            await pilot.press("5")
            await settle(pilot)
            _check_screen(app, "heat map")
            await pilot.press("f1")
            await settle(pilot)
            _check_screen(app, "help")
            await pilot.press("f1")
            await pilot.press("1")
            await settle(pilot)
            # the palette: its discovery list, then a search, both naming groups and ops
            await pilot.press("ctrl+p")
            await pilot.pause(0.5)
            assert isinstance(app.screen, CommandPalette)
            palette = app.screen.query_one(CommandList)
            prompts = [str(palette.get_option_at_index(i).prompt) for i in range(palette.option_count)]
            assert any("F:GroupInfo.text\\x1b]0;PWNED" in p and "[reverse]MARKUP" in p for p in prompts), prompts
            _check_screen(app, "palette")
            await pilot.press(*"group")
            await pilot.pause(1.0)
            _check_screen(app, "palette search")
            await pilot.press("escape")
            await pilot.pause()
            svg = app.export_screenshot()
            assert raw_controls(svg) == [] and "MARKUP" in svg
            return app

    app = asyncio.run(browse())
    assert app.return_code in (None, 0) and app.bundle_error is None


def test_the_tui_opens_an_imported_dump_of_payloads(hostile, tmp_path):
    from prism_rr import api

    out = tmp_path / "fr.prism"
    api.import_fr(hostile["fr"], out)

    async def browse():
        app = make_app(out)
        async with app.run_test(size=(160, 50)) as pilot:
            await settle(pilot)
            await pilot.pause(0.2)
            await settle(pilot)
            text = _check_screen(app, "imported overview")
            assert "F:fr.pg.desc" in text
            await pilot.press("2")
            await settle(pilot, app.screen.timeline)
            call = next(r for r in app.model.load(0).records if type(r) is Collective)
            app.screen.goto(0, call.group, call.seq)
            await settle(pilot, app.screen.timeline)
            _check_screen(app, "imported details")
            await pilot.press("3")
            await settle(pilot)
            _check_screen(app, "imported collectives")

    asyncio.run(browse())
