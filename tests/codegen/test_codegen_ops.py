"""Every value op of the loop IR, compiled, against the loop interpreter on random inputs (a
16-lane vector loop plus a scalar tail, so both code paths run)."""

from __future__ import annotations

import numpy as np
import pytest
from loopkernels import one_op

from tilefuse.codegen import compile_kernel
from tilefuse.dtypes import DType
from tilefuse.loop import (
    BufferParam,
    LoopFunction,
    XOp,
    binary,
    broadcast,
    interpret,
    loop,
    reduce,
    select,
    var,
)
from tilefuse.testing import assert_close, random_array

SIZES = (1, 37)
FLOATS = (DType.f32, DType.f64)
INTS = (DType.i64, DType.i32, DType.i8, DType.u8)


def inputs(dtype: DType, n: int, arity: int, seed: int, *, specials: bool = False):
    rng = np.random.default_rng(seed)
    arrays = [random_array(rng, (n,), dtype) for _ in range(arity)]
    if specials and dtype.is_float and n > 8:
        for a in arrays:
            a[rng.choice(n, 4, replace=False)] = [np.nan, np.inf, -np.inf, 0.0]
    return arrays


def check(op: XOp, dtype: DType, *, out: DType | None = None, arity: int = 1,
          specials: bool = False, arrays=None, reduction: bool = False) -> None:
    fn = one_op(op, dtype, out, arity=arity)
    kernel = compile_kernel(fn)
    out_dtype = out or dtype
    for n in SIZES:
        xs = arrays if arrays is not None else inputs(dtype, n, arity, n, specials=specials)
        n = len(xs[0])
        got = np.zeros(n, out_dtype.np)
        want = np.zeros(n, out_dtype.np)
        kernel(*xs, got, n)
        interpret(fn, *xs, want, n)
        assert_close(got, want, reduction=reduction, msg=f"{op} {dtype}->{out_dtype} n={n}")


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("op", [XOp.ADD, XOp.SUB, XOp.MUL, XOp.DIV, XOp.MIN, XOp.MAX, XOp.POW])
def test_float_binary(op, dtype):
    check(op, dtype, arity=2, specials=True)


@pytest.mark.parametrize("dtype", INTS)
@pytest.mark.parametrize("op", [XOp.ADD, XOp.SUB, XOp.MUL, XOp.FLOORDIV, XOp.MOD, XOp.MIN,
                                XOp.MAX, XOp.AND, XOp.OR, XOp.XOR])
def test_int_binary(op, dtype):
    check(op, dtype, arity=2)


@pytest.mark.parametrize("dtype", [DType.i64, DType.i8])
def test_floordiv_and_mod_edge_cases(dtype):
    info = np.iinfo(dtype.np)
    a = np.array([7, -7, 7, -7, 0, 5, info.min, info.min, info.max, -1] * 4, dtype.np)
    b = np.array([2, 2, -2, -2, 3, 0, -1, 1, -1, 0] * 4, dtype.np)
    for op in (XOp.FLOORDIV, XOp.MOD):
        check(op, dtype, arity=2, arrays=[a, b])
    with np.errstate(all="ignore"):
        expected = np.floor_divide(a, b)
    got = np.zeros_like(a)
    compile_kernel(one_op(XOp.FLOORDIV, dtype, arity=2))(a, b, got, len(a))
    assert_close(got, expected)


@pytest.mark.parametrize("dtype", [DType.f32, DType.i32, DType.u8])
@pytest.mark.parametrize("op", [XOp.LT, XOp.LE, XOp.EQ, XOp.NE, XOp.GT, XOp.GE])
def test_comparisons(op, dtype):
    check(op, dtype, out=DType.bool, arity=2, specials=True)


@pytest.mark.parametrize(("op", "dtype"), [
    (XOp.NEG, DType.f32), (XOp.NEG, DType.i32), (XOp.ABS, DType.f64), (XOp.ABS, DType.i8),
    (XOp.ABS, DType.u8), (XOp.NOT, DType.i32), (XOp.NOT, DType.bool),
    (XOp.FLOOR, DType.f32), (XOp.CEIL, DType.f64), (XOp.ROUND, DType.f32),
    (XOp.SQRT, DType.f32), (XOp.RSQRT, DType.f64)])
def test_unary(op, dtype):
    check(op, dtype, specials=True)


def test_round_is_half_to_even():
    x = np.array([0.5, 1.5, 2.5, -0.5, -1.5, 2.4999998, 3.5000002] * 3, np.float32)
    check(XOp.ROUND, DType.f32, arrays=[x])


def test_isnan():
    check(XOp.ISNAN, DType.f32, out=DType.bool, specials=True)


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("op", [XOp.EXP, XOp.LOG, XOp.LOG1P, XOp.EXPM1, XOp.TANH, XOp.SIGMOID,
                                XOp.ERF, XOp.SIN, XOp.COS])
def test_math_against_interpreter(op, dtype):
    check(op, dtype, specials=True)


@pytest.mark.parametrize("dtype", [DType.f32, DType.i32])
def test_fma(dtype):
    check(XOp.FMA, dtype, arity=3)


_CAST_TYPES = (DType.f64, DType.f32, DType.f16, DType.bf16, DType.i64, DType.i32, DType.i8,
               DType.u8, DType.bool)


@pytest.mark.parametrize("src", _CAST_TYPES)
@pytest.mark.parametrize("dst", _CAST_TYPES)
def test_casts(src, dst):
    if src is dst:
        return
    check(XOp.CAST, src, out=dst)


@pytest.mark.parametrize("dst", [DType.i32, DType.i8, DType.u8, DType.i64])
def test_float_to_int_saturates(dst):
    x = np.array([np.nan, np.inf, -np.inf, 1e30, -1e30, 300.7, -300.7, -0.9, 2.5] * 2, np.float32)
    check(XOp.CAST, DType.f32, out=dst, arrays=[x])


def test_bf16_rounding_and_nan():
    x = np.array([1.00390625, 1.01171875, -3.3e38, 3.4e38, np.nan, 1e-40, 0.1] * 3, np.float32)
    check(XOp.CAST, DType.f32, out=DType.bf16, arrays=[x])


@pytest.mark.parametrize("dtype", [DType.f16, DType.bf16])
@pytest.mark.parametrize("op", [XOp.ADD, XOp.MUL, XOp.DIV, XOp.MAX])
def test_half_arithmetic(op, dtype):
    check(op, dtype, arity=2)


@pytest.mark.parametrize("dtype", [DType.f16, DType.bf16])
def test_half_math(dtype):
    check(XOp.EXP, dtype)


def _reduce_kernel(op: XOp, dtype: DType, lanes: int) -> LoopFunction:
    x_buf, y_buf = BufferParam("X", dtype, readonly=True), BufferParam("Y", dtype)
    r = var("r")
    body = y_buf.store(r, reduce(op, x_buf.load(r * lanes, lanes)))
    return LoopFunction("reduce", (x_buf, y_buf), ("rows",), loop("r", 0, var("rows"), [body]))


@pytest.mark.parametrize("lanes", [16, 5, 1])
@pytest.mark.parametrize("dtype", [DType.f32, DType.i32, DType.u8])
@pytest.mark.parametrize("op", [XOp.REDUCE_ADD, XOp.REDUCE_MAX, XOp.REDUCE_MIN])
def test_horizontal_reductions(op, dtype, lanes):
    rows = 7
    rng = np.random.default_rng(lanes)
    x = random_array(rng, (rows, lanes), dtype)
    if dtype.is_float:
        x[3, lanes // 2] = np.nan
    fn = _reduce_kernel(op, dtype, lanes)
    got, want = np.zeros(rows, dtype.np), np.zeros(rows, dtype.np)
    compile_kernel(fn)(x, got, rows)
    interpret(fn, x, want, rows)
    np_op = {XOp.REDUCE_ADD: np.sum, XOp.REDUCE_MAX: np.max, XOp.REDUCE_MIN: np.min}[op]
    assert_close(got, want)
    assert_close(got, np_op(x, axis=1).astype(dtype.np), reduction=True)


def test_select_and_broadcast():
    x_buf, y_buf = BufferParam("X", DType.f32, readonly=True), BufferParam("Y", DType.f32)
    i = var("i")
    v = x_buf.load(i, 8)
    half = broadcast(x_buf.load(0), 8)
    body = y_buf.store(i, select(binary(XOp.GT, v, half), v, half))
    fn = LoopFunction("sel", (x_buf, y_buf), ("n",), loop("i", 0, var("n"), [body], step=8))
    x = random_array(np.random.default_rng(2), (40,), DType.f32)
    got = np.zeros(40, np.float32)
    compile_kernel(fn)(x, got, 40)
    assert_close(got, np.where(x > x[0], x, x[0]))
