#!/usr/bin/env bash
# Creates (or reuses) the project's virtual environment in .venv and installs tilefuse into it.
# By default with every extra: the development tools and the optional parts (onnx, onnxruntime as
# the ONNX peer, torch 2.13.0 CPU, LightGBM and Ray for the tuner, transformers for the model zoo,
# matplotlib for plots, jax and OpenVINO as benchmark peers), so that every test runs rather than
# skips. TILEFUSE_EXTRAS chooses the extras instead ("" for tilefuse alone: what scripts/demo.sh needs). Safe to run again; a fresh
# machine needs only Python 3.11+ and access to PyPI.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
    "$PY" -m venv .venv
    # once, on a new venv: a run again skips the index round trip (~5-8 s)
    .venv/bin/python -m pip install --quiet --upgrade pip
fi
EXTRAS=${TILEFUSE_EXTRAS-dev,onnx,torch,tune,models,plot,peers}
.venv/bin/python -m pip install --quiet -e ".${EXTRAS:+[$EXTRAS]}"
