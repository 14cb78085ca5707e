"""Interleaved timing of several implementations of one computation: medians and ratios.

In each round every implementation runs once (a batch of calls when one call is shorter than
``min_sample`` seconds), in turn, so that noise from a shared machine hits all of them alike;
the figure is the median over rounds. Implementations named in ``separate`` are timed in rounds
of their own after the interleaved ones: NumPy's OpenBLAS keeps its threads busy-waiting after
every call, which slows whatever runs next on a small machine. ``benchmarks/run.py`` and
``tilefuse bench`` both time through :func:`interleaved_medians`.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any


def calls_per_sample(fn: Callable[[], Any], min_sample: float = 2e-3) -> int:
    """How many calls make one sample of at least ``min_sample`` seconds (``fn`` warmed up)."""
    start = time.perf_counter()
    fn()
    once = time.perf_counter() - start
    return max(1, int(min_sample / max(once, 1e-7)))


def interleaved_medians(impls: Mapping[str, Callable[[], Any]], rounds: int, *,
                        separate: Iterable[str] = (), min_sample: float = 2e-3,
                        on_round: Callable[[], None] | None = None) -> dict[str, float]:
    """Median seconds per call of each implementation (module docstring). ``on_round`` is
    called after every round (a progress bar)."""
    samples = interleaved_samples(impls, rounds, separate=separate, min_sample=min_sample,
                                  on_round=on_round)
    return {name: statistics.median(s) for name, s in samples.items()}


def interleaved_samples(impls: Mapping[str, Callable[[], Any]], rounds: int, *,
                        separate: Iterable[str] = (), min_sample: float = 2e-3,
                        on_round: Callable[[], None] | None = None) -> dict[str, list[float]]:
    """Every round's seconds per call of each implementation, timed as
    :func:`interleaved_medians` times them (for a minimum beside the median on a busy host)."""
    batch = {name: calls_per_sample(fn, min_sample) for name, fn in impls.items()}
    samples: dict[str, list[float]] = {name: [] for name in impls}
    alone = [name for name in separate if name in impls]
    together = [name for name in impls if name not in alone]
    for group in (together, *([name] for name in alone)):
        if not group:
            continue
        for _ in range(max(1, rounds)):
            for name in group:
                fn, n = impls[name], batch[name]
                start = time.perf_counter()
                for _ in range(n):
                    fn()
                samples[name].append((time.perf_counter() - start) / n)
            if on_round is not None:
                on_round()
    return samples


def format_seconds(seconds: float) -> str:
    """Three significant digits: ``40 ns``, ``812 us``, ``9.13 ms``, ``1.2 s``."""
    if seconds != seconds or seconds == float("inf"):
        return "n/a"
    for scale, unit in ((1e-6, "ns"), (1e-3, "us"), (1.0, "ms")):
        if seconds < scale:
            return f"{seconds * 1e3 / scale:.3g} {unit}"
    return f"{seconds:.3g} s"


__all__ = ["calls_per_sample", "format_seconds", "interleaved_medians",
           "interleaved_samples"]
