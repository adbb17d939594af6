# Two commands (README, "Quick start"):
#   make demo   set up .venv on a fresh machine and run `umlos-cuda demo`
#   make test   set up .venv and run the whole test suite (what .ci/run calls)
# Everything is installed from PyPI into .venv; nothing is needed by hand but python3 >= 3.11.

PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
# The CPU build of PyTorch for the integration tests; pinned so that pip never
# pulls a multi-gigabyte CUDA build on a machine without a GPU.
TORCH_CPU ?= torch==2.13.0
TEST_EXTRAS := test,checkpoint,nvrtc,torch,dali
DEMO_EXTRAS := checkpoint
DEMO_WORKDIR ?= demo-workdir

.PHONY: demo test bench venv clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

venv: $(BIN)/python

demo: venv
	$(BIN)/pip install --quiet -e '.[$(DEMO_EXTRAS)]'
	$(BIN)/umlos-cuda demo --workdir $(DEMO_WORKDIR)

test: venv
	$(BIN)/pip install --quiet $(TORCH_CPU)
	$(BIN)/pip install --quiet -e '.[$(TEST_EXTRAS)]'
	$(BIN)/python -m pytest

bench: venv
	$(BIN)/pip install --quiet -e '.[bench]'
	$(BIN)/python bench/bench_indices.py

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .hypothesis $(DEMO_WORKDIR)
