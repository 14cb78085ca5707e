"""Is merging BERT's parallel Q/K/V projections faster with the measured matmul kernel?

    .venv/bin/python benchmarks/qkv_merge.py [--rows 128 1024] [--rounds 30]

Two NumPy functions of one input ``x [M, 768]`` with constant weights, compiled natively:
``separate`` is ``x @ Wq + 1, x @ Wk + 1, x @ Wv + 1`` (what the graph keeps when
``passes.eqsat.encode.merge_pays`` declines the merge) and ``merged`` is what the
``merge_parallel_matmuls`` rule rewrites it to: ``y = x @ [Wq Wk Wv] + 1`` and three slices of
``y`` (each its own movement kernel, as kernel formation makes them). Rows 128 and 1024 are
BERT-base at batch 1 and 8, sequence 128. Prints best-of-rounds milliseconds of each (timed
alternately) and the largest difference between their results (the same sums, so 0).
"""

from __future__ import annotations

import argparse
import time

import numpy as np

import tilefuse
from tilefuse.runtime.native import NativeExecutable

HIDDEN = 768


def variants(rng: np.random.Generator) -> dict[str, object]:
    weights = [rng.standard_normal((HIDDEN, HIDDEN), dtype=np.float32) / 28 for _ in range(3)]
    joined = np.concatenate(weights, axis=1)

    def separate(x: np.ndarray) -> tuple[np.ndarray, ...]:
        return tuple(x @ w + 1.0 for w in weights)

    def merged(x: np.ndarray) -> tuple[np.ndarray, ...]:
        y = x @ joined + 1.0
        return y[:, :HIDDEN], y[:, HIDDEN:2 * HIDDEN], y[:, 2 * HIDDEN:]

    return {"separate": separate, "merged": merged}


def measure(rows: int, rounds: int) -> None:
    rng = np.random.default_rng(0)
    x = rng.standard_normal((rows, HIDDEN), dtype=np.float32)
    exes = {}
    for name, fn in variants(rng).items():
        graph = tilefuse.jit(fn).lower(x).optimized
        matmuls = sum(n.op.name == "matmul" for n in graph.nodes)
        assert matmuls == (3 if name == "separate" else 1), (name, matmuls)
        exes[name] = NativeExecutable(graph)
    outs = {name: exe(x) for name, exe in exes.items()}
    diff = max(float(np.abs(a - b).max()) for a, b in zip(*outs.values()))
    best = dict.fromkeys(exes, float("inf"))
    for _ in range(rounds):
        for name, exe in exes.items():
            start = time.perf_counter()
            exe(x)
            best[name] = min(best[name], time.perf_counter() - start)
    flops = 2 * rows * HIDDEN * 3 * HIDDEN
    for name, seconds in best.items():
        print(f"{rows:>6} {name:>9} {seconds * 1e3:>9.3f} {flops / seconds / 1e9:>8.1f}")
    print(f"{rows:>6} merged/separate {best['merged'] / best['separate']:.3f}, "
          f"max |difference| {diff:g}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[128, 1024])
    parser.add_argument("--rounds", type=int, default=30)
    args = parser.parse_args()
    print(f"{'M':>6} {'variant':>9} {'ms':>9} {'GFLOP/s':>8}")
    for rows in args.rows:
        measure(rows, args.rounds)


if __name__ == "__main__":
    main()
