"""Cost models on loop-IR features: train / predict smoke tests."""

from __future__ import annotations

import math

import numpy as np
import pytest
from helpers_tune import elementwise_graph, matmul_graph, rows_graph

from tilefuse.tune.cost_model import (
    FEATURE_NAMES,
    GRADES,
    LightGBMModel,
    RandomModel,
    cross_validated_recall,
    lightgbm_available,
    log_time_grades,
    top_k_recall,
)
from tilefuse.tune.features import candidate_features
from tilefuse.tune.space import space_for
from tilefuse.tune.task import tasks_from_graph


def features_of(graph, count: int = 12):
    [task] = tasks_from_graph(graph)
    space = space_for(task.group)
    rng = np.random.default_rng(0)
    schedules = [space.default()] + [space.sample(rng) for _ in range(count - 1)]
    return np.vstack([candidate_features(task.loop_functions(s), s, task.extents(),
                                         task.work(), 4) for s in schedules]), schedules


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


def test_features_see_reuse_of_the_packed_b_panel():
    """In the matmul micro-kernel, A's loads do not depend on the n loop around the
    micro-kernel, so some bytes are reused there; not all bytes are reused at the k loop."""
    rows, _ = features_of(matmul_graph(64, 48, 96), 4)
    hot_reused = rows[:, FEATURE_NAMES.index("level0_reused")]
    assert ((hot_reused >= 0) & (hot_reused < 1)).all()
    outer = rows[:, [FEATURE_NAMES.index(f"level{i}_reused") for i in range(1, 4)]]
    assert (outer > 0).any()


def test_lowering_failure_gives_nan_loop_features():
    [task] = tasks_from_graph(matmul_graph(64, 48, 96))
    s = space_for(task.group).default()
    row = candidate_features(None, s, task.extents(), task.work(), 4)
    assert row.shape == (len(FEATURE_NAMES),)
    assert np.isnan(row[0]) and np.isfinite(row[-1])


def test_log_time_grades():
    grades = log_time_grades([3.0, 1.0, math.inf, 2.0, 5.0])
    assert grades[1] == GRADES and grades[2] == 0 and grades[4] == 0
    assert grades[1] > grades[3] > grades[0] > grades[4]


def test_random_model():
    model = RandomModel(0)
    model.update(np.zeros((3, 4)), np.ones(3))
    assert model.predict(np.zeros((5, 4))).shape == (5,)


@pytest.mark.skipif(not lightgbm_available(), reason="lightgbm is not installed")
def test_lightgbm_learns_a_simple_cost():
    rng = np.random.default_rng(0)
    x = rng.uniform(0, 10, size=(80, 20))
    times = np.exp(0.3 * x[:, 0] - 0.1 * x[:, 1])
    times[::17] = math.inf  # failures train as slow
    model = LightGBMModel(min_samples=8, rounds=60, objective="regression")
    model.update(x[:60], times[:60])
    scores = model.predict(x[60:])
    assert scores.shape == (20,)
    finite = np.isfinite(times[60:])
    assert np.corrcoef(scores[finite], np.log(times[60:][finite]))[0, 1] > 0.5


def test_top_k_recall():
    assert top_k_recall([1, 2, 3, 4], [10, 20, 30, 40], 2) == 1.0
    assert top_k_recall([4, 3, 2, 1], [10, 20, 30, 40], 2) == 0.0
    assert top_k_recall([1, 3, 2, 4], [10, 20, 30, 40], 2) == 0.5


@pytest.mark.skipif(not lightgbm_available(), reason="lightgbm is not installed")
@pytest.mark.parametrize("objective", ["rank_xendcg", "lambdarank", "regression"])
def test_every_objective_ranks_held_out_candidates(objective):
    rng = np.random.default_rng(1)
    x = rng.uniform(0, 10, size=(150, 20))
    times = np.exp(0.3 * x[:, 0] - 0.2 * x[:, 3]) * rng.uniform(0.95, 1.05, 150)
    times[::23] = math.inf

    def make(seed: int = 0) -> LightGBMModel:
        return LightGBMModel(seed, objective=objective)

    recalls = cross_validated_recall(x, times, k=5, folds=5, make=make)  # type: ignore[arg-type]
    assert len(recalls) == 5
    chance = np.mean(cross_validated_recall(x, times, k=5, folds=5, make=RandomModel))
    assert np.mean(recalls) >= 0.5 > chance


def test_float_constants_of_any_value_are_not_index_values() -> None:
    # a row kernel's -inf max identity inside an expression the feature walk evaluates
    from tilefuse.dtypes import DType
    from tilefuse.loop.ir import const
    from tilefuse.tune.features import _value

    assert _value(const(float("-inf"), DType.f32, 16), {}) is None
    assert _value(const(float("nan"), DType.f32), {}) is None
    assert _value(const(7), {}) == 7
