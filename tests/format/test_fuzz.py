"""Structure-aware fuzzing of hostile bundles (the fuzzer is tests/format/fuzz.py).

Each case mutates the decoded msgpack of one section or chunk (or a binary index or a
frame header) of a real bundle, rebuilds the file with valid checksums, and runs every
read path a command takes. Only a PrismError may escape, and no case may use more than
512 MiB (tracemalloc's peak).

PRISM_FUZZ_CASES=N runs N cases (default 120, a few seconds); PRISM_FUZZ_JOBS=J splits
them over J subprocesses; PRISM_FUZZ_SEED picks the seed; PRISM_FUZZ_SAVE=1 writes each
failing case into tests/data/fuzz_corpus/, whose cases every run replays. The long run:

    PRISM_FUZZ_CASES=100000 PRISM_FUZZ_JOBS=2 .venv/bin/python -m pytest tests/format/test_fuzz.py -k fuzz_run -s
"""

import json
import os
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import fuzz  # noqa: E402

CASES = int(os.environ.get("PRISM_FUZZ_CASES", "120"))
JOBS = int(os.environ.get("PRISM_FUZZ_JOBS", "1"))
SEED = int(os.environ.get("PRISM_FUZZ_SEED", "2026"))
SAVE = fuzz.CORPUS if os.environ.get("PRISM_FUZZ_SAVE") else None


def test_corpus_of_past_failures_stays_fixed(tmp_path):
    outcomes = fuzz.replay_corpus(tmp_path)
    assert len(outcomes) >= 10, "the corpus of past failures is missing"
    bad = [f"{o.what}: {o.where}: {o.error}" for o in outcomes if o.error]
    assert not bad, "\n".join(bad)
    worst = max(outcomes, key=lambda o: o.peak)
    assert worst.peak < fuzz.MEMORY_LIMIT, (worst.what, worst.peak)


def test_fuzz_run(tmp_path):
    if JOBS <= 1:
        bundles = [fuzz.GOLDEN.read_bytes(), fuzz.demo_bundle(tmp_path)]
        outcomes = fuzz.fuzz(CASES, SEED, bundles, tmp_path)
        failures = [o for o in outcomes if o.error or o.peak > fuzz.MEMORY_LIMIT]
        for o in failures:
            if SAVE:
                fuzz.save(o, SAVE)
        worst = max(outcomes, key=lambda o: o.peak)
        print(f"\n{len(outcomes)} cases, {len(failures)} failures, peak {worst.peak / 2**20:.1f} MiB ({worst.what})")
        assert not failures, "\n".join(f"case {o.case} ({o.what}): {o.where}: {o.error or f'{o.peak} bytes'}" for o in failures[:20])
        return
    procs = []
    per = -(-CASES // JOBS)
    for j in range(JOBS):
        cmd = [sys.executable, str(Path(fuzz.__file__)), "--cases", str(min(per, CASES - j * per)),
               "--seed", str(SEED * 1000 + j), "--json"]
        if SAVE:
            cmd += ["--save", str(SAVE)]
        procs.append(subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True))
    results = []
    for p in procs:
        out, _ = p.communicate()
        assert p.returncode == 0, out
        results.append(json.loads(out.strip().splitlines()[-1]))
    cases = sum(r["cases"] for r in results)
    failures = sum(r["failures"] for r in results)
    peak = max(r["peak_max"] for r in results)
    print(f"\n{cases} cases in {JOBS} jobs, {failures} failures, peak {peak / 2**20:.1f} MiB")
    for r in results:
        print(json.dumps(r))
    assert failures == 0, [r["examples"] for r in results]
    assert peak < fuzz.MEMORY_LIMIT
