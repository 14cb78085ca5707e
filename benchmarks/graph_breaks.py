"""Per-call cost of a graph break: one function with a data-dependent branch (one break, one
guard), the same computation written without the break (``np.where``), and plain NumPy.

    PYTHONPATH=. python benchmarks/graph_breaks.py [--rounds 30]

Medians of interleaved rounds (tilefuse.cli.timing), microseconds per call, for a tiny input (the
overhead dominates) and a larger one.
"""

from __future__ import annotations

import argparse
import functools

import numpy as np

import tilefuse
from tilefuse.cli.timing import interleaved_medians


def with_break(x):
    y = x * 2.0 + 1.0
    if y.max() > 0:
        return np.tanh(y) - 1.0
    return np.tanh(y) + 1.0


def without_break(x):
    y = x * 2.0 + 1.0
    return np.tanh(y) + np.where(y.max() > 0, np.float32(-1.0), np.float32(1.0))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=30)
    args = parser.parse_args(argv)
    rng = np.random.default_rng(0)
    print(f"{'input':<12} {'NumPy':>9} {'jit, no break':>14} {'jit, 1 break':>13} "
          f"{'break - no break':>17}")
    for shape in ((16,), (512, 512)):
        x = rng.standard_normal(shape).astype(np.float32)
        broken, plain = tilefuse.jit(with_break), tilefuse.jit(without_break)
        np.testing.assert_allclose(broken(x), with_break(x), rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(plain(x), with_break(x), rtol=1e-5, atol=1e-5)
        times = interleaved_medians({"numpy": functools.partial(with_break, x),
                                     "plain": functools.partial(plain, x),
                                     "broken": functools.partial(broken, x)}, args.rounds)
        us = {k: v * 1e6 for k, v in times.items()}
        print(f"{'x'.join(map(str, shape)):<12} {us['numpy']:9.1f} {us['plain']:14.1f} "
              f"{us['broken']:13.1f} {us['broken'] - us['plain']:17.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
