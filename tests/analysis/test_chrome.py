"""export_chrome: valid trace JSON with a process per rank, spans, flows and counters."""

import json
from collections import Counter

from graph_sim import SimRun
from prism_rr.format import open_bundle
from prism_rr.analysis import export_chrome


def _export(tmp_path, **kw):
    run = SimRun(4, offsets={0: 0, 1: 10**9, 2: -5, 3: 7})
    run.train(3)
    run.compute(1000)
    run.collective(0, skip=(1,))
    out = tmp_path / "trace.json"
    with open_bundle(run.bundle(tmp_path)) as b:
        counts = export_chrome(b, out, **kw)
    return json.loads(out.read_text()), counts


def test_chrome_trace_has_processes_spans_flows_counters(tmp_path):
    doc, counts = _export(tmp_path)
    events = doc["traceEvents"]
    assert counts["events"] == len(events)
    names = {e["pid"]: e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "process_name"}
    assert names == {r: f"rank {r}" for r in range(4)}
    phases = Counter(e["ph"] for e in events)
    assert phases["X"] and phases["C"]
    spans = [e for e in events if e["ph"] == "X"]
    assert {e["cat"] for e in spans} >= {"compute", "communication", "step"}
    assert all(e["dur"] >= 0 and e["ts"] >= 0 for e in spans)
    # one flow per matched call: a start, a finish, and steps for the members between
    flows = [e for e in events if e["ph"] in "stf"]
    by_id = {}
    for e in flows:
        by_id.setdefault(e["id"], []).append(e)
    sizes = Counter(len(v) for v in by_id.values())
    assert sizes == {4: 6, 3: 1, 2: 3}  # 6 all_reduces, the hung one (3 members), 3 sends
    for members in by_id.values():
        ph = sorted(e["ph"] for e in members)
        assert ph.count("s") == 1 and ph.count("f") == 1
        assert len({e["pid"] for e in members}) == len(members)
        first = min(members, key=lambda e: e["ts"])
        assert first["ph"] == "s"
    # the hung call is drawn, open-ended, on the ranks that entered it
    hung = [e for e in spans if e["args"].get("never_completed")]
    assert sorted(e["pid"] for e in hung) == [0, 2, 3]
    # each flow event sits inside a communication span of its rank and thread
    for e in flows:
        assert any(s["pid"] == e["pid"] and s["tid"] == e["tid"] and s["ts"] <= e["ts"] <= s["ts"] + s["dur"]
                   for s in spans)


def test_chrome_trace_ranks_and_steps_filters(tmp_path):
    doc, _ = _export(tmp_path, ranks=[0, 2], steps=(1, 1))
    events = doc["traceEvents"]
    assert {e["pid"] for e in events} == {0, 2}
    steps = {e["args"]["step"] for e in events if e["ph"] == "X" and "step" in e.get("args", {})}
    assert steps == {1}
