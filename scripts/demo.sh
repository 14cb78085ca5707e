#!/usr/bin/env bash
# Sets everything up, then compiles the seed example gelu(x @ w + b) and shows every stage.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/python -m tilefuse.demo "$@"
