"""What a production job with Flight Recorder on does when it stops, for a test job on gloo.

NCCL's watchdog dumps each rank's Flight Recorder ring when a call times out; gloo's does
not. This gives a test job the same, from its environment (a replay runs the job without
it, and then nothing here does anything):

- FR_DUMPS=DIR (with TORCH_FR_BUFFER_SIZE): once the program called `settled()` and its
  main thread has been still for a second (waiting in a call, or held at its end), a thread
  dumps this rank's ring as torch's pickle (DIR/pickle/nccl_trace_rank_<r>) and its JSON
  (DIR/json/nccl_trace_rank_<r>.json);
- JOB_HOLD=1: `end()` holds a rank whose program is done, as its launcher would until the
  others finish (gloo would otherwise end its peers' wait with "Connection closed by
  peer", not a hang); whoever started the job ends it.
"""

import os
import sys
import threading
import time

_settled = threading.Event()


def start(rank: int) -> None:
    """Watch this rank, where FR_DUMPS asks for dumps."""
    if os.environ.get("FR_DUMPS"):
        threading.Thread(target=_dump_when_still, args=(os.environ["FR_DUMPS"], rank), daemon=True).start()


def settled() -> None:
    """From here on, a still main thread is the job's end or its hang."""
    _settled.set()


def end() -> None:
    """The program is done: where JOB_HOLD asks, stay up until the job is ended."""
    if os.environ.get("JOB_HOLD"):
        time.sleep(600)


def _dump_when_still(where: str, rank: int) -> None:
    from torch._C._distributed_c10d import _dump_fr_trace, _dump_fr_trace_json

    _settled.wait()
    main, seen, since = threading.main_thread().ident, None, time.monotonic()
    while time.monotonic() - since < 1.0:
        frame = sys._current_frames().get(main)
        now = (id(frame), frame.f_lineno if frame else None)
        if now != seen:
            seen, since = now, time.monotonic()
        time.sleep(0.05)
    for form, data, suffix in (("pickle", _dump_fr_trace(), ""), ("json", _dump_fr_trace_json(), ".json")):
        os.makedirs(os.path.join(where, form), exist_ok=True)
        path = os.path.join(where, form, f"nccl_trace_rank_{rank}{suffix}")
        with open(path + ".tmp", "wb") as f:
            f.write(data)
        os.replace(path + ".tmp", path)
