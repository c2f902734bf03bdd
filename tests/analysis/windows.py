"""Diagnosis read in windows of steps must say what it says read whole.

`diagnosed(bundle)` diagnoses the bundle whole and again one step at a time (each window
read with a step more on either side, as a bundle too big to hold is read), asserts both
give the same findings, word for word, and returns them. The tests of every finding kind
call it, so each planted problem is also found across window boundaries."""

from __future__ import annotations

from prism_rr.analysis import diagnose, diagnosis_json, step_windows


def diagnosed(bundle, **kw):
    whole = diagnose(bundle, **kw)
    if "graph" in kw or len(step_windows(bundle, 1)) < 2:
        return whole
    windowed = diagnose(bundle, window_events=1)
    assert diagnosis_json(windowed) == diagnosis_json(whole)
    return whole
