# `make demo` and `make test` each work from a fresh clone: they create .venv, install
# autopar with its test extras (torch pinned to the CPU wheel), then run.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: browser peers demo test test-extended test-gpu gpu-check gpu-wheels venv clean bench fuzz

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[test]'
	touch $(STAMP)

venv: $(STAMP)

demo: $(STAMP)
	$(PY) examples/demo.py

test: $(STAMP)
	$(PY) -m pytest -q tests

# the long multi-rank cases (16 ranks, each 3D overlap off alone, PTD-P variants...):
# they repeat paths `make test` checks on other cases; CI runs them after `make test`
test-extended: $(STAMP) browser peers
	$(PY) -m pytest -q -m extended tests

# the peer suite's model code from other libraries (tests/test_peers.py), installed without
# their dependencies (torchtitan would pull a CUDA torch): examples/peers/torchtitan_llama.py
PEERS := $(VENV)/.peers
$(PEERS): $(STAMP)
	$(PY) -m pip install -q --no-deps torchtitan==0.3.0 spmd_types==0.2.3 tyro docstring-parser typeguard
	touch $(PEERS)

peers: $(PEERS)

# headless Chromium for the plan report's browser test (tests/planning/test_report.py): Debian's
# package where apt-get can install it; elsewhere that test skips and says why
browser:
	@command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1 || \
		( (apt-get update -qq && apt-get install -y -qq chromium chromium-driver) >/dev/null 2>&1 || \
		  echo "make browser: chromium could not be installed; the report's browser test will skip" )

# on a machine with CUDA: the gpu-marked tests, generated kernels compiled for the GPU
# (not interpreted); elsewhere they are skipped
test-gpu: $(STAMP)
	TRITON_INTERPRET=0 $(PY) -m pytest -q -m gpu tests/test_gpu.py

# every GPU test and benchmark in one command, each step under its own limit (at most 11.5 minutes
# together), results under $$OUT or gpu-results/ (benchmarks/gpu_check.py). It
# runs with the interpreter given, not .venv: on a GPU machine, the Python that already has
# torch with CUDA (`make gpu-check PYTHON=python3`). Without CUDA it says what it would run.
gpu-check:
	$(PYTHON) benchmarks/gpu_check.py

# wheels of what the GPU machine's Python lacks (it reaches no registry), into .whl/, which
# gpu-check installs into a private directory before its steps
GPU_WHEELS := expecttest==0.3.0 pydot==4.0.1 torchtitan==0.3.0 spmd_types==0.2.3 tyro==1.0.17 docstring-parser==0.18.0 \
    typeguard==4.6.1
gpu-wheels:
	$(PYTHON) -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
		--platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 -d .whl $(GPU_WHEELS)

bench: $(STAMP)
	$(PY) benchmarks/run_all.py

# the differential fuzzer on its own (examples/fuzz.py): 2000 random models and losses from
# seeds the tests do not use, each exact against the single device or refused by compile;
# prints the counts per strategy and every failure (seed, strategy, error, the model's source)
fuzz: $(STAMP)
	$(PY) -m examples.fuzz --cases 2000 --start 10000

clean:
	rm -rf $(VENV) build *.egg-info gpu-results .whl
