"""One-row products by constant matrices on the cuda target (:mod:`tilefuse.runtime.gpu_gemv`):
row reductions over the transposed weight (a warp per output, 16-byte loads) with
``TILEFUSE_GPU_GEMV=1``, matching the reference in each float dtype (and so are products of
few rows against a transposed operand); by default they stay cuBLAS products."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

from tilefuse.dtypes import DType
from tilefuse.graph.builder import GraphBuilder
from tilefuse.graph.interpreter import interpret
from tilefuse.graph.ir import Graph, Literal
from tilefuse.runtime.gpu import GemmStep, GpuKernel
from tilefuse.runtime.gpu_cross import assemble, cross_compile
from tilefuse.runtime.gpu_simulate import simulate
from tilefuse.testing import assert_close, random_array


def linear_layers(dtype: DType, k: int = 320, n: int = 96) -> Graph:
    """x [1, 1, K] through two linear layers (the second weight [1, N, K]-shaped, as a folded
    3-D weight is) with a SiLU between and a residual-style add after."""
    rng = np.random.default_rng(7)
    b = GraphBuilder("linear_layers")
    x = b.input(((1, 1, k), dtype), "x")
    w1 = b.add1("constant", [], {"value": Literal(random_array(rng, (k, n), dtype))})
    w2 = b.add1("constant", [], {"value": Literal(random_array(rng, (1, n, k), dtype))})
    h = b.add1("matmul", [b.add1("reshape", [x], {"shape": (1, k)}), w1])
    h = b.add1("mul", [h, b.add1("sigmoid", [h])])
    y = b.add1("matmul", [b.add1("reshape", [h], {"shape": (1, 1, n)}), w2])
    return b.build([b.add1("add", [y, x])])


@pytest.mark.parametrize("dtype", [DType.bf16, DType.f16, DType.f32])
def test_one_row_products_are_row_reductions(dtype: DType, monkeypatch) -> None:
    monkeypatch.setenv("TILEFUSE_GPU_GEMV", "1")
    graph = linear_layers(dtype, k=512, n=768)
    built = cross_compile(graph, optimize=False)
    assert not built.host_steps
    assert not [s for s in built.program.steps if isinstance(s, GemmStep)]
    rows = [s for s in built.program.steps if isinstance(s, GpuKernel)
            and s.group.kind.value == "row_reduction"]
    assert len(rows) == 2 and all(s.simt_width == 32 for s in rows)
    for seed in (0, 1):
        x = random_array(np.random.default_rng(seed), (1, 1, 512), dtype)
        (got,), (want,) = simulate(built.program, [x]), interpret(graph, x)
        assert_close(np.asarray(got), np.asarray(want), reduction=True)
    for ptx in built.ptx().values():
        if dtype is not DType.f32:
            assert "ld.global.nc.v4" in ptx or "ld.global.v4" in ptx   # 16-byte weight loads
        if shutil.which("ptxas"):
            assemble(ptx)


def test_by_default_products_stay_with_cublas(monkeypatch) -> None:
    monkeypatch.delenv("TILEFUSE_GPU_GEMV", raising=False)
    built = cross_compile(linear_layers(DType.bf16), optimize=False)
    assert len([s for s in built.program.steps if isinstance(s, GemmStep)]) == 2


def test_few_rows_against_a_transpose_match_when_switched_on(monkeypatch) -> None:
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from test_gpu_grouped import decode_attention

    monkeypatch.setenv("TILEFUSE_GPU_GEMV", "1")
    graph = decode_attention(DType.bf16)
    built = cross_compile(graph)
    assert len([s for s in built.program.steps if isinstance(s, GemmStep)]) == 1  # p · v
    rng = np.random.default_rng(3)
    arrays = [random_array(rng, tuple(v.shape), DType.bf16) for v in graph.inputs]
    (got,), (want,) = simulate(built.program, arrays), interpret(graph, *arrays)
    assert_close(np.asarray(got), np.asarray(want), reduction=True)
