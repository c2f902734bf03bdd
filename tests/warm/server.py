"""The test suite's warm start: one process per xdist worker imports torch once, and each
torch program a test starts (`python script.py`, `python -m prism_rr.demo.train`) is forked
from it instead of paying torch's import again (about 3 s of CPU, and 3 s more for the
`torch._dynamo` a first `optimizer.step()` imports).

A test still starts its program as a user would: `sitecustomize.py` beside this file (on
PYTHONPATH while the suite runs) hands the new interpreter's argv, environment, working
directory and standard streams to this server and stays as the program's stand-in: its pid
is the one the test holds, the signals it gets reach the program's process group, and it
exits with the program's status (by the same signal where the program died of one). The
forked program is a real process with its own pid, session and gloo process groups; it
runs its start-up as a fresh interpreter would: PYTHONPATH, then sitecustomize (prism-rr's
hook when `record` or `replay` started it), then the script as `__main__`.

What differs from a cold start: the modules in PRELOAD are imported already (with the
warning filters and environment variables their import sets), and the random state of
modules that keep one (numpy's) is the server's; at its end the program is not torn down
unless its test is marked `teardown` (_end_quickly says why). Whatever else the server cannot reproduce
exactly starts cold (the stand-in just goes on):
interpreter options other than -u, -B and -W..., an import-time variable (TORCH_*, PYTORCH_*,
OMP_*, ...) unlike the server's, `-c` (but for a child of multiprocessing's spawn start
method, whose inherited fds the stand-in hands over at their numbers), a module not in
sitecustomize's _MODULES. Tests that must
start cold are marked `cold_start` (tests/conftest.py).

The server's code is compiled under a name in angle brackets, as Python's own runpy is, so
that prism-rr's stack walk counts none of its frames as the program's.
"""

import gc
import json
import os
import select
import signal
import socket
import struct
import sys

PRELOAD = (
    "torch",
    "torch.distributed",
    "torch._dynamo",  # a program's first optimizer.step() imports it (torch's _disable_dynamo)
    "torch.nn.parallel",
    "torch.distributed.fsdp",
    "torch.distributed.tensor",
    "torch.distributed.tensor.parallel",
    "torch.distributed.pipelining",
    "torch.distributed.elastic.multiprocessing.errors",
    # prism-rr's CLI (a few hundred commands a run) imports these: 0.05 s of CPU each, and
    # none reads the environment when imported
    "typer",
    "rich.console",
    "msgpack",
    "zstandard",
)

# Read at import or interpreter start: a program whose value differs from the server's starts cold.
_STARTUP_VARS = ("TORCH_", "PYTORCH_", "TORCHDYNAMO", "TORCHINDUCTOR", "OMP_", "MKL_", "KMP_", "GOMP_",
                 "LD_", "NCCL_", "GLOO_", "PYTHON", "MALLOC_")
# ... except these, read when used (Flight Recorder's and NCCL's when a group is made), or
# handled below.
_CALL_TIME_VARS = ("TORCH_NCCL_", "TORCH_FR_", "TORCHELASTIC_", "OMP_NUM_THREADS", "PYTHONPATH", "PYTHONUNBUFFERED", "PYTHONFAULTHANDLER",
                   "PYTHONDONTWRITEBYTECODE", "PYTHONIOENCODING", "PYTHONWARNINGS", "TORCH_DISTRIBUTED_TIMEOUT")


def _startup_env(env: dict) -> dict:
    return {k: v for k, v in env.items()
            if isinstance(v, str) and k.startswith(_STARTUP_VARS) and not k.startswith(_CALL_TIME_VARS)}


def _recv_request(conn: socket.socket):
    head, fds, _flags, _addr = socket.recv_fds(conn, 4, 64)
    while len(head) < 4:
        more = conn.recv(4 - len(head))
        if not more:
            raise EOFError
        head += more
    (size,) = struct.unpack("!I", head)
    body = b""
    while len(body) < size:
        more = conn.recv(size - len(body))
        if not more:
            raise EOFError
        body += more
    return json.loads(body), fds


def _send(conn: socket.socket, **msg) -> None:
    try:
        conn.sendall(json.dumps(msg).encode() + b"\n")
    except OSError:
        pass


def _why_cold(req: dict, base_env: dict) -> str | None:
    if req["main"] is None:
        return "not a script"
    mine, theirs = _startup_env(base_env), _startup_env(req["env"])
    for k, v in base_env["+imports"].items():
        if theirs.get(k) == v:
            theirs.pop(k)
    if mine != theirs:
        diff = sorted(set(mine.items()) ^ set(theirs.items()))
        return f"start-up variables differ: {diff[:3]}"
    return None


def _stdio(unbuffered: bool) -> None:
    import io

    for fd, name in ((0, "stdin"), (1, "stdout"), (2, "stderr")):
        old = getattr(sys, name)
        mode = "rb" if fd == 0 else "wb"
        raw = io.FileIO(fd, mode[0], closefd=False)
        buffering = 0 if (unbuffered and fd) else -1
        binary = raw if buffering == 0 else (io.BufferedReader(raw) if fd == 0 else io.BufferedWriter(raw))
        text = io.TextIOWrapper(binary, encoding=old.encoding, errors=old.errors,
                                line_buffering=(fd == 2 or (fd == 1 and raw.isatty())),
                                write_through=unbuffered or fd == 2)
        setattr(sys, name, text)
        setattr(sys, f"__{name}__", text)


def _exec_script(path: str) -> None:
    import builtins
    import types

    main = types.ModuleType("__main__")
    main.__file__ = path
    main.__builtins__ = builtins
    main.__cached__ = None
    sys.modules["__main__"] = main
    with open(path, "rb") as f:
        code = compile(f.read(), path, "exec")
    exec(code, main.__dict__)


def _exec_module(name: str) -> None:
    import builtins
    import runpy
    import types

    main = types.ModuleType("__main__")
    main.__builtins__ = builtins
    sys.modules["__main__"] = main
    runpy._run_module_as_main(name, alter_argv=True)


def _exec_spawn(tracker_fd: int, pipe_handle: int) -> None:
    """What `python -c "...spawn_main(...)" --multiprocessing-fork` runs: the child of
    multiprocessing's spawn start method, its task read from the parent's pipe."""
    import builtins
    import types

    main = types.ModuleType("__main__")
    main.__builtins__ = builtins
    sys.modules["__main__"] = main
    from multiprocessing.spawn import spawn_main

    spawn_main(tracker_fd=tracker_fd, pipe_handle=pipe_handle)


def _place(fds: list[int], targets: list[int]) -> None:
    """Each received fd at its number in the program (the standard streams; what a spawned
    child inherited), by way of numbers above them all."""
    import fcntl

    high = [fcntl.fcntl(fd, fcntl.F_DUPFD, 256) for fd in fds]
    for fd in fds:
        os.close(fd)
    for fd, target in zip(high, targets):
        os.dup2(fd, target)
        os.close(fd)


def _die_like(exc: BaseException) -> int:
    """What a fresh interpreter does with an uncaught exception: the traceback (the
    program's frames only), then exit 1, or death by SIGINT for KeyboardInterrupt."""
    tb = exc.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename.startswith("<prism-rr"):
        tb = tb.tb_next
    sys.excepthook(type(exc), exc.with_traceback(tb), tb)
    if isinstance(exc, KeyboardInterrupt):
        _before_teardown()
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    return 1


def _warnings(options: list[str], defaults: list, imported: list) -> None:
    """The filters a fresh interpreter has: PYTHONWARNINGS's and then -W's over the defaults,
    then what the imports added in front."""
    import warnings

    warnings.filters[:] = defaults
    sys.warnoptions[:] = [o for o in options if o]
    warnings._processoptions(sys.warnoptions)
    warnings.filters[:0] = imported
    warnings._filters_mutated()


def _threads(value: str | None) -> None:
    """OMP_NUM_THREADS is read when torch's libraries load: set what a fresh process would."""
    import torch

    try:
        n = int(value) if value else 0
    except ValueError:
        n = 0
    if n > 0:
        torch.set_num_threads(n)


def _child(req: dict, fds: list[int], base_path: list[str], base_env: dict) -> int:
    if req["own_group"]:  # as its stand-in: a launcher's rank (start_new_session) leads its own
        os.setsid()
    _place(fds, [0, 1, 2, *req["fds"]])
    os.chdir(req["cwd"])
    env = req["env"]
    os.environ.clear()
    os.environ.update(env)
    for k, v in base_env["+imports"].items():
        os.environ.setdefault(k, v)
    if env.get("OMP_NUM_THREADS") != base_env.get("OMP_NUM_THREADS"):
        _threads(env.get("OMP_NUM_THREADS"))
    _warnings([*env.get("PYTHONWARNINGS", "").split(","), *(o[2:] for o in req["options"] if o.startswith("-W"))],
              *base_env["+filters"])
    unbuffered = "-u" in req["options"] or bool(env.get("PYTHONUNBUFFERED"))
    _stdio(unbuffered)
    sys.dont_write_bytecode = "-B" in req["options"] or bool(env.get("PYTHONDONTWRITEBYTECODE"))
    if env.get("PYTHONFAULTHANDLER"):
        import faulthandler

        faulthandler.enable()
    kind, target = req["main"]
    first = os.path.dirname(os.path.abspath(target)) if kind == "script" else (os.getcwd() if kind == "module" else "")
    extra = [os.path.abspath(p) for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    sys.path[:] = [first, *extra, *base_path]
    sys.argv[:] = req["argv"]
    sys.orig_argv[:] = req["orig_argv"]
    sys._prism_rr_warm_child = True  # sitecustomize.py: this process is the program, not a stand-in
    sys.modules.pop("sitecustomize", None)
    try:
        import sitecustomize  # noqa: F401  (prism-rr's hook, when record or replay put it first)
    except ImportError as exc:
        if exc.name != "sitecustomize":
            print(f"Error in sitecustomize; set PYTHONVERBOSE for traceback:\n{type(exc).__name__}: {exc}",
                  file=sys.stderr)
    except Exception as exc:
        print(f"Error in sitecustomize; set PYTHONVERBOSE for traceback:\n{type(exc).__name__}: {exc}",
              file=sys.stderr)
    quick = not env.get("PRISM_RR_TEST_TEARDOWN")
    try:
        if kind == "script":
            _exec_script(os.path.abspath(target))
        elif kind == "module":
            _exec_module(target)
        else:
            _exec_spawn(*target)
    except SystemExit as exc:
        if not quick:
            raise
        _end_quickly(_exit_status(exc))
    except BaseException as exc:
        status = _die_like(exc)
        if quick:
            _end_quickly(status)
        return status
    if quick:
        _end_quickly(0)
    return 0


def _exit_status(exc: SystemExit) -> int:
    """The status a fresh interpreter exits with for `exc` (printing a message that is not a number)."""
    if exc.code is None:
        return 0
    if isinstance(exc.code, int):
        return exc.code & 0xFF
    print(exc.code, file=sys.stderr)
    return 1


def _end_quickly(status: int) -> None:
    """End as a fresh interpreter ends up to its teardown (threads joined, atexit's functions
    run, the standard streams flushed), then exit without tearing the interpreter down.

    The teardown of a forked child frees torch's modules, which copies every page of the
    server's it touches: about 0.35 s of CPU a program (0.3 s is all a warm `prism-rr info`
    costs otherwise), some 300 s of the suite's CPU. What it skips is the destructors of
    what was still alive at the end (a process group never destroyed, ...): the tests whose
    subject is a process's teardown are marked `teardown` (tests/conftest.py), and their
    programs are torn down as a fresh interpreter's are."""
    flushed = _before_teardown()
    os._exit(status if flushed else 120)  # 120: what a fresh interpreter exits with when it cannot flush them


def _before_teardown() -> bool:
    """What a fresh interpreter does at its end before its teardown: non-daemon threads
    joined, atexit's functions run, the standard streams flushed (False: one could not be)."""
    import atexit
    import threading

    threading._shutdown()
    atexit._run_exitfuncs()
    flushed = True
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            flushed = False
    return flushed


def serve(path: str) -> None:
    import warnings

    base_env = dict(os.environ)
    defaults = list(warnings.filters)
    for name in PRELOAD:
        __import__(name)
    base_env["+filters"] = (defaults, [f for f in warnings.filters if f not in defaults])
    # What the imports set (torch's inductor sets its cache directory): a fresh process
    # importing them sets it too.
    base_env["+imports"] = {k: v for k, v in os.environ.items() if base_env.get(k) != v}
    here = os.path.dirname(os.path.abspath(path))
    base_path = [p for p in sys.path[1:] if p]
    base_path = [p for p in base_path if os.path.abspath(p) not in
                 {os.path.abspath(e) for e in base_env.get("PYTHONPATH", "").split(os.pathsep) if e}]
    del here
    parent = os.getppid()
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    tmp = f"{path}.{os.getpid()}"
    listener.bind(tmp)
    listener.listen(128)
    os.rename(tmp, path)  # ready only once torch is in
    gc.collect()
    gc.freeze()  # the children share the imported pages; a collection would copy them all
    running: dict[int, tuple[int, socket.socket]] = {}  # pidfd -> (pid, connection)
    by_conn: dict[int, int] = {}  # connection fd -> pidfd
    me = os.getpid()
    trace = os.environ.get("PRISM_RR_TEST_WARM_CPU")  # FILE: each forked program's pid, CPU, argv and test
    req_argv: dict[int, list] = {}
    try:
        while os.getppid() == parent:
            watched = [listener.fileno(), *running, *by_conn]
            ready, _, _ = select.select(watched, [], [], 1.0)
            for fd in ready:
                if fd == listener.fileno():
                    conn, _ = listener.accept()
                    try:
                        req, fds = _recv_request(conn)
                    except (EOFError, OSError, ValueError):
                        conn.close()
                        continue
                    why = _why_cold(req, base_env)
                    if why is not None or len(fds) != 3 + len(req.get("fds", ())):
                        _send(conn, cold=why or "standard streams missing")
                        for f in fds:
                            os.close(f)
                        conn.close()
                        continue
                    for stream in (sys.stdout, sys.stderr):
                        stream.flush()
                    pid = os.fork()
                    if pid == 0:
                        listener.close()
                        conn.close()
                        for pidfd, (_, other) in running.items():
                            os.close(pidfd)
                            other.close()
                        raise SystemExit(_child(req, fds, base_path, base_env))
                    for f in fds:
                        os.close(f)
                    req_argv[pid] = (req["orig_argv"][1:], req["env"].get("PYTEST_CURRENT_TEST"))
                    pidfd = os.pidfd_open(pid)
                    running[pidfd] = (pid, conn)
                    by_conn[conn.fileno()] = pidfd
                    _send(conn, pid=pid)
                elif fd in running:
                    pid, conn = running.pop(fd)
                    by_conn.pop(conn.fileno(), None)
                    _, status, usage = os.wait4(pid, 0)
                    os.close(fd)
                    if trace:
                        argv, test = req_argv.pop(pid, (None, None))
                        with open(trace, "a") as f:
                            f.write(json.dumps({"pid": pid, "cpu": usage.ru_utime + usage.ru_stime,
                                                "argv": argv, "test": test}) + "\n")
                    _send(conn, status=status)
                    conn.close()
                elif fd in by_conn:  # the stand-in's side: a message, or its end (killed)
                    pidfd = by_conn[fd]
                    pid, conn = running[pidfd]
                    try:
                        gone = not conn.recv(64)
                    except OSError:
                        gone = True
                    if gone:
                        by_conn.pop(fd)
                        for kill in (os.killpg, os.kill):
                            try:
                                kill(pid, signal.SIGKILL)
                                break
                            except OSError:
                                pass
    finally:
        if os.getpid() == me:
            for pidfd, (pid, _) in running.items():
                try:
                    os.killpg(pid, signal.SIGKILL)
                except OSError:
                    pass
            try:
                os.unlink(path)
            except OSError:
                pass
