#!/usr/bin/env bash
# Bench-only environment with the real megatron-core (never a project dependency: docs/performance.md,
# "Megatron-LM reader"). Creates bench/.venv-megatron (git-ignored) with Python 3.12 (megatron-core 0.19
# needs >= 3.12), megatron-core 0.19.x, a torch, numpy and this project installed editable with no extras,
# then checks that megatron-core's C++ dataset helpers compile here (check_helpers.py).
# torch comes from PyTorch's CPU wheel index when that index answers (a few hundred MB), else from whatever pip
# resolves from PyPI (the CUDA build and its nvidia-* wheels, several GB, still runs on a CPU).
#
#     bash bench/megatron/setup.sh            # or: make bench-megatron-env
#     PYTHON=/path/to/python3.12 bash bench/megatron/setup.sh
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
venv="${MEGATRON_VENV:-$root/bench/.venv-megatron}"
python="${PYTHON:-}"
if [ -z "$python" ]; then
    for candidate in python3.12 "$(pyenv prefix 3.12 2>/dev/null)/bin/python3.12" \
            "$HOME"/.pyenv/versions/3.12*/bin/python3.12; do
        if [ -x "$(command -v "$candidate" 2>/dev/null)" ] && "$candidate" -c 'import sys' 2>/dev/null; then
            python="$candidate"; break
        fi
    done
fi
if [ -z "$python" ]; then
    echo "setup.sh: no working python3.12 found (megatron-core 0.19 needs Python >= 3.12); set PYTHON=" >&2
    exit 2
fi
"$python" -c 'import sys; assert sys.version_info >= (3, 12), sys.version' || {
    echo "setup.sh: $python is older than 3.12" >&2; exit 2; }
[ -x "$venv/bin/python" ] || "$python" -m venv "$venv"
pip=("$venv/bin/python" -m pip install --quiet)
cpu_index="https://download.pytorch.org/whl/cpu"
if "$venv/bin/python" -c "import torch" 2>/dev/null; then
    echo "torch already installed"
elif "$venv/bin/python" - "$cpu_index" <<'PY'
import sys, urllib.request
try:
    urllib.request.urlopen(sys.argv[1] + "/torch/", timeout=10)
except Exception:
    sys.exit(1)
PY
then
    echo "installing a CPU torch from $cpu_index"
    "${pip[@]}" --index-url "$cpu_index" torch
else
    echo "PyTorch's CPU index does not answer: installing the torch pip resolves from PyPI (the CUDA build, GBs)"
fi
# pybind11: only for check_helpers.py, which compiles megatron-core's C++ helpers here
"${pip[@]}" "megatron-core==0.19.*" numpy pybind11
# the project with no extras (the bench reads through its numpy-only modules); PYTHONWARNINGS as in the Makefile
PYTHONWARNINGS="ignore:Editable installation" "${pip[@]}" -e "$root"
"$venv/bin/python" - <<'PY'
import importlib.metadata as metadata
print(*(f"{name} {metadata.version(name)}" for name in ("megatron-core", "torch", "numpy", "umlos-cuda")))
PY
"$venv/bin/python" "$root/bench/megatron/check_helpers.py"
du -sh "$venv"
