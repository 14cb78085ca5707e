"""Reductions over any set of axes (REDUCTION kernels, kernel/lower_reduce.py): sum, mean, max,
min, prod, var, argmax and argmin over leading, middle, several and all axes, keepdims and
negative axes, fused with an elementwise prologue (broadcasting operands), in f32, f64, f16,
i32, i64 and bool, on odd shapes; NaN propagation and NumPy's first-NaN rule for arg-reductions;
ties take the first index. Each kernel runs in the loop interpreter and compiled against the
reference interpreter, and the whole graph runs natively with no host step."""

from __future__ import annotations

import numpy as np
import pytest
from test_lower_elementwise import check_graph, plan_of, random_inputs

from tilefuse.dtypes import DType
from tilefuse.graph.builder import GraphBuilder
from tilefuse.graph.interpreter import interpret
from tilefuse.graph.ir import Graph
from tilefuse.kernel.fusion import KernelKind
from tilefuse.runtime.native import NativeExecutable
from tilefuse.testing import assert_close

F32, F64, F16, I32, I64, BOOL = (DType.f32, DType.f64, DType.f16, DType.i32, DType.i64,
                                 DType.bool)


def reduce_graph(op: str, shape: tuple[int, ...], axes: object, dtype: DType = F32, *,
                 keepdims: bool = False, prologue: bool = True, bias: bool = False) -> Graph:
    """``op`` of ``abs(x) * x`` (``x`` as is for bools and arg-reductions of ints), with a
    broadcast ``+ b`` over the last axis when ``bias``."""
    b = GraphBuilder(op)
    x = b.input((shape, dtype), "x")
    v = x
    if prologue and dtype is not BOOL:
        v = b.add1("mul", [b.add1("abs", [x]), x])
    if bias:
        v = b.add1("add", [v, b.input(((shape[-1],), dtype), "b")])
    if op in ("argmax", "argmin"):
        y = b.add1(op, [v], {"axis": axes, "keepdims": keepdims})
    else:
        y = b.add1(op, [v], {"axes": axes, "keepdims": keepdims})
    return b.build([y])


def run_native(graph: Graph, arrays: list[np.ndarray]) -> NativeExecutable:
    exe = NativeExecutable(graph)
    assert exe.fallbacks == []
    for got, want in zip(exe(*arrays), interpret(graph, *arrays)):
        assert_close(got, want, reduction=True)
    return exe


CASES = [  # shape, axes
    ((13, 6), [0]),
    ((13, 6), [-2]),
    ((5, 7, 9), [0, 2]),
    ((5, 7, 9), [1]),
    ((5, 7, 9), [0, 1]),
    ((4, 3, 5, 33), [0, 2]),
    ((3, 70), [0]),
    ((1, 1), [0]),
    ((2, 3, 4), [0, 1, 2]),
]


@pytest.mark.parametrize("op", ["sum", "mean", "max", "min", "prod", "var"])
@pytest.mark.parametrize("shape,axes", CASES)
def test_reductions_over_any_axes(op, shape, axes):
    graph = reduce_graph(op, shape, axes, bias=len(shape) > 1)
    arrays = random_inputs(graph, seed=len(shape) * 7 + len(axes),
                           low=0.5 if op == "prod" else -2.0, high=1.3 if op == "prod" else 2.0)
    plan = plan_of(graph)
    assert KernelKind.REDUCTION in {g.kind for g in plan.groups} or axes == [0, 1, 2]
    check_graph(graph, arrays, reduction=True)
    run_native(graph, arrays)


@pytest.mark.parametrize("op", ["sum", "mean", "max", "var", "argmax", "argmin"])
def test_rank_zero_input(op):
    """A reduction of a 0-d value (torch's sum of a scalar tensor): its one element."""
    b = GraphBuilder(op)
    x = b.input(((), F32), "x")
    attrs = {"axis": None, "keepdims": False} if op.startswith("arg") else \
        {"axes": None, "keepdims": False}
    graph = b.build([b.add1(op, [b.add1("exp", [x])], attrs)])
    run_native(graph, [np.array(0.7, np.float32)])


@pytest.mark.parametrize("dtype", [F64, F16, I32, I64, BOOL])
@pytest.mark.parametrize("op", ["sum", "max", "min", "mean"])
def test_reduction_dtypes_and_keepdims(op, dtype):
    graph = reduce_graph(op, (9, 5, 19), [0, -1], dtype, keepdims=True)
    arrays = random_inputs(graph, seed=3)
    check_graph(graph, arrays, reduction=True)
    run_native(graph, arrays)


@pytest.mark.parametrize("dtype", [F32, F64, F16, I32, I64, BOOL])
@pytest.mark.parametrize("op", ["argmax", "argmin"])
@pytest.mark.parametrize("shape,axis", [((13, 6), 0), ((13, 6), -1), ((5, 7, 9), 1),
                                        ((5, 7, 9), None), ((3, 70), 0), ((40, 37), 1),
                                        ((3, 1003), -1)])
def test_arg_reductions(op, dtype, shape, axis):
    for keepdims in (False, True):
        graph = reduce_graph(op, shape, axis, dtype, keepdims=keepdims, prologue=False)
        arrays = random_inputs(graph, seed=11)  # small ints and bools: many ties
        check_graph(graph, arrays)
        run_native(graph, arrays)


@pytest.mark.parametrize("axis", [0, -1])
@pytest.mark.parametrize("op", ["argmax", "argmin", "max", "sum"])
def test_nan_propagates_and_arg_reductions_take_the_first_nan(op, axis):
    graph = reduce_graph(op, (6, 37), axis if op.startswith("arg") else [axis], prologue=False)
    x = np.random.default_rng(5).uniform(-1, 1, (6, 37)).astype(np.float32)
    x[3, 2] = x[1, 2] = np.nan
    x[4, 30] = np.nan
    x[:, 5] = np.inf if op == "argmax" else -np.inf
    x[2:4, 6] = x[:, 6].max() + 1  # a tie: the first wins
    x[5, 20:30] = 7.0  # a tie along a row, across the interleaved chains
    check_graph(graph, [x], reduction=True)
    run_native(graph, [x])


def test_large_column_sum_and_threads():
    graph = reduce_graph("sum", (301, 1037), [0], prologue=True, bias=True)
    arrays = random_inputs(graph, seed=1)
    check_graph(graph, arrays, reduction=True, threads=2)
    run_native(graph, arrays)
    graph = reduce_graph("max", (3, 257, 130), [0, 2], prologue=True)
    check_graph(graph, random_inputs(graph, seed=2), reduction=True, threads=2)


def test_held_out_example_runs_with_zero_host_steps():
    """The issue's example: a column sum of a fused where/clip chain plus a full max."""
    import tilefuse

    def reference(x, y):
        return np.clip(np.where(x > y, x - y, np.tanh(y) * 0.5), -0.75, 0.75).sum(axis=0) \
            + np.abs(x).max()

    rng = np.random.default_rng()
    for shape in [(13, 6), (100, 37), (1, 9)]:
        for dtype in (np.float32, np.float64):
            x, y = (rng.standard_normal(shape).astype(dtype) for _ in range(2))
            f = tilefuse.jit(reference)  # one per shape: no dynamic dims
            got = f(x, y)
            np.testing.assert_allclose(got, reference(x, y), rtol=1e-5, atol=1e-5)
            exe = f.lower(x, y).executable
            assert exe is not None and exe.fallbacks == []


@pytest.mark.parametrize("n", [64, 77, 256, 1000])
@pytest.mark.parametrize("op", ["argmax", "argmin"])
def test_arg_reductions_keep_exact_indices_per_lane(op, n):
    """Each lane keeps the index of its own first best (``bcast(i) + iota``); the answer is the
    least index among lanes holding the row's best: ties within a lane, across lanes and
    across the unrolled chains, the best in the scalar tail, and NaN (the first one) all give
    NumPy's index."""
    import tilefuse

    rng = np.random.default_rng(n)
    x = rng.integers(-3, 4, (12, n)).astype(np.float32)  # many ties
    x[1] = 5.0                                            # all equal: index 0
    x[2, n - 1] = 9.0                                     # best in the last element
    x[3, [n // 3, n // 2, n - 2]] = np.nan                # the first NaN wins
    x[4, [17, 33, 49]] = -9.0 if op == "argmin" else 9.0  # ties across lanes and chains
    x[5, -5:] = 20.0 if op == "argmax" else -20.0         # the tail holds the best
    # infinities send a row to the exact rule (x - x is NaN) with no NaN in it
    x[9, [n // 2, n - 3]] = np.inf if op == "argmax" else -np.inf
    x[10] = -np.inf if op == "argmax" else np.inf         # all the worst: index 0
    x[11, [2, n - 1]] = np.nan, np.inf                    # a NaN before an infinity
    fn = tilefuse.jit(lambda v: getattr(np, op)(v, axis=-1))
    np.testing.assert_array_equal(fn(x), getattr(np, op)(x, axis=-1))
