#!/usr/bin/env bash
# One device call (see /work/.library/device): install the carried llvmlite wheel (the image's
# llvmlite is numba's, not the project's), check the GPU tests, then time the GPU workloads.
#   bash benchmarks/gpu_session.sh [gpu_bench.py arguments...]
# Results: $OUT/tests.log, $OUT/bench.log, $OUT/bench.json.
set -u -o pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD || exit 1
else
  export PYTHONPATH=$PWD
fi
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv
python3 -c "import llvmlite, torch; print('llvmlite', llvmlite.__version__, 'torch', torch.__version__)"
date -u
python3 -m pytest -q -p no:cacheprovider tests/gpu 2>&1 \
  | tee "$OUT/tests.log" | tail -15
python3 benchmarks/gpu_bench.py --json "$OUT/bench.json" "$@" 2>&1 | tee "$OUT/bench.log"
