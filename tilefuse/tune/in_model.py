"""The model check: tuned schedules timed inside the model's own call, against the defaults.

A verdict (:func:`~tilefuse.tune.tuner.tune_task`) rests on its kernel timed alone, in
conditions made to resemble a model's (:func:`~tilefuse.tune.runner.before_each_call`) but not
the model itself: there, the kernel before it leaves its own data and its own thread placement
behind. :func:`check_in_model` therefore builds the graph twice — every kernel by the default
rule, and every tuned kernel with its verdict — and runs the two builds' launch sequences step by
step, alternating round by round, a timestamp around each step. A tuned kernel's gain in the
model is the median over rounds of (its steps' default seconds / the same steps' tuned seconds),
all the graph's kernels with its fingerprint counted; a verdict that is not faster in the model
(gain below :data:`IN_MODEL_MIN_GAIN`) is taken back: the database's verdict becomes the
default, and builds use the default rule for it.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from tilefuse.codegen.target import CpuTarget, host_target
from tilefuse.driver import CompileOptions, compile
from tilefuse.graph.ir import Graph
from tilefuse.kernel.schedule import Schedule
from tilefuse.runtime.kernel_cache import KernelCache
from tilefuse.runtime.profile import step_calls
from tilefuse.runtime.schedules import ForcedSchedules
from tilefuse.schedules.database import TuneKey, TuningDatabase
from tilefuse.testing import random_array
from tilefuse.tune.task import TuneError
from tilefuse.tune.tuner import paired_gain

IN_MODEL_ROUNDS = 31
"""Rounds of the check; each runs both builds' whole launch sequences once."""
IN_MODEL_MIN_GAIN = 1.0
"""A verdict is kept when its kernel's steps are at least this much faster in the model."""


@dataclass(frozen=True)
class TunedKernel:
    """A tuned fingerprint: its database key, the names of the graph's kernels that have it,
    its verdict and its default schedule."""

    key: TuneKey
    names: tuple[str, ...]
    verdict: Schedule
    default: Schedule


@dataclass(frozen=True)
class ModelCheck:
    """What :func:`check_in_model` measured: per tuned fingerprint (by its first kernel's
    name) the gain in the model, the names whose verdicts were taken back, and the medians of
    the whole launch sequence of each build (seconds)."""

    gains: dict[str, float]
    reverted: tuple[str, ...]
    default_seconds: float
    tuned_seconds: float
    rounds: int

    def summary(self) -> str:
        text = (f"in the model's call ({self.rounds} rounds, both builds alternating): "
                f"{self.default_seconds * 1e3:.3f} ms default, {self.tuned_seconds * 1e3:.3f} ms "
                f"with the verdicts ({self.default_seconds / self.tuned_seconds:.3f}x)")
        if self.reverted:
            text += f"; taken back, not faster in the model: {', '.join(self.reverted)}"
        return text


def _timed_round(steps: list[tuple[str, Callable[[], object]]]) -> dict[str, float]:
    times: dict[str, float] = {}
    for name, run in steps:
        start = time.perf_counter()
        run()
        times[name] = times.get(name, 0.0) + time.perf_counter() - start
    return times


def example_arrays(graph: Graph, seed: int = 0) -> list[np.ndarray]:
    """Random inputs of ``graph``'s input types; TuneError when a dim is symbolic (the check
    then needs the caller's example inputs)."""
    rng = np.random.default_rng(seed)
    arrays = []
    for v in graph.inputs:
        if not all(isinstance(d, int) for d in v.shape):
            raise TuneError(f"input {v.name or '?'} of @{graph.name} has symbolic dims "
                            f"{list(v.shape)}: the model check needs example inputs")
        arrays.append(random_array(rng, tuple(v.shape), v.dtype))
    return arrays


def check_in_model(graph: Graph, tuned: Sequence[TunedKernel], db: TuningDatabase,
                   inputs: Sequence[np.ndarray] | None = None, *,
                   rounds: int = IN_MODEL_ROUNDS, target: CpuTarget | None = None
                   ) -> ModelCheck | None:
    """Times ``graph`` built with the defaults and with the ``tuned`` verdicts in its own
    call (module docstring) and takes back, in ``db``, each verdict not faster there. None
    when nothing was tuned away from its default."""
    changed = [t for t in tuned if t.verdict != t.default]
    if not changed:
        return None
    target = target or host_target()
    arrays = list(inputs) if inputs is not None else example_arrays(graph)
    cache = KernelCache(None, target)   # the kernels both builds share compile once
    verdicts = {name: t.verdict for t in changed for name in t.names}
    default, tuned_exe = (  # the optimised graph through the driver's back-end stages
        compile(graph, "cpu", CompileOptions(optimize=False, cache=cache,
                                             schedules=ForcedSchedules(target, forced)))
        for forced in ({}, verdicts))
    builds = {"default": step_calls(default, arrays), "tuned": step_calls(tuned_exe, arrays)}
    for steps in builds.values():
        _timed_round(steps)   # warm-up
    samples: dict[str, list[dict[str, float]]] = {k: [] for k in builds}
    for r in range(max(1, rounds)):
        for name in (("default", "tuned") if r % 2 == 0 else ("tuned", "default")):
            samples[name].append(_timed_round(builds[name]))
    gains = {t.names[0]: _paired_gain(samples, t.names) for t in changed}
    reverted = []
    for t in changed:
        if gains[t.names[0]] < IN_MODEL_MIN_GAIN:
            db.decide(t.key, t.default, 1.0)
            reverted.append(t.names[0])
    whole = {k: statistics.median(sum(s.values()) for s in v) for k, v in samples.items()}
    return ModelCheck(gains, tuple(reverted), whole["default"], whole["tuned"], rounds)


def _paired_gain(samples: Mapping[str, list[dict[str, float]]], names: Sequence[str]) -> float:
    """:func:`~tilefuse.tune.tuner.paired_gain` of the two builds' seconds in ``names``' steps,
    round by round."""
    def seconds(times: dict[str, float]) -> float:
        return sum(times.get(n, 0.0) for n in names)

    rounds = [{"default": seconds(d), "tuned": seconds(t)}
              for d, t in zip(samples["default"], samples["tuned"])]
    return paired_gain(rounds, "default", "tuned")


__all__ = ["IN_MODEL_MIN_GAIN", "IN_MODEL_ROUNDS", "ModelCheck", "TunedKernel",
           "check_in_model", "example_arrays"]
