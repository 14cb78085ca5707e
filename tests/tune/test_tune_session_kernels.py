"""A measuring session compiles each kernel's loops once: a candidate measured again (the
tuner's confirmation passes, the in-process runner) runs the code compiled the first time, and
that code still computes the reference on new inputs."""

from __future__ import annotations

import numpy as np
import pytest
from helpers_tune import elementwise_graph, matmul_candidates

import tilefuse.runtime.kernel_cache as kernel_cache
from tilefuse.testing import assert_close
from tilefuse.tune.runner import InProcessRunner, MeasureOptions, Session, measure_schedule
from tilefuse.tune.space import space_for
from tilefuse.tune.task import SessionKernels, tasks_from_graph

FAST = MeasureOptions(warmup=0, repeats=1, min_repeat_seconds=0.0, flush_bytes=0)


@pytest.fixture
def llvm_compiles(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The names of the kernels LLVM compiles from here on (every build of a tuning task
    compiles through the kernel cache)."""
    names: list[str] = []
    real = kernel_cache.compile_kernel

    def counting(fn, **kwargs):
        names.append(fn.name)
        return real(fn, **kwargs)

    monkeypatch.setattr(kernel_cache, "compile_kernel", counting)
    return names


def test_a_candidate_measured_again_is_not_compiled_again(llvm_compiles):
    task, schedules = matmul_candidates(3)
    session = Session.start(task, FAST)
    first = [measure_schedule(session, s, FAST) for s in schedules]
    assert all(r.ok for r in first), [r.message for r in first]
    compiled = len(llvm_compiles)
    assert compiled >= len(schedules) and session.kernels.compiled == compiled
    again = [measure_schedule(session, s, FAST) for s in reversed(schedules)]
    assert all(r.ok for r in again), [r.message for r in again]
    assert len(llvm_compiles) == compiled   # nothing compiled the second time
    assert session.kernels.reused == compiled


def test_reused_code_computes_the_reference_on_new_inputs(llvm_compiles):
    [task] = tasks_from_graph(elementwise_graph((5, 37)))
    schedule = space_for(task.group).default()
    kernels = SessionKernels()
    task.build(schedule, task.random_inputs(np.random.default_rng(0)), kernels=kernels).run()
    compiled = len(llvm_compiles)
    for seed in (1, 2):
        inputs = task.random_inputs(np.random.default_rng(seed))
        built = task.build(schedule, inputs, kernels=kernels)
        built.run()
        for got, want in zip(built.outputs, task.reference(inputs), strict=True):
            assert_close(got, want)
    assert len(llvm_compiles) == compiled and kernels.reused == 2 * compiled


def test_only_the_last_kernels_are_kept(llvm_compiles):
    task, (a, b) = matmul_candidates(2)
    inputs = task.random_inputs(np.random.default_rng(0))
    kernels = SessionKernels(limit=1)
    for schedule in (a, b, a):
        task.build(schedule, inputs, kernels=kernels).run()
    per_build = kernels.compiled // 3
    assert per_build >= 1 and kernels.compiled == 3 * per_build == len(llvm_compiles)
    assert len(kernels._kept) == 1


def test_the_in_process_runner_reuses_its_sessions_kernels(llvm_compiles):
    task, schedules = matmul_candidates(2)
    runner = InProcessRunner(FAST)
    assert all(r.ok for r in runner.measure(task, schedules))
    compiled = len(llvm_compiles)
    assert all(r.ok for r in runner.measure(task, schedules[::-1]))
    assert len(llvm_compiles) == compiled
