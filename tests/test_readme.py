"""Every `prism-rr ...` command the README and its reference pages show runs, as a new
user would run it.

The commands are read from README.md and the pages of docs/ it links (PAGES) when the tests
are collected: each line of a ```sh block that starts with `prism-rr` or `make`, and each
inline `prism-rr ...` span of the prose. They run in PAGES order in one working directory,
as a user following the README, then the reference, would, so a command finds what earlier ones wrote (run.prism, run.prism.d, slice.prism,
big.prism). What the README takes for granted is made here, named explicitly:

- PLACEHOLDERS: files the README names but no README command makes (train.py, ...),
  or that a README command makes elsewhere: demo.prism is a copy of `make demo`'s bundle
  (the session's demo run writes it in a directory of its own);
- `make demo` runs the Makefile's demo recipe (`prism-rr demo`) without its set-up step;
  `make gpu-check` is skipped: its tests need a CUDA GPU;
- `python` and `torchrun` after `--` are this interpreter and its venv's torchrun;
- `[...]` in a command is an optional part: it is run with it;
- `# ... (exit N)` in a command's comment is its documented exit code (default 0);
  `(exit N if any)`: 0 or N;
- `prism-rr tui` runs the app under textual's Pilot (open, help, each screen, quit);
- SKIPPED: commands a test cannot run, with the reason.

A README command that none of this covers fails `test_readme_command`: add how to run it
here, or list it in SKIPPED with the reason. So the README and the code change together.
The demo variants are the slow part (about 10 and 25 s on a quiet machine): they are the
session's runs (the `demo_runs` fixture, tests/conftest.py), which other tests share
(`make demo`'s bundle is the scale-replay test's recording).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import socket
import subprocess
import sys
import textwrap
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
# The README, then the reference pages it links, in the order a reader follows them: a
# page's commands may use what an earlier page's made (run.prism, slice.prism).
PAGES = [README, *(ROOT / "docs" / f"{name}.md" for name in
                   ("cli", "recording", "multinode", "replay", "analysis", "formats", "gpu", "layout"))]
README_LINES = 100  # at most: the README is read in five minutes; the rest is the reference's
BIN = Path(sys.executable).parent
TIMEOUT = 240  # seconds for one command (the default demo is the longest)

# A small data-parallel trainer: a 1-D DeviceMesh, gradients all-reduced by hand, an
# optimizer step per step (the recorder's step boundaries). --batch-size is the global
# batch (the README replays a world of 4096 with --batch-size 16384: 4 rows a rank, as
# recorded at world 4).
TRAIN = textwrap.dedent("""
    import argparse
    import torch, torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    p = argparse.ArgumentParser()
    p.add_argument("--batch-size", type=int, default=0)
    p.add_argument("--steps", type=int, default=5)
    args = p.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    world, rank = dist.get_world_size(), dist.get_rank()
    dp = init_device_mesh("cpu", (world,), mesh_dim_names=("dp",)).get_group("dp")
    rows = (args.batch_size or 4 * world) // world
    torch.manual_seed(0)
    model = torch.nn.Linear(WIDTH, 4)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(args.steps):
        g = torch.Generator().manual_seed(1000 * step + rank % 4)
        loss = model(torch.randn(rows, WIDTH, generator=g)).square().mean()
        loss.backward()
        for prm in model.parameters():
            dist.all_reduce(prm.grad, group=dp)
            prm.grad /= world
        opt.step()
        opt.zero_grad()
    dist.barrier()
    dist.destroy_process_group()
""")

PRISM = [str(BIN / "prism-rr")] if (BIN / "prism-rr").exists() else [sys.executable, "-m", "prism_rr.cli"]
TORCHRUN = BIN / "torchrun"


def _record(out: str, nproc: int) -> list:
    return [*PRISM, "record", "-o", out, "--nproc", str(nproc), "--", sys.executable, "train.py"]


@dataclass(frozen=True)
class DemoBundle:
    """A placeholder copied from the bundle of the session's `prism-rr demo ARGS` run
    (`demo_runs`), once that run has ended with exit 0."""

    args: tuple = ()


# Files the README names that no README command makes here: how the test makes each one.
# A list is a command run in the working directory; a str is a file to copy there; a
# DemoBundle is a demo run's bundle, copied there.
PLACEHOLDERS: dict[str, object] = {
    "train.py": TRAIN.replace("WIDTH", "8"),
    # "the code under test, edited": a layer one feature wider, so every gradient's shape
    # differs from the recording and the replay stops at the first call (exit 3).
    "train_edited.py": TRAIN.replace("WIDTH", "9"),
    "dp2.prism": _record("dp2.prism", 2),  # a real run at dp 2 ...
    "dp4.prism": "run.prism",  # ... and at dp 4: the README's own run.prism (4 ranks of train.py)
    "reference.prism": "run.prism",  # diff's reference: the README's own run
    # Flight Recorder dumps of 3 gloo ranks, rank 1 skipping an all_reduce (tests/data/fr)
    "fr-dumps/": ["cp", "-r", str(Path(__file__).parent / "data" / "fr" / "skip" / "pickle"), "fr-dumps"],
    # A real two-rank hang's dumps (rank 1 skips a call rank 0 makes) and the program that made
    # them, which imports its dumping watchdog (tests/replayer/scripts; test_fr_replay.py)
    "hang-dumps/": ["cp", "-r", str(Path(__file__).parent / "data" / "fr" / "hang" / "pickle"), "hang-dumps"],
    "hang.py": ["sh", "-c", 'cp "$0/fr_hang.py" hang.py && cp "$0/fr_watchdog.py" .',
                str(Path(__file__).parent / "replayer" / "scripts")],
    # `make demo`'s bundle: the README's `make demo` runs as the session's demo run
    # (`prism-rr demo`), which writes demo.prism in a directory of its own, not here.
    "demo.prism": DemoBundle(),
    # A replay's own recording, to compare with the recording in the TUI.
    "replay.prism": [*PRISM, "replay", "run.prism", "--ranks", "0", "-o", "replay.prism", "--timeout", "120",
                     "--", sys.executable, "train.py"],
}

# Commands a test cannot run, with the reason (the key is the command as the README has it,
# without its comment).
SKIPPED: dict[str, str] = {
    "make test": "runs this test suite, this file included: it would run itself",
    # Many nodes: each line runs on one node of several; tests/recorder/test_multinode.py and
    # tests/replayer/test_multinode_replay.py run them with two local torchrun agents.
    "prism-rr record -o run.prism -- torchrun --nnodes 2 --node-rank $NODE_RANK --nproc-per-node 8 "
    "--rdzv-backend c10d --rdzv-endpoint $HEAD:29500 train.py": "one node of two hosts (test_multinode.py)",
    "prism-rr record -o run.prism --node $SLURM_NODEID -- python train.py": "one node of a SLURM job (test_multinode.py)",
    "prism-rr pack node0/run.prism.d node1/run.prism.d -o run.prism": "needs two nodes' directories (test_multinode.py)",
    "prism-rr replay run.prism --ranks 0-15 --report fidelity.json -- torchrun --nnodes 2 --node-rank $i "
    "--nproc-per-node 8 --rdzv-backend c10d --rdzv-endpoint $HEAD:29500 train.py":
        "16 workers on two hosts (test_multinode_replay.py)",
}

OUTPUT_OPTIONS = {"-o", "--output", "--report"}
FILE = re.compile(r".*\.(py|prism|prism\.d|json)$|^(fr|hang)-dumps/$")
EXIT = re.compile(r"\(exit (\d+)( if any)?\)")


@dataclass
class Command:
    line: int  # 1-based line in its page
    text: str  # the command, without its comment
    comment: str = ""
    page: str = "README.md"  # relative to the repository
    order: int = 0  # its place among every page's commands (PAGES order)

    @property
    def where(self) -> str:
        return f"{self.page} line {self.line}"

    @property
    def id(self) -> str:
        return f"{self.page}:L{self.line}:{self.text[:60]}"


def readme_commands(text: str | None = None, page: str = "README.md") -> list[Command]:
    """Every command one page shows (the README's by default), in its order."""
    text = README.read_text() if text is None else text
    out: list[Command] = []
    block = None
    for n, line in enumerate(text.splitlines(), 1):
        fence = line.strip().startswith("```")
        if fence:
            block = line.strip()[3:].strip() if block is None else None
            continue
        if block is not None:
            if block in ("sh", "bash", "console", "shell", ""):
                code, _, comment = line.partition(" #")
                code = code.strip().removeprefix("$ ")
                if code.startswith(("prism-rr", "make ")) or code == "make":
                    out.append(Command(n, " ".join(code.split()), comment.strip(), page))
            continue
        for span in re.findall(r"`([^`]+)`", line):
            if span.startswith("prism-rr ") and not span.strip().endswith("..."):
                out.append(Command(n, " ".join(span.split()), page=page))
    return out


def all_commands() -> list[Command]:
    """Every page's commands, numbered in PAGES order."""
    out = [c for path in PAGES for c in readme_commands(path.read_text(), str(path.relative_to(ROOT)))]
    for i, c in enumerate(out):
        c.order = i
    return out


COMMANDS = all_commands()


@dataclass
class Plan:
    argv: list = field(default_factory=list)
    codes: tuple = (0,)
    needs: list = field(default_factory=list)  # placeholder files to make first
    tui: bool = False
    skip: str | None = None


class Uncovered(Exception):
    pass


def plan(cmd: Command) -> Plan:
    """How to run a README command here, or why not; Uncovered when this file does not say."""
    if cmd.text in SKIPPED:
        return Plan(skip=SKIPPED[cmd.text])
    m = EXIT.search(cmd.comment)
    codes = (0,) if m is None else ((int(m.group(1)),) if not m.group(2) else (0, int(m.group(1))))
    words = shlex.split(cmd.text.replace("[", " ").replace("]", " "))
    if words[0] == "make":
        if words[1:] == ["gpu-check"]:
            return Plan(skip="runs tests/gpu, which need a CUDA GPU (torch.cuda.is_available())")
        if words[1:] != ["demo"]:
            raise Uncovered(f"`{cmd.text}`: only `make demo` is known (it runs `prism-rr demo`)")
        return Plan(argv=[*PRISM, "demo"], codes=codes)
    if words[0] != "prism-rr":
        raise Uncovered(f"`{cmd.text}`: not a prism-rr command")
    sub = words[1]
    known = {"demo", "record", "replay", "tui", "diagnose", "analyze", "diff", "export", "redact", "info",
             "scale", "verify", "pack", "repair", "import", "--help"}
    if sub not in known:
        raise Uncovered(f"`{cmd.text}`: this test does not know how to run `prism-rr {sub}`")
    argv, needs, after, prev = [*PRISM], [], False, None
    for w in words[1:]:
        if after and w == "python":
            w = sys.executable
        elif after and w == "torchrun":
            if not TORCHRUN.exists():
                return Plan(skip="needs torchrun, which this environment lacks")
            w = str(TORCHRUN)
        elif w == "--":
            after = True
        elif FILE.match(w) and prev not in OUTPUT_OPTIONS:
            if w in PLACEHOLDERS:
                needs.append(w)
            elif not _made_by_readme(w, cmd):
                raise Uncovered(f"`{cmd.text}`: `{w}` is neither made by an earlier README command "
                                f"nor in PLACEHOLDERS")
        argv.append(w)
        prev = w
    return Plan(argv=argv, codes=codes, needs=needs, tui=sub == "tui")


def _made_by_readme(name: str, cmd: Command) -> bool:
    """Does a README command before `cmd` write `name` (an -o output, or the spools that
    `record --keep-spools` keeps beside it: without it, a record leaves one file)?"""
    for c in COMMANDS:
        if c.order >= cmd.order:
            break
        words = c.text.replace("[", " ").replace("]", " ").split()
        kept = c.text.startswith("prism-rr record") and "--keep-spools" in words
        for opt, val in zip(words, words[1:]):
            if opt in OUTPUT_OPTIONS and (val == name or (kept and val + ".d" == name)):
                return True
    return False


# `prism-rr tui ...` under Pilot: the CLI parses the arguments and opens the bundles as
# for a user; textual's App.run is swapped for a headless run that shows help and the rank
# timelines, then quits with q as a user would.
TUI_DRIVER = textwrap.dedent("""
    import asyncio, sys
    from textual.app import App

    def run(self, *args, **kwargs):
        async def drive():
            self.animation_level = "none"
            async with self.run_test(size=(120, 40)) as pilot:
                await pilot.pause()
                for key in ("f1", "escape", "2"):  # help, then the rank timelines
                    await pilot.press(key)
                    await pilot.pause()
                await pilot.press("q")
            print("tui ok", type(self).__name__)

        asyncio.run(drive())
        return self.return_value

    App.run = run
    sys.argv = ["prism-rr", *sys.argv[1:]]
    from prism_rr.cli import main
    main()
""")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _is_demo(cmd: Command) -> bool:
    try:
        p = plan(cmd)
    except Uncovered:
        return False
    return not p.skip and p.argv[len(PRISM):][:1] == ["demo"]


class Walkthrough:
    """The README's commands run in order in one directory, each once, on demand.

    The demo variants need nothing from other commands and are the slowest: they are
    started at once on the session's demo thread (`demo_runs`, one after another, each
    in a directory of its own), and run beside the rest.
    """

    def __init__(self, work: Path, demo_runs):
        self.work = work
        self.results: dict[int, subprocess.CompletedProcess | None] = {}  # by Command.order
        self.env = dict(os.environ, PATH=f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
                        OMP_NUM_THREADS="1", PET_MASTER_PORT=str(_free_port()))
        self.env.pop("PRISM_RR_REPLAY_TRACE", None)
        self.demo_runs = demo_runs
        self.demos = {c.order: demo_runs.start(*plan(c).argv[len(PRISM) + 1:]).future
                      for c in COMMANDS if _is_demo(c)}
        # A placeholder command that reads no bundle (dp2.prism: a record of train.py) is
        # made from the start too, on a thread of its own, beside the rest.
        self.pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="readme-placeholder")
        self.early = {name: self.pool.submit(self._run, how) for name, how in PLACEHOLDERS.items()
                      if isinstance(how, list) and not any(FILE.match(str(w)) and str(w).endswith(".prism")
                                                           and w != name for w in how)}

    def close(self) -> None:
        self.pool.shutdown(wait=True, cancel_futures=True)

    def _run(self, argv, timeout=TIMEOUT, cwd=None) -> subprocess.CompletedProcess:
        return subprocess.run([str(a) for a in argv], cwd=cwd or self.work, env=self.env,
                              capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)

    def _make(self, name: str) -> None:
        how = PLACEHOLDERS[name]
        if name in self.early:
            out = self.early[name].result()
            assert out.returncode == 0, f"making {name}: {how}\n{out.stderr[-3000:]}"
            return
        if (self.work / name).exists():
            return
        if isinstance(how, DemoBundle):
            run = self.demo_runs.start(*how.args)
            out = run.result()  # the demo's thread: wait for it, it may still be running
            assert out.returncode == 0, (f"making {name}: {shlex.join(map(str, run.argv))} ended with exit "
                                         f"{out.returncode}\n{out.stderr[-3000:]}")
            shutil.copy(run.bundle, self.work / name)
        elif isinstance(how, str) and name.endswith(".py"):
            (self.work / name).write_text(how)
        elif isinstance(how, str):
            self._make_source(how)
            shutil.copy(self.work / how, self.work / name)
        else:
            out = self._run(how)
            assert out.returncode == 0, f"making {name}: {how}\n{out.stderr[-3000:]}"

    def _make_source(self, name: str) -> None:
        if not (self.work / name).exists():  # made by a README command: run the README up to it
            for c in COMMANDS:
                if (self.work / name).exists():
                    break
                self.result(c)

    def result(self, cmd: Command) -> subprocess.CompletedProcess | None:
        """Run every README command up to `cmd` not yet run (what `cmd` may need), then `cmd`."""
        key = cmd.order
        if key in self.demos:
            # Meanwhile, the rest of the README: what the demo's thread is there for.
            for c in COMMANDS:
                try:
                    self._once(c)
                except Exception:
                    pass  # reported by that command's own test
            return self.demos[key].result()
        for c in COMMANDS:
            if c.order >= key:
                break
            self._once(c)
        return self._once(cmd)

    def _once(self, cmd: Command):
        key = cmd.order
        if key in self.demos:
            return None  # on its own thread
        if key not in self.results:
            try:
                p = plan(cmd)
            except Uncovered:
                self.results[key] = None
                return None
            if p.skip:
                self.results[key] = None
                return None
            for name in p.needs:
                self._make(name)
            argv = [sys.executable, "-c", TUI_DRIVER, *p.argv[len(PRISM):]] if p.tui else p.argv
            try:
                self.results[key] = self._run(argv)
            except (subprocess.TimeoutExpired, AssertionError) as exc:
                self.results[key] = exc  # reported by the command's own test
        out = self.results[key]
        if isinstance(out, Exception):
            raise out
        return out


@pytest.fixture(scope="module")
def walkthrough(tmp_path_factory, demo_runs):
    work = tmp_path_factory.mktemp("readme")
    (work / "train.py").write_text(PLACEHOLDERS["train.py"])
    walk = Walkthrough(work, demo_runs)
    yield walk
    walk.close()


def test_the_readme_is_short_and_links_every_page():
    """The README is read in five minutes: what it is, the two commands, the tour, then
    links; every page of docs/ is one of PAGES (so its commands run here), linked from the
    README, and every relative link of a page leads to a file."""
    text = README.read_text()
    assert len(text.splitlines()) <= README_LINES, f"README.md has {len(text.splitlines())} lines"
    heads = re.findall(r"(?m)^## (.*)$", text)
    assert heads[:2] == ["Two commands", "A tour, on the demo's bundle"], heads
    tour = {c.text.split()[1] for c in COMMANDS if c.page == "README.md" and c.text.startswith("prism-rr ")}
    assert {"record", "replay", "diagnose", "tui", "info"} <= tour, tour
    pages = sorted((ROOT / "docs").glob("*.md"))
    assert sorted(PAGES[1:]) == pages, "every page of docs/ is in PAGES, in reading order"
    for page in pages:
        assert f"(docs/{page.name})" in text, f"README.md does not link docs/{page.name}"
    for page in PAGES:
        for target in re.findall(r"\]\(([^)#:]+)\)", page.read_text()):
            assert (page.parent / target).exists(), f"{page.relative_to(ROOT)} links {target}, which is not there"


def test_readme_commands_are_found():
    texts = [c.text for c in COMMANDS]
    for expected in ("make demo", "prism-rr demo --pp 2 --world 2", "prism-rr --help"):
        assert expected in texts, texts
    assert sum(t.startswith("prism-rr ") for t in texts) >= 15, texts
    recipe = re.search(r"(?m)^demo:.*\n\t(.*)$", (ROOT / "Makefile").read_text())
    assert recipe and recipe.group(1).split() == ["$(BIN)/prism-rr", "demo"], "make demo is run as `prism-rr demo`"
    gpu = re.search(r"(?m)^gpu-check:.*\n((?:\t.*\n)+)", (ROOT / "Makefile").read_text())
    assert gpu and "-m gpu tests/gpu" in gpu.group(1), "make gpu-check runs the gpu tests"
    stale = set(SKIPPED) - set(texts)
    assert not stale, f"SKIPPED lists commands the README no longer has: {stale}"
    used = {w for c in COMMANDS for w in shlex.split(c.text.replace("[", " ").replace("]", " "))}
    unused = set(PLACEHOLDERS) - used
    assert not unused, f"PLACEHOLDERS names files no README command uses: {unused}"


def readme_python(text: str | None = None) -> list[str]:
    """The ```python blocks of every page (docs/cli.md's "From Python"), in order."""
    text = "\n".join(p.read_text() for p in PAGES) if text is None else text
    return re.findall(r"(?ms)^```python\n(.*?)^```", text)


def test_readme_python_runs(tmp_path):
    """The README's Python, run as written in a directory that holds a `run.prism` (a
    synthetic run's): the api it documents is the api there is, and it prints nothing
    raw."""
    from prism_rr.format import pack
    from prism_rr.format.synthetic import write_synthetic

    blocks = readme_python()
    assert blocks and any("from prism_rr import api" in b for b in blocks)
    pack(write_synthetic(tmp_path / "run.prism.d", 4, 200), tmp_path / "run.prism")
    for block in blocks:
        out = subprocess.run([sys.executable, "-c", block], cwd=tmp_path, capture_output=True, text=True,
                             timeout=TIMEOUT)
        assert out.returncode == 0, f"{block}\nstderr:\n{out.stderr[-3000:]}"
        assert "world size      4" in out.stdout and "step 0:" in out.stdout, out.stdout[-2000:]
    assert (tmp_path / "trace.json").exists() and (tmp_path / "public.prism").exists()


def test_extraction_rules():
    text = textwrap.dedent("""
        Run `prism-rr info x.prism` or `prism_rr.step()`.
        ```sh
        make demo    # a comment
        prism-rr   verify   run.prism    # every checksum (exit 4 if bad)
        echo not a command
        ```
        ```python
        prism-rr in python is not a command
        ```
    """)
    got = [(c.text, c.comment) for c in readme_commands(text)]
    assert got == [("prism-rr info x.prism", ""), ("make demo", "a comment"),
                   ("prism-rr verify run.prism", "every checksum (exit 4 if bad)")]
    unknown = Command(99, "prism-rr frobnicate run.prism")
    with pytest.raises(Uncovered):
        plan(unknown)
    with pytest.raises(Uncovered):
        plan(Command(99, "prism-rr info nowhere.prism"))
    with pytest.raises(Uncovered):
        plan(Command(99, "make lint"))
    assert plan(Command(99, "make gpu-check")).skip
    assert plan(Command(99, "prism-rr diagnose x", "# (exit 5 if any)")).codes == (0, 5)
    assert plan(Command(99, "prism-rr replay x", "# stops (exit 3)")).codes == (3,)


@pytest.mark.timeout(900)
@pytest.mark.parametrize("cmd", COMMANDS, ids=[c.id for c in COMMANDS])
def test_readme_command(walkthrough, cmd):
    try:
        p = plan(cmd)
    except Uncovered as exc:
        pytest.fail(f"{cmd.where}: {exc}. Add how to run it to tests/test_readme.py, "
                    f"or list it in SKIPPED with the reason.")
    if p.skip:
        pytest.skip(f"{cmd.where}: {p.skip}")
    out = walkthrough.result(cmd)
    assert out is not None
    shown = f"{cmd.where}: `{cmd.text}` ran as {p.argv}\nstdout:\n{out.stdout[-2000:]}\nstderr:\n{out.stderr[-4000:]}"
    assert out.returncode in p.codes, shown
    assert "Traceback" not in out.stderr or out.returncode != 0, shown
    if "--json" in p.argv:
        json.loads(out.stdout)
    if p.tui:
        assert "tui ok" in out.stdout, shown
    if p.argv[len(PRISM):][:1] == ["demo"]:
        # The demo records, replays rank 0 and prints the card: no divergence, no failure.
        assert "prism-rr replay" in out.stderr and "diverged: no" in out.stderr, shown
        assert "[rank0]" not in out.stderr, shown
