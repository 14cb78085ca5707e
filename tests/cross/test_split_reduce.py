"""Long column sums on the GPU are two kernels (``passes/split_reduce.py``): a thread per
output of a [s, outputs] partial sum, then the s partials folded. The cross-compiled program,
run on the host (kernels through the loop-IR interpreter), matches NumPy in f32 and bf16."""

from __future__ import annotations

import numpy as np
import pytest

from tilefuse.dtypes import DType
from tilefuse.graph.builder import GraphBuilder
from tilefuse.graph.types import TensorType
from tilefuse.passes.split_reduce import split_long_sums
from tilefuse.runtime.gpu import GpuKernel
from tilefuse.runtime.gpu_cross import cross_compile
from tilefuse.runtime.gpu_simulate import simulate

rng = np.random.default_rng(3)


def _graph(dtype: DType):
    b = GraphBuilder("sums")
    x = b.input(TensorType((4, 300, 24), dtype), "x")        # a bias gradient: rows folded
    y = b.input(TensorType((6, 5, 24, 20), dtype), "y")      # NCHW: (0, 2, 3) folded
    z = b.input(TensorType((3, 7), dtype), "z")              # short: stays one kernel
    outs = [b.add1("sum", [x], {"axes": (0, 1), "keepdims": False}),
            b.add1("sum", [y], {"axes": (0, 2, 3), "keepdims": True}),
            b.add1("sum", [z], {"axes": (0,), "keepdims": False})]
    return b.build(outs)


def test_only_long_narrow_sums_are_split() -> None:
    graph = _graph(DType.f32)
    split = split_long_sums(graph)
    sums = [n for n in split.nodes if n.op.name == "sum"]
    assert len(sums) == 5   # two split in two, the short one kept
    assert [tuple(v.shape) for v in split.outputs] == [tuple(v.shape) for v in graph.outputs]
    partial = sums[0].outputs[0]
    assert partial.shape[-1] == 24 and partial.shape[0] > 1   # s partial rows per column


@pytest.mark.parametrize("dtype", [DType.f32, DType.bf16])
def test_split_sums_match_numpy_on_the_gpu_program(dtype: DType) -> None:
    graph = _graph(dtype)
    built = cross_compile(graph)
    assert not built.host_steps
    assert sum(isinstance(s, GpuKernel) for s in built.program.steps) >= 5
    arrays = [rng.normal(size=tuple(v.shape)).astype(np.float32) for v in graph.inputs]
    if dtype is DType.bf16:
        arrays = [a.astype(dtype.np) for a in arrays]
    got = simulate(built.program, arrays)
    wide = [a.astype(np.float64) for a in arrays]
    want = [wide[0].sum((0, 1)), wide[1].sum((0, 2, 3), keepdims=True), wide[2].sum(0)]
    tol = 1e-4 if dtype is DType.f32 else 1e-2
    for g, w in zip(got, want, strict=True):
        assert g.shape == w.shape and g.dtype == dtype.np
        scale = np.abs(w).max() + np.sqrt(np.prod(w.shape))
        np.testing.assert_allclose(np.asarray(g, np.float64), w, atol=tol * scale)
