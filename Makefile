# Two commands (README, "Quick start"):
#   make demo   set up .venv on a fresh machine and run `umlos-cuda demo`
#   make test   set up .venv, run ruff and mypy, then the whole test suite (what .ci/run calls)
#   make lint   only ruff and mypy (configured in pyproject.toml), once .venv has the test extra
# Everything is installed from PyPI into .venv; nothing is needed by hand but python3 >= 3.11.

PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
# The CPU build of PyTorch for the integration tests; pinned so that pip never
# pulls a multi-gigabyte CUDA build on a machine without a GPU.
TORCH_CPU ?= torch==2.13.0
# One CUDA major for the whole environment (docs/install.md): NVRTC for the
# kernel compile test and DALI's CPU pipelines both run without a GPU.
# ray: CI starts a local Ray cluster of two worker nodes and runs the Ray Data
# tokenize job on it (tests/test_tokenize_ray.py).
TEST_EXTRAS := test,torch,nvrtc-cu12,dali-cu12,gym,plot,data,hf,ray
DEMO_WORKDIR ?= demo-workdir
# setuptools announces every editable install of a package whose folders are
# mapped (kernels/ -> umlos_cuda._kernels) with an information-only warning
# ("Editable installation."); it asks nothing of us, so it is filtered here and
# every other warning still shows.
PIP_INSTALL := PYTHONWARNINGS="ignore:Editable installation" $(BIN)/pip install --quiet

.PHONY: demo test lint bench bench-megatron-env venv clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

venv: $(BIN)/python

demo: venv
	$(PIP_INSTALL) -e .
	$(BIN)/umlos-cuda demo --workdir $(DEMO_WORKDIR)

# ruff and mypy run first: they take seconds, the suite minutes.
test: venv
	$(PIP_INSTALL) $(TORCH_CPU)
	$(PIP_INSTALL) -e '.[$(TEST_EXTRAS)]'
	$(MAKE) --no-print-directory lint
	$(BIN)/python -m pytest

lint:
	$(BIN)/ruff check
	$(BIN)/mypy

bench: venv
	$(PIP_INSTALL) -e '.[bench]'
	$(BIN)/python bench/bench_indices.py

# megatron-core beside this project, for bench/ only (never a dependency): bench/.venv-megatron, Python 3.12.
bench-megatron-env:
	bash bench/megatron/setup.sh

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .hypothesis .ruff_cache .mypy_cache $(DEMO_WORKDIR)
