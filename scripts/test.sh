#!/usr/bin/env bash
# Sets everything up, then runs the whole test suite and ruff.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/python -m ruff check .
exec .venv/bin/python -m pytest -q -p no:cacheprovider "$@"
