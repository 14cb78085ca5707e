#!/usr/bin/env bash
# Sets everything up, then compiles the seed example gelu(x @ w + b) and shows every stage.
set -euo pipefail
cd "$(dirname "$0")/.."
TILEFUSE_EXTRAS="${TILEFUSE_EXTRAS-}" bash scripts/setup.sh   # tilefuse alone: numpy, scipy, llvmlite, egglog
exec .venv/bin/python -m tilefuse.demo "$@"
