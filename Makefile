# make demo: set up .venv and run the embedded demo.   make test: set up .venv and run the tests.
# make gpu-check: the nccl/CUDA tests (tests/gpu), then bench/gpu_fidelity.py, on a machine with a GPU.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: test gpu-check demo setup clean

setup: $(STAMP)

$(STAMP): pyproject.toml setup.py constraints.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -c constraints.txt -e '.[dev]'
	touch $(STAMP)

# The tests run on TEST_JOBS workers (pytest-xdist), a file's tests on one worker, so a
# module's recordings are made once (the run's shared recordings, tests/conftest.py, once
# a run). 3 on CI's two cores: with 2, a fifth of the cores' time went idle while tests
# waited out hangs, timeouts and peers (a clean clone's make test: 9 min 27 s with 2,
# 8 min 25 s with 3); TEST_JOBS=0 runs them in one process, one by one.
TEST_JOBS ?= 3

# Each rank a test starts imports prism_rr: its bytecode is compiled once here, since an
# environment with PYTHONDONTWRITEBYTECODE set (CI's) would otherwise compile it in every one.
test: $(STAMP)
	$(BIN)/python -m compileall -q prism_rr > /dev/null
	$(BIN)/python -m pytest -q -n $(TEST_JOBS) --dist loadfile

# gpu-check runs the machine's own CUDA build of torch, with the interpreter that has it
# (PYTHON; tests/gpu/gpu_setup.py says more). PIP_ARGS reaches pip where a dependency is
# missing (offline: PIP_ARGS="--no-index --find-links DIR").
GPU_SITE := .gpu-site

# The fidelity bench runs after the tests even when they fail (one GPU run must bring back
# every figure), its JSON into GPU_FIDELITY after each workload; the target fails if either did.
# GPU_FIDELITY_ARGS reaches the bench (e.g. --repeats 1, --workloads demo,fsdp).
GPU_PATH := PYTHONPATH=$(CURDIR)/$(GPU_SITE):$(CURDIR)
GPU_FIDELITY ?= gpu-fidelity.json
GPU_FIDELITY_ARGS ?=

gpu-check:
	$(PYTHON) tests/gpu/gpu_setup.py $(GPU_SITE) $(PIP_ARGS)
	$(GPU_PATH) $(PYTHON) -m pytest -q -s -m gpu tests/gpu; tests=$$?; \
	$(GPU_PATH) $(PYTHON) bench/gpu_fidelity.py --out $(GPU_FIDELITY) $(GPU_FIDELITY_ARGS); bench=$$?; \
	echo "gpu-check: tests exit $$tests, bench exit $$bench, figures in $(GPU_FIDELITY)"; \
	test $$tests -eq 0 -a $$bench -eq 0

demo: $(STAMP)
	$(BIN)/prism-rr demo

clean:
	rm -rf $(VENV) $(GPU_SITE) build *.egg-info demo.prism demo.prism.d $(GPU_FIDELITY)
