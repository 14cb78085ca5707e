"""Row reductions over long rows whose length is not a multiple of the warp (GPT-2's
50257-token vocabulary: the loss's log-sum-exp and its gradient) are a warp per row on the GPU
(coalesced, the last ``n % 32`` elements a uniform tail), not a thread per row. The
cross-compiled program, run on the host, matches NumPy; ptxas accepts it."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

from tilefuse.dtypes import DType
from tilefuse.graph.builder import GraphBuilder
from tilefuse.graph.types import TensorType
from tilefuse.runtime.gpu import GpuKernel
from tilefuse.runtime.gpu_cross import assemble, cross_compile
from tilefuse.runtime.gpu_simulate import simulate


@pytest.mark.parametrize(("dtype", "n"), [(DType.f32, 1001), (DType.f32, 300),
                                          (DType.bf16, 4099)])
def test_long_unaligned_rows_are_a_warp_per_row(dtype: DType, n: int) -> None:
    b = GraphBuilder("rows")
    x = b.input(TensorType((5, n), dtype), "x")
    outs = [b.add1("log_softmax", [x], {"axis": -1}),
            b.add1("sum", [x], {"axes": (1,), "keepdims": False}),
            b.add1("max", [x], {"axes": (1,), "keepdims": True})]
    built = cross_compile(b.build(outs))
    kernels = [s for s in built.program.steps if isinstance(s, GpuKernel)]
    assert kernels and all(k.simt_width == 32 for k in kernels), \
        [(k.group.name, k.simt_width) for k in kernels]
    a = (np.random.default_rng(n).normal(size=(5, n)) * 3).astype(dtype.np)
    w = a.astype(np.float64)
    top = w.max(1, keepdims=True)
    want = [w - top - np.log(np.exp(w - top).sum(1, keepdims=True)), w.sum(1), top]
    tol = 1e-5 if dtype is DType.f32 else 1e-2
    for got, ref in zip(simulate(built.program, [a]), want, strict=True):
        assert got.shape == ref.shape
        np.testing.assert_allclose(np.asarray(got, np.float64), ref,
                                   atol=tol * (np.abs(ref).max() + np.sqrt(n)))
    if shutil.which("ptxas"):
        for ptx in built.ptx().values():
            assemble(ptx)
