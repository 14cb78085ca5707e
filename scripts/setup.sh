#!/usr/bin/env bash
# Creates (or reuses) the project's virtual environment in .venv and installs tilefuse into it with
# the development tools and the optional parts (onnx, onnxruntime as the ONNX peer, torch 2.13.0
# CPU, LightGBM for the tuner's cost model, transformers for the model zoo), so that their tests run rather than skip. Safe to run again; a fresh machine needs only
# Python 3.11+ and access to PyPI.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
    "$PY" -m venv .venv
fi
.venv/bin/python -m pip install --quiet --upgrade pip
.venv/bin/python -m pip install --quiet -e ".[dev,onnx,torch,tune,models]"
