"""Search strategies: which candidates to measure next.

A strategy proposes ``count`` schedules not measured yet, given the space, the cost model and
the measurements so far (:class:`History`).

- :class:`RandomSearch` (trivial): fresh random samples.
- :class:`EvolutionarySearch`: a pool of children of the best measured schedules (mutations,
  crossovers of two of them) plus some fresh samples, scored by the cost model (on loop-IR
  features), of which the best-scored ``count`` are measured; a share ``explore`` of the slots
  goes to random members of the pool so the model also sees what it does not favour.
"""

from __future__ import annotations

import abc
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from tilefuse.kernel.schedule import Schedule
from tilefuse.tune.cost_model import CostModel
from tilefuse.tune.space import SearchSpace

Featurize = Callable[[Sequence[Schedule]], np.ndarray]


@dataclass
class History:
    """Measured schedules and their seconds (inf for failures), in order."""

    schedules: list[Schedule] = field(default_factory=list)
    seconds: list[float] = field(default_factory=list)

    def add(self, schedule: Schedule, seconds: float) -> None:
        self.schedules.append(schedule)
        self.seconds.append(seconds)

    def seen(self) -> set[str]:
        return {s.to_json() for s in self.schedules}

    def best(self, count: int) -> list[Schedule]:
        """The ``count`` fastest schedules that worked."""
        ranked = sorted((t, i) for i, t in enumerate(self.seconds) if math.isfinite(t))
        return [self.schedules[i] for _, i in ranked[:count]]


def _fresh(candidates: Sequence[Schedule], seen: set[str]) -> list[Schedule]:
    out: dict[str, Schedule] = {}
    for s in candidates:
        key = s.to_json()
        if key not in seen:
            out.setdefault(key, s)
    return list(out.values())


class SearchStrategy(abc.ABC):
    @abc.abstractmethod
    def propose(self, space: SearchSpace, model: CostModel, featurize: Featurize,
                history: History, count: int, rng: np.random.Generator) -> list[Schedule]:
        """Up to ``count`` schedules not in ``history``."""


class RandomSearch(SearchStrategy):
    """The trivial strategy: random samples of the space."""

    def propose(self, space: SearchSpace, model: CostModel, featurize: Featurize,
                history: History, count: int, rng: np.random.Generator) -> list[Schedule]:
        seen = history.seen()
        picked: list[Schedule] = []
        for _ in range(count * 20):
            if len(picked) >= count:
                break
            picked = _fresh([*picked, space.sample(rng)], seen)
        return picked


class EvolutionarySearch(SearchStrategy):
    """Mutation and crossover of the best, ranked by the cost model (module docstring)."""

    def __init__(self, parents: int = 6, pool: int = 48, random_share: float = 0.25,
                 explore: float = 0.25):
        self.parents, self.pool = parents, pool
        self.random_share, self.explore = random_share, explore

    def candidates(self, space: SearchSpace, history: History,
                   rng: np.random.Generator) -> list[Schedule]:
        parents = history.best(self.parents) or [space.default()]
        made: list[Schedule] = []
        for _ in range(self.pool):
            roll = rng.random()
            if roll < self.random_share:
                made.append(space.sample(rng))
            elif roll < 0.7 or len(parents) < 2:
                made.append(space.mutate(parents[int(rng.integers(len(parents)))], rng))
            else:
                i, j = rng.choice(len(parents), 2, replace=False)
                made.append(space.mutate(space.crossover(parents[i], parents[j], rng), rng)
                            if rng.random() < 0.3 else
                            space.crossover(parents[i], parents[j], rng))
        return _fresh(made, history.seen())

    def propose(self, space: SearchSpace, model: CostModel, featurize: Featurize,
                history: History, count: int, rng: np.random.Generator) -> list[Schedule]:
        pool = self.candidates(space, history, rng)
        if len(pool) <= count:
            return pool
        scores = model.predict(featurize(pool))
        order = [int(i) for i in np.argsort(scores, kind="stable")]
        explore = round(count * self.explore)
        picked = order[:count - explore]
        rest = [i for i in order if i not in picked]
        picked += [int(i) for i in rng.permutation(rest)[:explore]]
        return [pool[i] for i in picked]


__all__ = ["EvolutionarySearch", "History", "RandomSearch", "SearchStrategy"]
