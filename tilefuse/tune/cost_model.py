"""Cost models: rank candidate schedules before measuring them.

Features come from the lowered loop IR and the schedule (:mod:`tilefuse.tune.features`), so one
model serves every kernel kind. Lower scores mean predicted faster.

- :class:`RandomModel` (trivial): random scores.
- :class:`LightGBMModel`: gradient-boosted trees (LightGBM, an optional dependency). The
  default objective ranks, with one query group per kernel: the tuner needs the order of
  candidates, not their times. Labels are relevance grades linear in each group's log time
  (the fastest gets :data:`GRADES`, failures 0). The default is ``lambdarank`` on trees of
  4 leaves; ``rank_xendcg`` is the other ranking objective, and ``regression`` regresses log
  seconds instead. Held-out top-5 recall (5 folds x 6 fold seeds) on two sets of 120 random
  W1 candidates measured 2026-12-02: lambdarank 0.63 and 0.63 (with rank-order grades and
  15 leaves, the earlier default, rank_xendcg gave 0.51 and 0.54), regression 0.71 and 0.71;
  on a tuning run's own history (crowded near the best, where noise sets the order) all
  0.33-0.41. Until it has ``min_samples`` measurements it scores randomly.

:func:`top_k_recall` measures how well a model's top k matches the measured top k;
:func:`cross_validated_recall` is that figure on held-out folds of a set of measurements.
"""

from __future__ import annotations

import abc
import math
from collections.abc import Sequence

import numpy as np

from tilefuse.errors import TilefuseError
from tilefuse.tune.features import FEATURE_NAMES, loop_features

RANKING = ("rank_xendcg", "lambdarank")
OBJECTIVES = (*RANKING, "regression")
DEFAULT_OBJECTIVE = "lambdarank"

GRADES = 10
"""The best grade of the ranking labels (lambdarank's default gain of grade g is 2^g - 1)."""


class CostModel(abc.ABC):
    """Scores feature rows (lower: predicted faster) and learns from measurements."""

    @abc.abstractmethod
    def update(self, features: np.ndarray, times: np.ndarray) -> None:
        """Adds measurements (rows of features, seconds; inf for failures) and retrains."""

    @abc.abstractmethod
    def predict(self, features: np.ndarray) -> np.ndarray:
        """One score per row."""


class RandomModel(CostModel):
    """The trivial model: random scores (the search then measures at random)."""

    def __init__(self, seed: int = 0):
        self.rng = np.random.default_rng(seed)

    def update(self, features: np.ndarray, times: np.ndarray) -> None:
        pass

    def predict(self, features: np.ndarray) -> np.ndarray:
        return self.rng.random(len(features))


def lightgbm_available() -> bool:
    try:
        import lightgbm  # noqa: F401
    except ImportError:
        return False
    return True


def log_time_grades(times: Sequence[float]) -> np.ndarray:
    """Relevance grades of one group, linear in log time: the fastest finite time gets
    :data:`GRADES`, the slowest finite one 0; failures (inf) get 0. (Grades linear in rank
    order lost how much slower a candidate is: see the module docstring's recall figures.)"""
    times = np.asarray(times, dtype=np.float64)
    grades = np.zeros(len(times), dtype=np.int32)
    finite = np.isfinite(times) & (times > 0)
    if finite.any():
        logs = np.log(times[finite])
        span = max(float(logs.max() - logs.min()), 1e-12)
        grades[finite] = np.round(GRADES * (1.0 - (logs - logs.min()) / span)).astype(np.int32)
    return grades


class LightGBMModel(CostModel):
    """LightGBM ranking (or regression) on candidate features (see the module docstring).
    Each :meth:`update` call's rows join group ``group`` (default: one group, one kernel)."""

    def __init__(self, seed: int = 0, min_samples: int = 8, rounds: int = 120,
                 objective: str = DEFAULT_OBJECTIVE, leaves: int = 4):
        if not lightgbm_available():
            raise TilefuseError("LightGBMModel needs lightgbm: pip install 'tilefuse[tune]'")
        if objective not in OBJECTIVES:
            raise TilefuseError(f"objective must be one of {', '.join(OBJECTIVES)}, "
                                f"got {objective!r}")
        self.seed, self.min_samples, self.rounds = seed, min_samples, rounds
        self.objective, self.leaves = objective, leaves
        self.rng = np.random.default_rng(seed)
        self.groups: dict[object, tuple[list[np.ndarray], list[float]]] = {}
        self.booster: object | None = None

    def update(self, features: np.ndarray, times: np.ndarray, group: object = 0) -> None:
        rows, seen = self.groups.setdefault(group, ([], []))
        rows.extend(np.atleast_2d(features))
        seen.extend(float(t) for t in times)
        good = sum(math.isfinite(t) and t > 0 for _, ts in self.groups.values() for t in ts)
        if good >= self.min_samples:
            self.booster = self._train()

    def _train(self) -> object:
        """A booster trained on every measurement so far."""
        import lightgbm

        x = np.vstack([r for rows, _ in self.groups.values() for r in rows])
        params = {"learning_rate": 0.1, "num_leaves": self.leaves, "min_data_in_leaf": 2,
                  "min_data_in_bin": 1,
                  "verbose": -1, "seed": self.seed, "deterministic": True, "num_threads": 1}
        if self.objective in RANKING:
            labels = np.concatenate([log_time_grades(ts) for _, ts in self.groups.values()])
            sizes = [len(ts) for _, ts in self.groups.values()]
            params |= {"objective": self.objective}
            if self.objective == "lambdarank":
                params |= {"lambdarank_truncation_level": max(sizes) + 1}
            data = lightgbm.Dataset(x, labels, group=sizes, params={"verbose": -1})
        else:
            good = [t for _, ts in self.groups.values() for t in ts if math.isfinite(t) and t > 0]
            worst = math.log(max(good) * 4.0)
            labels = np.array([math.log(t) if math.isfinite(t) and t > 0 else worst
                               for _, ts in self.groups.values() for t in ts])
            params |= {"objective": "regression"}
            data = lightgbm.Dataset(x, labels, params={"verbose": -1})
        return lightgbm.train(params, data, num_boost_round=self.rounds)

    def predict(self, features: np.ndarray) -> np.ndarray:
        if self.booster is None:
            return self.rng.random(len(features))
        scores = np.asarray(self.booster.predict(np.atleast_2d(features)))  # type: ignore[attr-defined]
        return -scores if self.objective in RANKING else scores


def best_model(seed: int = 0) -> CostModel:
    """LightGBM when it is installed, else random."""
    return LightGBMModel(seed) if lightgbm_available() else RandomModel(seed)


def top_k_recall(scores: Sequence[float], times: Sequence[float], k: int) -> float:
    """The share of the k fastest measured candidates among the k best-scored ones."""
    k = max(1, min(k, len(times)))
    predicted = set(np.argsort(np.asarray(scores), kind="stable")[:k].tolist())
    actual = set(np.argsort(np.asarray(times), kind="stable")[:k].tolist())
    return len(predicted & actual) / k


def cross_validated_recall(features: np.ndarray, times: Sequence[float], k: int = 5,
                           folds: int = 5, seed: int = 0,
                           make: type[CostModel] | None = None) -> list[float]:
    """Top-``k`` recall of a model trained on all folds but one and asked to rank the held-out
    one, per fold (measurements shuffled with ``seed``; failures stay in the training folds
    only, since a failed candidate has no place in a measured top k)."""
    times = np.asarray(times, dtype=np.float64)
    rng = np.random.default_rng(seed)
    order = rng.permutation(len(times))
    recalls = []
    for fold in range(folds):
        test = [i for j, i in enumerate(order) if j % folds == fold and np.isfinite(times[i])]
        train = [i for j, i in enumerate(order) if j % folds != fold]
        if len(test) < k:
            continue
        model = (make or LightGBMModel)(seed=seed)
        model.update(features[train], times[train])
        recalls.append(top_k_recall(model.predict(features[test]), times[test], k))
    return recalls


__all__ = ["DEFAULT_OBJECTIVE", "FEATURE_NAMES", "GRADES", "CostModel", "LightGBMModel",
           "RandomModel", "best_model", "cross_validated_recall", "lightgbm_available",
           "log_time_grades", "loop_features", "top_k_recall"]
