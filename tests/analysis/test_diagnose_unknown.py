"""diagnose() on hand-built runs says only what the records show: a rank whose records
end abruptly is unknown afterwards, a crash file is reported (and read as untrusted text),
and ranks whose calls part in a step are a drift."""

import dataclasses

from graph_sim import SimRun
from prism_rr.format import open_bundle, pack
from prism_rr.format.records import Collective
from prism_rr.analysis import diagnose
from prism_rr.analysis._build import parse_crash
from windows import diagnosed

CRASH = """prism-rr crash file: rank 2, pid 4242, main thread 0x00007f0000000001
Fatal Python error: Aborted

Thread 0x00007f0000000002 (most recent call first):
  File "/usr/lib/python3.11/threading.py", line 331 in wait
  File "/home/u/venv/lib/python3.11/site-packages/prism_rr/format/spool.py", line 326 in _run

Thread 0x00007f0000000001 (most recent call first):
  File "/home/u/venv/lib/python3.11/site-packages/prism_rr/recorder/_group.py", line 133 in wait
  File "/home/u/venv/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py", line 3252 in all_reduce
  File "/home/u/venv/lib/python3.11/site-packages/torch/distributed/c10d_logger.py", line 83 in wrapper
  File "/home/u/project/train.py", line 34 in train_step
  File "/home/u/project/train.py", line 80 in <module>

Extension modules: torch._C (total: 1)
"""


def _killed_run(tmp_path, crash=None):
    run = SimRun(4)
    run.train(3)
    run.compute(1000)
    run.kill(2)
    run.collective(0)
    spools = run.write(tmp_path / "run.prism.d")
    if crash is not None:
        (spools / "rank-00002.crash").write_text(crash)
    out = tmp_path / "run.prism"
    pack(spools, out)
    with open_bundle(out) as b:
        return diagnosed(b)


def test_killed_rank_is_unknown_after_its_records(tmp_path):
    findings = _killed_run(tmp_path)
    (hang,) = [f for f in findings if f.kind == "hang"]
    assert hang.ranks == (2,) and (hang.group, hang.seq) == (0, 6)
    assert "never by rank 2" not in hang.message
    assert "Rank 2's records end at +" in hang.message
    assert "(no proper end: the process died or was killed); what it did afterwards is unknown" in hang.message
    assert hang.details["unknown_after"] == [2] and hang.details["missing_last"]["2"]["state"] == "stopped"
    assert not [f for f in findings if f.kind == "crashed"]


def test_crash_file_is_a_finding_with_signal_call_line_and_stack(tmp_path):
    findings = _killed_run(tmp_path, CRASH)
    crashed = findings[0]
    assert (crashed.kind, crashed.ranks) == ("crashed", (2,))
    assert crashed.message.startswith("Rank 2 crashed (SIGABRT) in all_reduce at train.py:34;")
    assert crashed.stack[0] == "_group.py:133 in wait" and crashed.stack[3] == "train.py:34 in train_step"
    assert crashed.details["thread"] == "main"
    (hang,) = [f for f in findings if f.kind == "hang"]
    assert "(process died: SIGABRT); what it did afterwards is unknown" in hang.message


def test_crash_text_is_untrusted(tmp_path):
    for value in (None, 3, "text", {"text": 5}, {"text": ""}, {"text": "garbage\x00" * 100_000},
                  {"text": "Fatal Python error: Aborted\n", "main_thread": 7},
                  {"text": 'Thread 0xzz (most recent call first):\n  File "a", line x in f\n'}):
        crash = parse_crash(value)
        assert crash is None or (crash.signal == "SIGABRT" and crash.stack == ())
    big = {"text": "Fatal Python error: Segmentation fault\nCurrent thread 0x1 (most recent call first):\n"
                   + '  File "/p/x.py", line 1 in f\n' * 50_000}
    crash = parse_crash(big)
    assert crash.signal == "SIGSEGV" and len(crash.stack) <= 200 and len(crash.text) <= 64 << 10
    assert crash.where == "x.py:1" and crash.thread == "current"


def test_drift_is_named_at_its_step_with_both_lines(tmp_path):
    run = SimRun(4)
    run.train(1)
    run.collective(0, line=120)  # step 1: rank 3 makes no such call (removed below)
    run.recs[3].pop()
    run.seq[(3, 0)] -= 1
    run.train(2, line=130)
    spools = run.write(tmp_path / "run.prism.d")
    pack(spools, tmp_path / "run.prism")
    with open_bundle(tmp_path / "run.prism") as b:
        findings = diagnosed(b)
    drift = findings[0]
    assert (drift.kind, drift.ranks, drift.group, drift.seq) == ("drift", (3,), 0, 2), [f.message for f in findings]
    assert drift.message.startswith("In step 1, rank 3 made 2 of the 3 all_reduce calls (group 0) that rank 0 made; "
                                    "from there on its calls pair with the wrong ones")
    assert "train.py:120" in drift.details["where"]["0"] and "train.py:130" in drift.details["where"]["3"]
    # the mismatches that follow (rank 3's (256, 4) against the others' (1024,)) are its consequences
    assert not [f for f in findings if f.kind == "mismatch"]
    assert drift.details["later_mismatches"] >= 1


def _diagnose(run, tmp_path):
    pack(run.write(tmp_path / "run.prism.d"), tmp_path / "run.prism")
    with open_bundle(tmp_path / "run.prism") as b:
        return diagnosed(b)


def test_killed_rank_blocked_elsewhere_shows_that_call_and_unknown(tmp_path):
    run = SimRun(4, groups=[(0, 1), (1, 2, 3)])
    run.train(2)
    run.collective(2, skip=(3,))  # ranks 1 and 2 wait in group 2 for rank 3
    run.kill(1)
    run.collective(1)  # rank 0 waits in group 1 for rank 1
    hangs = {f.group: f for f in _diagnose(run, tmp_path) if f.kind == "hang"}
    msg = hangs[1].message
    assert "never by rank 1" not in msg
    assert "Rank 1 was in all_reduce (group 2, seq 0) since +" in msg
    assert "when its records end (no proper end: the process died or was killed); what it did afterwards is unknown" in msg


def test_rank_whose_records_go_on_past_the_call_never_entered_it(tmp_path):
    run = SimRun(4)
    run.train(3)
    run.collective(0, skip=(2,))
    run.compute(500_000_000, ranks=[2])  # rank 2 goes on for 500 ms, then is killed
    run.kill(2)
    (hang,) = [f for f in _diagnose(run, tmp_path) if f.kind == "hang"]
    assert "never by rank 2" in hang.message and "unknown" not in hang.message
    assert "without a proper end" in hang.message
