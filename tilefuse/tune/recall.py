"""The cost model's top-k recall on held-out measurements of one kernel.

:func:`recall_report` takes a task and a database: the distinct schedules measured for the
task's key (the fastest measurement of each; a tuning run records every candidate) are topped
up with random candidates of the space, measured by the runner and recorded, until there are
``count``; then each model ranks held-out folds after training on the rest
(:func:`~tilefuse.tune.cost_model.cross_validated_recall`, 5 folds), next to a random ranking
for scale, over :data:`SPLITS` shuffles of the folds (repeated cross-validation: with one
shuffle, which candidates shared a fold moved the figure by ±0.1). Random candidates spread
widely in time; a tuning run's candidates crowd near the best, where measurement noise decides
much of the order, so the figure on a tuning run's history is the harder one. Both are printed
by ``python -m tilefuse.tune --recall``.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from tilefuse.codegen.target import host_target
from tilefuse.errors import TilefuseError
from tilefuse.kernel.schedule import Schedule
from tilefuse.schedules.database import TuneKey, TuningDatabase
from tilefuse.schedules.fingerprint import target_string
from tilefuse.tune.cost_model import (
    DEFAULT_OBJECTIVE,
    CostModel,
    LightGBMModel,
    RandomModel,
    cross_validated_recall,
    lightgbm_available,
)
from tilefuse.tune.features import candidate_features
from tilefuse.tune.runner import Runner
from tilefuse.tune.space import space_for
from tilefuse.tune.task import TuneError, TuneTask

SPLITS = 10
"""Shuffles of the candidates into folds that the recall is averaged over."""


@dataclass(frozen=True)
class RecallReport:
    """Mean top-``k`` recall per model over the folds of ``splits`` shuffles, on ``measured``
    candidates (``failed`` of them failed and only train); ``spread``: the least and the most
    of LightGBM's per-shuffle means."""

    k: int
    measured: int
    failed: int
    lightgbm: float
    random: float
    splits: int = 1
    spread: tuple[float, float] = (math.nan, math.nan)

    def __str__(self) -> str:
        low, high = self.spread
        return (f"top-{self.k} recall on held-out candidates (5-fold x {self.splits} "
                f"shuffles, {self.measured} measured, {self.failed} failed): LightGBM "
                f"({DEFAULT_OBJECTIVE}) {self.lightgbm:.2f} (shuffles {low:.2f}-{high:.2f}), "
                f"random ranking {self.random:.2f}")


def measured_schedules(task: TuneTask, db: TuningDatabase) -> dict[str, float]:
    """Schedule JSON -> its fastest measurement, for the task's key on this machine."""
    key = TuneKey(task.fingerprint(), target_string(host_target()))
    best: dict[str, float] = {}
    for record in db.records(key):
        text = record.schedule.to_json()
        best[text] = min(best.get(text, math.inf), record.seconds)
    return best


def top_up(task: TuneTask, db: TuningDatabase, runner: Runner, count: int, seed: int = 0,
           on_measured: Callable[[int], None] | None = None) -> dict[str, float]:
    """:func:`measured_schedules`, with random candidates measured (and recorded) until
    there are ``count`` (or the space has no more new ones)."""
    have = measured_schedules(task, db)
    key = TuneKey(task.fingerprint(), target_string(host_target()))
    space = space_for(task.group, host_target())
    rng = np.random.default_rng(seed)
    misses = 0
    while len(have) < count and misses < 50:
        batch: list[Schedule] = []
        while len(batch) < min(8, count - len(have)) and misses < 50:
            s = space.sample(rng)
            if s.to_json() in have or s in batch:
                misses += 1
                continue
            batch.append(s)
        for result in runner.measure(task, batch):
            db.record(key, result.schedule, result.seconds)
            have[result.schedule.to_json()] = result.seconds
        if on_measured is not None:
            on_measured(len(have))
    return have


def recall_report(task: TuneTask, measured: dict[str, float], k: int = 5,
                  seed: int = 0, splits: int = SPLITS) -> RecallReport:
    """Cross-validated top-``k`` recall of LightGBM and of a random ranking, averaged over
    ``splits`` shuffles into folds (seeds ``seed``, ``seed + 1``, ...)."""
    if not lightgbm_available():
        raise TuneError("the recall report needs lightgbm: pip install lightgbm")
    schedules = [Schedule.from_json(text) for text in measured]
    times = np.array(list(measured.values()))
    rows = []
    cores = os.cpu_count() or 1
    for s in schedules:
        try:
            fns = task.loop_functions(s)
        except TilefuseError:
            fns = None
        rows.append(candidate_features(fns, s, task.extents(), task.work(), cores))
    features = np.vstack(rows)
    finite = int(np.isfinite(times).sum())
    if finite < 5 * k:
        raise TuneError(f"{finite} successful measurements: too few for a {k}-fold held-out "
                        f"recall (need {5 * k})")
    def per_split(make: type[CostModel]) -> list[float]:
        return [float(np.mean(cross_validated_recall(features, times, k, seed=s, make=make)))
                for s in range(seed, seed + splits)]
    learned, chance = per_split(LightGBMModel), per_split(RandomModel)
    return RecallReport(k, len(times), len(times) - finite, float(np.mean(learned)),
                        float(np.mean(chance)), splits, (min(learned), max(learned)))


__all__ = ["SPLITS", "RecallReport", "measured_schedules", "recall_report", "top_up"]
