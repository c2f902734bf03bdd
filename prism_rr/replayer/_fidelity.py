"""The fidelity report: recorded against replayed iteration time, memory and compute, or,
for a scaled bundle or a what-if replay, what the replay predicts."""

from __future__ import annotations

import signal

from prism_rr.analysis import step_durations
from prism_rr.format.records import Collective, Compute, PointToPoint
from prism_rr.text import shown
from prism_rr.replayer._environment import current_versions
from prism_rr.replayer._hang import sentence
from prism_rr.replayer._honesty import caveats, noise
from prism_rr.replayer._replace import note_lines as replace_notes
from prism_rr.replayer._replace import words as replace_words
from prism_rr.replayer._transfers import card_lines as program_lines
from prism_rr.replayer._transfers import merged as program_facts

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


def fidelity_report(bundle, ranks, stats: dict[int, dict], *, timing: str, what_if: dict | None = None) -> dict:
    """One JSON object; `stats` holds what each real rank wrote (rank -> facts).

    A replay of the recording as it ran measures the replay: its `*_error_pct` keys say
    how far it is from the recording. A replay of a bundle made by `scale`, or one that
    asks what if (`what_if`: comm_scale, compute_scale, slow_rank, replace_rank), predicts
    another run:
    then `mode` is "prediction" and `prediction` holds what it predicts, with the change
    from the recording signed; the error keys are kept, but they are that change's size,
    not an error (`predicted_keys` names them).
    """
    recorded_compute, progress = _recorded_calls(bundle, ranks, stats)
    device_steps = {r: {s: b - a for s, a, b in st.get("device_steps") or ()} for r, st in stats.items()}
    clock = _clock(bundle, stats, device_steps)
    steps, rec_peak, rep_peak, compute_ratios = _step_rows(bundle, ranks, stats, device_steps, recorded_compute, clock)
    # The first step also holds start-up (imports, model build): leave it out when others exist.
    scored = steps[1:] if len(steps) > 1 else steps
    rec_step = sum(s["recorded_s"] for s in scored) / len(scored) if scored else None
    rep_step = sum(s["replayed_s"] for s in scored) / len(scored) if scored else None
    prediction = _prediction(bundle, what_if, rec_step, rep_step, rec_peak, rep_peak)
    return {
        # "fidelity": the replay of the recording as it ran; "prediction": of another run
        # (a scaled bundle, a what-if), whose `prediction` says what it predicts
        "mode": "prediction" if prediction else "fidelity",
        # a bundle `import fr` made of Flight Recorder dumps: calls are checked, nothing is scored
        "imported": isinstance(bundle.manifest.get("imported"), dict),
        "prediction": prediction,
        "predicted_keys": ["iteration_time_error_pct", "peak_memory_error_pct", "step_peak_memory_error_pct"]
        if prediction else [],
        "ranks": list(ranks),
        "world_size": bundle.world_size,
        "timing": timing,
        "steps": steps,
        "scored_steps": [s["step"] for s in scored],
        "recorded_steps": list(bundle.steps),
        **_time_keys(bundle, ranks, stats, steps, scored, clock),
        **_memory_keys(scored, rec_peak, rep_peak),
        **_compute_keys(stats, scored, compute_ratios),
        **_call_keys(bundle, ranks, stats, progress),
    }


def _recorded_calls(bundle, ranks, stats: dict[int, dict]) -> tuple[dict[tuple[int, int], int], dict]:
    """One read of each real rank's records: its recorded compute by (rank, step), and how
    far its replay got against the calls and steps it recorded (_progress, by str(rank))."""
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
    return recorded_compute, progress


def _clock(bundle, stats: dict[int, dict], device_steps: dict[int, dict]) -> str:
    """The clock both sides are timed on: the device's where the recording has device step
    times and every real rank's replay timed its steps there too, else the host's."""
    return "device" if (stats and all(device_steps.get(r) for r in stats)
                        and any(step_durations(bundle, s, clock="device") for s in bundle.steps)) else "host"


def _step_rows(bundle, ranks, stats: dict[int, dict], device_steps: dict[int, dict],
               recorded_compute: dict[tuple[int, int], int], clock: str) -> tuple[list[dict], int | None,
                                                                                 int | None, dict[int, list]]:
    """Each step that a real rank both recorded and replayed, as the report's row (means
    over those ranks); the peak memory recorded and replayed over all of them; and per real
    rank, its (step, replayed / recorded compute)."""
    replayed: dict[int, dict[int, list]] = {r: {s[0]: s for s in st.get("steps", ())} for r, st in stats.items()}
    steps = []
    rec_peak = rep_peak = None
    compute_ratios: dict[int, list] = {}
    for step in bundle.steps:
        recorded = step_durations(bundle, step, clock=clock)
        peaks = bundle.summaries["steps"].get(step, {})
        rec_s, rep_s, own_s = [], [], []
        compute = 0
        step_rec_peak = step_rep_peak = None
        for r in ranks:
            if r not in recorded or step not in replayed.get(r, {}):
                continue
            row = replayed[r][step]
            _, start, end, used, peak = row[:5]
            took = end - start if clock == "host" else device_steps[r].get(step)
            if took is None:
                continue
            rec_s.append(recorded[r] / 1e9)
            rep_s.append(took / 1e9)
            own_s.append(row[5] / 1e9 if len(row) > 5 else 0.0)
            compute += used
            if recorded_compute.get((r, step)):
                compute_ratios.setdefault(r, []).append((step, used / recorded_compute[(r, step)]))
            rp = peaks.get(r, (None, None, None))[2]
            if rp is not None:
                rec_peak = max(rec_peak or 0, rp)
                step_rec_peak = max(step_rec_peak or 0, rp)
            if peak is not None:
                rep_peak = max(rep_peak or 0, peak)
                step_rep_peak = max(step_rep_peak or 0, peak)
        if rec_s:
            steps.append({"step": step, "recorded_s": sum(rec_s) / len(rec_s), "replayed_s": sum(rep_s) / len(rep_s),
                          "replayed_compute_s": compute / len(rep_s) / 1e9,
                          "replayer_s": sum(own_s) / len(own_s),
                          "peak_recorded_bytes": step_rec_peak, "peak_replayed_bytes": step_rep_peak})
    return steps, rec_peak, rep_peak, compute_ratios


def _time_keys(bundle, ranks, stats: dict[int, dict], steps: list[dict], scored: list[dict], clock: str) -> dict:
    """The report's step-time keys: the error, beside the recording's own noise, the clock,
    how virtual peers waited, and why the error may not be a fidelity figure."""
    errors = [_pct(s["recorded_s"], s["replayed_s"]) for s in scored]
    errors = [e for e in errors if e is not None]
    warned = caveats(bundle, ranks, clock=clock) if steps else []
    return {
        "iteration_time_error_pct": sum(errors) / len(errors) if errors else None,
        # beside it, to tell fidelity from noise: the recording's own step-to-step spread
        # (std / mean, and the range) and the error of the mean step
        **noise(scored),
        # the clock the step times were taken on, in the recording and the replay alike:
        # "device" (both have device step times) or "host"
        "clock": clock,
        # how each real rank's virtual peers waited, where a waiter did it (_device_wait:
        # PRISM_RR_DEVICE_WAITS): {rank: {"mechanism", "waits", "offset_ms", "transfer_ms",
        # "last"}} (_session.write); {} where the host slept
        "device_waits": {str(r): st["device_waits"] for r, st in sorted(stats.items()) if st.get("device_waits")},
        # why the error above is not a fidelity figure ([] where it is): the recorded ranks
        # shared cores, another kind of device, host times of work on a GPU
        "caveats": warned,
        "fidelity_figure": not warned,
    }


def _memory_keys(scored: list[dict], rec_peak: int | None, rep_peak: int | None) -> dict:
    """The report's peak memory keys: over the run, and per scored step."""
    return {
        "peak_memory_recorded_bytes": rec_peak,
        "peak_memory_replayed_bytes": rep_peak,
        "peak_memory_error_pct": _pct(rec_peak, rep_peak),
        # Per scored step, the median of |replayed - recorded| peak: a racy step (a backend
        # thread letting go of a buffer late while recording) does not stand for the run.
        "step_peak_memory_error_pct": _median([_pct(s["peak_recorded_bytes"], s["peak_replayed_bytes"])
                                               for s in scored]),
    }


def _compute_keys(stats: dict[int, dict], scored: list[dict], compute_ratios: dict[int, list]) -> dict:
    """The report's keys on compute and on the replayer's own time: in set-up, in steps."""
    # Each real rank's compute against its own recorded compute, per scored step; the
    # median of those: the same question with one real rank or many (a sum over ranks
    # would compare rank totals, which a user reads against one step's time).
    scored_steps = {s["step"] for s in scored}
    by_rank = {r: _median([q for st, q in qs if st in scored_steps]) for r, qs in sorted(compute_ratios.items())}
    return {
        # per real rank, the median over scored steps of its replayed compute over its
        # recorded compute; `compute_ratio` is the median of those
        "compute_ratio": _median(by_rank.values()),
        # the slowest real rank's time from its start-up hook to its first step, and the
        # replayer's own share of it (reading the bundle, planning the virtual peers)
        "setup_s": _slowest(stats, "setup_ns"),
        "replayer_setup_s": _slowest(stats, "replayer_setup_ns"),
        # within the scored steps (and in their times), the replayer's own work on the
        # program's data in calls with virtual peers: payloads read and decompressed,
        # outputs built; per step, mean over real ranks, and the largest such step
        "replayer_in_steps_s": max((s["replayer_s"] for s in scored), default=None),
        "compute_ratio_by_rank": {str(r): q for r, q in by_rank.items()} or None,
    }


def _call_keys(bundle, ranks, stats: dict[int, dict], progress: dict) -> dict:
    """The report's keys on the calls the real ranks made: divergences, made-up and
    predicted data, calibration, how far each got, and a bundle program's transfers."""
    divs = [d for r in sorted(stats) for d in stats[r].get("divergences", ())]
    return {
        "diverged": bool(divs),
        "first_divergence": divs[0] if divs else None,
        "divergences": len(divs),
        "synthetic_numerics": any(st.get("synthetic_numerics") for st in stats.values()),
        # a replay whose program is the bundle (driver.py): the calls whose inputs it made up
        # (seeded, of the recorded shape), the bundle holding no bytes for them; their data unchecked
        "inputs_made_up_calls": sum(int(st.get("inputs_made_up_calls") or 0) for st in stats.values()),
        # calls whose inputs were compared with the recording once the device had passed
        # them (on CUDA: no host synchronization for the check), over the real ranks
        "inputs_checked_later": sum(int(st.get("inputs_checked_later") or 0) for st in stats.values()),
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
        # a replay whose program is the bundle (--from-bundle): its calls on groups of real
        # ranks by kind, recorded against replayed, and the outputs it compared (_transfers)
        "bundle_program": _program(bundle, ranks, stats),
    }


def _program(bundle, ranks, stats: dict[int, dict]) -> dict | None:
    out = program_facts(stats)
    if out is not None:
        versions = bundle.rank_info(ranks[0]).get("versions") if ranks else None
        was = versions.get("torch") if isinstance(versions, dict) else None
        out.update(torch_recorded=was if isinstance(was, str) else None, torch_here=current_versions()["torch"])
    return out


def _slowest(stats: dict[int, dict], key: str) -> float | None:
    values = [st[key] for st in stats.values() if isinstance(st.get(key), int) and not isinstance(st.get(key), bool)]
    return max(values) / 1e9 if values else None


def _prediction(bundle, what_if: dict | None, rec_step, rep_step, rec_peak, rep_peak) -> dict | None:
    """What a replay of another run than the recorded one predicts, or None: a bundle made
    by `scale` (another world size), or what-if options."""
    asked = {}
    if what_if:
        if what_if.get("comm_scale", 1.0) != 1.0:
            asked["comm_scale"] = what_if["comm_scale"]
        if what_if.get("compute_scale", 1.0) != 1.0:
            asked["compute_scale"] = what_if["compute_scale"]
        if what_if.get("slow_rank"):
            asked["slow_rank"] = dict(what_if["slow_rank"])
        if what_if.get("replace_rank"):
            asked["replace_rank"] = list(what_if["replace_rank"])
    scaled = bundle.manifest.get("scale")
    recorded_world = None
    if isinstance(scaled, dict) and isinstance(scaled.get("from"), dict):
        w = scaled["from"].get("world_size")
        if isinstance(w, int) and not isinstance(w, bool) and w != bundle.world_size:
            recorded_world = w  # rescaled to another world size: a prediction of that run
    if not asked and recorded_world is None:
        return None

    def change(a, b):
        return None if a is None or b is None or not a else (b - a) / a * 100.0

    return {
        "world_size": bundle.world_size,
        "recorded_world_size": recorded_world if recorded_world is not None else bundle.world_size,
        "what_if": asked,
        "step_time_s": rep_step,
        "recorded_step_time_s": rec_step,
        "step_time_change_pct": change(rec_step, rep_step),
        "peak_memory_bytes": rep_peak,
        "recorded_peak_memory_bytes": rec_peak,
        "peak_memory_change_pct": change(rec_peak, rep_peak),
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


def _signed(v) -> str:
    return "n/a" if v is None else f"{v:+.1f}%"


def _secs(v) -> str:
    return "n/a" if v is None else (f"{v * 1e3:.1f} ms" if v < 10 else f"{v:.2f} s")


def _what_if_words(asked: dict) -> str:
    words = []
    if "comm_scale" in asked:
        words.append(f"communication x{asked['comm_scale']:g}")
    if "compute_scale" in asked:
        words.append(f"compute x{asked['compute_scale']:g}")
    for r, f in sorted((asked.get("slow_rank") or {}).items(), key=lambda kv: int(kv[0])):
        words.append(f"rank {r}'s compute x{f:g}")
    for e in asked.get("replace_rank") or ():
        words.append(f"rank {e['rank']} replaced at step {e['step']}")
    return ", ".join(words)


def _measured_lines(report: dict) -> list[str]:
    """The replay of the recording as it ran: how far the replay is from it."""
    lines = [
        f"  steps {len(report['steps'])} · iteration time error {_fmt(report['iteration_time_error_pct'], '%')} "
        f"(mean abs, steps {report['scored_steps']}, {report.get('clock', 'host')} clock)",
        f"  peak memory recorded {_mb(report['peak_memory_recorded_bytes'])}, replayed "
        f"{_mb(report['peak_memory_replayed_bytes'])} (error {_fmt(report['peak_memory_error_pct'], '%')})",
    ]
    spread = report.get("recorded_step_spread_pct")
    if report.get("mean_step_error_pct") is not None:
        lines.insert(1, f"  mean step error {_fmt(report['mean_step_error_pct'], '%')}"
                     + (f" · the recorded steps themselves vary {_fmt(spread, '%')} (std/mean; range "
                        f"{_fmt(report.get('recorded_step_range_pct'), '%')})" if spread is not None else ""))
    lines += _wait_lines(report)
    warned = report.get("caveats") or []
    for i, c in enumerate(warned):
        lines.append(("  not a fidelity figure: " if i == 0 else "  and ") + c["text"])
    return lines


def _wait_lines(report: dict) -> list[str]:
    """How the virtual peers waited (PRISM_RR_DEVICE_WAITS), and for how long they were asked."""
    waits = report.get("device_waits") or {}
    if not waits:
        return []
    lines = ["  virtual peers waited with " + ", ".join(
        f"{w['mechanism']} (rank {r}: {w['waits']} waits)" for r, w in waits.items())]
    for r, w in waits.items():
        if w.get("offset_ms") and w.get("transfer_ms"):
            (o0, o1, o2), (t0, t1, t2) = w["offset_ms"], w["transfer_ms"]
            lines.append(f"    rank {r}: until {o0:g} / {o1:g} / {o2:g} ms after its step's start (min / median / "
                         f"max), then {t0:g} / {t1:g} / {t2:g} ms of transfer")
        last = w.get("last") or []
        if last:
            late = sorted(end - (offset + transfer) for _, offset, transfer, end in last)
            lines.append(f"    rank {r}: its last {len(last)} waits ended {late[0]:.3f} / {late[len(late) // 2]:.3f} / "
                         f"{late[-1]:.3f} ms after that (min / median / max: the stream came later, or the wait "
                         "started late)")
    return lines


def _predicted_lines(report: dict) -> list[str]:
    """A scaled bundle or a what-if: what the replay predicts, beside what was recorded."""
    p = report["prediction"]
    world, rec_world = p["world_size"], p["recorded_world_size"]
    at = f"at world {world}" + (f" ({_what_if_words(p['what_if'])})" if p["what_if"] else "")
    recorded = f"recording at world {rec_world}" if rec_world != world else "as recorded"
    return [
        f"  predicted {at}, steps {report['scored_steps']}:",
        f"  step time {_secs(p['step_time_s'])} ({recorded}: {_secs(p['recorded_step_time_s'])}, "
        f"{_signed(p['step_time_change_pct'])})",
        f"  peak memory {_mb(p['peak_memory_bytes'])} ({recorded}: {_mb(p['recorded_peak_memory_bytes'])}, "
        f"{_signed(p['peak_memory_change_pct'])})",
        *_replaced_lines(report, p["what_if"].get("replace_rank") or ()),
        *_wait_lines(report),
    ]


def _replaced_lines(report: dict, replaced) -> list[str]:
    """Each replaced rank: its downtime and its parts, and what its step took in the replay."""
    by_step = {s["step"]: s for s in report["steps"]}
    lines = []
    for e in replaced:
        line = f"  rank {e['rank']} replaced at step {e['step']}: {replace_words(e)}"
        s = by_step.get(e["step"])
        if s is not None:
            line += (f"; step {e['step']} took {_secs(s['replayed_s'])} instead of {_secs(s['recorded_s'])} "
                     f"({s['replayed_s'] - s['recorded_s']:+.2f} s)")
        lines.append(line)
        lines.extend(f"    note: {n}" for n in replace_notes(e))
    return lines


# Why an error is not a fidelity figure (_honesty.caveats' kinds), in a few words for the headline.
_CAVEAT_WORDS = {
    "shared_cores": "the recorded ranks shared CPUs",
    "busy_host": "the recording's host was busy",
    "replay_shared_cores": "the replayed ranks share CPUs",
    "busy_replay": "this machine was busy",
    "device_kind": "another kind of device",
    "host_clock": "GPU work timed on the host",
}


def headline(report: dict) -> str:
    """The card's first line: the result a reader should remember. How the replay ended
    (made every recorded call as recorded, diverged, reproduced the recorded hang or
    failure, stopped early), then the iteration-time and peak-memory errors, the first
    said to be no fidelity figure, and why in a few words, where the card says so."""
    if report["first_divergence"] is not None:
        d = report["first_divergence"]
        return (f"result: the program diverged from the recording at rank {d['rank']}'s {shown(d['op'], 40)} "
                f"(group {d['group']}, seq {d['seq']}): below")
    if report.get("hang"):
        return "result: the recorded hang reproduced, at the call where the recording went wrong: below"
    if report.get("reproduced"):
        return "result: the recorded failure reproduced: each rank that failed failed as it did in the recording"
    if report.get("stopped_early"):
        return "result: the replay stopped before the recording's end, with no divergence in the calls made: below"
    if not report["steps"] or report.get("prediction"):
        return "result: every recorded call made as recorded (no divergence)"
    error = report.get("iteration_time_error_pct")
    why = sorted({_CAVEAT_WORDS.get(c.get("kind"), "see below") for c in report.get("caveats") or ()})
    time = f"step time {_fmt(error, '%')} from the recording" + (
        f" (not a fidelity figure here: {', '.join(why)})" if why else "")
    return (f"result: every recorded call made as recorded (no divergence); {time}; "
            f"peak memory {_fmt(report.get('peak_memory_error_pct'), '%')} from it")


def card(report: dict) -> str:
    """A few lines for people (stderr), the headline first."""
    real = len(report["ranks"])
    lines = [
        headline(report),
        f"prism-rr replay · {real} real rank(s) {report['ranks']}, {report['world_size'] - real} virtual · "
        f"timing {report['timing']}",
    ]
    early = report.get("stopped_early") or []
    if not report["steps"] and early:
        return "\n".join(lines + _attempt_lines(report) + _unscored_lines(report, early))
    lines += _attempt_lines(report)
    if report.get("imported") and not report["steps"]:
        lines.append("  calls checked against Flight Recorder dumps, which hold no steps to score and no data "
                     "(outputs are made up, the same each run)")
    else:
        lines += _predicted_lines(report) if report.get("prediction") else _measured_lines(report)
    if report.get("setup_s") is not None:
        share = report.get("replayer_setup_s")
        lines.append(f"  set-up {report['setup_s']:.2f} s before the first step"
                     + (f" (the replayer's own {share:.2f} s)" if share is not None else ""))
    own = report.get("replayer_in_steps_s")
    if own:
        lines.append(f"  the replayer's own work on payloads: at most {own * 1e3:.1f} ms in a scored step "
                     "(included in the step times)")
    lines.append(_numerics_line(report))
    lines += program_lines(report.get("bundle_program"), report["first_divergence"])
    lines += _ending_lines(report, early)
    return "\n".join(lines)


def _unscored_lines(report: dict, early: list[dict]) -> list[str]:
    """Nothing to score (every real rank stopped before a step's end): who ended, where,
    and what it printed last."""
    lines = []
    first = (report.get("recorded_steps") or [None])[0]
    for e in early:
        before = f"before the end of step {first}, the recording's first" if first is not None else \
            "before the end of any step"
        lines.append(f"  stopped early: rank {e.get('rank')} {_ended(e)} {before} ({_made(e)}){_recorded(e)}")
        tail = e.get("output_tail")
        if tail:
            lines.append(f"  the last lines rank {e.get('rank')} wrote:")
            lines.extend(f"    | {line}" for line in tail)
        elif tail is None:
            lines.append(f"  (rank {e.get('rank')}'s output is above)")
    if report.get("reproduced"):
        lines.append("  reproduced: each rank that failed failed as it did in the recording")
    return lines


def _numerics_line(report: dict) -> str:
    """Whether the numerics are the recording's, synthetic (no payloads) or made up by the
    bundle's program, and the calls whose shapes `scale` predicted."""
    if not report.get("inputs_made_up_calls"):
        return f"  numerics {'synthetic (no payloads)' if report['synthetic_numerics'] else 'as recorded'}"
    return (f"  numerics {'synthetic' if report['synthetic_numerics'] else 'made up'}: the bundle's program made up "
            f"the inputs of {report['inputs_made_up_calls']} calls (no bytes recorded for them: their data is not "
            "checked)"
            + (f" · shapes predicted by `scale` on {report['predicted_shape_calls']} calls, not checked "
               f"({report.get('predicted_shape_mismatches', 0)} differ from the live ones)"
               if report.get("predicted_shape_calls") else ""))


def _ending_lines(report: dict, early: list[dict]) -> list[str]:
    """How the replay ended: its first divergence (or none), the recorded hangs it resolved
    or reached, the ranks that failed or stopped early, and the ranks with no results."""
    lines = []
    d = report["first_divergence"]
    if d is not None:
        at = f" at {shown(d['stack'][0])}" if d.get("stack") else ""
        lines.append(f"  diverged: rank {d['rank']} group {d['group']} seq {d['seq']} {shown(d['op'])}{at}: "
                     f"{d['what']} expected {shown(d['expected'])}, got {shown(d['got'], 600)}")
    elif not early and not report.get("hang"):
        lines.append("  diverged: no")
    lines.extend(f"  {sentence(h)}" for h in report.get("resolved") or ())
    if report.get("hang"):
        lines.append(f"  {sentence(report['hang'])}")
    if report.get("reproduced"):
        lines.append("  reproduced: each rank that failed failed as it did in the recording")
    lines.extend(f"  {'failed' if e.get('complete') else 'stopped early'}: {how_far(e)}" for e in early)
    if early and d is None:
        lines.append("  no divergence in the calls made")
    if report.get("unreported"):
        lines.append(f"  no results from rank(s) {report['unreported']} (another node's replay has them)")
    return lines


def _attempt_lines(report: dict) -> list[str]:
    """Which attempt of a restarted job the replay ran, where the bundle holds several."""
    a = report.get("attempt") or {}
    if len(a.get("attempts") or ()) < 2:
        return []
    default = " (the bundle's default)" if a.get("attempt") == a.get("default") else ""
    return [f"  attempt {a['attempt']} of the job's attempts {', '.join(map(str, a['attempts']))}{default}"]


def same_end(code: int, was) -> bool:
    """Whether a replayed rank's exit code (negative: killed by that signal) is how it
    ended in the recording (`was`: its rank info's `exit`, or its crash's signal)."""
    if not isinstance(was, dict) or not code:
        return False
    if code > 0:
        return was.get("code") == code
    try:
        sig = signal.Signals(-code)
    except ValueError:
        return False
    return was.get("signal") in (sig.name, signal.strsignal(sig))


def _recorded(e: dict) -> str:
    """How the rank's program ended in the recording, beside how it ended now."""
    was = e.get("recorded_exit")
    if not isinstance(was, dict):
        return ""
    how = f" ({shown(was['how'])})" if isinstance(was.get("how"), str) else ""
    code = was.get("code")
    if same_end(e.get("exit_code", 0), was):
        return f", as in the recording{how}"
    if type(code) is int:
        return f"; in the recording it exited with code {code}{how}"
    return f"; in the recording{how or ' it ended otherwise'}"


def _ended(e: dict) -> str:
    c = e.get("exit_code", 0)
    if e.get("timed_out"):
        return "was stopped by the timeout"
    if c > 0:
        return f"exited with code {c}"
    if c < 0:
        return f"was ended by signal {-c}"
    return "ended"


def _made(e: dict) -> str:
    calls, total = e.get("calls"), e.get("recorded_calls", 0)
    if calls is None and e.get("exit_code", 0) >= 0 and not e.get("timed_out"):
        calls = 0  # exited normally without writing results: it never made a process group
    if calls is None:
        return "(how far it got is not known)"
    if calls == 0:
        return f"before the first of {total} recorded calls"
    return f"after {calls} of {total} recorded calls"


def how_far(e: dict) -> str:
    """One rank's end, for a replay that did not run to the recording's end."""
    ended, made, calls = _ended(e), _made(e), e.get("calls")
    last = e.get("recorded_last_step")
    where = ""
    if e.get("step") is not None and last is not None and calls:
        where = f", in step {e['step']} (the recording's last is {last})"
    return f"rank {e.get('rank')} {ended} {made}{where}{_recorded(e)}"
