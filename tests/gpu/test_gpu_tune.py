"""Tuning GPU kernels (:mod:`tilefuse.tune.gpu`): candidates are GpuTarget knobs stored as
schedules under the GPU target; a build picks the database's fastest without a GPU; on a GPU,
every candidate is checked against the references and timed with CUDA events."""

from __future__ import annotations

import math

import numpy as np
import pytest
from test_gpu_program import layer_norm_graph, w7_graph

from tilefuse.codegen.llvm_nvptx import SM90
from tilefuse.graph.interpreter import interpret
from tilefuse.kernel.schedule import Schedule
from tilefuse.runtime.cuda_driver import cuda_available
from tilefuse.runtime.gpu import GpuKernel, build_gpu_program
from tilefuse.testing import assert_close, random_array
from tilefuse.tune.database import MemoryDatabase, SQLiteDatabase
from tilefuse.tune.gpu import (
    gpu_candidates,
    gpu_key,
    gpu_target_string,
    knob_target,
    tune_gpu,
)


def test_candidates_are_knob_schedules_that_round_trip() -> None:
    program = build_gpu_program(w7_graph((4096,)))
    (step,) = program.steps
    candidates = gpu_candidates(step.group)
    assert len(candidates) == 12 and len(set(candidates)) == 12
    for schedule in candidates:
        assert Schedule.from_json(schedule.to_json()) == schedule
    target = knob_target(SM90, candidates[0])
    assert (target.block_threads, target.elementwise_unroll) == (128, 1)
    assert gpu_target_string(SM90).startswith("cuda/nvptx64-nvidia-cuda/sm_90")


def test_build_uses_the_fastest_measured_schedule() -> None:
    graph = w7_graph((4096,))
    (default,) = build_gpu_program(graph).steps
    assert isinstance(default, GpuKernel) and default.simt_width == 32
    db = MemoryDatabase()
    key = gpu_key(default.group, build_gpu_program(graph).constants)
    by_knobs = {dict(s.unroll)["elementwise_unroll"]: s for s in gpu_candidates(default.group)
                if dict(s.unroll)["block_threads"] == 512}
    db.record(key, by_knobs[1], 1e-5)   # one unrolled run: per-thread form
    db.record(key, by_knobs[8], 2e-5)
    db.record(key, by_knobs[4], math.inf)
    (tuned,) = build_gpu_program(graph, database=db).steps
    assert isinstance(tuned, GpuKernel)
    assert (tuned.simt_width, tuned.block) == (1, 512)


@pytest.mark.skipif(not cuda_available(), reason="no CUDA device here")
@pytest.mark.parametrize("make", [lambda: w7_graph((3 * 4096 + 37,)),
                                  lambda: layer_norm_graph(37, 1024)])
def test_tune_gpu_measures_stores_and_rebuilds(make, tmp_path) -> None:
    graph = make()
    db = SQLiteDatabase(tmp_path / "tune.sqlite")
    (result,) = tune_gpu(graph, db, repeats=2, rounds=2)
    assert result.candidates == len(gpu_candidates(build_gpu_program(graph).steps[0].group))
    assert math.isfinite(result.ms) and result.ms > 0
    (key,) = db.keys()
    assert key.target == gpu_target_string(SM90)
    assert len(db.records(key)) == result.candidates
    from tilefuse.runtime.gpu import CudaExecutable

    executable = CudaExecutable(build_gpu_program(graph, database=db))
    rng = np.random.default_rng(11)
    arrays = [random_array(rng, tuple(v.shape), v.dtype) for v in graph.inputs]
    for got, want in zip(executable(*arrays), interpret(graph, *arrays)):
        assert_close(got, want, reduction=True)
