#!/usr/bin/env bash
# Sets everything up, then runs the whole test suite and ruff.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/python -m ruff check .
# Bytecode caches (__pycache__, git-ignored) are written even where PYTHONDONTWRITEBYTECODE is
# set: otherwise each xdist worker and each Python process the tests start (CLI runs, tuner and
# Ray workers, torch.distributed ranks) compiles tilefuse and rewrites the tests' asserts from
# source again; collecting the suite took 25.8 s of CPU per worker without them, 15.2 s with
# them (busy 2-core machine, 2026-12-03).
unset PYTHONDONTWRITEBYTECODE
# One pytest-xdist worker per core (-n auto), at most 4 (each worker holds its own compiled
# models; 2 workers peaked at ~4 GB here); an idle worker takes half of another's queue
# (worksteal: a few tests take a minute each; tests/conftest.py puts them first).
# Extra arguments go to pytest; -n 0 runs in one process.
exec .venv/bin/python -m pytest -q -p no:cacheprovider -n auto --maxprocesses=4 --dist worksteal "$@"
