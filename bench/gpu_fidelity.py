"""GPU fidelity (issue 27): every figure of one GPU run in one table.

Per workload, each recorded once and replayed `--repeats` times with rank 0 real (the
median replay's figures): the recorded and replayed iteration time per step, the error
(mean of per-step errors, and error of the mean step), peak memory recorded and replayed
and its error, the replay's wall time and the replayer's own share, on the clock the
fidelity report names; whether the recording carries device time and for how many steps;
host synchronizations per step, recorded and replayed (CUDA's sync debug mode, counted by
bench/workloads/count_syncs.py, which runs every workload). Workloads:

  demo   the embedded demo (prism_rr.demo) at world 1
  ddp    tests/gpu/cuda_train.py: DDP over a DeviceMesh, logging collectives
  fsdp   bench/workloads/fsdp_train.py: FSDP2 over a DeviceMesh of the devices at hand
  scale  the fsdp recording `scale`d to dp 64, replayed: a prediction, not a fidelity figure
         (at world 1, where FSDP2 makes no collective calls, the ddp recording's)
  scale-waits  the same replays with the virtual peers' waits on the device's stream
         (PRISM_RR_DEVICE_WAITS=auto: replayer/_device_wait.py), beside scale's host waits

Then the device waits of bench/device_wait.py where it exists. Targets (median of 3
replays on one GPU): iteration-time error <= 1% at world 1, <= 2% for FSDP2; peak memory
<= 0.01%.

    python bench/gpu_fidelity.py [--device auto|cuda|cpu] [--workloads demo,ddp,fsdp,scale]
        [--steps 12] [--repeats 3] [--payload digest] [--no-floor] [--quick] [--timeout 300] [--json]
        [--out FILE]

Each fidelity workload is recorded a second time (unless --no-floor) and that recording
scored against the first as a replay is: the noise floor, how far two runs of the same
program are apart on this machine (on an H200 a plain run's steps moved between 31 and
48 ms within one run), beside which an error means something.

Every child has a timeout; a workload that fails has its error in the table and the rest
go on (exit 1 at the end). Progress goes to stderr, each workload's figures as it ends; the
table to stdout, or with --json one JSON object to stdout and the table to stderr; --out
writes the JSON to a file after each workload too. Prints figures; asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

BENCH = REPO / "bench"
COUNT_SYNCS = BENCH / "workloads" / "count_syncs.py"
FSDP_TRAIN = BENCH / "workloads" / "fsdp_train.py"
DDP_TRAIN = REPO / "tests" / "gpu" / "cuda_train.py"
WORKLOADS = ("demo", "ddp", "fsdp", "scale", "scale-waits")
SCALE_DP = 64
MEMORY_TARGET_PCT = 0.01
LATENESS_MS = (0.1, 1.0, 10.0)
# FSDP2 model sizes: a GPU step that computes more than it launches; a CPU step of a
# second at most; --quick's smaller still
FSDP_SIZES = {
    "cuda": ["--vocab", "32000", "--dim", "1024", "--heads", "16", "--layers", "8", "--seq", "1024", "--batch", "8"],
    "cpu": ["--dim", "256", "--layers", "4", "--seq", "128", "--batch", "8"],
    "quick": ["--dim", "128", "--layers", "2", "--seq", "64", "--batch", "4"],
}


class Failed(Exception):
    """A step of a workload failed: one line for the table."""


@dataclass
class Clock:
    started: float = field(default_factory=time.monotonic)

    def say(self, msg: str) -> None:
        print(f"[{time.monotonic() - self.started:6.1f} s] {msg}", file=sys.stderr, flush=True)


def run_child(argv: list[str], *, timeout: float, env: dict, cwd: Path, what: str) -> tuple[str, float]:
    """Run argv in a session of its own (its ranks with it); stdout and the wall time, or
    Failed naming what failed and the last line it wrote. A child past its timeout is
    killed with everything it started."""
    t = time.monotonic()
    proc = subprocess.Popen([str(a) for a in argv], env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            stdin=subprocess.DEVNULL, text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.communicate()
        raise Failed(f"{what} timed out after {timeout:.0f} s") from None
    wall = time.monotonic() - t
    if proc.returncode != 0:
        lines = [ln.strip() for ln in (err or out).splitlines() if ln.strip()]
        raise Failed(f"{what} exited {proc.returncode}: {lines[-1] if lines else '(no output)'}")
    return out, wall


@dataclass
class Workload:
    name: str
    world: int
    program: list[str]  # one rank's program, run under count_syncs.py
    target_pct: float | None  # iteration-time error target; None: a prediction, or no target
    source: str | None = None  # scale's: the workload whose recording it scales


def workloads(device: str, world: int, steps: int, quick: bool) -> dict[str, Workload]:
    from prism_rr import demo

    train = demo.plan(1).train[1:]  # ["-m", "prism_rr.demo.train", ...]
    train[train.index("--steps") + 1] = str(steps)
    sizes = FSDP_SIZES["quick" if quick else device]
    fsdp = [str(FSDP_TRAIN), "--steps", str(steps), *sizes]
    ddp = [str(DDP_TRAIN), "--steps", str(steps)]
    # scale's source: a recording with collective calls to fit on and virtual peers to wait
    # for; FSDP2 at world 1 makes none, the DDP trainer's logging calls are there at any world
    source = "fsdp" if world > 1 else "ddp"
    return {
        "demo": Workload("demo", 1, train, 1.0),
        "ddp": Workload("ddp", world, ddp, 1.0 if world == 1 else None),
        "fsdp": Workload("fsdp", world, fsdp, 2.0),
        "scale": Workload("scale", world, fsdp if source == "fsdp" else ddp, None, source),
        "scale-waits": Workload("scale-waits", world, fsdp if source == "fsdp" else ddp, None, source),
    }


class Bench:
    def __init__(self, args, device: str, work: Path, clock: Clock):
        self.args, self.device, self.work, self.clock = args, device, work, clock
        self.env = dict(os.environ)
        self.env.setdefault("OMP_NUM_THREADS", "1")
        self.env.pop("PRISM_RR_REPLAY_TRACE", None)
        if device == "cpu":
            self.env["CUDA_VISIBLE_DEVICES"] = ""  # the workloads fall back to gloo on CPU
        self.bundles: dict[str, Path] = {}
        self.scaled: dict | None = None  # what `scale --json` said of the dp-64 bundle
        self.floored = False  # a workload's floor was taken

    def cli(self, *args) -> list:
        return [sys.executable, "-m", "prism_rr.cli", *args]

    def program(self, w: Workload) -> list:
        return [sys.executable, str(COUNT_SYNCS), *w.program]

    def child_timeout(self) -> list:
        return ["--timeout", str(max(10, int(self.args.timeout) - 20))]  # its own first: a hang still reports

    def record(self, w: Workload, again: bool = False) -> tuple[Path, dict]:
        name = f"{w.name}-again" if again else w.name
        bundle = self.work / f"{name}.prism"
        syncs = self.work / f"{name}-record-syncs"
        syncs.mkdir()
        self.clock.say(f"{w.name}: recording {'again (the noise floor) ' if again else ''}world {w.world}, "
                       f"steps 1:{self.args.steps}")
        _, wall = run_child(self.cli("record", "-o", bundle, "--nproc", w.world, "--steps", f"1:{self.args.steps}",
                                     "--payload", self.args.payload, "--memory", *self.child_timeout(), "--",
                                     *self.program(w)),
                            timeout=self.args.timeout, env=dict(self.env, PRISM_BENCH_SYNCS=str(syncs)),
                            cwd=self.work, what=f"{w.name}: record")
        self.clock.say(f"{w.name}: recorded in {wall:.1f} s")
        return bundle, {"record_wall_s": wall, "syncs": read_syncs(syncs)}

    def replay(self, w: Workload, bundle: Path, i: int, extra=(), env=None) -> tuple[dict, float, dict | None]:
        report = self.work / f"{w.name}-replay{i}.json"
        syncs = self.work / f"{w.name}-replay{i}-syncs"
        syncs.mkdir()
        self.clock.say(f"{w.name}: replay {i + 1} of {self.args.repeats}")
        _, wall = run_child(self.cli("replay", bundle, "--ranks", "0", "--report", report, *extra,
                                     *self.child_timeout(), "--", *self.program(w)),
                            timeout=self.args.timeout, env=dict(self.env, **(env or {}), PRISM_BENCH_SYNCS=str(syncs)),
                            cwd=self.work, what=f"{w.name}: replay {i + 1}")
        self.clock.say(f"{w.name}: replayed in {wall:.1f} s")
        return json.loads(report.read_text()), wall, read_syncs(syncs)

    def replays(self, w: Workload, bundle: Path, extra=(), env=None) -> tuple[list, list[str]]:
        done, failures = [], []
        for i in range(self.args.repeats):
            try:
                done.append(self.replay(w, bundle, i, extra, env))
            except Failed as e:
                failures.append(str(e))
                self.clock.say(str(e))
        if not done:
            raise Failed(failures[-1])
        return done, failures

    def fidelity(self, w: Workload) -> dict:
        bundle, rec = self.record(w)
        self.bundles[w.name] = bundle
        done, failures = self.replays(w, bundle)
        out = row(w, bundle, rec, done, failures)
        if self.args.floor and not (self.args.quick and self.floored):
            # the same program recorded again, scored against the first as a replay is: how
            # far apart two runs of it are here, with no replay at all (--quick: the first
            # workload's only, enough to know the column works)
            self.floored = True
            try:
                again, _ = self.record(w, again=True)
                out.update(floor(bundle, again, out["scored_steps"], out["clock"]))
            except Failed as e:
                out["floor_error"] = str(e)
                self.clock.say(str(e))
        return out

    def scale(self, w: Workload) -> dict:
        base = self.bundles.get(w.source)
        if base is None:
            base, _ = self.record(Workload(w.source, w.world, w.program, None))
            self.bundles[w.source] = base
        big = self.work / f"{w.source}-dp{SCALE_DP}.prism"
        if not big.exists():
            self.clock.say(f"scale: {base.name} to dp {SCALE_DP}")
            out, _ = run_child(self.cli("scale", base, "--dp", SCALE_DP, "-o", big, "--json"),
                               timeout=self.args.timeout, env=self.env, cwd=self.work, what="scale: scale")
            self.scaled = json.loads(out)
        note = self.scaled
        rec = {"record_wall_s": None, "syncs": None, "fit_samples": note["model"]["fit_error"]["samples"],
               "scaled_world": note["to"]["world_size"]}
        # scale-waits: the virtual peers wait on the device's stream (the host's on CPU)
        waits = {"PRISM_RR_DEVICE_WAITS": "auto"} if w.name == "scale-waits" else {"PRISM_RR_DEVICE_WAITS": "off"}
        done, failures = self.replays(w, big, extra=("--continue-on-divergence",), env=waits)
        out = row(w, big, rec, done, failures)
        out["device_waits"] = [rep.get("device_waits") or {} for rep, _, _ in done]
        return out


def floor(first: Path, again: Path, scored: list[int], clock: str) -> dict:
    """Rank 0's scored steps in a second recording against the first, on `clock`: the mean
    of per-step errors and the error of the mean step, as a replay's are reckoned."""
    from prism_rr.analysis import step_durations
    from prism_rr.format import open_bundle

    with open_bundle(first) as a, open_bundle(again) as b:
        pairs = [(step_durations(a, s, clock).get(0), step_durations(b, s, clock).get(0)) for s in scored]
    pairs = [(x, y) for x, y in pairs if x and y]
    if not pairs:
        return {"floor_error_pct": None, "floor_mean_error_pct": None}
    per_step = statistics.mean(abs(y - x) / x * 100 for x, y in pairs)
    mx, my = statistics.mean(x for x, _ in pairs), statistics.mean(y for _, y in pairs)
    return {"floor_error_pct": per_step, "floor_mean_error_pct": abs(my - mx) / mx * 100,
            "floor_step_s": my / 1e9}


def read_syncs(folder: Path) -> dict | None:
    """Rank 0's sync counts per step (count_syncs.py's file), None where it wrote none."""
    files = sorted(folder.glob("syncs-0-*.json"))
    if not files:
        return None
    data = json.loads(files[-1].read_text())
    return {"cuda": data["cuda"], "steps": {int(k): v for k, v in data["steps"].items()}}


def per_step(syncs: dict | None, steps: list[int]) -> float | None:
    if not syncs or not syncs["cuda"] or not steps:
        return None
    return statistics.mean(syncs["steps"].get(s, 0) for s in steps)


def device_time(bundle: Path, scored: list[int]) -> dict:
    """The recording's device clock facts: the feature, its clocks, steps resolved on it."""
    from prism_rr.analysis import step_durations
    from prism_rr.format import open_bundle
    from prism_rr.format.facts import device_time_facts

    with open_bundle(bundle) as b:
        facts = device_time_facts(b)
        features = list(b.manifest.get("features_required", ())) + list(b.manifest.get("features_optional", ()))
        durations = {s: step_durations(b, s, clock="device").get(0) for s in b.steps}
        steps = list(b.steps)
    resolved = [s for s in steps if durations[s] is not None]
    on_device = [durations[s] / 1e9 for s in scored if durations.get(s) is not None]
    return {"feature": "device-time" in features, "clocks": facts["clocks"] if facts else [],
            "records": facts["records"] if facts else 0, "steps_resolved": len(resolved), "steps": len(steps),
            "recorded_device_step_s": statistics.mean(on_device) if on_device else None}


def _median(values):
    values = [v for v in values if isinstance(v, (int, float)) and not isinstance(v, bool)]
    return statistics.median(values) if values else None


def _first_of_each_kind(caveats) -> dict:
    """Each kind of caveat once (the replays' texts differ only in the load they saw)."""
    out: dict[str, str] = {}
    for c in caveats:
        out.setdefault(c["kind"], c["text"])
    return out


def row(w: Workload, bundle: Path, rec: dict, done: list, failures: list[str]) -> dict:
    """One workload's figures: the median over its replays of each."""
    reports = [r for r, _, _ in done]
    first = reports[0]
    scored = first["scored_steps"]

    def mean_of(rep, key):
        vals = [s[key] for s in rep["steps"] if s["step"] in rep["scored_steps"]]
        return statistics.mean(vals) if vals else None

    out = {
        "workload": w.name, "world": first["world_size"], "real_ranks": first["ranks"], "mode": first["mode"],
        "clock": first.get("clock", "host"), "scored_steps": scored, "replays": len(reports),
        "target_error_pct": w.target_pct, "target_peak_memory_error_pct": MEMORY_TARGET_PCT,
        "recorded_step_s": mean_of(first, "recorded_s"),
        "replayed_step_s": _median(mean_of(r, "replayed_s") for r in reports),
        "error_pct": _median(r["iteration_time_error_pct"] for r in reports),
        "mean_step_error_pct": _median(r.get("mean_step_error_pct") for r in reports),
        "recorded_step_spread_pct": first.get("recorded_step_spread_pct"),
        "peak_recorded_bytes": first["peak_memory_recorded_bytes"],
        "peak_replayed_bytes": _median(r["peak_memory_replayed_bytes"] for r in reports),
        "peak_error_pct": _median(r["peak_memory_error_pct"] for r in reports),
        "step_peak_error_pct": _median(r["step_peak_memory_error_pct"] for r in reports),
        "replay_wall_s": _median(wall for _, wall, _ in done),
        "replayer_setup_s": _median(r.get("replayer_setup_s") for r in reports),
        "replayer_in_steps_s": _median(r.get("replayer_in_steps_s") for r in reports),
        "setup_s": _median(r.get("setup_s") for r in reports),
        "record_wall_s": rec["record_wall_s"],
        "syncs_recorded_per_step": per_step(rec["syncs"], scored),
        "syncs_replayed_per_step": _median(per_step(s, scored) for _, _, s in done),
        "syncs_measured": bool(rec["syncs"] and rec["syncs"]["cuda"]) or any(s and s["cuda"] for _, _, s in done),
        "device_time": device_time(bundle, scored),
        "fidelity_figure": all(r.get("fidelity_figure", True) for r in reports),
        "caveats": list(_first_of_each_kind(c for r in reports for c in r.get("caveats") or ()).values()),
        "divergences": max(r["divergences"] for r in reports),
        "errors_pct": [r["iteration_time_error_pct"] for r in reports],
        "mean_step_errors_pct": [r.get("mean_step_error_pct") for r in reports],
        "failures": failures,
    }
    if first["mode"] == "prediction":
        # the report's error keys are the predicted change's size there, not an error
        out.update(dict.fromkeys(("error_pct", "mean_step_error_pct", "peak_error_pct", "step_peak_error_pct",
                                  "errors_pct", "mean_step_errors_pct", "target_peak_memory_error_pct")))
        p = [r["prediction"] for r in reports]
        out["prediction"] = {
            "world_size": p[0]["world_size"], "recorded_world_size": p[0]["recorded_world_size"],
            "step_time_s": _median(x["step_time_s"] for x in p), "recorded_step_time_s": p[0]["recorded_step_time_s"],
            "step_time_change_pct": _median(x["step_time_change_pct"] for x in p),
            "peak_memory_bytes": _median(x["peak_memory_bytes"] for x in p),
            "recorded_peak_memory_bytes": p[0]["recorded_peak_memory_bytes"],
            "peak_memory_change_pct": _median(x["peak_memory_change_pct"] for x in p),
            "fit_samples": rec.get("fit_samples"),
        }
    return out


def device_waits(device: str, repeats: int, timeout: float, env: dict) -> dict:
    """bench/device_wait.py's measure() in a child of its own, or why not."""
    code = (
        "import json, sys\n"
        f"sys.path.insert(0, {str(BENCH)!r})\n"
        "try:\n"
        "    import device_wait\n"
        "except ModuleNotFoundError as e:\n"
        "    if e.name != 'device_wait':\n"
        "        raise\n"
        "    print(json.dumps({'absent': True})); sys.exit()\n"
        f"rows = device_wait.measure({device!r}, lateness_ms={LATENESS_MS!r}, repeats={repeats})\n"
        "print(json.dumps({'rows': rows}))\n"
    )
    try:
        out, _ = run_child([sys.executable, "-c", code], timeout=timeout, env=env, cwd=REPO, what="device waits")
        data = json.loads(out.strip().splitlines()[-1])
    except (Failed, ValueError, IndexError) as e:
        return {"error": str(e) or "no JSON line"}
    if data.get("absent"):
        return {"absent": True}
    return {"rows": data["rows"]}


# --- the table -----------------------------------------------------------------------


def summary(r: dict) -> str:
    """One workload's figures in a progress line (a run cut short has said them)."""
    if r["mode"] == "prediction":
        p = r["prediction"]
        figures = (f"predicted at world {p['world_size']}: {_ms(p['step_time_s'])}/step "
                   f"({_f(p['step_time_change_pct'], '+.1f', '%')}), peak {_mb(p['peak_memory_bytes'])}")
    else:
        figures = (f"{_ms(r['recorded_step_s'])} -> {_ms(r['replayed_step_s'])}/step ({r['clock']} clock), error "
                   f"{_f(r['error_pct'], '.2f', '%')} per step, {_f(r['mean_step_error_pct'], '.2f', '%')} of the "
                   f"mean; peak memory error {_f(r['peak_error_pct'], '.4f', '%')}")
    return f"{r['workload']}: {figures}; syncs/step {_syncs(r)}; device time {_device_time(r['device_time'])}"


def _f(v, fmt: str, unit: str = "") -> str:
    return "n/a" if v is None else f"{v:{fmt}}{unit}"


def _ms(v) -> str:
    return _f(None if v is None else v * 1e3, ".2f", " ms")


def _mb(v) -> str:
    return _f(None if v is None else v / 2**20, ".1f", " MiB")


def _target(v, target) -> str:
    if target is None:
        return "-"
    mark = "n/a" if v is None else ("ok" if v <= target else "MISS")
    return f"<={target:g}% {mark}"


def _syncs(r: dict) -> str:
    if not r["syncs_measured"]:
        return "not measured (no CUDA)"
    return f"{_f(r['syncs_recorded_per_step'], '.1f')} -> {_f(r['syncs_replayed_per_step'], '.1f')}"


def _floor(r: dict) -> str:
    if "floor_error_pct" not in r:
        return "-" if "floor_error" not in r else "failed"
    return f"{_f(r['floor_error_pct'], '.2f', '%')} / {_f(r['floor_mean_error_pct'], '.2f', '%')}"


def _device_time(d: dict) -> str:
    if not d["feature"]:
        return "no"
    return f"yes ({', '.join(d['clocks'])}), {d['steps_resolved']}/{d['steps']} steps"


COLUMNS = ("workload", "world", "clock", "recorded", "replayed", "err/step", "err(mean)", "target", "floor", "spread",
           "peak rec", "peak rep", "peak err", "target", "replay", "replayer own", "syncs/step rec->rep",
           "device time")


def cells(r: dict) -> list[str]:
    world = f"{r['world']} ({len(r['real_ranks'])} real)"
    own = f"{_f(r['replayer_setup_s'], '.2f', ' s')} + {_ms(r['replayer_in_steps_s'])}/step"
    if r["mode"] == "prediction":
        p = r["prediction"]
        err = [f"{_f(p['step_time_change_pct'], '+.1f', '%')} predicted", "", "-", "", "",
               _mb(p["recorded_peak_memory_bytes"]),
               _mb(p["peak_memory_bytes"]), f"{_f(p['peak_memory_change_pct'], '+.1f', '%')} predicted", "-"]
        rec, rep = _ms(p["recorded_step_time_s"]), _ms(p["step_time_s"])
    else:
        err = [_f(r["error_pct"], ".2f", "%"), _f(r["mean_step_error_pct"], ".2f", "%"),
               _target(r["error_pct"], r["target_error_pct"]), _floor(r), _f(r["recorded_step_spread_pct"], ".1f", "%"),
               _mb(r["peak_recorded_bytes"]), _mb(r["peak_replayed_bytes"]), _f(r["peak_error_pct"], ".4f", "%"),
               _target(r["peak_error_pct"], MEMORY_TARGET_PCT)]
        rec, rep = _ms(r["recorded_step_s"]), _ms(r["replayed_step_s"])
    return [r["workload"], world, r["clock"], rec, rep, *err, _f(r["replay_wall_s"], ".1f", " s"), own, _syncs(r),
            _device_time(r["device_time"])]


def table(result: dict) -> str:
    d = result["device"]
    lines = [f"gpu fidelity · {d['kind']} ({d['name']}) · torch {d['torch']} · steps 1:{result['steps']} recorded "
             f"(payload {result.get('payload', 'digest')}), "
             f"rank 0 replayed, median of {result['repeats']} replay(s) · {result['elapsed_s']:.0f} s"]
    rows, notes = [], []
    for name, r in result["workloads"].items():
        if "error" in r:
            notes.append(f"  {name}: FAILED: {r['error']}")
            rows.append([name, "FAILED"] + [""] * (len(COLUMNS) - 2))
            continue
        rows.append(cells(r))
        for f in r["failures"]:
            notes.append(f"  {name}: {f} (left out of the median)")
        if r["mode"] == "prediction":
            p = r["prediction"]
            notes.append(f"  {name}: a prediction at world {p['world_size']} from a recording at world "
                         f"{p['recorded_world_size']} (cost model fitted on {p['fit_samples']} calls), not a "
                         "fidelity figure")
        elif not r["fidelity_figure"]:
            notes.append(f"  {name}: not a fidelity figure: " + "; ".join(r["caveats"]))
        if "device_waits" in r:
            used = sorted({f"{w['mechanism']}" for rep in r["device_waits"] for w in rep.values()})
            waits = sum(w["waits"] for rep in r["device_waits"] for w in rep.values())
            notes.append(f"  {name}: virtual peers waited " + (f"with {', '.join(used)} ({waits} waits)" if used
                                                                 else "by blocking the host"))
        dt = r["device_time"]
        if dt["recorded_device_step_s"] is not None:
            notes.append(f"  {name}: recorded on the device clock {_ms(dt['recorded_device_step_s'])}/step "
                         f"(the replay is scored on the {r['clock']} clock)")
    widths = [max(len(h), *(len(c[i]) for c in rows)) if rows else len(h) for i, h in enumerate(COLUMNS)]
    lines.append("  ".join(h.ljust(w) for h, w in zip(COLUMNS, widths)).rstrip())
    lines += ["  ".join(c.ljust(w) for c, w in zip(cs, widths)).rstrip() for cs in rows]
    lines += notes
    lines.append("targets: iteration-time error <= 1% at world 1, <= 2% for FSDP2 (err/step: the mean of per-step "
                 "errors; err(mean): the error of the mean step; floor: a second recording against the first, per step / of "
                 "the mean, the noise no replay can beat here; spread: the recorded steps' std/mean); peak memory "
                 f"<= {MEMORY_TARGET_PCT}%; no host synchronization added inside a replayed step")
    waits = result["device_waits"]
    if waits.get("absent"):
        lines.append("device waits: not measured (bench/device_wait.py absent)")
    elif "error" in waits:
        lines.append(f"device waits: FAILED: {waits['error']}")
    else:
        lines.append("device waits (a virtual peer recorded `lateness` after the real rank; wait: what the device "
                     "shows; target: within 20 us of the expected):")
        lines.append(f"  {'mechanism':<16} {'case':<8} {'lateness':>9} {'expected':>11} {'wait':>11} {'error':>10}"
                     "  host syncs")
        for w in waits["rows"]:
            if "error" in w:
                lines.append(f"  {str(w.get('mechanism')):<16} FAILED: {w['error']}")
                continue
            err = w.get("error_us")
            mark = "" if err is None else ("ok" if abs(err) <= 20 else "MISS")
            lines.append(f"  {str(w.get('mechanism')):<16} {str(w.get('case', '')):<8} "
                         f"{_f(w.get('lateness_ms'), '.1f', ' ms'):>9} {_f(w.get('expected_ms'), '.4f', ' ms'):>11} "
                         f"{_f(w.get('wait_ms'), '.4f', ' ms'):>11} {_f(err, '+.1f', ' us'):>10} {mark:<4}  "
                         f"{w.get('host_syncs', 'n/a')}")
    load = result["load_average"]
    lines.append(f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} on {result['cpus']} CPUs · device: "
                 f"{d['name']}")
    return "\n".join(lines)


def finite(v):
    """v with NaN and infinities as None (JSON has neither)."""
    if isinstance(v, float) and not math.isfinite(v):
        return None
    if isinstance(v, dict):
        return {k: finite(x) for k, x in v.items()}
    if isinstance(v, list):
        return [finite(x) for x in v]
    return v


def device_facts(kind: str) -> dict:
    import torch

    if kind == "cuda":
        return {"kind": "cuda", "name": torch.cuda.get_device_name(), "count": torch.cuda.device_count(),
                "torch": torch.__version__, "cuda": torch.version.cuda}
    return {"kind": "cpu", "name": f"{os.cpu_count()} CPU cores", "count": 0, "torch": torch.__version__,
            "cuda": None}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", choices=("auto", "cuda", "cpu"), default="auto")
    p.add_argument("--workloads", default=",".join(WORKLOADS), help="some of " + ",".join(WORKLOADS))
    p.add_argument("--steps", type=int, default=12, help="steps each program runs (1 warm-up, 1 start-up step)")
    p.add_argument("--repeats", type=int, default=3, help="replays of each recording")
    p.add_argument("--world", type=int, default=None,
                   help="ranks of ddp and fsdp (default: the GPUs at hand, at most 8; 2 on CPU)")
    p.add_argument("--payload", default="digest", choices=("digest", "small", "none", "full"),
                   help="what the recordings keep of each call's tensors (digest: hashed on the host, "
                        "which synchronizes a CUDA device at each call; none: nothing)")
    p.add_argument("--no-floor", dest="floor", action="store_false",
                   help="skip each workload's second recording (the noise floor: two runs of it, no replay)")
    p.add_argument("--quick", action="store_true",
                   help="fewest steps, one replay, small models, the floor of the first workload only: a smoke test")
    p.add_argument("--timeout", type=float, default=300, help="seconds for each child process")
    p.add_argument("--json", action="store_true", help="one JSON object on stdout; the table on stderr")
    p.add_argument("--out", type=Path, help="also write the JSON object here, after each workload and at the end")
    args = p.parse_args(argv)
    names = [n.strip() for n in args.workloads.split(",") if n.strip()]
    unknown = [n for n in names if n not in WORKLOADS]
    if unknown or not names:
        p.error(f"unknown workloads {unknown}: choose from {','.join(WORKLOADS)}")
    if args.quick:
        args.steps, args.repeats = 4, 1
    if args.steps < 4:
        p.error("--steps must be at least 4 (a recorded step 1 and two scored steps)")
    import torch

    cuda = torch.cuda.is_available()
    if args.device == "cuda" and not cuda:
        p.error(f"--device cuda: torch {torch.__version__} ({sys.executable}) sees no CUDA device")
    device = "cuda" if args.device == "cuda" or (args.device == "auto" and cuda) else "cpu"
    world = args.world or (min(8, torch.cuda.device_count()) if device == "cuda" else 2)

    clock = Clock()
    clock.say(f"gpu fidelity on {device}: {', '.join(names)}, steps {args.steps}, {args.repeats} replay(s), "
              f"world {world} for ddp and fsdp, timeout {args.timeout:.0f} s a child")
    plan = workloads(device, world, args.steps, args.quick)
    results: dict[str, dict] = {}
    waits: dict = {"error": "not run"}

    def result(complete: bool) -> dict:
        out = {
            "device": device_facts(device), "payload": args.payload, "steps": args.steps, "repeats": args.repeats, "world": world,
            "workloads": results, "device_waits": waits, "complete": complete,
            "load_average": list(os.getloadavg()), "cpus": len(os.sched_getaffinity(0)),
            "elapsed_s": time.monotonic() - clock.started,
        }
        out = finite(out)
        if args.out:  # as it goes: a run cut short still leaves the figures it took
            args.out.write_text(json.dumps(out) + "\n")
        return out

    with tempfile.TemporaryDirectory(prefix="prism-gpu-fidelity-") as d:
        bench = Bench(args, device, Path(d), clock)
        for name in names:
            try:
                results[name] = (bench.scale(plan[name]) if name.startswith("scale")
                                 else bench.fidelity(plan[name]))
                clock.say(summary(results[name]))
            except Exception as e:  # one workload's failure must not lose the others' figures
                if not isinstance(e, Failed):
                    traceback.print_exc()
                msg = str(e).strip().splitlines()[-1] if str(e).strip() else type(e).__name__
                results[name] = {"workload": name, "error": msg if isinstance(e, Failed) else f"{type(e).__name__}: {msg}"}
                clock.say(f"{name}: FAILED: {results[name]['error']}")
            result(complete=False)
        clock.say("device waits")
        waits = device_waits(device, args.repeats, args.timeout, bench.env)
    final = result(complete=True)
    text = table(final)
    if args.json:
        print(json.dumps(final))
        print(text, file=sys.stderr)
    else:
        print(text)
    return 1 if any("error" in r for r in results.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
