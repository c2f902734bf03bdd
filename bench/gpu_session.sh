#!/bin/sh
# A GPU session's one device check (issue 27), prepared to run once through the device
# tool: `make gpu-check` (the CUDA tests, then bench/gpu_fidelity.py), with its log and the
# bench's JSON written under $OUT so that they come back, and the time each part took.
#   run: OUT=$OUT sh bench/gpu_session.sh        (timeout_s 590; about 9 minutes on an H200)
# Rerun only what failed: GPU_FIDELITY_ARGS="--workloads fsdp,scale-waits" or
# `pytest -q -s -m gpu tests/gpu/test_device_wait_cuda.py` with the same PYTHONPATH.
# The device machine reaches no package index: prism-rr's dependencies it lacks travel as
# wheels for its Python 3.12 in .whl/ (in 2026-11: textual, zstandard, mdit-py-plugins,
# linkify-it-py, uc-micro-py, platformdirs, and rich >= 14.2; carry: [".whl"];
# `python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 ... -d .whl`,
# /work/.library/device/README.md) and are installed into .gpu-site, which gpu-check uses.
OUT=${OUT:-.}
PYTHON=${PYTHON:-python3}
mkdir -p "$OUT"
if ls .whl/*.whl > /dev/null 2>&1; then
  $PYTHON -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target .gpu-site .whl/*.whl \
    > "$OUT/pip.log" 2>&1 || echo "installing .whl/ failed: $OUT/pip.log"
  export PYTHONPATH="$PWD/.gpu-site${PYTHONPATH:+:$PYTHONPATH}"
fi
{
  date
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv 2>&1
  $PYTHON -c 'import torch, sys; print("torch", torch.__version__, "cuda", torch.version.cuda, torch.cuda.is_available(), sys.executable)'
  $PYTHON -c 'import triton; print("triton", triton.__version__)' 2>&1
} > "$OUT/gpu-env.txt" 2>&1
cat "$OUT/gpu-env.txt"
start=$(date +%s)
# What fits one call of the device tool (10 minutes) beside the tests (3 minutes on an
# H200): every process there spends 12-17 s starting CUDA, so 30 steps cost little and
# each replay or recording about 15 s; two replays and the floor's second recording a
# workload, the workloads that carry the targets first.
BENCH_ARGS="--steps 30 --repeats 2 --timeout 90 --workloads fsdp,demo,ddp,scale-waits,scale"
make gpu-check PYTHON="$PYTHON" GPU_FIDELITY="$OUT/gpu-fidelity.json" GPU_FIDELITY_ARGS="${GPU_FIDELITY_ARGS:-$BENCH_ARGS}" \
  > "$OUT/gpu-check.log" 2>&1
rc=$?
echo "make gpu-check exit $rc after $(( $(date +%s) - start )) s; log and figures in $OUT"
tail -n 60 "$OUT/gpu-check.log"
exit $rc
