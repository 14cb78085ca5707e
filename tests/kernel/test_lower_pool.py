"""Native pooling kernels (kernel/lower_pool.py) against the reference interpreter, through the
whole native build: max and average pooling run with no host fallback on odd shapes, with
padding, strides, dilation, ceil mode and both count_include_pad rules."""

from __future__ import annotations

import numpy as np
import pytest

from tilefuse.dtypes import DType
from tilefuse.graph.builder import GraphBuilder
from tilefuse.graph.interpreter import interpret
from tilefuse.graph.ir import Graph
from tilefuse.kernel.fusion import form_kernels
from tilefuse.kernel.lower_pool import MAX_WINDOW, lower_pool
from tilefuse.runtime.native import build_native
from tilefuse.testing import assert_close, random_array

GEOMETRIES = [  # shape, kernel, stride, padding, ceil_mode
    ((1, 1, 1, 1), (1, 1), (1, 1), (0, 0, 0, 0), False),
    ((2, 3, 7, 9), (3, 3), (2, 2), (1, 1, 1, 1), False),
    ((1, 64, 56, 56), (3, 3), (2, 2), (1, 1, 1, 1), False),
    ((2, 5, 7, 7), (7, 7), (1, 1), (0, 0, 0, 0), False),
    ((1, 2, 8, 11), (2, 3), (2, 2), (0, 1, 1, 0), True),
    ((3, 1, 13, 5), (5, 1), (1, 1), (2, 0, 2, 0), False),
]


def pool_graph(op: str, shape: tuple[int, ...], dtype: DType, attrs: dict) -> Graph:
    builder = GraphBuilder(op)
    x = builder.input((shape, dtype), "x")
    return builder.build([builder.add1(op, [x], attrs)])


def check(graph: Graph, seed: int = 0) -> None:
    exe = build_native(graph)
    assert exe.fallbacks == []
    rng = np.random.default_rng(seed)
    x = random_array(rng, tuple(graph.inputs[0].shape), graph.inputs[0].dtype)
    (expected,) = interpret(graph, x)
    (got,) = exe(x)
    assert got.shape == expected.shape and got.dtype == expected.dtype
    assert_close(got, expected, reduction=True)


@pytest.mark.parametrize("dtype", [DType.f32, DType.f64, DType.bf16, DType.i32])
@pytest.mark.parametrize("shape,kernel,stride,padding,ceil_mode", GEOMETRIES)
def test_max_pool(shape, kernel, stride, padding, ceil_mode, dtype):
    check(pool_graph("max_pool2d", shape, dtype, {"kernel": kernel, "stride": stride,
                                                  "padding": padding, "ceil_mode": ceil_mode}))


@pytest.mark.parametrize("include_pad", [False, True])
@pytest.mark.parametrize("dtype", [DType.f32, DType.f16])
@pytest.mark.parametrize("shape,kernel,stride,padding,ceil_mode", GEOMETRIES)
def test_avg_pool(shape, kernel, stride, padding, ceil_mode, dtype, include_pad):
    check(pool_graph("avg_pool2d", shape, dtype, {
        "kernel": kernel, "stride": stride, "padding": padding, "ceil_mode": ceil_mode,
        "count_include_pad": include_pad}))


def test_max_pool_dilated():
    check(pool_graph("max_pool2d", (2, 3, 11, 10), DType.f32, {
        "kernel": (3, 2), "stride": (2, 1), "padding": (2, 1, 2, 1), "dilation": (2, 2),
        "ceil_mode": True}))


def test_max_pool_propagates_nan():
    graph = pool_graph("max_pool2d", (1, 1, 4, 4), DType.f32,
                       {"kernel": (2, 2), "stride": (2, 2), "padding": (0, 0, 0, 0)})
    x = np.arange(16, dtype=np.float32).reshape(1, 1, 4, 4)
    x[0, 0, 1, 1] = np.nan
    (got,) = build_native(graph)(x)
    assert np.isnan(got[0, 0, 0, 0]) and not np.isnan(got[0, 0, 1:, 1:]).any()


@pytest.mark.parametrize("op,attrs", [
    ("max_pool2d", {"stride": (1, 1), "padding": (0, 0, 0, 0)}),
    ("max_pool2d", {"stride": (2, 3), "padding": (1, 2, 0, 3)}),
    ("avg_pool2d", {"stride": (1, 2), "padding": (2, 1, 2, 1), "count_include_pad": False}),
    ("avg_pool2d", {"stride": (1, 1), "padding": (1, 1, 1, 1), "count_include_pad": True})])
def test_a_window_over_the_unroll_limit_loops_over_its_taps(op, attrs):
    side = int(MAX_WINDOW ** 0.5) + 1
    graph = pool_graph(op, (2, 3, side + 4, side + 1), DType.f32,
                       {"kernel": (side, side), **attrs})
    (group,) = form_kernels(graph).groups
    assert "for a" in str(lower_pool(group))  # a loop over the taps, not unrolled
    check(graph)
