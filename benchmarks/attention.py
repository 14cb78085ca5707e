"""Fused vs unfused attention: time and arena bytes at B1 H12 D64, sequence 2048 and 4096.

    .venv/bin/python benchmarks/attention.py [--seqs 2048 4096] [--repeats 5] [--arena-only]

Each sequence length is compiled twice from the same NumPy function: once as the pipeline
makes it (the ``attention`` pass fuses it into one online-softmax kernel) and once with
``$TILEFUSE_NO_FUSED_ATTENTION=1`` (matmul, row softmax, matmul kernels holding S×S scores).
Prints one line per (sequence, variant): best-of-N milliseconds, GFLOP/s of the two products
(``4·H·S²·D`` per call, the softmax not counted) and the arena in MiB.
"""

from __future__ import annotations

import argparse
import math
import os
import time

import numpy as np

import tilefuse
from tilefuse.passes.attention import DISABLE_ENV
from tilefuse.runtime.native import NativeExecutable

HEADS, HEAD_DIM = 12, 64


def attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, mask: np.ndarray) -> np.ndarray:
    s = q @ k.swapaxes(-1, -2) / math.sqrt(q.shape[-1]) + mask
    e = np.exp(s - s.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True) @ v


def inputs(seq: int) -> list[np.ndarray]:
    rng = np.random.default_rng(0)
    qkv = [rng.standard_normal((1, HEADS, seq, HEAD_DIM)).astype(np.float32) for _ in range(3)]
    mask = np.where(rng.random((1, 1, 1, seq)) < 0.1, -np.inf, 0.0).astype(np.float32)
    return [*qkv, mask]


def measure(seq: int, fused: bool, repeats: int, arena_only: bool) -> tuple[float, int]:
    """(best milliseconds or NaN, arena bytes) of one compiled variant."""
    previous = os.environ.pop(DISABLE_ENV, None)
    if not fused:
        os.environ[DISABLE_ENV] = "1"
    try:
        jitted = tilefuse.jit(attention)
        args = inputs(seq)
        lowered = jitted.lower(*args)
        ops = [n.op.name for n in lowered.optimized.nodes]
        assert ("attention" in ops) == fused, ops
        # The arena is allocated, not touched, at build time: sizing it needs no run.
        executable = NativeExecutable(lowered.optimized)
        arena = executable.arena.nbytes
    finally:
        os.environ.pop(DISABLE_ENV, None)
        if previous is not None:
            os.environ[DISABLE_ENV] = previous
    if arena_only:
        return math.nan, arena
    executable(*args)
    best = math.inf
    for _ in range(repeats):
        start = time.perf_counter()
        executable(*args)
        best = min(best, time.perf_counter() - start)
    return best * 1e3, arena


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seqs", type=int, nargs="+", default=[2048, 4096])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--arena-only", action="store_true", help="compile and report arenas")
    args = parser.parse_args()
    print(f"{'seq':>6} {'variant':>8} {'ms':>10} {'GFLOP/s':>8} {'arena MiB':>10}")
    for seq in args.seqs:
        flops = 4 * HEADS * seq * seq * HEAD_DIM
        for fused in (True, False):
            ms, arena = measure(seq, fused, args.repeats, args.arena_only)
            print(f"{seq:>6} {'fused' if fused else 'unfused':>8} {ms:>10.2f} "
                  f"{flops / ms / 1e6:>8.1f} {arena / 2**20:>10.2f}")


if __name__ == "__main__":
    main()
