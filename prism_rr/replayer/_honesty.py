"""What a fidelity card must say beside its figures, so that a reader can tell fidelity
from noise and from a comparison that measures something else.

Noise: the recording's own step-to-step spread over the scored steps (short CPU steps
vary by several percent from one step to the next), and the error of the mean step
beside the mean of the per-step errors. Caveats: the reasons the replay's error is not a
fidelity figure: the recorded ranks shared cores (more torch threads than CPUs on a
host: their compute ran slower than a replay of fewer ranks will), the replay runs on
another kind of device than the recording, or the times are host times of work that ran
on a GPU (the host runs ahead of the device; a step's host time measures the launch
queue).
"""

from __future__ import annotations

import os
from statistics import mean, pstdev

from prism_rr.format.facts import cpu_sharing
from prism_rr.text import shown

# Deferred imports: torch until `here` asks for this host's CUDA device; the card's noise
# and caveats need none.

__all__ = ["caveats", "here", "noise"]


def noise(scored: list[dict]) -> dict:
    """{"recorded_step_spread_pct": the recorded steps' standard deviation over their mean,
    "recorded_step_range_pct": (slowest - fastest) over the mean, "mean_step_error_pct":
    the error of the mean step} over the scored steps (rows of fidelity_report's steps);
    None where fewer than two steps (spread) or none (error) are scored."""
    rec = [s["recorded_s"] for s in scored if s.get("recorded_s")]
    rep = [s["replayed_s"] for s in scored if s.get("recorded_s")]
    out = {"recorded_step_spread_pct": None, "recorded_step_range_pct": None, "mean_step_error_pct": None}
    if rec:
        m = mean(rec)
        out["mean_step_error_pct"] = abs(mean(rep) - m) / m * 100.0
        if len(rec) > 1:
            out["recorded_step_spread_pct"] = pstdev(rec) / m * 100.0
            out["recorded_step_range_pct"] = (max(rec) - min(rec)) / m * 100.0
    return out


def here() -> dict:
    """This machine as a replay sees it: CPUs it may use, CUDA and the device's name."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = os.cpu_count() or 1
    cuda, name = False, None
    try:
        import torch

        cuda = bool(torch.cuda.is_available())
        if cuda:
            name = torch.cuda.get_device_name()
    except Exception:
        pass
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    return {"cpus": cpus, "cuda": cuda, "device_name": name, "load_1m": load}


def caveats(bundle, ranks, *, machine: dict | None = None, clock: str = "host") -> list[dict]:
    """[{"kind", "text"}]: why this replay's error is not a fidelity figure; [] where it is.
    `clock`: the one the steps were scored on (work on a GPU timed on the host is a caveat)."""
    machine = here() if machine is None else machine
    out = []
    infos = {r: bundle.rank_info(r) for r in bundle.recorded_ranks}
    cpu = cpu_sharing(bundle)
    if cpu is not None and cpu["shared"]:
        h = cpu["hosts"][0]
        out.append({"kind": "shared_cores", "text": (
            f"the recording's ranks shared cores ({h['ranks']} ranks, {h['threads']} torch threads on "
            f"{h['cpus']} CPUs): its compute was slowed by contention that a replay of {len(ranks)} real "
            f"rank(s) does not have; record at most {max(1, h['cpus'] * h['ranks'] // max(1, h['threads']))} "
            f"ranks per {h['cpus']} CPUs for a fidelity figure")})
    if cpu is not None and cpu.get("busy"):
        b = cpu["busy"][0]
        out.append({"kind": "busy_host", "text": (
            f"the recording's host had other work (load {b['load']:.1f} on {b['cpus']} CPUs as the ranks ended, "
            f"{b['threads']} of it their own threads): the recorded times hold that contention")})
    threads = sum(int(infos[r].get("cpu", {}).get("threads", 1) or 1) if isinstance(infos.get(r, {}).get("cpu"), dict)
                  else 1 for r in ranks if r in infos)
    if not any(str(infos[r].get("device", "cpu")).startswith("cuda") for r in ranks if r in infos) \
            and threads > machine["cpus"]:
        out.append({"kind": "replay_shared_cores", "text": (
            f"the replay's {len(ranks)} real rank(s) run {threads} torch threads on this machine's "
            f"{machine['cpus']} CPUs: they compute slower than they were recorded")})
    load = machine.get("load_1m")
    if load is not None and load - threads > machine["cpus"] / 2:
        out.append({"kind": "busy_replay", "text": (
            f"this machine had other work during the replay (load {load:.1f} on {machine['cpus']} CPUs, "
            f"{threads} of it the replay's threads)")})
    devices = {str(infos[r].get("device", "cpu")) for r in ranks if r in infos}
    on_gpu = any(d.startswith("cuda") for d in devices)
    if on_gpu and not machine["cuda"]:
        out.append({"kind": "device_kind", "text": "recorded on CUDA, replayed on CPU: the calls are checked and the "
                    "timing modelled, the compute is not the recording's"})
    elif on_gpu:
        names = {infos[r].get("device_name") for r in ranks if isinstance(infos.get(r, {}).get("device_name"), str)}
        if names and machine["device_name"] not in names:
            out.append({"kind": "device_kind", "text": (
                f"recorded on {shown(sorted(names)[0], 60)}, replayed on {shown(machine['device_name'], 60)}")})
    if on_gpu and machine["cuda"] and clock == "host":
        out.append({"kind": "host_clock", "text": (
            "times taken on the host clock of work that ran on the GPU: the host runs ahead of the device, "
            "so a step's host time measures the launch queue as much as the work")})
    return out
