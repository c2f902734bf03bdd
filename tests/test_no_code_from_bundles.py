"""A bundle never runs code: no command that reads one runs, imports or unpickles what it names.

The crafted bundle's rank info names a command that touches a marker file, a working
directory full of modules that touch it when imported (sitecustomize, usercustomize,
msgpack, zstandard, typer, textual, torch), and an environment that would load them
(PYTHONPATH, PYTHONSTARTUP, PATH, LD_PRELOAD, NCCL_NET_PLUGIN); one of its blobs is a pickle
that touches it when loaded. Each command runs as a user runs it, in a fresh interpreter.
"""

from __future__ import annotations

import dataclasses
import pickle
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from prism_rr.format import layout, pack
from prism_rr.format.blobs import write_blob
from prism_rr.format.records import Collective
from prism_rr.format.spool import encode_frame, spool_path
from prism_rr.format.synthetic import synthetic_records

ROOT = Path(__file__).resolve().parent.parent
MODULES = ("sitecustomize", "usercustomize", "msgpack", "zstandard", "typer", "textual", "torch")


class _Touch:
    """Unpickling this touches `path`."""

    def __init__(self, path: str):
        self.path = path

    def __reduce__(self):
        return (Path.touch, (Path(self.path),))


def _evil_dir(evil: Path, marker: Path) -> None:
    """Everything a careless reader could pick up from the bundle's cwd or env."""
    evil.mkdir(parents=True, exist_ok=True)
    touch = f"import pathlib; pathlib.Path({str(marker)!r}).touch()\n"
    for name in MODULES:
        (evil / f"{name}.py").write_text(touch)
    (evil / "prism_rr").mkdir(exist_ok=True)
    (evil / "prism_rr" / "__init__.py").write_text(touch)
    for exe in ("python", "python3", "torchrun", "sh"):
        script = evil / exe
        script.write_text(f"#!/bin/sh\ntouch {marker}\n")
        script.chmod(0o755)


def hostile_info(rank: int, world: int, evil: Path, marker: Path) -> dict:
    """A rank info as a stranger could write it."""
    # ... and a terminal escape that would hide the rest of the line, were it printed raw
    touch = f"import pathlib; pathlib.Path({str(marker)!r}).touch()  # \x1b[8m"
    return {
        "world_size": world, "rank": rank, "backend": "gloo", "device": "cpu",
        "argv": ["-c", touch], "orig_argv": [sys.executable, "-c", touch],
        "executable": sys.executable, "cwd": str(evil),
        "env": {
            "PYTHONPATH": str(evil), "PYTHONSTARTUP": str(evil / "sitecustomize.py"), "PATH": str(evil),
            "LD_PRELOAD": str(evil / "libevil.so"), "LD_LIBRARY_PATH": str(evil),
            "NCCL_NET_PLUGIN": str(evil / "libevil.so"), "BASH_ENV": str(evil / "python"),
            "PYTHONHOME": str(evil), "PRISM_RR_REPLAY": "{}", "NCCL_PROTO": f"$(touch {marker})",
            "OMP_NUM_THREADS": "3", "NCCL_ALGO": "Ring",
        },
    }


def crafted_spools(spool_dir: Path, evil: Path, marker: Path, world: int = 4) -> Path:
    """Spools of a synthetic dp x tp run whose rank infos are hostile and whose first
    collective's payload is a pickle."""
    _evil_dir(evil, marker)
    spool_dir.mkdir(parents=True, exist_ok=True)
    bomb = write_blob(spool_dir, pickle.dumps(_Touch(str(marker))))
    for rank in range(world):
        recs = list(synthetic_records(rank, world, 120, payload=True, spool_dir=spool_dir))
        first = next(i for i, r in enumerate(recs) if isinstance(r, Collective))
        recs[first] = dataclasses.replace(recs[first], blob_in=(bomb,), blob_out=(bomb,))
        head = layout.SPOOL_HEADER.pack(layout.SPOOL_MAGIC, layout.MAJOR, layout.MINOR, rank, 0)
        parts = [head[:-4] + layout.crc32(head[:-4]).to_bytes(4, "little"),
                 encode_frame(layout.FRAME_RANK_INFO, rank, 0, info=hostile_info(rank, world, evil, marker))]
        for i in range(0, len(recs), 64):
            parts.append(encode_frame(layout.FRAME_EVENTS, rank, 1 + i // 64, records=recs[i : i + 64]))
        spool_path(spool_dir, rank).write_bytes(b"".join(parts))
    return spool_dir


def crafted_bundle(tmp: Path) -> tuple[Path, Path, Path]:
    """(bundle, its spool directory, the marker that must never appear)."""
    marker = tmp / "pwned"
    spools = crafted_spools(tmp / "crafted.prism.d", tmp / "evil", marker)
    out = tmp / "crafted.prism"
    pack(spools, out)
    return out, spools, marker


@pytest.fixture(scope="module")
def crafted(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("crafted")
    bundle, spools, marker = crafted_bundle(tmp)
    user = tmp / "user"  # where the user runs prism-rr: nothing of the bundle's
    user.mkdir()
    return bundle, spools, marker, user


def _cli(user: Path, *args, timeout: int = 120):
    return subprocess.run([sys.executable, "-m", "prism_rr.cli", *map(str, args)], cwd=user,
                          stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=timeout)


TUI = textwrap.dedent("""
    import asyncio, sys
    from prism_rr.tui.app import PrismApp

    async def main():
        app = PrismApp(sys.argv[1], None)
        app.animation_level = "none"
        async with app.run_test(size=(120, 40)) as pilot:
            for key in "1234":
                await pilot.press(key)
                await pilot.pause()
            await app.workers.wait_for_complete()
            await pilot.pause()

    asyncio.run(main())
""")

# (name, arguments after `prism-rr`, exit codes a user could see): {B} the bundle,
# {D} its spools, {O} an output directory.
COMMANDS = [
    ("info", ["info", "{B}"], (0,)),
    ("info --json", ["info", "{B}", "--json"], (0,)),
    ("verify", ["verify", "{B}"], (0,)),
    ("diagnose", ["diagnose", "{B}", "--json"], (0, 5)),
    ("export", ["export", "{B}", "--format", "chrome", "-o", "{O}/trace.json"], (0,)),
    ("scale", ["scale", "{B}", "--dp", "4", "--mesh", "dp=2,tp=2", "-o", "{O}/big.prism"], (0,)),
    ("redact", ["redact", "{B}", "-o", "{O}/public.prism"], (0,)),
    ("pack", ["pack", "{D}", "-o", "{O}/repacked.prism"], (0,)),
    ("repair", ["repair", "{D}"], (0,)),
]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("name,args,codes", COMMANDS, ids=[c[0] for c in COMMANDS])
def test_command_runs_nothing_from_the_bundle(crafted, tmp_path, name, args, codes):
    bundle, spools, marker, user = crafted
    argv = [a.format(B=bundle, D=spools, O=tmp_path) for a in args]
    out = _cli(user, *argv)
    assert out.returncode in codes, out.stderr[-2000:]
    assert not marker.exists(), f"`prism-rr {name}` ran something the bundle named"
    assert "libevil" not in out.stderr + out.stdout  # nobody tried to preload the bundle's library


@pytest.mark.timeout(120)
def test_tui_runs_nothing_from_the_bundle(crafted):
    bundle, _, marker, user = crafted
    out = subprocess.run([sys.executable, "-c", TUI, str(bundle)], cwd=user, stdin=subprocess.DEVNULL,
                         capture_output=True, text=True, timeout=100)
    assert out.returncode == 0, out.stderr[-2000:]
    assert not marker.exists()


@pytest.mark.timeout(60)
def test_replay_without_a_command_runs_nothing(crafted):
    bundle, _, marker, user = crafted
    out = _cli(user, "replay", bundle, "--ranks", "0")
    assert out.returncode == 2
    assert not marker.exists()
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "-- " in lines[0] and "--run-recorded-command" in lines[0]


# What reads a bundle may import, and what it never calls: a grep, as the rule is stated.
_NEVER = re.compile(r"^\s*(import|from)\s+(pickle|cPickle|dill|marshal|shelve|cloudpickle)\b"
                    r"|\btorch\.load\(|\bpickle\.loads?\(|\b__import__\(|\bimport_module\(|\bos\.system\(",
                    re.M)
_RUNNERS = {"localrun.py", "recorder/launch.py", "replayer/launch.py"}  # start the user's command
# Starts prism-rr itself, with a fixed argv (sys.executable -c "...serve()"), to read half
# of a big bundle's ranks; what comes back is msgpack of plain values, never a pickle.
_OWN_CHILD = {"analysis/_build.py"}


def test_no_module_unpickles_evaluates_or_imports_by_name():
    pkg = ROOT / "prism_rr"
    for path in sorted(pkg.rglob("*.py")):
        rel = path.relative_to(pkg).as_posix()
        text = path.read_text()
        assert not _NEVER.search(text), f"prism_rr/{rel}: {_NEVER.search(text).group(0)!r}"
        if rel not in _RUNNERS | _OWN_CHILD:
            assert "subprocess" not in re.sub(r"#.*", "", text), f"prism_rr/{rel} starts processes"
        for m in re.finditer(r"\b(eval|exec)\(", text):
            # the one exec: codec's record builder, whose source names only our own fields
            assert rel == "format/codec.py", f"prism_rr/{rel}: {m.group(0)}"
