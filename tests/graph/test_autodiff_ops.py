"""Reverse-mode rules of the ops beyond arithmetic (tilefuse/ops/vjp.py and the rules next to
their ops): each against central finite differences in f64 on fresh random inputs, plus the
composites differentiated through their decompositions and the named refusals."""

from __future__ import annotations

import numpy as np
import pytest
from test_autodiff import Body, _op, check_gradient

from tilefuse.dtypes import DType
from tilefuse.errors import GradientError
from tilefuse.graph.autodiff import gradients
from tilefuse.graph.builder import GraphBuilder
from tilefuse.graph.interpreter import interpret
from tilefuse.graph.ir import Literal, Value

rng = np.random.default_rng(11)


@pytest.mark.parametrize(("name", "low", "high"), [
    ("log1p", -0.5, 2.0), ("expm1", -2.0, 2.0), ("rsqrt", 0.5, 3.0), ("reciprocal", 0.5, 3.0),
    ("softplus", -3.0, 3.0)])
def test_unary_more(name: str, low: float, high: float) -> None:
    check_gradient([(3, 5)], _op(name), low=low, high=high)


@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_gelu(approximate: str) -> None:
    check_gradient([(4, 7)], _op("gelu", approximate=approximate), low=-3.0, high=3.0)


@pytest.mark.parametrize("name", ["floor", "sign", "round", "ceil"])
def test_piecewise_constant_ops_have_zero_gradient(name: str) -> None:
    def body(b: GraphBuilder, xs: list[Value]) -> Value:
        return b.add1("add", [b.add1(name, xs), b.add1("mul", [xs[0], xs[0]])])

    check_gradient([(6,)], body)


@pytest.mark.parametrize(("name", "axes", "keepdims"), [
    ("max", None, False), ("max", (1,), True), ("min", (0, 2), False), ("prod", (-1,), False),
    ("prod", None, True)])
def test_more_reductions(name: str, axes, keepdims: bool) -> None:
    check_gradient([(2, 3, 5)], _op(name, axes=axes, keepdims=keepdims), low=0.5, high=2.0)


def test_max_ties_share_the_gradient() -> None:
    b = GraphBuilder("f")
    x = b.input(((4,), DType.f64))
    y = b.add1("max", [x], {"axes": None, "keepdims": False})
    (g,) = gradients(b, b.nodes, y, [x])
    got = interpret(b.build([g]), np.array([1.0, 3.0, 3.0, 0.0]))[0]
    np.testing.assert_array_equal(got, [0.0, 0.5, 0.5, 0.0])


@pytest.mark.parametrize("ddof", [0, 1])
def test_var(ddof: int) -> None:
    check_gradient([(3, 6)], _op("var", axes=(1,), keepdims=False, ddof=ddof))


@pytest.mark.parametrize(("starts", "stops", "steps"), [
    ((1, 0), (4, 5), (1, 1)), ((0, 4), (5, -7), (2, -1)), ((-1, 1), (-7, 5), (-2, 3)),
    ((2, 0), (2, 5), (1, 1))])
def test_slice(starts, stops, steps) -> None:
    check_gradient([(5, 6)], _op("slice", starts=starts, stops=stops, steps=steps))


def test_concat_stack_split() -> None:
    def body(b: GraphBuilder, xs: list[Value]) -> Value:
        a, c = xs
        joined = b.add1("concat", [a, c, a], {"axis": 1})                 # [3, 9]
        first, _, last = b.add("split", [joined], {"axis": 1, "sizes": (2, 4, 3)})
        stacked = b.add1("stack", [first, b.add1("slice", [last], {
            "starts": (0, 0), "stops": (3, 2), "steps": (1, 1)})], {"axis": 0})
        return b.add1("mul", [stacked, stacked])

    check_gradient([(3, 3), (3, 3)], body)


def test_pad_constant() -> None:
    check_gradient([(3, 4)], _op("pad", pads=(1, 0, 2, 3), value=1.5))


def test_pad_reflect_is_refused() -> None:
    b = GraphBuilder("f")
    x = b.input(((3, 4), DType.f64))
    y = b.add1("sum", [b.add1("pad", [x], {"pads": (1, 1, 1, 1), "mode": "reflect"})])
    with pytest.raises(GradientError, match=r"pad.*reflect padding"):
        gradients(b, b.nodes, y, [x])


def _indexed(name: str, index: np.ndarray, axis: int) -> Body:
    def body(b: GraphBuilder, xs: list[Value]) -> Value:
        idx = b.add1("constant", [], {"value": Literal(index)})
        out = b.add1(name, [xs[0], idx], {"axis": axis})
        return b.add1("mul", [out, out])
    return body


@pytest.mark.parametrize("axis", [0, 1, -1])
def test_take(axis: int) -> None:
    index = np.array([[0, 2, -1], [1, 1, 0]], dtype=np.int64)      # repeats accumulate
    check_gradient([(4, 3, 5)], _indexed("take", index, axis))


def test_take_along_axis() -> None:
    index = rng.integers(-3, 3, size=(4, 2, 1)).astype(np.int32)
    check_gradient([(4, 3, 5)], _indexed("take_along_axis", index, 1))


@pytest.mark.parametrize("name", ["softmax", "log_softmax"])
@pytest.mark.parametrize("axis", [0, -1])
def test_softmax_rules(name: str, axis: int) -> None:
    weights = rng.normal(size=(3, 5))

    def body(b: GraphBuilder, xs: list[Value]) -> Value:
        y = b.add1(name, xs, {"axis": axis})
        return b.add1("mul", [y, b.add1("constant", [], {"value": Literal(weights)})])

    check_gradient([(3, 5)], body)


@pytest.mark.parametrize(("name", "shapes", "attrs"), [
    ("layer_norm", [(3, 7), (7,), (7,)], {"eps": 1e-5}),
    ("rms_norm", [(2, 3, 6), (6,)], {"eps": 1e-6}),
    ("group_norm", [(2, 4, 3, 3), (4,), (4,)], {"groups": 2, "eps": 1e-5}),
    ("attention", [(2, 3, 4), (2, 5, 4), (2, 5, 3)], {"scale": 0.5})])
def test_composites_through_decompositions(name: str, shapes, attrs) -> None:
    weights = rng.normal(size=(128,))

    def body(b: GraphBuilder, xs: list[Value]) -> Value:
        y = b.add1(name, xs, attrs)
        n = int(np.prod(y.type.shape))
        w = b.add1("constant", [], {"value": Literal(weights[:n].reshape(y.type.shape))})
        return b.add1("mul", [y, w])

    check_gradient(shapes, body)


@pytest.mark.parametrize(("stride", "padding", "dilation", "bias"), [
    ((1, 1), (0, 0, 0, 0), (1, 1), True), ((2, 1), (1, 0, 1, 2), (1, 1), False),
    ((1, 2), (1, 1, 1, 1), (2, 1), True), ((2, 2), (0, 0, 0, 0), (1, 1), False)])
def test_conv2d(stride, padding, dilation, bias: bool) -> None:
    shapes = [(2, 3, 7, 6), (4, 3, 3, 2)] + ([(4,)] if bias else [])
    check_gradient(shapes, _op("conv2d", stride=stride, padding=padding, dilation=dilation))


def test_grouped_conv2d_is_refused() -> None:
    b = GraphBuilder("f")
    x = b.input(((1, 4, 5, 5), DType.f64))
    w = b.input(((4, 2, 3, 3), DType.f64))
    y = b.add1("sum", [b.add1("conv2d", [x, w], {"groups": 2})])
    with pytest.raises(GradientError, match=r"conv2d.*groups=2"):
        gradients(b, b.nodes, y, [x, w])


@pytest.mark.parametrize("name", ["max_pool2d", "avg_pool2d"])
def test_pooling_tiling_windows(name: str) -> None:
    def body(b: GraphBuilder, xs: list[Value]) -> Value:
        y = b.add1(name, xs, {"kernel": (2, 3), "stride": (2, 3)})
        return b.add1("mul", [y, y])

    check_gradient([(2, 3, 4, 6)], body)


def test_overlapping_pooling_is_refused() -> None:
    b = GraphBuilder("f")
    x = b.input(((1, 1, 5, 5), DType.f64))
    y = b.add1("sum", [b.add1("max_pool2d", [x], {"kernel": (3, 3), "stride": (1, 1)})])
    with pytest.raises(GradientError, match=r"max_pool2d.*tile the input"):
        gradients(b, b.nodes, y, [x])


@pytest.mark.parametrize(("equation", "shapes"), [
    ("ij,jk->ik", [(3, 4), (4, 5)]), ("bij,bjk->bik", [(2, 3, 4), (2, 4, 2)]),
    ("ij,j->i", [(3, 4), (4,)]), ("ij,kl->il", [(2, 3), (4, 5)]), ("...ij->...ji", [(2, 3, 4)])])
def test_einsum(equation: str, shapes) -> None:
    check_gradient(shapes, _op("einsum", equation=equation))
