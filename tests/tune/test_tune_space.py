"""Search spaces: every schedule they hand out validates, on groups of random shapes."""

from __future__ import annotations

import numpy as np
import pytest
from helpers_tune import attention_graph, elementwise_graph, matmul_graph, rows_graph

from tilefuse.codegen.target import host_target
from tilefuse.kernel.fusion import KernelKind
from tilefuse.kernel.schedule import CpuTarget, validate
from tilefuse.tune.runner import InProcessRunner, MeasureOptions
from tilefuse.tune.space import MAX_ACCUMULATORS, FixedSpace, space_for
from tilefuse.tune.task import tasks_from_graph


def random_graph(seed: int):
    rng = np.random.default_rng(seed)
    kind = seed % 4
    if kind == 3:
        sq, sk, d, dv = (int(v) for v in rng.integers(1, 150, 4))
        return attention_graph((int(rng.integers(1, 4)),), sq, sk, d, dv, mask=bool(seed % 2))
    if kind == 0:
        m, k, n = (int(v) for v in rng.integers(1, 300, 3))
        return matmul_graph(m, k, n, constant_w=bool(seed % 2), gelu=bool(seed % 4 < 2))
    if kind == 1:
        shape = tuple(int(v) for v in rng.integers(1, 70, int(rng.integers(1, 4))))
        return elementwise_graph(shape)
    rows, width = (int(v) for v in rng.integers(1, 200, 2))
    return rows_graph((rows, width), "softmax" if seed % 2 else "layer_norm")


@pytest.mark.parametrize("seed", range(12))
@pytest.mark.parametrize("bits", [512, 256])
def test_every_produced_schedule_validates(seed, bits):
    rng = np.random.default_rng(seed)
    target = CpuTarget(bits, cores=4)
    for task in tasks_from_graph(random_graph(seed)):
        space = space_for(task.group, target)
        extents = task.extents()
        made = [space.default()]
        for _ in range(25):
            a, b = space.sample(rng), space.sample(rng)
            made += [a, space.mutate(a, rng), space.crossover(a, b, rng)]
        made += space.neighbours(made[1])
        for schedule in made:
            validate(schedule, extents)
            if schedule.kind is KernelKind.CONTRACTION:
                mr, nr = schedule.micro_tile
                assert nr % schedule.vector_width == 0
                assert mr * nr // schedule.vector_width <= MAX_ACCUMULATORS or \
                    schedule == space.default()


def test_contraction_knobs_come_from_the_group():
    [task] = tasks_from_graph(matmul_graph(512, 768, 3072, constant_w=False))
    space = space_for(task.group, CpuTarget(512, cores=2))
    assert space.knobs["width"] == (16, 8)
    assert set(space.knobs["parallel"]) == {"n", "m", ""}
    assert space.knobs["unroll_k"] == (1, 2, 4, 8)
    assert space.knobs["pack_b"] == (True, False)
    assert max(space.knobs["mr"]) == 16
    # the point of the default maps back to the default
    assert space.make(space.point(space.default())) == space.default()


def test_invalid_points_are_rejected_before_building():
    [task] = tasks_from_graph(matmul_graph(64, 32, 48))
    space = space_for(task.group, CpuTarget(512, cores=2))
    point = space.point(space.default())
    assert space.make({**point, "mr": 16, "nr_vectors": 3, "width": 16}) is None  # 48 accs


@pytest.mark.parametrize("graph", [matmul_graph(37, 29, 53), elementwise_graph((5, 333)),
                                   rows_graph((33, 70)), attention_graph((2, 3), 45, 83, 24, 40)],
                         ids=["matmul", "elementwise", "rows", "attention"])
def test_sampled_schedules_compute_the_reference(graph):
    """Random members of each space, built and run in process, match the reference."""
    rng = np.random.default_rng(7)
    [task] = tasks_from_graph(graph)
    space = space_for(task.group, host_target())
    runner = InProcessRunner(MeasureOptions(warmup=0, repeats=1, min_repeat_seconds=0))
    results = runner.measure(task, [space.sample(rng) for _ in range(4)])
    assert all(r.ok for r in results), [(r.status, r.message) for r in results]


def test_fixed_space():
    [task] = tasks_from_graph(elementwise_graph((8, 8)))
    default = space_for(task.group).default()
    space = FixedSpace([default])
    assert space.sample(np.random.default_rng(0)) == default
    assert space.neighbours(default) == []
    assert space.mutate(default, np.random.default_rng(0)) == default


def test_attention_knobs_come_from_the_group_and_respect_the_register_budget():
    [task] = tasks_from_graph(attention_graph((12,), 128, 128, 64, 64))
    space = space_for(task.group, CpuTarget(512, cores=2))
    assert task.extents() == {"b": 12, "q": 128, "k": 128, "v": 64}
    assert space.knobs["block_q"] == (8, 16, 32, 64, 128)
    assert space.knobs["key_vectors"] == (1, 2, 3, 4, 6, 8)
    assert space.knobs["pv_vectors"] == (1, 2, 3, 4)
    assert space.make(space.point(space.default())) == space.default()
    point = space.point(space.default())
    assert space.make({**point, "rows": 4, "key_vectors": 8}) is None   # 32 accumulators
    assert space.make({**point, "rows": 3, "key_vectors": 8}) is not None
