"""Reverse-mode gradients on graph IR (tilefuse.graph.autodiff and each op's vjp rule): every
rule against central finite differences in f64 on fresh random inputs, with broadcasting,
odd sizes, 1-D matmul operands, reductions with axes; and the named errors."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

from tilefuse.dtypes import DType
from tilefuse.errors import GradientError
from tilefuse.graph.autodiff import gradients
from tilefuse.graph.builder import GraphBuilder
from tilefuse.graph.interpreter import interpret
from tilefuse.graph.ir import Value
from tilefuse.testing import FD_STEP, FINITE_DIFFERENCE, tolerance

rng = np.random.default_rng(7)
Body = Callable[[GraphBuilder, list[Value]], Value]


def _graph(shapes: list[tuple[int, ...]], body: Body, with_grads: bool):
    b = GraphBuilder("f")
    xs = [b.input(((*s,), DType.f64)) for s in shapes]
    y = body(b, xs)
    y = b.add1("sum", [y]) if y.type.rank else y
    outs = [y, *gradients(b, b.nodes, y, xs)] if with_grads else [y]
    return b.build(outs)


def _numeric_gradient(graph, arrays: list[np.ndarray], i: int) -> np.ndarray:
    grad = np.zeros_like(arrays[i])
    for index in np.ndindex(arrays[i].shape):
        plus = [a.copy() for a in arrays]
        minus = [a.copy() for a in arrays]
        plus[i][index] += FD_STEP
        minus[i][index] -= FD_STEP
        grad[index] = (interpret(graph, *plus)[0] - interpret(graph, *minus)[0]) / (2 * FD_STEP)
    return grad


def check_gradient(shapes: list[tuple[int, ...]], body: Body, low: float = -2.0,
                   high: float = 2.0) -> None:
    arrays = [rng.uniform(low, high, size=s) for s in shapes]
    forward = _graph(shapes, body, with_grads=False)
    got = interpret(_graph(shapes, body, with_grads=True), *arrays)
    for i in range(len(shapes)):
        assert got[1 + i].shape == arrays[i].shape
        np.testing.assert_allclose(got[1 + i], _numeric_gradient(forward, arrays, i),
                                   rtol=FINITE_DIFFERENCE.rtol, atol=FINITE_DIFFERENCE.atol,
                                   err_msg=f"gradient of input {i}")


def _op(name: str, **attrs) -> Body:
    return lambda b, xs: b.add1(name, xs, attrs)


UNARY = ["neg", "exp", "tanh", "sigmoid", "erf", "silu", "sin", "cos", "abs", "relu"]


@pytest.mark.parametrize("name", UNARY)
@pytest.mark.parametrize("shape", [(1,), (7,), (3, 5)])
def test_unary(name: str, shape: tuple[int, ...]) -> None:
    check_gradient([shape], _op(name))


@pytest.mark.parametrize("name", ["log", "sqrt"])
def test_unary_positive(name: str) -> None:
    check_gradient([(4, 3)], _op(name), low=0.5, high=3.0)


@pytest.mark.parametrize("name", ["add", "sub", "mul", "div", "maximum", "minimum"])
@pytest.mark.parametrize("shapes", [[(7,), (7,)], [(3, 1), (1, 4)], [(2, 3, 4), (4,)],
                                    [(5,), ()]])
def test_binary_broadcasting(name: str, shapes: list[tuple[int, ...]]) -> None:
    check_gradient(shapes, _op(name))


def test_pow() -> None:
    check_gradient([(3, 4), (4,)], _op("pow"), low=0.5, high=2.0)


@pytest.mark.parametrize("shapes", [[(3, 4), (4, 5)], [(2, 3, 4), (4, 5)], [(4,), (4, 5)],
                                    [(3, 4), (4,)], [(2, 1, 3, 4), (5, 4, 2)], [(1, 7), (7, 1)]])
def test_matmul(shapes: list[tuple[int, ...]]) -> None:
    check_gradient(shapes, _op("matmul"))


@pytest.mark.parametrize(("name", "axes", "keepdims"), [
    ("sum", None, False), ("sum", (1,), False), ("sum", (0, 2), True), ("mean", (-1,), False),
    ("mean", None, True)])
def test_reductions(name: str, axes, keepdims: bool) -> None:
    check_gradient([(2, 3, 5)], _op(name, axes=axes, keepdims=keepdims))


@pytest.mark.parametrize("body", [
    _op("reshape", shape=(5, 6)), _op("transpose", perm=(2, 0, 1)),
    _op("broadcast_to", shape=(4, 2, 3, 5)), _op("expand_dims", axes=(0, 3)),
    _op("squeeze", axes=None)])
def test_movement(body: Body) -> None:
    check_gradient([(2, 3, 5)], body)


def test_squeeze_of_ones() -> None:
    check_gradient([(1, 4, 1)], _op("squeeze", axes=(0, 2)))


def test_where_clip_cast() -> None:
    def body(b: GraphBuilder, xs: list[Value]) -> Value:
        x, y = xs
        cond = b.add1("gt", [x, y])
        picked = b.add1("where", [cond, x, y])
        clipped = b.add1("clip", [picked], {"min": -0.5, "max": 1.0})
        wide = b.add1("cast", [b.add1("cast", [clipped], {"dtype": DType.f32})],
                      {"dtype": DType.f64})
        return b.add1("mul", [wide, x])

    # the analytic gradient: where picks, clip passes inside its bounds, casts pass through
    arrays = [rng.uniform(-2, 2, size=(6, 5)), rng.uniform(-2, 2, size=(5,))]
    graph = _graph([(6, 5), (5,)], body, with_grads=True)
    x, y = arrays
    picked = np.where(x > y, x, y)
    inside = (picked >= -0.5) & (picked <= 1.0)
    clipped = np.clip(picked, -0.5, 1.0).astype(np.float32).astype(np.float64)
    gx = clipped + x * np.where(inside & (x > y), 1.0, 0.0)
    gy = (x * np.where(inside & ~(x > y), 1.0, 0.0)).sum(axis=0)
    _, got_x, got_y = interpret(graph, *arrays)
    f32 = tolerance(DType.f32)  # the gradient flows through the f32 value in f32
    np.testing.assert_allclose(got_x, gx, rtol=f32.rtol, atol=f32.atol)
    np.testing.assert_allclose(got_y, gy, rtol=f32.rtol, atol=f32.atol)


def test_shared_value_accumulates_and_chain() -> None:
    def body(b: GraphBuilder, xs: list[Value]) -> Value:
        x, w = xs
        h = b.add1("tanh", [b.add1("matmul", [x, w])])
        return b.add1("mul", [h, b.add1("exp", [h])])

    check_gradient([(3, 4), (4, 2)], body)


def test_unrelated_input_gets_zeros() -> None:
    b = GraphBuilder("f")
    x = b.input(((3,), DType.f32))
    z = b.input(((2,), DType.f32))
    y = b.add1("sum", [b.add1("exp", [x])])
    gx, gz = gradients(b, b.nodes, y, [x, z])
    xv, zv = rng.uniform(-1, 1, 3).astype(np.float32), rng.uniform(-1, 1, 2).astype(np.float32)
    got = interpret(b.build([gx, gz]), xv, zv)
    np.testing.assert_allclose(got[0], np.exp(xv), rtol=1e-6)
    assert got[1].dtype == np.float32 and not got[1].any()


def test_op_without_rule_is_named() -> None:
    b = GraphBuilder("f")
    x = b.input(((1, 4, 4, 2), DType.f32))
    y = b.add1("sum", [b.add1("window_patches", [x], {"kernel": (2, 2)})])
    with pytest.raises(GradientError, match="window_patches: has no gradient rule"):
        gradients(b, b.nodes, y, [x])


def test_integer_values_are_refused() -> None:
    b = GraphBuilder("f")
    x = b.input(((3,), DType.i32))
    y = b.add1("sum", [x])
    with pytest.raises(GradientError, match="floating-point"):
        gradients(b, b.nodes, y, [x])
