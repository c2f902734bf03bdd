"""The suite's shared recordings: each made once per test run, whichever xdist worker asks
first, the other waiting on a file lock beside pytest's base temp (`shared_runs`). A new
test reads one of these before it records its own; tests/README.md lists them.

- `make_demo` / `demo_runs.start(*ARGS)`: `prism-rr demo ARGS` (make_demo: the default, world
  4, dp2 x tp2, rank 0 replayed), its bundle at `.bundle`;
- `demo_training(world, args, rep)`: the demo trainer plain (rep 0) or recorded with full
  payloads and memory (rep 1, packed to `.bundle`, spools at `.spool_dir`), parameters saved;
- `crashy_runs(mode)`: tests/recorder/scripts/crashy.py MODE as 2 recorded ranks, packed;
- `killed_peer`: hang.py kill, rank 1 SIGKILLed before an all_reduce rank 0 waits in, packed, spools kept;
- `restarted_job`: tests/recorder/scripts/elastic.py under `record`, torchrun restarting it
  once (attempt 0: rank 1 exits 17 in step 2; attempt 1 runs to the end).

What they leave is read, never written: a test that needs to change a bundle copies it.
"""

import fcntl
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import pytest

DATA = Path(__file__).parent / "data"
BIN = Path(sys.executable).parent
PRISM = [str(BIN / "prism-rr")] if (BIN / "prism-rr").exists() else [sys.executable, "-m", "prism_rr.cli"]
DEMO_TIMEOUT = 300  # seconds for one `prism-rr demo`: a world recorded, then rank 0 replayed
TRAIN_TIMEOUT = 120  # seconds for one plain run of the demo trainer (demo_training)


WARM = Path(__file__).parent / "warm"
# Runs tests/warm/server.py under a name in angle brackets (its docstring says why).
_WARM_BOOT = ("import sys; p = sys.argv[1]; ns = {'__name__': 'prism_rr_warm_server', '__file__': p}; "
              "exec(compile(open(p).read(), '<prism-rr warm start>', 'exec'), ns); ns['serve'](sys.argv[2])")


class _WarmStart:
    """One warm server for this pytest process (an xdist worker, or the only process), started
    at configure time: before the test modules are imported, so an environment a module
    copies at import (`ENV = dict(os.environ, ...)`) sends its programs to the server too."""

    def __init__(self):
        import tempfile

        self.where = Path(tempfile.mkdtemp(prefix="prism-warm-"))  # short: a socket's path is at most 107 bytes
        self.sock = self.where / "sock"
        env = {k: v for k, v in os.environ.items() if k != "PRISM_RR_TEST_WARM"}
        with open(self.where / "server.log", "wb") as log:
            self.server = subprocess.Popen([sys.executable, "-c", _WARM_BOOT, str(WARM / "server.py"), str(self.sock)],
                                           env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                                           start_new_session=True)
        (self.where / "server.pid").write_text(str(self.server.pid))  # a stand-in waits while it starts
        self.saved = {k: os.environ.get(k) for k in ("PRISM_RR_TEST_WARM", "PYTHONPATH")}
        os.environ["PRISM_RR_TEST_WARM"] = str(self.sock)
        os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(WARM), self.saved["PYTHONPATH"]) if p)

    def stop(self) -> None:
        for k, v in self.saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        self.server.terminate()
        try:
            self.server.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.server.kill()
            self.server.wait()
        shutil.rmtree(self.where, ignore_errors=True)


_warm: _WarmStart | None = None


def pytest_configure(config):
    """Torch programs the tests start are forked from one warm interpreter per worker
    (tests/warm/server.py); PRISM_RR_TEST_COLD=1 starts every one cold. xdist's controller,
    which runs no test, starts none."""
    global _warm
    controller = not hasattr(config, "workerinput") and bool(config.getoption("numprocesses", None))
    if os.environ.get("PRISM_RR_TEST_COLD") or controller or _warm is not None:
        return
    _warm = _WarmStart()


def pytest_unconfigure(config):
    global _warm
    if _warm is not None:
        _warm.stop()
        _warm = None


@pytest.fixture(scope="session")
def warm_start():
    """The warm server's socket (None when the programs start cold)."""
    return None if _warm is None else _warm.sock


@pytest.fixture(autouse=True)
def _cold_start(request, monkeypatch):
    """A test marked `cold_start` starts its programs as fresh interpreters; one marked
    `teardown` has its warm programs torn down at exit as a fresh interpreter's are."""
    if request.node.get_closest_marker("cold_start"):
        monkeypatch.delenv("PRISM_RR_TEST_WARM", raising=False)
    if request.node.get_closest_marker("teardown"):
        monkeypatch.setenv("PRISM_RR_TEST_TEARDOWN", "1")


def pytest_collection_modifyitems(config, items):
    """Tests marked `gpu` are skipped where torch sees no CUDA device (`make gpu-check` runs them)."""
    gpu = [item for item in items if item.get_closest_marker("gpu")]
    if not gpu:
        return
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU: torch.cuda.is_available() is false")
    for item in gpu:
        item.add_marker(skip)


@pytest.fixture
def small_bundle(tmp_path):
    """A 4-rank synthetic bundle with payload blobs, packed from real spools."""
    from prism_rr.format import pack
    from prism_rr.format.synthetic import write_synthetic

    spools = write_synthetic(tmp_path / "run.prism.d", 4, 120, payload=True, chunk_records=64)
    out = tmp_path / "run.prism"
    pack(spools, out)
    return out


class SharedRuns:
    """Work made once per test run for all xdist workers: the first to ask makes it in a
    directory of its own while holding a lock file; the others wait for the lock and read
    what it left. A making that raised leaves nothing, and the next to ask tries again."""

    def __init__(self, root: Path):
        self.root = root
        root.mkdir(parents=True, exist_ok=True)

    def dir(self, key: str) -> Path:
        """Where `key` is made (it may not be there yet)."""
        name = "".join(c if c.isalnum() or c in "-_." else "_" for c in key)[:60]
        return self.root / f"{name}-{hashlib.sha1(key.encode()).hexdigest()[:8]}"

    def get(self, key: str, make: Callable[[Path], dict]) -> tuple[Path, dict]:
        """(the directory, what `make(directory)` returned): made here, or by another worker."""
        d = self.dir(key)
        made = d.with_name(d.name + ".json")
        with open(d.with_name(d.name + ".lock"), "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
            if not made.exists():
                shutil.rmtree(d, ignore_errors=True)  # a making that raised
                d.mkdir()
                made.write_text(json.dumps(make(d)))
            return d, json.loads(made.read_text())


@pytest.fixture(scope="session")
def shared_runs(tmp_path_factory) -> SharedRuns:
    """Beside each worker's base temp under xdist (one directory per test run: the run's
    uid names it), in the base temp itself without."""
    base = tmp_path_factory.getbasetemp()
    uid = os.environ.get("PYTEST_XDIST_TESTRUNUID")
    return SharedRuns(base.parent / f"shared-{uid}" if uid else base / "shared")


@dataclass
class DemoRun:
    """One `prism-rr demo ...` run, on the session's demo thread; `result()` waits for it."""

    argv: list
    dir: Path
    future: Future

    @property
    def bundle(self) -> Path:
        return self.dir / "demo.prism"

    def result(self) -> subprocess.CompletedProcess:
        return self.future.result()


def _run_demo(shared: SharedRuns, key: str, argv: list, env: dict) -> subprocess.CompletedProcess:
    def make(cwd: Path) -> dict:
        out = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=DEMO_TIMEOUT,
                             stdin=subprocess.DEVNULL)
        return {"returncode": out.returncode, "stdout": out.stdout, "stderr": out.stderr}

    _, made = shared.get(key, make)
    return subprocess.CompletedProcess(argv, made["returncode"], made["stdout"], made["stderr"])


class DemoRuns:
    """`prism-rr demo ARGS`, each ARGS run once a test run (shared by the workers), one run
    at a time on a thread of this worker's, in a directory of its own (each writes
    demo.prism). A test that asks for a run the README also makes shares it instead of
    running the demo again."""

    def __init__(self, shared: SharedRuns):
        self.shared = shared
        self.env = dict(os.environ, PATH=f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}", OMP_NUM_THREADS="1")
        self.env.pop("PRISM_RR_REPLAY_TRACE", None)
        self.pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="demo")
        self.runs: dict[tuple, DemoRun] = {}

    def start(self, *args: str) -> DemoRun:
        if args not in self.runs:
            key = "demo " + " ".join(args)
            argv = [*PRISM, "demo", *args]
            future = self.pool.submit(_run_demo, self.shared, key, argv, self.env)
            self.runs[args] = DemoRun(argv, self.shared.dir(key), future)
        return self.runs[args]

    def close(self) -> None:
        self.pool.shutdown(wait=True, cancel_futures=True)


@pytest.fixture(scope="session")
def demo_runs(shared_runs):
    runs = DemoRuns(shared_runs)
    yield runs
    runs.close()


@pytest.fixture(scope="session")
def make_demo(demo_runs) -> DemoRun:
    """What `make demo` runs (`prism-rr demo`: world 4, dp2 x tp2, steps 1-3 recorded, rank 0
    replayed). The README's `make demo` line checks its output; the scale-replay test
    scales its bundle."""
    return demo_runs.start()


@dataclass
class TrainRun:
    """One run of the demo trainer (`python -m prism_rr.demo.train`): plain, or recorded."""

    codes: list
    dir: Path
    recorded: bool

    @property
    def params(self) -> Path:
        """The prefix of its ranks' saved parameters (`--save-params`): params.rank{R}.pt."""
        return self.dir / "params"

    @property
    def logs(self) -> Path:
        return self.dir / "logs"

    @property
    def spool_dir(self) -> Path:
        """A recorded run's spools (kept after packing)."""
        return self.dir / "run.prism.d"

    @property
    def bundle(self) -> Path:
        """A recorded run's bundle, packed from its spools once every rank exited 0."""
        return self.dir / "run.prism"


@pytest.fixture(scope="session")
def demo_training(shared_runs):
    """`demo_training(world, args, rep=0, payload="full")`: the demo trainer run as `world`
    ranks with `args` and --save-params, each (world, args, rep, payload) once a test run.
    Rep 0 runs plainly; rep 1 runs under the recorder with `payload` (full unless asked) and
    the memory tracker, and is packed. One
    such pair serves three tests: the training tests check rep 1 trains bitwise as rep 0
    did (the demo is reproducible), the recorder's tests (tests/recorder/test_frameworks.py)
    check the same of a recorded run and read its records, and the replayer's
    (tests/replayer/test_replay_parallel.py) replay it bitwise."""
    from prism_rr.format import pack
    from prism_rr.localrun import run_local
    from prism_rr.recorder import RecordOptions
    from prism_rr.recorder.launch import hook_env

    def get(world: int, args: list, rep: int = 0, payload: str = "full") -> TrainRun:
        args = list(map(str, args))

        def make(d: Path) -> dict:
            run = TrainRun([], d, bool(rep))
            argv = [sys.executable, "-m", "prism_rr.demo.train", *args, "--save-params", str(run.params)]
            env = {"PYTHONWARNINGS": "ignore"}
            if rep:
                env.update(hook_env(RecordOptions.make(run.spool_dir, payload=payload, memory=True)))
            run.codes = run_local(argv, world, env=env, timeout=TRAIN_TIMEOUT, cwd=d, log_dir=run.logs)
            if not rep and _aborted_at_exit(run, world):
                # The plain run: see _aborted_at_exit. Once more; a recorded run never is.
                run.codes = run_local(argv, world, env=env, timeout=TRAIN_TIMEOUT, cwd=d, log_dir=run.logs)
            if rep and run.codes == [0] * world:
                pack(run.spool_dir, run.bundle)
            return {"codes": run.codes}

        d, made = shared_runs.get(f"train w{world} {' '.join(args)} rep{rep}" + (f" {payload}" if payload != "full" else ""),
                                  make)
        return TrainRun(made["codes"], d, bool(rep))

    return get


def _aborted_at_exit(run: TrainRun, world: int) -> bool:
    """Torch 2.13's own abort after a program's last line, in a run without prism-rr: a gloo
    worker thread that still drops a tensor once the interpreter is finalizing dies in
    pthread_exit, "terminate called without an active exception" (prism_rr/intercept/
    teardown.py; recorded and replayed processes settle it, a plain one cannot). Every rank
    saved its parameters, and a rank that died of SIGABRT printed that line."""
    codes = run.codes
    if -signal.SIGABRT not in codes or any(c not in (0, -signal.SIGABRT, -signal.SIGTERM) for c in codes):
        return False
    if not all(Path(f"{run.params}.rank{r}.pt").exists() for r in range(world)):
        return False
    return all("terminate called without an active exception" in (run.logs / f"rank{r}.stderr").read_text()
               for r, c in enumerate(codes) if c == -signal.SIGABRT)


@dataclass
class CrashRun:
    """Two recorded gloo ranks of tests/recorder/scripts/crashy.py that die hard."""

    codes: list
    dir: Path  # the ranks' marker files and logs (rank{R}.log)

    @property
    def bundle(self) -> Path:
        return self.dir / "run.prism"

    def log(self, rank: int) -> str:
        return (self.dir / f"rank{rank}.log").read_text()[-2000:]


def _recorder_helpers():
    """tests/recorder/recorder_helpers.py (start_ranks, finish), which the recorder's tests
    import by name: the session's crash runs start and stop their ranks as those tests do."""
    where = str(Path(__file__).parent / "recorder")
    if where not in sys.path:
        sys.path.insert(0, where)
    import recorder_helpers

    return recorder_helpers




@pytest.fixture(scope="session")
def crashy_runs(shared_runs):
    """`crashy_runs(mode)`: crashy.py MODE run once a test run as 2 recording gloo ranks,
    then packed. The recorder's crash-safety tests read its records, the diagnosis tests
    its findings."""
    from prism_rr.format import pack
    from prism_rr.recorder.launch import spool_dir_for

    helpers = _recorder_helpers()

    def get(mode: str) -> CrashRun:
        def make(d: Path) -> dict:
            out, procs = helpers.start_ranks(d, "crashy.py", mode, 2, f"crashy-{mode}")
            codes = helpers.finish(procs, 60)
            pack(spool_dir_for(out), out)
            return {"codes": codes}

        d, made = shared_runs.get(f"crashy {mode}", make)
        return CrashRun(made["codes"], d)

    return get


@pytest.fixture(scope="session")
def killed_peer(shared_runs) -> CrashRun:
    """hang.py kill, once a test run: rank 1 SIGKILLs itself where rank 0 waits for it in
    an all_reduce; rank 0, if still there 0.5 s later, is stopped with SIGTERM. Packed, the
    spools kept: tests/recorder/test_failures.py reads the spools, the diagnosis tests the
    findings."""
    from prism_rr.format import pack
    from prism_rr.recorder.launch import spool_dir_for

    helpers = _recorder_helpers()

    def make(d: Path) -> dict:
        out, procs = helpers.start_ranks(d, "hang.py", "kill", 2, "hang-kill")
        deadline = time.monotonic() + 60
        while not all((d / f"stuck-{r}").exists() for r in range(2)):
            if time.monotonic() > deadline:
                helpers.finish(procs, 0.1)
                pytest.fail("ranks never reached the planted failure: " + (d / "rank1.log").read_text()[-2000:])
            time.sleep(0.05)
        try:
            procs[1].wait(10)
        except subprocess.TimeoutExpired:
            pass
        time.sleep(0.5)
        if procs[0].poll() is None:
            procs[0].send_signal(signal.SIGTERM)
        codes = helpers.finish(procs, 15)
        pack(spool_dir_for(out), out)
        return {"codes": codes}

    d, made = shared_runs.get("killed peer", make)
    return CrashRun(made["codes"], d)


@dataclass
class RecordRun:
    """One `prism-rr record` of a job: how the command ended and the bundle it wrote."""

    returncode: int
    stderr: str
    bundle: Path


@pytest.fixture(scope="session")
def restarted_job(shared_runs) -> RecordRun:
    """elastic.py under `prism-rr record`, torchrun restarting it once, once a test run: the
    recorder's attempt tests read it, the replayer's replay each attempt."""
    script = Path(__file__).parent / "recorder" / "scripts" / "elastic.py"
    # CI=... makes torch's harness write JUnit XML through a module it does not install
    env = {k: v for k, v in os.environ.items() if k != "CI"} | {"PYTHONWARNINGS": "ignore", "OMP_NUM_THREADS": "1"}

    def make(d: Path) -> dict:
        got = subprocess.run(
            [sys.executable, "-m", "prism_rr.cli", "record", "-o", str(d / "run.prism"), "--timeout", "150", "--",
             sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--max-restarts", "1",
             "--standalone", str(script), str(d)],
            capture_output=True, text=True, timeout=200, env=env, cwd=d, stdin=subprocess.DEVNULL)
        return {"returncode": got.returncode, "stderr": got.stderr}

    d, made = shared_runs.get("elastic restarted", make)
    return RecordRun(made["returncode"], made["stderr"], d / "run.prism")
