"""Elementwise ops against NumPy: unary math, binary arithmetic and comparisons with
broadcasting, where, cast and clip."""

from __future__ import annotations

import math

import numpy as np
import pytest
import scipy.special
from hypothesis import given, settings
from hypothesis.extra.numpy import mutually_broadcastable_shapes
from opcheck import FLOATS, INTS, LOW, ODD_SHAPES, array, in_f64, noncontiguous, rng, run1, seeds

from tilefuse.dtypes import DType, promote
from tilefuse.ops.rules import dtype_of
from tilefuse.testing import assert_close

SQRT2 = math.sqrt(2.0)

# name -> (NumPy expression, input range)
FLOAT_MATH = {
    "exp": (np.exp, (-2, 2)),
    "log": (np.log, (0.1, 3)),
    "log1p": (np.log1p, (-0.5, 2)),
    "expm1": (np.expm1, (-2, 2)),
    "sqrt": (np.sqrt, (0, 4)),
    "rsqrt": (lambda x: 1 / np.sqrt(x), (0.1, 4)),
    "reciprocal": (lambda x: 1 / x, (0.25, 3)),
    "tanh": (np.tanh, (-3, 3)),
    "sigmoid": (lambda x: 1 / (1 + np.exp(-x)), (-4, 4)),
    "erf": (scipy.special.erf, (-2, 2)),
    "gelu": (lambda x: 0.5 * x * (1 + scipy.special.erf(x / SQRT2)), (-3, 3)),
    "silu": (lambda x: x / (1 + np.exp(-x)), (-4, 4)),
    "softplus": (lambda x: np.log1p(np.exp(x)), (-3, 3)),
    "sin": (np.sin, (-3, 3)),
    "cos": (np.cos, (-3, 3)),
}

NUMERIC_UNARY = {
    "neg": np.negative,
    "abs": np.abs,
    "relu": lambda x: np.maximum(x, np.zeros_like(x)),
    "sign": np.sign,
    "floor": np.floor,
    "ceil": np.ceil,
    "round": np.round,
}


def _expect_unary(fn, x: np.ndarray, out: DType) -> np.ndarray:
    """The NumPy expression itself for f32/f64/ints; exact math rounded once for f16/bf16."""
    if x.dtype in (d.np for d in LOW) or out.np != x.dtype:
        return in_f64(fn, x, out=out)
    with np.errstate(all="ignore"):
        return np.asarray(fn(x))


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("name", sorted(FLOAT_MATH))
def test_float_math_on_floats(name: str, dtype: DType) -> None:
    fn, (low, high) = FLOAT_MATH[name]
    r = rng(name, dtype.value)
    for shape in ODD_SHAPES:
        x = array(r, shape, dtype, low, high)
        for arg in (x, noncontiguous(x)):
            assert_close(run1(name, [arg]), _expect_unary(fn, x, dtype), msg=f"{name} {shape}")


@pytest.mark.parametrize("dtype", [DType.i8, DType.i32, DType.u8, DType.bool])
@pytest.mark.parametrize("name", sorted(FLOAT_MATH))
def test_float_math_on_integers_gives_f64(name: str, dtype: DType) -> None:
    fn, (low, _) = FLOAT_MATH[name]
    x = array(rng(3), (7, 3), dtype)
    if low >= 0 and dtype is not DType.bool:
        x = np.abs(x) + 1  # stay inside the domain (positive ints)
    got = run1(name, [x])
    assert got.dtype == np.float64
    assert_close(got, in_f64(fn, x, out=DType.f64))


def test_gelu_tanh_approximation() -> None:
    c = math.sqrt(2 / math.pi)
    for dtype in FLOATS:
        x = array(rng(4), (513,), dtype, -4, 4)
        expect = in_f64(lambda v: 0.5 * v * (1 + np.tanh(c * (v + 0.044715 * v**3))), x,
                        out=dtype)
        assert_close(run1("gelu", [x], {"approximate": "tanh"}), expect)


@pytest.mark.parametrize("dtype", FLOATS + INTS)
@pytest.mark.parametrize("name", sorted(NUMERIC_UNARY))
def test_numeric_unary(name: str, dtype: DType) -> None:
    fn = NUMERIC_UNARY[name]
    r = rng(name, dtype.value)
    for shape in ODD_SHAPES:
        x = array(r, shape, dtype, -5, 5)
        got = run1(name, [noncontiguous(x)])
        assert_close(got, _expect_unary(fn, x, dtype), msg=f"{name} {shape}")


def test_round_is_half_to_even_and_nan_propagates() -> None:
    x = np.array([0.5, 1.5, 2.5, -0.5, -2.5, 3.7, np.nan], dtype=np.float32)
    np.testing.assert_array_equal(run1("round", [x]), np.round(x))
    for name, fn in (("relu", lambda v: np.maximum(v, 0)), ("sign", np.sign),
                     ("abs", np.abs), ("floor", np.floor)):
        assert_close(run1(name, [x]), fn(x).astype(np.float32))


@pytest.mark.parametrize("dtype", [DType.f32, DType.bf16, DType.i32, DType.u8, DType.bool])
def test_logical_not_and_isnan(dtype: DType) -> None:
    x = array(rng(5), (513,), dtype)
    if dtype.is_float:
        x[::3] = 0
        x[1::5] = np.nan
    elif dtype is not DType.bool:
        x[::3] = 0
    np.testing.assert_array_equal(run1("logical_not", [x]), x.astype(np.float64) == 0)
    np.testing.assert_array_equal(run1("isnan", [x]), np.isnan(x.astype(np.float64)))


# ---- binary ----------------------------------------------------------------------------------

BINARY = {
    "add": np.add, "sub": np.subtract, "mul": np.multiply, "div": np.true_divide,
    "floordiv": np.floor_divide, "mod": np.mod, "pow": np.power,
    "maximum": np.maximum, "minimum": np.minimum,
    "eq": np.equal, "ne": np.not_equal, "lt": np.less, "le": np.less_equal,
    "gt": np.greater, "ge": np.greater_equal,
    "logical_and": np.logical_and, "logical_or": np.logical_or, "logical_xor": np.logical_xor,
}
COMPARISONS = {"eq", "ne", "lt", "le", "gt", "ge", "logical_and", "logical_or", "logical_xor"}
PAIRS = [(d, d) for d in FLOATS + INTS] + [
    (DType.i32, DType.f32), (DType.u8, DType.i8), (DType.i8, DType.f16), (DType.bool, DType.i32),
    (DType.f16, DType.bf16), (DType.bf16, DType.i8), (DType.bf16, DType.f32),
]


def _operands(name: str, a_type: DType, b_type: DType, shapes, seed: int):
    r = rng(seed)
    a = array(r, shapes[0], a_type)
    b = array(r, shapes[1], b_type)
    if name == "pow":
        if a_type.is_float:
            a = np.abs(a) + a.dtype.type(0.25)  # real results for fractional exponents
        if not b_type.is_float:
            b = (np.abs(b.astype(np.int64)) % 4).astype(b.dtype)
    if b_type.is_float:
        # x // y and x % y right next to a discontinuity depend on the last bit: stay away
        b[np.abs(b.astype(np.float64)) < 0.125] = 1
    if name in ("eq", "ne", "le", "ge") and a.shape == b.shape:
        a.flat[::4] = b.flat[::4]  # some equal pairs, or eq would be all False
    return a, b


def _expect_binary(name: str, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    fn = BINARY[name]
    types = {a.dtype, b.dtype}
    if DType.bf16.np not in types:
        with np.errstate(all="ignore"):
            return np.asarray(fn(a, b))
    out = promote(dtype_of(a), dtype_of(b))
    if name in COMPARISONS:
        out = DType.bool
    return in_f64(fn, a, b, out=out)


@pytest.mark.parametrize("pair", PAIRS, ids=lambda p: f"{p[0].value}-{p[1].value}")
@pytest.mark.parametrize("name", sorted(BINARY))
def test_binary(name: str, pair: tuple[DType, DType]) -> None:
    for i, shapes in enumerate([((513,), (513,)), ((7, 1), (1, 513)), ((1,), (7, 3)),
                                ((7, 3), (3,))]):
        a, b = _operands(name, *pair, shapes, seed=i)
        expect = _expect_binary(name, a, b)
        assert_close(run1(name, [noncontiguous(a), b]), expect, msg=f"{name} {shapes}")


@pytest.mark.parametrize("name", ["add", "mul", "maximum", "minimum", "logical_and",
                                  "logical_or", "logical_xor", "eq", "div"])
def test_binary_on_bools(name: str) -> None:
    a, b = array(rng(1), (7, 3), DType.bool), array(rng(2), (3,), DType.bool)
    with np.errstate(all="ignore"):
        expect = np.asarray(BINARY[name](a, b))
    assert_close(run1(name, [a, b]), expect)


@settings(max_examples=30, deadline=None)
@given(shapes=mutually_broadcastable_shapes(num_shapes=2, min_dims=0, max_dims=4, max_side=5),
       seed=seeds)
def test_binary_broadcasting(shapes, seed: int) -> None:
    in_shapes, out_shape = shapes
    for name in ("add", "sub", "mul", "div", "maximum", "lt", "logical_or", "mod"):
        for dtype in (DType.f32, DType.i32):
            a, b = _operands(name, dtype, dtype, in_shapes, seed)
            got = run1(name, [a, b])
            assert got.shape == out_shape
            assert_close(got, _expect_binary(name, a, b), msg=name)


def test_maximum_minimum_propagate_nan() -> None:
    a = np.array([1.0, np.nan, 3.0, np.nan], dtype=np.float32)
    b = np.array([np.nan, 2.0, 1.0, np.nan], dtype=np.float32)
    assert_close(run1("maximum", [a, b]), np.maximum(a, b))
    assert_close(run1("minimum", [a, b]), np.minimum(a, b))


def test_floordiv_and_mod_follow_python_signs() -> None:
    a = np.array([7, -7, 7, -7, 0], dtype=np.int32)
    b = np.array([2, 2, -2, -2, 3], dtype=np.int32)
    np.testing.assert_array_equal(run1("floordiv", [a, b]), [7 // 2, -7 // 2, 7 // -2, 3, 0])
    np.testing.assert_array_equal(run1("mod", [a, b]), [7 % 2, -7 % 2, 7 % -2, -7 % -2, 0])
    af, bf = a.astype(np.float32), b.astype(np.float32)
    assert_close(run1("mod", [af, bf]), np.mod(af, bf))


# ---- where, cast, clip -----------------------------------------------------------------------


@settings(max_examples=25, deadline=None)
@given(shapes=mutually_broadcastable_shapes(num_shapes=3, min_dims=0, max_dims=3, max_side=5),
       seed=seeds)
def test_where_broadcasts(shapes, seed: int) -> None:
    r = rng(seed)
    c = array(r, shapes.input_shapes[0], DType.bool)
    a = array(r, shapes.input_shapes[1], DType.f32)
    b = array(r, shapes.input_shapes[2], DType.i32)
    assert_close(run1("where", [c, a, b]), np.where(c, a, b))


@pytest.mark.parametrize("src,dst", [(DType.f32, DType.i32), (DType.f32, DType.bf16),
                                     (DType.bf16, DType.f32), (DType.i32, DType.f16),
                                     (DType.bool, DType.f32), (DType.f64, DType.bool),
                                     (DType.i64, DType.u8), (DType.f16, DType.f64)])
def test_cast(src: DType, dst: DType) -> None:
    x = array(rng(6), (513,), src, -100, 100)
    got = run1("cast", [noncontiguous(x)], {"dtype": dst})
    assert_close(got, x.astype(dst.np))


@pytest.mark.parametrize("dtype", (*FLOATS, DType.i8, DType.i32, DType.u8))
@pytest.mark.parametrize("bounds", [(-0.5, 1.25), (None, 0.75), (-1.5, None), (None, None),
                                    (2.0, -2.0)])
def test_clip(dtype: DType, bounds: tuple[float | None, float | None]) -> None:
    lo, hi = bounds
    x = array(rng(7), (7, 513), dtype, -3, 3)
    got = run1("clip", [noncontiguous(x)], {"min": lo, "max": hi})
    if dtype.is_float:
        expect = in_f64(lambda v: np.clip(v, lo, hi), x, out=dtype)
    else:  # integer bounds round inwards and saturate at the dtype's range
        ilo = None if lo is None else math.ceil(lo)
        ihi = None if hi is None else math.floor(hi)
        info = np.iinfo(dtype.np)
        expect = np.clip(np.clip(x.astype(np.int64), ilo, ihi), info.min, info.max)
        expect = expect.astype(dtype.np)
    assert_close(got, expect)
