"""The stand-in side of the suite's warm start (server.py says what it is and why).

On PYTHONPATH while the suite runs. In a new interpreter whose program the warm server can
start (a script, the demo's trainer, prism-rr's CLI or a child of multiprocessing's spawn
start method, with no option but -u, -B or -W...), it hands argv, environment,
working directory and the three standard streams to the server, forwards the signals it
gets to the program's process group, and exits with the program's status. Anything else,
or no server to hand it to, and it returns: the interpreter goes on cold, as it would
without this file.
"""

import os
import sys


# The modules run with -m, and the console scripts, that the server can start: the demo's
# trainer, prism-rr's own commands (the tests start a few hundred), replay --from-bundle's
# driver and torchrun.
_MODULES = ("prism_rr.demo.train", "prism_rr.cli", "prism_rr.localrun", "prism_rr.replayer.driver",
            "torch.distributed.run")
_SCRIPTS = ("prism-rr", "torchrun")


# What multiprocessing's spawn start method runs (torch's MultiProcessTestCase, a
# DataLoader's workers, mp.spawn): the child reads its task from the parent's pipe.
_SPAWN = "from multiprocessing.spawn import spawn_main; spawn_main(tracker_fd={}, pipe_handle={})"


def _main_of(orig_argv: list[str]):
    """(options, ("script", path) | ("module", name) | ("spawn", [tracker_fd, pipe_handle]))
    when the server can run it, else None."""
    args = orig_argv[1:]
    options = []
    while args and args[0].startswith("-") and args[0] != "-":
        if args[0] in ("-u", "-B") or (args[0].startswith("-W") and len(args[0]) > 2):
            options.append(args.pop(0))
        elif args[0] == "-m" and len(args) > 1 and args[1] in _MODULES:
            return options, ("module", args[1])
        elif args[0] == "-c" and args[2:] == ["--multiprocessing-fork"]:
            fds = _spawn_fds(args[1])
            return (options, ("spawn", fds)) if fds else None
        else:
            return None
    if args and (args[0].endswith(".py") or os.path.basename(args[0]) in _SCRIPTS) and os.path.isfile(args[0]):
        return options, ("script", args[0])
    return None


def _spawn_fds(code: str):
    import re

    m = re.fullmatch(re.escape(_SPAWN).replace(r"\{\}", r"(\d+)"), code)
    return [int(m.group(1)), int(m.group(2))] if m else None


def _inherited() -> list[int]:
    """The fds a spawned child was given beyond the standard streams (its pipe, its resource
    tracker's, a queue's ends: multiprocessing passes each at its number)."""
    return sorted(fd for fd in map(int, os.listdir("/proc/self/fd")) if fd > 2 and _is_open(fd))


def _is_open(fd: int) -> bool:
    try:
        os.fstat(fd)
        return True
    except OSError:
        return False  # listdir's own, closed by now


def _hand_over(path: str, options: list[str], main) -> None:
    import json
    import signal
    import socket
    import struct

    fds = _inherited() if main[0] == "spawn" else []
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        _connect(conn, path)
    except OSError:
        conn.close()
        _trace("no server", main)
        return  # no server: start cold
    req = {"fds": fds, "argv": list(sys.argv), "orig_argv": list(sys.orig_argv), "options": options, "main": main,
           "env": dict(os.environ), "cwd": os.getcwd(),
           "own_group": os.getpgid(0) == os.getpid()}
    body = json.dumps(req).encode()
    socket.send_fds(conn, [struct.pack("!I", len(body))], [0, 1, 2, *req["fds"]])
    conn.sendall(body)
    reader = conn.makefile("rb")
    first = json.loads(reader.readline() or b"{}")
    if "pid" not in first:
        conn.close()
        _trace("refused " + str(first.get("cold")), main)
        return  # the server said cold
    child = first["pid"]
    for fd in fds:  # the program's now: a pipe's other end sees its end when the program's ends
        os.close(fd)
    _trace("warm", main)
    try:
        status = _wait(reader, child)
    finally:  # from here on this process is the program's stand-in, never the program
        _exit_as(status if "status" in locals() else None)


def _connect(conn, path: str, patience: float = 30.0) -> None:
    """Connect to the server; while it is still importing torch (alive, its socket not
    there yet), wait for it: a few seconds idle cost less than a cold start's CPU."""
    import time

    deadline = time.monotonic() + patience
    while not os.path.exists(path) and _alive(os.path.join(os.path.dirname(path), "server.pid")):
        if time.monotonic() > deadline:
            break
        time.sleep(0.05)
    conn.connect(path)


def _alive(pid_file: str) -> bool:
    try:
        with open(pid_file) as f:
            os.kill(int(f.read()), 0)
        return True
    except (OSError, ValueError):
        return False


def _wait(reader, child: int):
    import json
    import signal

    def forward(signum, frame):
        for kill in (os.killpg, os.kill):
            try:
                kill(child, signum)
                return
            except OSError:
                pass

    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2):
        signal.signal(sig, forward)
    line = reader.readline()
    return json.loads(line).get("status") if line else None


def _exit_as(status) -> None:
    """Exit as the program did: its code, or death by its signal."""
    import signal

    if status is None:  # the server went away, and the program with it
        os._exit(1)
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        try:
            signal.signal(sig, signal.SIG_DFL)
        except (OSError, ValueError):
            pass  # SIGKILL and SIGSTOP have no handler to reset
        os.kill(os.getpid(), sig)
        os._exit(128 + sig)
    os._exit(os.waitstatus_to_exitcode(status))


def _start() -> None:
    path = os.environ.get("PRISM_RR_TEST_WARM")
    if not path or getattr(sys, "_prism_rr_warm_child", False):
        return
    found = _main_of(list(getattr(sys, "orig_argv", [])))
    cold = os.environ.get("PRISM_RR_TEST_COLD_SCRIPTS")  # a,b: a program naming one of them starts cold
    if found is not None and cold and set(cold.split(",")) & {os.path.basename(a) for a in sys.orig_argv[1:]}:
        found = None
    if found is not None:
        _hand_over(path, *found)
    _trace("cold", found)


def _trace(how: str, what) -> None:
    """PRISM_RR_TEST_WARM_TRACE=FILE: a line per interpreter the suite started (cold or warm)."""
    trace = os.environ.get("PRISM_RR_TEST_WARM_TRACE")
    if trace:
        with open(trace, "a") as f:
            f.write(f"{how} {os.getpid()} {what} {sys.orig_argv[1:4]}\n")


_start()
