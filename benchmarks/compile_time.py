"""Cold and warm compile time of W1 ``gelu(x @ w + b)`` in fresh processes.

    python benchmarks/compile_time.py [--runs 3]

Each run starts a new Python process (imports included in neither figure) with an empty
kernel cache directory (cold) and then another process on the same directory (warm: every
kernel loads from the disk cache). The figure is the first call's time minus one warm call's
time, i.e. tracing + graph passes + kernel formation + lowering + LLVM (or cache load) + weight
packing. Medians over runs.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile

CHILD = r"""
import math, time
import numpy as np, scipy.special
import tilefuse
rng = np.random.default_rng(0)
x = rng.standard_normal((512, 768), dtype=np.float32)
w = rng.standard_normal((768, 3072), dtype=np.float32) / 28
b = rng.standard_normal(3072, dtype=np.float32)
f = tilefuse.jit(lambda x: (lambda y: 0.5 * y * (1.0 + scipy.special.erf(y / math.sqrt(2.0))))(
    x @ w + b))
t0 = time.perf_counter(); f(x); first = time.perf_counter() - t0
t0 = time.perf_counter(); f(x); warm = time.perf_counter() - t0
print(first - warm)
"""


def _run(cache: str) -> float:
    env = {**os.environ, "TILEFUSE_CACHE_DIR": cache}
    out = subprocess.run([sys.executable, "-c", CHILD], env=env, capture_output=True, text=True,
                         check=True)
    return float(out.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args(argv)
    cold, warm = [], []
    for _ in range(args.runs):
        with tempfile.TemporaryDirectory() as tmp:
            cache = os.path.join(tmp, "cache")
            cold.append(_run(cache))
            warm.append(_run(cache))
    print(f"W1 compile, cold (empty cache): {statistics.median(cold):.3f} s  "
          f"(runs: {', '.join(f'{c:.3f}' for c in cold)})")
    print(f"W1 compile, warm (disk cache):  {statistics.median(warm):.3f} s  "
          f"(runs: {', '.join(f'{c:.3f}' for c in warm)})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
