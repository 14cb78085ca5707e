"""Budget where the time is: shares, the split, skipped kernels, carry-over; progress lines."""

from __future__ import annotations

import io
import logging
import math

from helpers_tune import elementwise_graph

from tilefuse.tune.budget import BudgetPlan, KernelShare, shares_of, split_budget
from tilefuse.tune.progress import Progress
from tilefuse.tune.task import tasks_from_graph
from tilefuse.tune.tuner import Budget, Round

TASK = tasks_from_graph(elementwise_graph((8, 8)))[0]


def _kernels(*seconds: float) -> list[KernelShare]:
    names = [f"k{i}" for i in range(len(seconds))]
    return shares_of(names, [TASK] * len(seconds), seconds)


def test_shares_rank_hottest_first_and_count_a_failure_as_hot():
    kernels = _kernels(1.0, 3.0, math.inf)
    assert [k.name for k in kernels][2] == "k0"
    assert math.isclose(sum(k.share for k in kernels), 1.0)
    assert {k.name: k.share for k in kernels}["k1"] == 3.0 / 7.0


def test_the_larger_kernel_gets_more_trials_and_a_negligible_one_none():
    allocations = split_budget(_kernels(7.0, 2.7, 0.3), trials=40, seconds=100.0, min_trials=3)
    by_name = {a.kernel.name: a for a in allocations}
    assert by_name["k0"].trials > by_name["k1"].trials >= 3
    assert by_name["k2"].trials == 0 and "cover 90%" in by_name["k2"].reason
    assert sum(a.trials for a in allocations) == 40
    assert math.isclose(sum(a.seconds for a in allocations), 100.0)
    assert [a.kernel.name for a in allocations] == ["k0", "k1", "k2"]  # hottest first


def test_time_spread_over_many_kernels_is_still_tuned():
    """~50 kernels of 1-5% each (a ResNet-50): the hottest ones covering 90% get trials, the
    cold tail and anything under 1% do not."""
    times = [5.0 - 0.08 * i for i in range(50)] + [0.02]
    allocations = split_budget(_kernels(*times), trials=300, seconds=100.0, min_trials=3)
    tuned = [a for a in allocations if a.trials]
    assert 30 <= len(tuned) < 50
    assert sum(a.trials for a in allocations) == 300
    assert "under 1%" in allocations[-1].reason


def test_a_tiny_budget_skips_the_coldest_kernels_first():
    allocations = split_budget(_kernels(5.0, 3.0, 2.0), trials=7, seconds=10.0, min_trials=3)
    assert [a.trials for a in allocations] == [4, 3, 0]
    assert "too few" in allocations[2].reason


def test_unused_budget_flows_to_the_next_kernels():
    plan = BudgetPlan.make(_kernels(6.0, 3.0, 1.0), Budget(trials=30, seconds=60.0,
                                                           per_round=2))
    planned = [a.trials for a in plan.tuned()]
    assert planned[0] > planned[1] > planned[2] > 0 and sum(planned) == 30
    first = plan.budget_at(0, 30, 60.0)
    assert first.trials == planned[0] and first.per_round == 2
    # the first kernel stopped after 3 trials: the rest splits what is left in proportion
    second = plan.budget_at(1, 27, 50.0)
    assert second.trials == round(27 * planned[1] / (planned[1] + planned[2]))
    last = plan.budget_at(2, 27 - second.trials, 20.0)
    assert last.trials == 27 - second.trials and last.seconds == 20.0


def _round(i: int) -> Round:
    return Round(TASK, i, 1 + 4 * i, 9, 1e-3 / (i + 1), 1e-3, 1e-4)


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_prints_plain_lines_and_logs_each_round(caplog):
    stream = io.StringIO()
    progress = Progress(show=True, stream=stream)
    progress.start("k0 elementwise add")
    with caplog.at_level(logging.INFO, logger="tilefuse.tune"):
        progress(_round(0))
        progress(_round(1))
    lines = stream.getvalue().splitlines()
    assert len(lines) == 2 and "round 1, 5/9 trials" in lines[1] and "20% of bound" in lines[1]
    assert sum("k0 elementwise add: round" in r.getMessage() for r in caplog.records) == 2


def test_progress_rewrites_one_line_on_a_terminal_and_is_silent_elsewhere():
    terminal = _Terminal()
    progress = Progress(stream=terminal)
    progress.start("k0")
    progress(_round(0))
    progress(_round(1))
    progress.finish()
    text = terminal.getvalue()
    assert text.count("\r") == 2 and text.endswith("\n") and text.count("\n") == 1
    quiet = io.StringIO()
    Progress(stream=quiet)(_round(0))
    assert quiet.getvalue() == ""


def _repeated_blocks_graph():
    """Two linear layers of one shape (different weights) and one of another shape."""
    import numpy as np

    from tilefuse.dtypes import DType
    from tilefuse.graph.builder import GraphBuilder

    rng = np.random.default_rng(3)
    b = GraphBuilder("blocks")
    x = b.input(((7, 16), DType.f32), "x")
    for n in (16, 16, 24):
        w = b.add1("constant", [], {"value": rng.standard_normal((16, n), np.float32)})
        x = b.add1("tanh", [b.add1("matmul", [x, w])])
    return b.build([x])


def test_kernels_of_one_computation_are_measured_and_tuned_once():
    from tilefuse.tune.budget import profile_kernels, unique_tasks
    from tilefuse.tune.task import named_tasks

    named = named_tasks(_repeated_blocks_graph())
    assert len(named) == 3
    unique = unique_tasks(named)
    assert [(name, count) for name, _, count in unique] == [(named[0][0], 2), (named[2][0], 1)]

    class Clock:
        """A runner whose every measurement takes 1 ms (and counts the calls)."""
        calls = 0

        def measure(self, task, schedules):
            from tilefuse.tune.runner import MeasureResult
            Clock.calls += 1
            return [MeasureResult(s, 1e-3, "ok") for s in schedules]

    kernels = profile_kernels(named, Clock(), passes=1)
    assert Clock.calls == 2
    by_count = {k.count: k for k in kernels}
    assert math.isclose(by_count[2].share, 2 / 3) and math.isclose(by_count[1].share, 1 / 3)
    assert by_count[2].label.startswith(f"{named[0][0]} x2 contraction")
