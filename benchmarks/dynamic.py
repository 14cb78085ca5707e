"""Dynamic shapes: per-size speed of one dynamic compile against a static compile of each size,
the per-call guard overhead, and the compile counts.

    .venv/bin/python benchmarks/dynamic.py [--rounds 7] [--w1-rows 1 7 64 512]
                                           [--bert 1x128 8x128 1x512] [--skip-bert]
                                           [--cores N]

**W1** ``gelu(x @ w + b)`` with ``x[M,768]``, ``w[768,3072]``: one ``tilefuse.jit`` with
``dynamic={"x": {0: "m"}}`` serves every M; a fresh static jit per M is the baseline.
**BERT layer** (``zoo.bert_layer_numpy``, batch and sequence dynamic) likewise, per BxS.
Each size prints the median milliseconds of both (interleaved rounds) and dynamic/static.
**Guard overhead**: a jitted ``x + 1`` on 8 floats, hit path, dynamic (symbols bound, checked
and the specialisation looked up) against static; the difference is what dynamic dims add per
call. Last, the compile counts (``cache_info()``) of the dynamic functions (with what the
symbolic native build compiled once and per size) and of 100 calls with random batch sizes
under automatic dynamic dims.

``--cores N`` compiles everything for N cores (``os.cpu_count`` is N for the run): with
``--cores 1`` every kernel is serial, which on a shared, loaded machine is the only way to get
ratios that parallel regions waiting on a busy core do not swamp.
"""

from __future__ import annotations

import argparse
import math
import os
import time

import numpy as np
import scipy.special

import tilefuse
from tilefuse import zoo
from tilefuse.cli.timing import format_seconds, interleaved_medians
from tilefuse.frontend.jit import JitFunction


def w1(x: np.ndarray, w: np.ndarray, b: np.ndarray) -> np.ndarray:
    y = x @ w + b
    return 0.5 * y * (1.0 + scipy.special.erf(y / math.sqrt(2.0)))


def compare(label: str, dynamic: JitFunction, fn, args: list[np.ndarray],
            rounds: int) -> None:
    """One line: dynamic against a fresh static compile of this size."""
    static = tilefuse.jit(fn, dynamic=False)
    start = time.perf_counter()
    dynamic(*args)
    first = time.perf_counter() - start
    static(*args)
    times = interleaved_medians({"dynamic": lambda: dynamic(*args),
                                 "static": lambda: static(*args)}, rounds)
    ratio = times["dynamic"] / times["static"]
    print(f"  {label:<14} dynamic {format_seconds(times['dynamic']):>10}  static "
          f"{format_seconds(times['static']):>10}  ratio {ratio:5.2f}  "
          f"(first call of the size {format_seconds(first)})")


def run_w1(rows: list[int], rounds: int) -> JitFunction:
    rng = np.random.default_rng(0)
    w = rng.standard_normal((768, 3072), dtype=np.float32)
    b = rng.standard_normal(3072, dtype=np.float32)
    dynamic = tilefuse.jit(w1, dynamic={"x": {0: "m"}})
    print("W1 gelu(x @ w + b), x[M,768]:")
    for m in rows:
        x = rng.standard_normal((m, 768), dtype=np.float32)
        compare(f"M={m}", dynamic, w1, [x, w, b], rounds)
    return dynamic


def run_bert(sizes: list[tuple[int, int]], rounds: int) -> JitFunction:
    layer = zoo.bert_layer_numpy(zoo.bert_layer())
    dynamic = tilefuse.jit(layer, dynamic={"x": {0: "batch", 1: "seq"},
                                           "mask": {0: "batch", 3: "seq"}})
    print("BERT-base layer, x[B,S,768]:")
    for batch, seq in sizes:
        compare(f"B={batch} S={seq}", dynamic, layer, zoo.bert_inputs(batch, seq), rounds)
    return dynamic


def describe_build(fn: JitFunction) -> str:
    """What the dynamic entry runs: the one symbolic native build (its kernels with runtime
    extents and the kernels it specialised per size) or per-size builds."""
    entries = [e.executable for e in fn._cache.values()]  # the benchmark's own functions
    parts = []
    for exe in entries:
        symbolic = getattr(exe, "symbolic", None)
        if symbolic is None:
            parts.append(f"{exe!r}")
            continue
        parts.append(f"{symbolic!r}; kernel specialisations {symbolic.kernel_specializations}, "
                     f"LLVM builds {symbolic.cache_stats.misses}, disk-cache loads "
                     f"{symbolic.cache_stats.hits}")
    return "; ".join(parts)


def guard_overhead(rounds: int) -> None:
    def add_one(x: np.ndarray) -> np.ndarray:
        return x + 1.0

    x = np.arange(8, dtype=np.float32)
    static = tilefuse.jit(add_one, dynamic=False)
    dynamic = tilefuse.jit(add_one, dynamic={"x": {0: "n"}})
    static(x)
    dynamic(x)
    times = interleaved_medians({"static": lambda: static(x), "dynamic": lambda: dynamic(x)},
                                rounds, min_sample=20e-3)
    print(f"guard overhead (x + 1 on 8 floats, cache hit): static call "
          f"{format_seconds(times['static'])}, dynamic call {format_seconds(times['dynamic'])}, "
          f"dynamic dims add {format_seconds(times['dynamic'] - times['static'])} per call")


def automatic_storm() -> None:
    rng = np.random.default_rng(1)
    w = rng.standard_normal((64, 64), dtype=np.float32)
    f = tilefuse.jit(lambda x: np.tanh(x @ w))
    for n in rng.integers(1, 65, size=100):
        f(rng.standard_normal((int(n), 64), dtype=np.float32))
    print(f"automatic dynamic dims, 100 calls with random batch 1..64: {f.cache_info()}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--w1-rows", type=int, nargs="+", default=[1, 7, 64, 512])
    parser.add_argument("--bert", nargs="+", default=["1x128", "8x128", "1x512"],
                        help="BxS sizes of the BERT layer")
    parser.add_argument("--skip-bert", action="store_true")
    parser.add_argument("--cores", type=int, default=0,
                        help="compile for this many cores (default: the machine's)")
    args = parser.parse_args()
    if args.cores > 0:
        os.cpu_count = lambda: args.cores  # read when each build makes its CPU target
    guard_overhead(args.rounds)
    counted = [("W1", run_w1(args.w1_rows, args.rounds))]
    if not args.skip_bert:
        sizes = [tuple(int(p) for p in s.lower().split("x")) for s in args.bert]
        counted.append(("BERT", run_bert(sizes, args.rounds)))  # type: ignore[arg-type]
    for name, fn in counted:
        print(f"{name} dynamic: {fn.cache_info()}")
        print(f"  {describe_build(fn)}")
    automatic_storm()


if __name__ == "__main__":
    main()
