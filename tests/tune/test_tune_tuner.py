"""End to end: a short tuning run of a tiny matmul returns a schedule that computes the
reference."""

from __future__ import annotations

import itertools
import math
import statistics

import numpy as np
import pytest
from helpers_tune import matmul_candidates, matmul_graph, small_probe

from tilefuse.graph.interpreter import interpret
from tilefuse.kernel.fusion import form_kernels
from tilefuse.kernel.schedule import iteration_axes, validate
from tilefuse.testing import assert_close, random_array
from tilefuse.tune.cost_model import best_model
from tilefuse.tune.database import SQLiteDatabase
from tilefuse.tune.roofline import MeasuredRoofline, Peaks, Roofline
from tilefuse.tune.runner import LocalRunner, MeasureOptions
from tilefuse.tune.search import EvolutionarySearch
from tilefuse.tune.task import TuneTask, tasks_from_graph
from tilefuse.tune.tuner import Budget, target_string, tune_group, tune_task

OPTIONS = MeasureOptions(warmup=1, repeats=3, min_repeat_seconds=1e-4, timeout=30.0)


def test_short_tuning_run_matches_the_reference(tmp_path):
    graph = matmul_graph(48, 40, 72)
    [task] = tasks_from_graph(graph)
    db = SQLiteDatabase(tmp_path / "tune.db")
    roofline = MeasuredRoofline(db, target_string(), lambda: Peaks(1e15, 1e15),  # unreachable
                                probe=small_probe)
    with LocalRunner(OPTIONS) as runner:
        result = tune_task(task, Budget(trials=8, seconds=60, per_round=4), db, runner,
                           best_model(), EvolutionarySearch(pool=24), roofline=roofline)
    assert len(result.history.seconds) == 8
    assert math.isfinite(result.seconds) and result.seconds <= result.default_seconds
    assert db.best(result.key)[0] == result.schedule == db.verdict(result.key)[0]
    # the best schedule, built again on fresh inputs, computes the whole graph's answer
    rng = np.random.default_rng(11)
    x = random_array(rng, tuple(graph.inputs[0].shape), graph.inputs[0].dtype)
    [value] = task.random_inputs(rng)  # the one non-constant input
    built = task.build(result.schedule, {value: x})
    built.run()
    [expected] = interpret(graph, x)
    assert_close(built.outputs[0], expected, reduction=True)


class _TinyBound(Roofline):
    """A bound of 1 ps: with a huge margin every kernel is within it, none beats it."""

    def bound_seconds(self, flops: float, nbytes: float) -> float:
        return 1e-12


def test_roofline_stops_a_kernel_at_its_bound(tmp_path):
    [task] = tasks_from_graph(matmul_graph(16, 16, 16))
    db = SQLiteDatabase(tmp_path / "tune.db")
    with LocalRunner(OPTIONS) as runner:
        result = tune_task(task, Budget(trials=50, seconds=60, margin=1e12), db, runner,
                           best_model(), EvolutionarySearch(), roofline=_TinyBound())
    assert result.stopped == "roofline" and len(result.history.seconds) == 1


def test_a_kernel_faster_than_the_stored_peaks_keeps_searching(tmp_path):
    """Peaks measured low (1 FLOP/s, 1 B/s: a busy machine) are raised to the kernel's own
    speed, and that bound, the kernel's own time, does not stop its search."""
    [task] = tasks_from_graph(matmul_graph(16, 16, 16))
    db = SQLiteDatabase(tmp_path / "tune.db")
    roofline = MeasuredRoofline(db, "t", lambda: Peaks(1.0, 1.0), probe=small_probe)
    again = MeasuredRoofline(db, "t", lambda: Peaks(2.0, 2.0))
    assert again.peaks == roofline.peaks == Peaks(1.0, 1.0)  # stored once, not re-measured
    with LocalRunner(OPTIONS) as runner:
        result = tune_task(task, Budget(trials=6, seconds=60, per_round=2, margin=0.1), db,
                           runner, best_model(), EvolutionarySearch(), roofline=roofline)
    assert result.stopped == "budget" and len(result.history.seconds) == 6
    assert roofline.peaks.flops > 1.0  # raised to what the kernel reached


def test_tune_group_on_a_bare_group(tmp_path):
    graph = matmul_graph(20, 12, 36, constant_w=False, gelu=False)
    [group] = form_kernels(graph).groups
    db = SQLiteDatabase(tmp_path / "tune.db")
    with LocalRunner(OPTIONS) as runner:
        schedule, seconds = tune_group(group, Budget(trials=3, seconds=60, per_round=2), db,
                                       runner, best_model(), EvolutionarySearch(pool=12))
    assert math.isfinite(seconds)
    validate(schedule, iteration_axes(group))
    assert TuneTask.of_group(group).fingerprint() == TuneTask.of_group(group).fingerprint()


def _scripted_tuning(task, candidates, plan, per_round, roofline=None):
    """``tune_task`` over exactly ``candidates`` (the first the default) with a runner that
    gives each schedule its ``plan`` times in order, into a fresh in-memory database."""
    from tilefuse.tune.database import MemoryDatabase
    from tilefuse.tune.runner import MeasureResult
    from tilefuse.tune.search import RandomSearch
    from tilefuse.tune.space import FixedSpace

    class Scripted:
        def measure(self, task, schedules):
            return [MeasureResult(s, plan[s.to_json()].pop(0), "ok") for s in schedules]

    db = MemoryDatabase()
    budget = Budget(trials=len(candidates), seconds=60, per_round=per_round)
    result = tune_task(task, budget, db, Scripted(), best_model(), RandomSearch(),
                       space=FixedSpace(candidates), roofline=roofline)
    return result, db


class _MovingHost(Roofline):
    """Peaks that follow the host's speed, probe by probe: ``peak × speeds[i]``."""

    def __init__(self, peak: float, speeds: list[float]):
        self.peak, self.speeds, self.probes = peak, list(speeds), 0

    def bound_seconds(self, flops: float, nbytes: float) -> float:
        return 1e-12   # the stored bound: far away, the search never stops at it

    def measure_now(self) -> Peaks:
        self.probes += 1
        return Peaks(self.peak * self.speeds.pop(0), 1e30)


def test_the_share_of_the_bound_is_paired_with_the_peaks_measured_beside_it():
    """The host's speed moves between the confirmation's passes, and the kernels' times and
    the peaks measured around each pass move with it: the verdict's share of its bound comes
    out as the same 40 % in every pass, where a bound from one stored peak would not."""
    task, (default, steady, _) = matmul_candidates(3)
    speeds = [1.0, 1.2, 0.8, 1.0, 1.1]                  # at the 5 probes around 4 passes
    pace = [(a + b) / 2 for a, b in itertools.pairwise(speeds)]  # a pass: its brackets' mean
    flops = task.work()[0]
    peak = flops / (0.4 * 1.5)                          # steady at 1.5 s is 40 % of its bound
    plan = {default.to_json(): [2.0] + [2.0 / m for m in pace],
            steady.to_json(): [1.5] + [1.5 / m for m in pace]}
    roofline = _MovingHost(peak, speeds)
    result, _ = _scripted_tuning(task, [default, steady], plan, per_round=1, roofline=roofline)
    assert roofline.probes == 5 and result.schedule == steady and result.bound_paired
    assert result.seconds == pytest.approx(statistics.median(2.0 / m for m in pace) * 0.75)
    assert result.bound_seconds / result.seconds == pytest.approx(0.4)
    # a default without contenders is measured again too, for its share of the bound
    alone = _MovingHost(peak, speeds)
    plan = {default.to_json(): [2.0] + [1.5 / m for m in pace]}
    result, _ = _scripted_tuning(task, [default], plan, per_round=1, roofline=alone)
    assert alone.probes == 5 and result.schedule == default and result.bound_paired
    assert result.bound_seconds / result.seconds == pytest.approx(0.4)
    # without probes (a roofline that measures nothing) the stored bound is reported
    plan = {default.to_json(): [2.0] * 5, steady.to_json(): [1.5] * 5}
    result, _ = _scripted_tuning(task, [default, steady], plan, per_round=1,
                                 roofline=_TinyBound())
    assert not result.bound_paired and result.bound_seconds == 1e-12


def test_a_lucky_measurement_does_not_pick_the_winner():
    """After the search, the default and the fastest schedules are measured again: one that
    was fast once and slow twice loses to one that is steadily fast, and the result is what
    the database gives builds, with the default's median beside it."""
    task, (default, lucky, steady) = matmul_candidates(3)
    plan = {default.to_json(): [2.0, 2.2, 1.9, 2.1, 2.0],
            lucky.to_json(): [1.0, 3.0, 3.1, 2.9, 3.2],
            steady.to_json(): [1.5, 1.6, 1.4, 1.5, 1.45]}
    result, db = _scripted_tuning(task, [default, lucky, steady], plan, per_round=2)
    assert len(result.history.seconds) == 3                   # the search's own trials
    assert all(not left for left in plan.values())            # each measured 4 times more
    assert db.best(result.key) == (steady, 1.5) and result.schedule == steady
    # the default's median over the 4 passes, and that over steady's paired gain
    assert result.default_seconds == 2.05
    gain = statistics.median([2.2 / 1.6, 1.9 / 1.4, 2.1 / 1.5, 2.0 / 1.45])
    assert db.verdict(result.key) == (steady, gain)
    assert result.seconds == pytest.approx(2.05 / gain)


def test_a_gain_within_the_noise_keeps_the_default():
    """A contender whose median is lower but which is, pass by pass, only ~1 % faster than the
    default measured beside it (the host slowed down during the default's own search row) is
    not the verdict: builds keep the default."""
    from tilefuse.tune.tuner import MIN_GAIN

    task, (default, close, _) = matmul_candidates(3)
    # search rows, then 4 passes in which the host's speed moves 1.0 -> 1.4 -> 0.9 -> 1.2
    plan = {default.to_json(): [3.0, 2.00, 2.80, 1.80, 2.40],
            close.to_json(): [1.9, 1.98, 2.77, 1.79, 2.37]}
    result, db = _scripted_tuning(task, [default, close], plan, per_round=1)
    assert statistics.median([1.9, 1.98, 2.77, 1.79, 2.37]) < statistics.median(
        [3.0, 2.00, 2.80, 1.80, 2.40])                          # the least median would switch
    assert result.schedule == default and db.verdict(result.key) == (default, 1.0)
    assert db.best(result.key) == (default, 2.4)                # its median over all 5 rows
    assert result.seconds == result.default_seconds == 2.2     # over the 4 passes
    assert MIN_GAIN > 1.01
