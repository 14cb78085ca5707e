"""Small NumPy functions compiled by tilefuse.jit against NumPy itself, at 1k-64k elements:
reductions (over the last axis, the first, all), arg-reductions, gathers (take, take_along_axis,
fancy indexing), scans and elementwise chains. The issue-28 target: no compiled NumPy function
slower than NumPy on inputs of 1k elements or more.

    PYTHONPATH=. python benchmarks/numpy_sweep.py [--rounds 9] [--only argmax,take]

Each row: the function, the input shape, tilefuse's and NumPy's time per call (best of the
interleaved rounds of a batch of calls: the figure least disturbed by other load on a shared
host; the median is printed too) and their ratio; rows above 1.0 are marked. Outputs are
checked against NumPy first.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import numpy as np

import tilefuse
from tilefuse.testing import assert_close

SIZES = ((8, 128), (16, 256), (64, 256), (128, 512))   # 1k, 4k, 16k, 64k elements


def _functions() -> dict[str, tuple[Callable[..., np.ndarray], str]]:
    """name -> (function of x[, idx], the kind of second input: '' none, 'row' indices into
    the last axis per row, 'flat' indices into the last axis)."""
    return {
        "sum(-1)": (lambda x: x.sum(axis=-1), ""),
        "sum(0)": (lambda x: x.sum(axis=0), ""),
        "sum()": (lambda x: x.sum(), ""),
        "mean(-1)": (lambda x: x.mean(axis=-1), ""),
        "max(-1)": (lambda x: x.max(axis=-1), ""),
        "max()": (lambda x: np.max(x), ""),
        "min(0)": (lambda x: x.min(axis=0), ""),
        "var(-1)": (lambda x: x.var(axis=-1), ""),
        "argmax(-1)": (lambda x: np.argmax(x, axis=-1), ""),
        "argmin(-1)": (lambda x: np.argmin(x, axis=-1), ""),
        "argmax(0)": (lambda x: np.argmax(x, axis=0), ""),
        "take(-1)": (lambda x, i: np.take(x, i, axis=-1), "flat"),
        "take(0)": (lambda x, i: np.take(x, i % x.shape[0], axis=0), "flat"),
        "take_along_axis(-1)": (lambda x, i: np.take_along_axis(x, i, axis=-1), "row"),
        "cumsum(-1)": (lambda x: np.cumsum(x, axis=-1), ""),
        "exp(x)*2+1": (lambda x: np.exp(x) * 2.0 + 1.0, ""),
        "where(x>0,x,0.1x)": (lambda x: np.where(x > 0, x, 0.1 * x), ""),
        "softmax(-1)": (lambda x: np.exp(x - x.max(-1, keepdims=True))
                        / np.exp(x - x.max(-1, keepdims=True)).sum(-1, keepdims=True), ""),
        "abs(x).max()+sum(0)": (lambda x: np.abs(x).max() + x.sum(axis=0), ""),
    }


def _time(fn: Callable[[], object], calls: int) -> float:
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - start) / calls


def measure(name: str, fn: Callable[..., np.ndarray], kind: str, shape: tuple[int, int],
            rounds: int) -> tuple[float, float, float, float]:
    """(tilefuse best, NumPy best, tilefuse median, NumPy median) seconds per call."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal(shape, dtype=np.float32)
    args: list[np.ndarray] = [x]
    if kind == "flat":
        args.append(rng.integers(0, shape[-1], shape[-1] // 2))
    elif kind == "row":
        args.append(rng.integers(0, shape[-1], (shape[0], shape[-1] // 2)))
    jitted = tilefuse.jit(fn)
    want = fn(*args)
    got = jitted(*args)
    if np.issubdtype(np.asarray(want).dtype, np.integer):
        np.testing.assert_array_equal(got, want, err_msg=name)
    else:
        assert_close(np.asarray(got), np.asarray(want), reduction=True)
    impls = {"tilefuse": lambda: jitted(*args), "numpy": lambda: fn(*args)}
    calls = max(20, int(2e-3 / max(_time(impls["numpy"], 20), 1e-7)))
    samples: dict[str, list[float]] = {k: [] for k in impls}
    for _ in range(rounds):
        for k, f in impls.items():
            samples[k].append(_time(f, calls))
    return (min(samples["tilefuse"]), min(samples["numpy"]),
            statistics.median(samples["tilefuse"]), statistics.median(samples["numpy"]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--only", default="", help="comma-separated function names")
    args = parser.parse_args()
    only = {n.strip() for n in args.only.split(",") if n.strip()}
    print(f"{'function':<22}{'shape':<11}{'tilefuse µs':>12}{'numpy µs':>10}{'ratio':>7}"
          f"{'(medians)':>18}")
    slow = 0
    for name, (fn, kind) in _functions().items():
        if only and name not in only:
            continue
        for shape in SIZES:
            t, n, tm, nm = measure(name, fn, kind, shape, args.rounds)
            mark = "  <- slower" if t > n else ""
            slow += t > n
            print(f"{name:<22}{'x'.join(map(str, shape)):<11}{t * 1e6:12.2f}{n * 1e6:10.2f}"
                  f"{t / n:7.2f}{tm * 1e6:9.2f}/{nm * 1e6:.2f}{mark}", flush=True)
    print(f"\n{slow} row(s) where tilefuse is slower than NumPy (best of {args.rounds} rounds)")


if __name__ == "__main__":
    main()
