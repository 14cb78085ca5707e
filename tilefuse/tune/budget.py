"""Budget where the time is: split a graph's tuning budget by each kernel's share of the time.

The rule (:func:`profile_kernels`, :func:`split_budget`, :class:`BudgetPlan`):

1. **Measure.** Every tunable kernel of the graph is measured with its default schedule (the
   schedule a build uses without tuning), through the same runner as the search, in
   ``passes`` interleaved passes (2) keeping each kernel's fastest median: one pass on a busy
   machine can catch a kernel in a stall of a few milliseconds and misplace the time.
2. **Share.** A kernel's share is its default time over the sum of all of them. A kernel whose
   default fails to measure (inf) counts as the largest finite time, so it is not skipped.
3. **Skip the negligible.** Ranked hottest first, the kernels after the first ones that
   together cover ``cover`` (90%) of the time keep their default schedule, and so does any
   kernel under ``min_share`` (1%): even infinitely fast schedules for all of them would save
   little. (A fixed 5% floor tuned nothing in a ResNet-50, whose time spreads over ~50
   kernels of 1–5% each.)
4. **Split.** The trials go to the other kernels in proportion to their shares (largest
   remainder rounding, so they add up to the budget), each getting at least ``min_trials``
   (the default plus one round). When the budget cannot give every kernel its minimum, the
   coldest kernels are skipped too (the reason says so). Seconds are split like the trials.
5. **Once per computation.** Kernels with the same fingerprint (the same computation on the
   same shapes and dtypes: a ResNet's repeated blocks, a transformer's layers) are one
   database key, so they are measured and tuned once, as the first of them, with the share of
   all of them (:func:`unique_tasks`; the report's ``×N`` says how many it stands for).
6. **Hot first, unused budget moves on.** Kernels are tuned hottest first. A kernel that stops
   early (at its roofline bound, or with its space exhausted) leaves trials and seconds unused;
   each kernel's budget at its turn is what is left times its planned part of what is left to
   plan (:meth:`BudgetPlan.budget_at`), so the unused part flows to the kernels after it in
   proportion. The time budget is a wall-clock deadline for the whole run, measuring included.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

from tilefuse.codegen.target import CpuTarget, host_target
from tilefuse.tune.runner import Runner
from tilefuse.tune.space import space_for
from tilefuse.tune.task import TuneTask, node_ops
from tilefuse.tune.tuner import Budget

MIN_SHARE = 0.01
"""Kernels under this share of the graph's default time are not tuned."""
COVER = 0.9
"""The hottest kernels covering this share of the time are tuned; the cold rest is not."""


@dataclass(frozen=True)
class KernelShare:
    """One tunable kernel: its name in the plan, task, default seconds and share of the time."""

    name: str
    task: TuneTask
    default_seconds: float
    share: float
    count: int = 1
    """How many kernels of the graph this one stands for (same fingerprint)."""

    @property
    def label(self) -> str:
        times = f" x{self.count}" if self.count > 1 else ""
        return f"{self.name}{times} {self.task.kind.value} {'+'.join(node_ops(self.task.group))}"


@dataclass(frozen=True)
class Allocation:
    """A kernel's planned trials and seconds (0 trials: keeps its default, ``reason`` says
    why)."""

    kernel: KernelShare
    trials: int
    seconds: float
    reason: str = ""

    @property
    def tuned(self) -> bool:
        return self.trials > 0


def unique_tasks(named: Sequence[tuple[str, TuneTask]]) -> list[tuple[str, TuneTask, int]]:
    """The first kernel of each fingerprint, in plan order, with how many kernels share it."""
    first: dict[str, int] = {}
    out: list[tuple[str, TuneTask, int]] = []
    for name, task in named:
        key = task.fingerprint()
        if key in first:
            n, t, count = out[first[key]]
            out[first[key]] = (n, t, count + 1)
        else:
            first[key] = len(out)
            out.append((name, task, 1))
    return out


def profile_kernels(named: Sequence[tuple[str, TuneTask]], runner: Runner,
                    target: CpuTarget | None = None, passes: int = 2) -> list[KernelShare]:
    """Measures the default schedule of each distinct task (fastest of ``passes``); the
    kernels hottest first, with shares (a task's time counts once per kernel it stands for)."""
    target = target or host_target()
    unique = unique_tasks(named)
    seconds = [math.inf] * len(unique)
    for _ in range(max(1, passes)):
        for i, (_, task, _) in enumerate(unique):
            [result] = runner.measure(task, [space_for(task.group, target).default()])
            seconds[i] = min(seconds[i], result.seconds)
    return shares_of([name for name, _, _ in unique], [task for _, task, _ in unique], seconds,
                     [count for _, _, count in unique])


def shares_of(names: Sequence[str], tasks: Sequence[TuneTask], seconds: Sequence[float],
              counts: Sequence[int] | None = None) -> list[KernelShare]:
    """Kernels with their shares of the total, each kernel's time taken ``counts`` times (an
    inf time counts as the largest finite one, or 1 s when none is finite), hottest first."""
    counts = list(counts) if counts is not None else [1] * len(names)
    finite = [t for t in seconds if math.isfinite(t)]
    stand_in = max(finite, default=1.0)
    counted = [(t if math.isfinite(t) else stand_in) * c for t, c in zip(seconds, counts)]
    total = sum(counted) or 1.0
    kernels = [KernelShare(n, task, t, c / total, count)
               for n, task, t, c, count in zip(names, tasks, seconds, counted, counts)]
    return sorted(kernels, key=lambda k: -k.share)


def split_budget(kernels: Sequence[KernelShare], trials: int, seconds: float, *,
                 min_share: float = MIN_SHARE, min_trials: int = 2,
                 cover: float = COVER) -> list[Allocation]:
    """Trials and seconds per kernel by the rule in the module docstring, hottest first."""
    ranked = sorted(kernels, key=lambda k: -k.share)
    hot, covered, reasons = [], 0.0, {}
    for k in ranked:
        if k.share < min_share:
            reasons[k.name] = f"under {100 * min_share:.0f}% of the time"
        elif covered >= cover:
            reasons[k.name] = f"hotter kernels cover {100 * cover:.0f}% of the time"
        else:
            hot.append(k)
            covered += k.share
    while hot and len(hot) * min_trials > trials:
        cold = hot.pop()
        reasons[cold.name] = f"{trials} trials too few for every hotter kernel"
    counts = _largest_remainder([k.share for k in hot], trials - len(hot) * min_trials)
    planned = {k.name: min_trials + c for k, c in zip(hot, counts)}
    out = []
    for k in ranked:
        n = planned.get(k.name, 0)
        out.append(Allocation(k, n, seconds * n / max(trials, 1), reasons.get(k.name, "")))
    return out


def _largest_remainder(weights: Sequence[float], total: int) -> list[int]:
    """Non-negative integers proportional to ``weights`` that add up to ``total``."""
    if not weights or total <= 0:
        return [0] * len(weights)
    scale = total / (sum(weights) or 1.0)
    exact = [w * scale for w in weights]
    counts = [math.floor(e) for e in exact]
    order = sorted(range(len(weights)), key=lambda i: counts[i] - exact[i])
    for i in order[:total - sum(counts)]:
        counts[i] += 1
    return counts


@dataclass(frozen=True)
class BudgetPlan:
    """The allocations of one run and how much each kernel may spend at its turn."""

    allocations: list[Allocation]
    budget: Budget

    @staticmethod
    def make(kernels: Sequence[KernelShare], budget: Budget,
             min_share: float = MIN_SHARE) -> BudgetPlan:
        min_trials = min(budget.per_round + 1, max(budget.trials, 1))
        allocations = split_budget(kernels, budget.trials, budget.seconds, min_share=min_share,
                                   min_trials=min_trials)
        return BudgetPlan(allocations, budget)

    def tuned(self) -> list[Allocation]:
        return [a for a in self.allocations if a.tuned]

    def budget_at(self, index: int, trials_left: int, seconds_left: float) -> Budget:
        """The budget of the ``index``-th tuned kernel given what earlier ones left."""
        tuned = self.tuned()
        planned = tuned[index].trials
        rest = sum(a.trials for a in tuned[index:]) or 1
        if index == len(tuned) - 1:
            trials, seconds = trials_left, seconds_left
        else:
            trials = max(1, round(trials_left * planned / rest))
            seconds = seconds_left * planned / rest
        return replace(self.budget, trials=max(0, trials), seconds=max(0.0, seconds))


__all__ = ["COVER", "MIN_SHARE", "Allocation", "BudgetPlan", "KernelShare", "profile_kernels",
           "shares_of", "split_budget", "unique_tasks"]
