# `make demo` and `make test` each work from a fresh clone: they create .venv, install
# autopar with its test extras (torch pinned to the CPU wheel), then run.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test test-extended test-gpu venv clean bench

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
test-extended: $(STAMP)
	$(PY) -m pytest -q -m extended tests

# on a machine with CUDA: the gpu-marked tests, generated kernels compiled for the GPU
# (not interpreted); elsewhere they are skipped
test-gpu: $(STAMP)
	TRITON_INTERPRET=0 $(PY) -m pytest -q -m gpu tests/test_gpu.py

bench: $(STAMP)
	$(PY) benchmarks/run_all.py

clean:
	rm -rf $(VENV) build *.egg-info
