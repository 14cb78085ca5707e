"""Where W5's microseconds go: the MLP 256-256-256-10 at batch 1, weights as arguments and as
constants, split into the jit call path (cache key, argument checks, output buffers), each
kernel of the launch sequence, and what is left (the launcher, Python between steps).

    PYTHONPATH=. python benchmarks/w5_profile.py [--rounds 15]

Also times a 7-argument jitted function whose kernel is trivial (the per-call overhead the
issue bounds at 3 µs) and NumPy's own W5. Every figure is the median over rounds of the mean
of a batch of calls, all implementations interleaved in each round; on the shared 2-core host
compare ratios, not absolute times.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from workloads import w5_numpy

import tilefuse
from tilefuse.runtime.profile import step_calls


def _batch(fn: Callable[[], object], calls: int) -> float:
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - start) / calls


def interleaved(impls: dict[str, Callable[[], object]], rounds: int, calls: int = 200
                ) -> dict[str, tuple[float, float]]:
    """Median and best seconds per call of each implementation, interleaved round by round
    (the best batch is the figure least disturbed by other load on a shared host)."""
    for fn in impls.values():
        _batch(fn, 20)
    samples: dict[str, list[float]] = {k: [] for k in impls}
    for _ in range(rounds):
        for name, fn in impls.items():
            samples[name].append(_batch(fn, calls))
    return {k: (statistics.median(v), min(v)) for k, v in samples.items()}


def seven_args(a, b, c, d, e, f, g):
    return a + b + c + d + e + f + g


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    x = rng.standard_normal((1, 256), dtype=np.float32)
    ws = [rng.standard_normal(s, dtype=np.float32) * (1 / 16 if len(s) == 2 else 1)
          for s in ((256, 256), (256,), (256, 256), (256,), (256, 10), (10,))]
    as_args = tilefuse.jit(lambda x, w1, b1, w2, b2, w3, b3: w5_numpy(x, w1, b1, w2, b2, w3,
                                                                       b3))
    as_consts = tilefuse.jit(lambda x: w5_numpy(x, *ws))
    tiny = [rng.standard_normal(4, dtype=np.float32) for _ in range(7)]
    seven = tilefuse.jit(seven_args)
    for fn, call_args in ((as_args, (x, *ws)), (as_consts, (x,)), (seven, tiny)):
        np.testing.assert_allclose(fn(*call_args), (fn._fn if hasattr(fn, "_fn") else fn)(
            *call_args) if fn is seven else w5_numpy(x, *ws), rtol=1e-4, atol=1e-5)

    impls: dict[str, Callable[[], object]] = {
        "numpy W5": lambda: w5_numpy(x, *ws),
        "tilefuse W5, weights as arguments": lambda: as_args(x, *ws),
        "tilefuse W5, weights as constants": lambda: as_consts(x),
        "tilefuse 7-argument a+b+...+g (f32[4])": lambda: seven(*tiny),
    }
    # the parts of a call: the cache key, the executable alone, each step alone
    for label, fn, call_args in (("args", as_args, (x, *ws)), ("consts", as_consts, (x,)),
                                 ("7-arg", seven, tiny)):
        executable = fn.lower(*call_args).executable
        arrays = list(call_args)
        impls[f"  {label}: cache key (general path)"] = \
            lambda fn=fn, a=tuple(call_args): fn._key(a, {})
        impls[f"  {label}: executable.run_args (the fast path's call)"] = \
            lambda e=executable, a=tuple(call_args): e.run_args(a)
        impls[f"  {label}: executable.run_trusted"] = \
            lambda e=executable, a=arrays: e.run_trusted(a)
        for name, run in step_calls(executable, arrays):
            impls[f"  {label}: step {name}"] = run
    medians = interleaved(impls, args.rounds)
    width = max(len(k) for k in medians)
    print(f"µs per call over {args.rounds} interleaved rounds of 200 calls, median and best "
          "(busy host: compare ratios)")
    for name, (median, best) in medians.items():
        print(f"{name:<{width}}  {median * 1e6:8.2f}  {best * 1e6:8.2f}")
    for label, fn, call_args in (("args", as_args, (x, *ws)), ("consts", as_consts, (x,))):
        executable = fn.lower(*call_args).executable
        print(f"\n{label}: kernels of the launch sequence:")
        for step in executable.steps:
            print(f"  {step.name}: {len(getattr(step, 'launches', ()))} launch(es)")


if __name__ == "__main__":
    main()
