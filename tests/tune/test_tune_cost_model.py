"""Cost models on loop-IR features: train / predict smoke tests."""

from __future__ import annotations

import math

import numpy as np
import pytest
from helpers_tune import elementwise_graph, matmul_graph, rows_graph

from tilefuse.tune.cost_model import (
    FEATURE_NAMES,
    LightGBMModel,
    RandomModel,
    lightgbm_available,
    loop_features,
    top_k_recall,
)
from tilefuse.tune.space import space_for
from tilefuse.tune.task import tasks_from_graph


def features_of(graph, count: int = 12):
    [task] = tasks_from_graph(graph)
    space = space_for(task.group)
    rng = np.random.default_rng(0)
    schedules = [space.default()] + [space.sample(rng) for _ in range(count - 1)]
    return np.vstack([loop_features(task.lower(s).functions, task.work(), 4)
                      for s in schedules]), schedules


@pytest.mark.parametrize("graph", [matmul_graph(64, 48, 96), elementwise_graph((300, 7)),
                                   rows_graph((40, 100))], ids=["matmul", "ew", "rows"])
def test_features_are_finite_and_named(graph):
    rows, _ = features_of(graph, 6)
    assert rows.shape == (6, len(FEATURE_NAMES))
    assert np.isfinite(rows).all()


def test_features_see_the_micro_tile():
    rows, schedules = features_of(matmul_graph(64, 48, 96), 12)
    fmas = rows[:, FEATURE_NAMES.index("hot_fmas")]
    for row_fmas, s in zip(fmas, schedules):
        mr, nr = s.micro_tile
        assert row_fmas >= mr * nr // s.vector_width  # at least one k step of the tile


def test_random_model():
    model = RandomModel(0)
    model.update(np.zeros((3, 4)), np.ones(3))
    assert model.predict(np.zeros((5, 4))).shape == (5,)


@pytest.mark.skipif(not lightgbm_available(), reason="lightgbm is not installed")
def test_lightgbm_learns_a_simple_cost():
    rng = np.random.default_rng(0)
    x = rng.uniform(0, 10, size=(80, len(FEATURE_NAMES)))
    times = np.exp(0.3 * x[:, 0] - 0.1 * x[:, 1])
    times[::17] = math.inf  # failures train as slow
    model = LightGBMModel(min_samples=8, rounds=60)
    model.update(x[:60], times[:60])
    scores = model.predict(x[60:])
    assert scores.shape == (20,)
    finite = np.isfinite(times[60:])
    assert np.corrcoef(scores[finite], np.log(times[60:][finite]))[0, 1] > 0.5


def test_top_k_recall():
    assert top_k_recall([1, 2, 3, 4], [10, 20, 30, 40], 2) == 1.0
    assert top_k_recall([4, 3, 2, 1], [10, 20, 30, 40], 2) == 0.0
    assert top_k_recall([1, 3, 2, 4], [10, 20, 30, 40], 2) == 0.5
