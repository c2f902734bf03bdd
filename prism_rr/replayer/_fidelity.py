"""The fidelity report: recorded against replayed iteration time, memory and compute."""

from __future__ import annotations

from prism_rr.analysis import step_durations
from prism_rr.format.records import Collective, Compute, PointToPoint

__all__ = ["card", "fidelity_report", "how_far"]


def _pct(a: float | None, b: float | None) -> float | None:
    if a is None or b is None or not a:
        return None
    return abs(b - a) / a * 100.0


def _median(values):
    values = sorted(v for v in values if v is not None)
    if not values:
        return None
    mid = len(values) // 2
    return values[mid] if len(values) % 2 else (values[mid - 1] + values[mid]) / 2


def fidelity_report(bundle, ranks, stats: dict[int, dict], *, timing: str) -> dict:
    """One JSON object; `stats` holds what each real rank wrote (rank -> facts)."""
    replayed: dict[int, dict[int, list]] = {r: {s[0]: s for s in st.get("steps", ())} for r, st in stats.items()}
    recorded_compute: dict[tuple[int, int], int] = {}
    progress = {}
    for r in ranks:
        calls, last_step = 0, None
        for rec in bundle.events(r):
            if isinstance(rec, Compute) and rec.name is None and rec.end_ns is not None:
                key = (r, rec.step)
                recorded_compute[key] = recorded_compute.get(key, 0) + rec.end_ns - rec.start_ns
            elif isinstance(rec, (Collective, PointToPoint)):
                calls += 1
                last_step = rec.step if last_step is None else max(last_step, rec.step)
        progress[str(r)] = _progress(bundle.rank_info(r), stats.get(r), calls, last_step)
    steps = []
    rec_peak = rep_peak = None
    compute_by_step: dict[int, list[int]] = {}
    for step in bundle.steps:
        recorded = step_durations(bundle, step)
        peaks = bundle.summaries["steps"].get(step, {})
        rec_s, rep_s = [], []
        step_rec_peak = step_rep_peak = None
        for r in ranks:
            if r not in recorded or step not in replayed.get(r, {}):
                continue
            _, start, end, compute, peak = replayed[r][step]
            rec_s.append(recorded[r] / 1e9)
            rep_s.append((end - start) / 1e9)
            compute_by_step.setdefault(step, [0, 0])
            compute_by_step[step][0] += recorded_compute.get((r, step), 0)
            compute_by_step[step][1] += compute
            rp = peaks.get(r, (None, None, None))[2]
            if rp is not None:
                rec_peak = max(rec_peak or 0, rp)
                step_rec_peak = max(step_rec_peak or 0, rp)
            if peak is not None:
                rep_peak = max(rep_peak or 0, peak)
                step_rep_peak = max(step_rep_peak or 0, peak)
        if rec_s:
            steps.append({"step": step, "recorded_s": sum(rec_s) / len(rec_s), "replayed_s": sum(rep_s) / len(rep_s),
                          "replayed_compute_s": compute_by_step[step][1] / len(rep_s) / 1e9,
                          "peak_recorded_bytes": step_rec_peak, "peak_replayed_bytes": step_rep_peak})
    # The first step also holds start-up (imports, model build): leave it out when others exist.
    scored = steps[1:] if len(steps) > 1 else steps
    errors = [_pct(s["recorded_s"], s["replayed_s"]) for s in scored]
    errors = [e for e in errors if e is not None]
    rec_compute = sum(compute_by_step[s["step"]][0] for s in scored)
    rep_compute = sum(compute_by_step[s["step"]][1] for s in scored)
    divs = [d for r in sorted(stats) for d in stats[r].get("divergences", ())]
    return {
        "ranks": list(ranks),
        "world_size": bundle.world_size,
        "timing": timing,
        "steps": steps,
        "scored_steps": [s["step"] for s in scored],
        "iteration_time_error_pct": sum(errors) / len(errors) if errors else None,
        "peak_memory_recorded_bytes": rec_peak,
        "peak_memory_replayed_bytes": rep_peak,
        "peak_memory_error_pct": _pct(rec_peak, rep_peak),
        # Per scored step, the median of |replayed - recorded| peak: a racy step (a backend
        # thread letting go of a buffer late while recording) does not stand for the run.
        "step_peak_memory_error_pct": _median([_pct(s["peak_recorded_bytes"], s["peak_replayed_bytes"])
                                               for s in scored]),
        "compute_ratio": rep_compute / rec_compute if rec_compute else None,
        "diverged": bool(divs),
        "first_divergence": divs[0] if divs else None,
        "divergences": len(divs),
        "synthetic_numerics": any(st.get("synthetic_numerics") for st in stats.values()),
        # A bundle made by `scale` predicts the shapes of FSDP's gathers and scatters on the
        # groups it resized; those calls are checked on op, group, seq and dtypes only.
        "predicted_shape_calls": sum(int(st.get("predicted_shape_calls", 0)) for st in stats.values()),
        "predicted_shape_mismatches": sum(int(st.get("predicted_shape_mismatches", 0)) for st in stats.values()),
        "predicted_shape_examples": [e for r in sorted(stats) for e in stats[r].get("predicted_shape_examples", ())][:5],
        # timing "virtual": replayed compute -> recorded compute, learned on step 0, per real rank
        "calibration": {str(r): st.get("calibration") for r, st in sorted(stats.items())
                        if st.get("calibration") is not None} or None,
        # per real rank: the calls and steps it made against those recorded
        "progress": progress,
    }


def _progress(info, st: dict | None, recorded_calls: int, recorded_last_step: int | None) -> dict:
    """How far a real rank got. A rank recorded for some steps only (--steps) makes calls
    outside them: there the step it reached counts, elsewhere the calls it made."""
    windowed = isinstance(info, dict) and info.get("steps") is not None
    calls = int(st.get("calls", 0)) if st else None  # None: the rank wrote no results
    step = len(st.get("steps", ())) if st else None  # the step it was in when it ended
    if windowed:
        complete = recorded_calls == 0 or (bool(calls) and (step or 0) >= (recorded_last_step or 0))
    else:
        complete = (calls or 0) >= recorded_calls
    return {"calls": calls, "recorded_calls": recorded_calls, "step": step,
            "recorded_last_step": recorded_last_step, "windowed": windowed, "complete": complete}


def _fmt(v, unit="") -> str:
    return "n/a" if v is None else f"{v:.2f}{unit}"


def _mb(v) -> str:
    return "n/a" if v is None else f"{v / 1e6:.1f} MB"


def card(report: dict) -> str:
    """A few lines for people (stderr)."""
    real = len(report["ranks"])
    lines = [
        f"prism-rr replay · {real} real rank(s) {report['ranks']}, {report['world_size'] - real} virtual · "
        f"timing {report['timing']}",
        f"  steps {len(report['steps'])} · iteration time error {_fmt(report['iteration_time_error_pct'], '%')} "
        f"(mean abs, steps {report['scored_steps']}) · compute ratio {_fmt(report['compute_ratio'])}",
        f"  peak memory recorded {_mb(report['peak_memory_recorded_bytes'])}, replayed "
        f"{_mb(report['peak_memory_replayed_bytes'])} (error {_fmt(report['peak_memory_error_pct'], '%')})",
        f"  numerics {'synthetic (no payloads)' if report['synthetic_numerics'] else 'as recorded'}"
        + (f" · shapes predicted by `scale` on {report['predicted_shape_calls']} calls, not checked "
           f"({report.get('predicted_shape_mismatches', 0)} differ from the live ones)"
           if report.get("predicted_shape_calls") else ""),
    ]
    d = report["first_divergence"]
    early = report.get("stopped_early") or []
    if d is not None:
        lines.append(f"  diverged: rank {d['rank']} group {d['group']} seq {d['seq']} {d['op']}: {d['what']} "
                     f"expected {d['expected']}, got {d['got']}")
    elif not early:
        lines.append("  diverged: no")
    lines.extend(f"  {'failed' if e.get('complete') else 'stopped early'}: {how_far(e)}" for e in early)
    if early and d is None:
        lines.append("  no divergence in the calls made")
    if report.get("unreported"):
        lines.append(f"  no results from rank(s) {report['unreported']} (another node's replay has them)")
    return "\n".join(lines)


def how_far(e: dict) -> str:
    """One rank's end, for a replay that did not run to the recording's end."""
    c = e.get("exit_code", 0)
    if e.get("timed_out"):
        ended = "was stopped by the timeout"
    elif c > 0:
        ended = f"exited with code {c}"
    elif c < 0:
        ended = f"was ended by signal {-c}"
    else:
        ended = "ended"
    calls, total = e.get("calls"), e.get("recorded_calls", 0)
    if calls is None and c >= 0 and not e.get("timed_out"):
        calls = 0  # exited normally without writing results: it never made a process group
    if calls is None:
        made = "(how far it got is not known)"
    elif calls == 0:
        made = f"before the first of {total} recorded calls"
    else:
        made = f"after {calls} of {total} recorded calls"
    last = e.get("recorded_last_step")
    where = ""
    if e.get("step") is not None and last is not None and calls:
        where = f", in step {e['step']} (the recording's last is {last})"
    return f"rank {e.get('rank')} {ended} {made}{where}"
