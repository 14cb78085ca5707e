"""The local runner: crashing, hanging and wrong candidates score inf; the tuner goes on."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from helpers_tune import matmul_candidates, matmul_graph

from tilefuse.testing import assert_close
from tilefuse.tune.cost_model import RandomModel
from tilefuse.tune.database import MemoryDatabase
from tilefuse.tune.runner import (
    CRASH,
    INVALID,
    OK,
    TIMEOUT,
    WRONG,
    LocalRunner,
    MeasureOptions,
    PlantedFault,
)
from tilefuse.tune.search import RandomSearch
from tilefuse.tune.space import FixedSpace
from tilefuse.tune.tuner import Budget, tune_task

FAST = MeasureOptions(warmup=0, repeats=2, min_repeat_seconds=0.0, timeout=20.0)


def test_planted_failures_score_inf_and_workers_are_replaced():
    """One build worker: the dead or hung worker is replaced for the next candidate."""
    task, (good, aborts, hangs, good2) = matmul_candidates(4)
    faults = {"abort": aborts, "hang": hangs}
    results = {}
    for kind, victim in faults.items():
        fault = PlantedFault(kind, frozenset({victim.to_json()}), hang_seconds=60)
        options = MeasureOptions(warmup=0, repeats=2, min_repeat_seconds=0.0, timeout=4.0)
        with LocalRunner(options, fault, build_workers=1) as runner:
            out = runner.measure(task, [good, victim, good2])
            results[kind] = (out, runner.workers_started)
    for kind, status in (("abort", CRASH), ("hang", TIMEOUT)):
        (first, bad, after), started = results[kind]
        assert first.status == OK and math.isfinite(first.seconds)
        assert bad.status == status and bad.seconds == math.inf, bad
        assert after.status == OK and math.isfinite(after.seconds)  # on a fresh worker
        assert started == 2


def test_corrupt_output_is_wrong():
    task, (good, victim) = matmul_candidates(2)
    fault = PlantedFault("corrupt", frozenset({victim.to_json()}))
    with LocalRunner(FAST, fault, build_workers=2) as runner:
        ok, bad = runner.measure(task, [good, victim])
        assert ok.status == OK
        assert bad.status == WRONG and bad.seconds == math.inf
        again = runner.measure(task, [victim, good])
        assert [r.status for r in again] == [WRONG, OK]
        assert runner.workers_started == 2  # a wrong answer does not cost the worker


def test_builds_run_at_once_and_no_timing_overlaps_a_build():
    task, found = matmul_candidates(5)
    with LocalRunner(FAST, build_workers=2) as runner:
        results = runner.measure(task, found)
        spans = runner.spans
        assert runner.workers_started == 2
    assert [r.schedule for r in results] == found
    assert all(r.status == OK and math.isfinite(r.seconds) for r in results)
    builds = [s for s in spans if s.phase == "build"]
    timings = [s for s in spans if s.phase == "time"]
    assert sorted(s.index for s in builds) == list(range(5))
    # FAST has 2 repeats: a round in the order given, then one in reverse
    assert [s.index for s in timings] == [0, 1, 2, 3, 4, 4, 3, 2, 1, 0]
    assert all(len(r.times) == 2 for r in results)
    first, second = sorted(builds, key=lambda s: s.start)[:2]
    assert second.start < first.end  # two builds were under way at once
    assert max(s.end for s in builds) <= min(s.start for s in timings)
    assert all(a.end <= b.start for a, b in itertools.pairwise(timings))


@pytest.mark.parametrize("kind,status", [("abort", CRASH), ("hang", TIMEOUT)])
def test_a_failure_while_building_in_parallel_costs_only_its_candidate(kind, status):
    """Each worker holds a checked build when the victim kills or hangs one of them: the
    lost build is built again and timed on a fresh worker."""
    task, (good, good2, victim, good3) = matmul_candidates(4)
    fault = PlantedFault(kind, frozenset({victim.to_json()}), hang_seconds=60)
    options = MeasureOptions(warmup=0, repeats=2, min_repeat_seconds=0.0, timeout=4.0)
    with LocalRunner(options, fault, build_workers=2) as runner:
        out = runner.measure(task, [good, good2, victim, good3])
        started = runner.workers_started
    assert [r.status for r in out] == [OK, OK, status, OK]
    assert all(math.isfinite(r.seconds) for r in out if r.status == OK)
    assert started == 3


def test_invalid_schedule_is_rejected_before_building():
    task, (good,) = matmul_candidates(1)
    import dataclasses

    bad = dataclasses.replace(good, micro_tile=(good.micro_tile[0], 7))  # NR not x width
    with LocalRunner(FAST) as runner:
        [result] = runner.measure(task, [bad])
        assert result.status == INVALID
        assert runner.workers_started == 0


def test_tuner_goes_on_past_failures():
    task, found = matmul_candidates(5)
    aborts = found[1]
    fault_abort = PlantedFault("abort", frozenset({aborts.to_json()}))
    db = MemoryDatabase()
    with LocalRunner(FAST, fault_abort) as runner:
        result = tune_task(task, Budget(trials=5, seconds=120), db, runner, RandomModel(),
                           RandomSearch(), space=FixedSpace(found))
    seconds = dict(zip((s.to_json() for s in result.history.schedules),
                       result.history.seconds))
    assert len(seconds) == 5
    assert seconds[aborts.to_json()] == math.inf
    assert math.isfinite(result.seconds)
    assert result.schedule != aborts
    assert db.best(result.key)[0] == result.schedule


def test_every_timed_call_follows_a_cache_flush():
    """The runner flushes before every timed call (as a kernel in a model finds the caches),
    outside the timing, and not at all with flush_bytes=0."""
    from tilefuse.tune.runner import flush_scratch, time_runs

    events: list[str] = []
    options = MeasureOptions(warmup=1, repeats=3, min_repeat_seconds=0.0)
    times = time_runs(lambda: events.append("run"), options, lambda: events.append("flush"))
    assert len(times) == 3
    timed = events[2:]          # the warm-up call and the call that sizes a timing: no flush
    assert events[:2] == ["run", "run"] and timed == ["flush", "run"] * 3
    assert flush_scratch(MeasureOptions(flush_bytes=0)) is None
    assert flush_scratch(MeasureOptions(flush_bytes=1 << 20)).nbytes == 1 << 20
    events.clear()
    time_runs(lambda: events.append("run"), options, None)
    assert events == ["run"] * 5


def test_a_warm_build_is_timed_without_warm_up_or_sizing_calls():
    """Given the calls per timing an earlier timing found, every call is a flushed, timed one;
    the sizing rule caps flushed timings at FLUSHED_CALLS and keeps an unflushed one long
    enough to time."""
    from tilefuse.tune.runner import FLUSHED_CALLS, calls_per_timing, time_runs

    events: list[str] = []
    options = MeasureOptions(warmup=2, repeats=3, min_repeat_seconds=1e-3)
    times = time_runs(lambda: events.append("run"), options, lambda: events.append("flush"),
                      inner=2)
    assert len(times) == 3 and events == ["flush", "run"] * 6
    assert calls_per_timing(1e-6, options, flushed=True) == FLUSHED_CALLS
    assert calls_per_timing(5e-6, options, flushed=False) == 200
    assert calls_per_timing(5e-3, options, flushed=False) == 1


def test_before_each_call_writes_the_inputs_again_after_the_flush():
    """Before a timed call the scratch is written and then the kernel's inputs, with the
    session's values (a model's producer just wrote them), whatever the buffers held."""
    from tilefuse.codegen.target import host_target
    from tilefuse.kernel.schedule import default_schedule
    from tilefuse.tune.runner import Session, before_each_call
    from tilefuse.tune.task import tasks_from_graph

    [task] = tasks_from_graph(matmul_graph(7, 13, 9, constant_w=False))
    session = Session.start(task, MeasureOptions(flush_bytes=1 << 20))
    built = task.build(default_schedule(task.group, host_target()), session.inputs)
    assert len(built.arrays) == 2
    for array in built.arrays:
        array[...] = 0.0
    session.scratch[...] = 0.0
    before_each_call(session, built)()
    for array, value in zip(built.arrays, task.graph.inputs):
        np.testing.assert_array_equal(array, session.inputs[value])
    assert (session.scratch == 1.0).all()
    built.run()
    for got, want in zip(built.outputs, session.reference):
        assert_close(got, want, reduction=True)
    assert before_each_call(Session.start(task, MeasureOptions(flush_bytes=0)), built) is None


def _default_task(m: int, k: int, n: int):
    from tilefuse.tune.space import space_for
    from tilefuse.tune.task import tasks_from_graph

    [task] = tasks_from_graph(matmul_graph(m, k, n))
    return task, space_for(task.group).default()


def test_workers_switch_tasks_instead_of_restarting():
    """A new task goes to the running workers (a start costs seconds): each kernel is still
    checked against its own reference, so a corrupt output on the second task is WRONG."""
    first, first_default = _default_task(24, 16, 40)
    second, second_default = _default_task(7, 9, 13)
    _, (_, other) = matmul_candidates(2)
    fault = PlantedFault("corrupt", frozenset({second_default.to_json()}))
    with LocalRunner(FAST, fault, build_workers=2) as runner:
        a = runner.measure(first, [first_default, other])
        b = runner.measure(second, [second_default])
        c = runner.measure(first, [other, first_default])
        assert runner.workers_started == 2
    assert [r.status for r in a + c] == [OK] * 4
    assert [r.status for r in b] == [WRONG]


def test_a_dead_worker_is_replaced_when_the_task_changes():
    first, first_default = _default_task(24, 16, 40)
    second, second_default = _default_task(7, 9, 13)
    fault = PlantedFault("abort", frozenset({first_default.to_json()}))
    options = MeasureOptions(warmup=0, repeats=2, min_repeat_seconds=0.0, timeout=10.0)
    with LocalRunner(options, fault, build_workers=1) as runner:
        [dead] = runner.measure(first, [first_default])
        [ok] = runner.measure(second, [second_default])
        assert runner.workers_started == 2
    assert dead.status == CRASH and ok.status == OK and math.isfinite(ok.seconds)


def test_a_schedule_measured_again_reuses_its_checked_build():
    """The confirmation measures the same schedules again: each goes back to the worker that
    built it, which times its checked build again; a new task starts afresh."""
    task, found = matmul_candidates(3)
    other, other_default = _default_task(7, 9, 13)
    with LocalRunner(FAST, build_workers=2) as runner:
        first = runner.measure(task, found)
        assert runner.builds_reused == 0
        again = runner.measure(task, found[::-1])
        assert runner.builds_reused == 3
        runner.measure(other, [other_default])
        runner.measure(task, found[:1])
        assert runner.builds_reused == 3   # the switch dropped the builds
    assert all(r.status == OK and len(r.times) == 2 for r in first + again)


def test_worker_builds_keep_only_the_recent_ones():
    from tilefuse.tune.runner import RECENT_BUILDS, KeptBuild, WorkerBuilds

    builds = WorkerBuilds()
    for j in range(RECENT_BUILDS + 2):
        builds.kept[str(j)] = KeptBuild(object(), inner=5)  # type: ignore[arg-type]
        builds.done(str(j))
    assert list(builds.recent) == [str(j) for j in range(2, RECENT_BUILDS + 2)]
    assert not builds.reuse("0") and builds.reuse("2")
    assert builds.kept["2"].inner is None and "2" not in builds.recent  # it warms up again


def test_each_worker_times_on_its_own_cores():
    """A worker's thread is pinned to the CPU of its slot and its pool's workers to the next
    ones (ThreadPool.pin): unpinned, a kernel timed between pipe messages shared a core with
    the pool's worker in one timing of three, at up to twice its time."""
    import os

    cpus = sorted(os.sched_getaffinity(0))
    task, found = matmul_candidates(2)
    with LocalRunner(FAST, build_workers=2) as runner:
        runner.measure(task, found)
        pids = [w.process.pid for w in runner._workers if w is not None]
        assert len(pids) == 2
        allowed = [os.sched_getaffinity(pid) for pid in pids]   # a pid: its main thread
    if len(cpus) >= 2:
        assert allowed == [{cpus[0]}, {cpus[1]}]
    else:
        assert allowed == [set(cpus), set(cpus)]
