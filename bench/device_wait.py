"""How exactly a virtual peer's wait occupies the program's stream (issue 27).

For virtual peers recorded 0.1, 1 and 10 ms later than the real rank, the wait the device
actually shows, with each mechanism of prism_rr/replayer/_device_wait.py available here
(CUDA: the Triton %globaltimer spin and calibrated `torch.cuda._sleep`; CPU: the host's
sleep-then-spin). Two cases a lateness each:

  queued   the host has queued the stamp, the wait and a dependent kernel behind a busy
           kernel, as a host that runs ahead of the device does: the device waits
           `lateness` after the stamp (CUDA events around the wait: the stamp's, the
           wait's end; the dependent kernel then runs).
  late     the real rank reaches the wait 2 x lateness after the stamp (its own compute):
           the peer is already there, so the device should not wait at all (an absolute
           mechanism); a relative one waits `lateness` more.

Each figure is the median of `--repeats`; error_us is the wait less the expected wait. On
CUDA the host-synchronizations inside the queued waits are counted with
torch.cuda.set_sync_debug_mode (target: none). Target: every wait within 20 us of the
expected. Prints figures; asserts nothing.

    python bench/device_wait.py [--device auto|cuda|cpu] [--lateness 0.1,1,10] [--repeats 5] [--json]

`measure()` is what bench/gpu_fidelity.py calls.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import warnings
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

TARGET_US = 20.0


def _cuda_case(torch, w, lateness_ns: int, case: str) -> tuple[float, int]:
    """(the wait the device showed in ms, host syncs) for one queued or late wait."""
    busy = int(2e6 * w_cycles_per_ns(torch))  # ~2 ms of busy device ahead, so the host runs ahead
    ev = [torch.cuda.Event(enable_timing=True) for _ in range(3)]
    x = torch.zeros(1, device="cuda")
    torch.cuda.synchronize()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            torch.cuda._sleep(busy)
            w.stamp(0)
            ev[0].record()
            if case == "late":  # the real rank's own compute, past the peer's arrival
                torch.cuda._sleep(int(2 * lateness_ns * w_cycles_per_ns(torch)))
            ev[1].record()
            w.occupy(0, lateness_ns)
            ev[2].record()
            x.add_(1)  # the dependent kernel
        finally:
            torch.cuda.set_sync_debug_mode(0)
        syncs = sum("synchroniz" in str(c.message) for c in caught)
    torch.cuda.synchronize()
    if case == "queued":
        return ev[0].elapsed_time(ev[2]), syncs
    return ev[1].elapsed_time(ev[2]), syncs  # what the wait adds after the rank's own compute


_RATE: list[float] = []


def w_cycles_per_ns(torch) -> float:
    """torch.cuda._sleep's cycles per ns, measured once (for the busy kernels)."""
    if not _RATE:
        from prism_rr.replayer._device_wait import SleepWaiter

        _RATE.append(SleepWaiter("cuda", 1).cycles_per_ns)
    return _RATE[0]


def _host_case(w, lateness_ns: int, case: str) -> tuple[float, int]:
    from prism_rr.replayer._session import sleep_until

    w.stamp(0)
    t0 = w.read(0)  # the stamp itself: a host wait is timed from there, as the device's from its stamp
    if case == "late":
        sleep_until(t0 + 2 * lateness_ns)
    t1 = time.monotonic_ns()
    w.occupy(0, lateness_ns)
    t2 = time.monotonic_ns()
    return ((t2 - t0) if case == "queued" else (t2 - t1)) / 1e6, 0


def measure(device: str = "auto", lateness_ms=(0.1, 1.0, 10.0), repeats: int = 3) -> list[dict]:
    """One row per mechanism, case and lateness: {mechanism, case, lateness_ms, expected_ms,
    wait_ms (median), error_us, host_syncs, device} or, for a mechanism that failed,
    {mechanism, error}."""
    import torch

    from prism_rr.replayer._device_wait import mechanisms, waiter_for

    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    rows = []
    if not mechanisms(device):
        return [{"mechanism": "none", "device": device, "error": f"no device wait mechanism on {device} here"}]
    for name in mechanisms(device):
        try:
            w = waiter_for(device, name, slots=1)
            for case in ("queued", "late"):
                for ms in lateness_ms:
                    ns = int(ms * 1e6)
                    # late: what NCCL would show (nothing); a relative mechanism misses it
                    expected = ms if case == "queued" else 0.0
                    waits, syncs = [], 0
                    for _ in range(repeats + 1):  # the first warms up (a kernel's compile)
                        wait, s = _cuda_case(torch, w, ns, case) if device != "cpu" else _host_case(w, ns, case)
                        waits.append(wait)
                        syncs += s
                    wait = statistics.median(waits[1:])
                    rows.append({"mechanism": name, "case": case, "lateness_ms": ms, "expected_ms": expected,
                                 "wait_ms": round(wait, 4), "error_us": round((wait - expected) * 1000, 1),
                                 "host_syncs": syncs, "device": device})
        except Exception as e:  # one mechanism failing must not lose the others' figures
            rows.append({"mechanism": name, "device": device, "error": f"{type(e).__name__}: {e}"[:300]})
    return rows


def table(rows: list[dict]) -> str:
    out = [f"{'mechanism':<11} {'case':<7} {'late ms':>8} {'expect ms':>9} {'wait ms':>9} {'error us':>9} "
           f"{'syncs':>5}  target |error| <= {TARGET_US:g} us"]
    for r in rows:
        if "error" in r:
            out.append(f"{r['mechanism']:<11} failed: {r['error']}")
            continue
        ok = "ok" if abs(r["error_us"]) <= TARGET_US else "MISS"
        out.append(f"{r['mechanism']:<11} {r['case']:<7} {r['lateness_ms']:>8g} {r['expected_ms']:>9g} "
                   f"{r['wait_ms']:>9.4f} {r['error_us']:>9.1f} {r['host_syncs']:>5}  {ok}")
    return "\n".join(out)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="auto", choices=["auto", "cuda", "cpu"])
    p.add_argument("--lateness", default="0.1,1,10", help="ms, comma-separated")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--json", action="store_true", help="one JSON object on stdout, the table on stderr")
    a = p.parse_args()
    rows = measure(a.device, tuple(float(v) for v in a.lateness.split(",")), a.repeats)
    load = os.getloadavg()[0]
    text = table(rows) + f"\nload average {load:.2f}"
    if a.json:
        print(text, file=sys.stderr)
        print(json.dumps({"rows": rows, "load_1m": load}))
    else:
        print(text)


if __name__ == "__main__":
    main()
