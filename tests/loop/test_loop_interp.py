"""The loop interpreter against NumPy on random inputs, and its runtime checks."""

from __future__ import annotations

import numpy as np
import pytest

from tilefuse.dtypes import DType
from tilefuse.errors import GuardError, VerifyError
from tilefuse.loop import (
    BufferParam,
    If,
    Let,
    Local,
    LoopFunction,
    LoopKind,
    LType,
    XOp,
    binary,
    block,
    broadcast,
    cast,
    const,
    fma,
    interpret,
    loop,
    maximum,
    reduce,
    thread_id,
    unary,
    var,
)
from tilefuse.testing import assert_close, random_array

F32 = DType.f32
i, j, n, r, c = var("i"), var("j"), var("n"), var("r"), var("c")


def gelu_like(lanes: int = 8) -> LoopFunction:
    """Y = x * sigmoid(1.702 x) + tanh(x), vector loop plus scalar tail."""
    x_buf, y_buf = BufferParam("X", F32, readonly=True), BufferParam("Y", F32)
    nv = Let("nv", n // lanes * lanes)

    def body(index, width, tag):
        x = Let(f"x{tag}", x_buf.load(index, width))
        value = x.ref * unary(XOp.SIGMOID, const(1.702, F32, width) * x.ref)
        return [x, y_buf.store(index, value + unary(XOp.TANH, x.ref))]

    return LoopFunction("g", (x_buf, y_buf), ("n",), block(
        nv, loop("i", 0, nv.ref, body(i, lanes, "v"), step=lanes, kind=LoopKind.VECTORIZED),
        loop("j", nv.ref, n, body(j, 1, "s"))))


@pytest.mark.parametrize("size", [1, 7, 513])
def test_elementwise_matches_numpy(size):
    rng = np.random.default_rng(size)
    x = random_array(rng, (size,), F32, -5, 5)
    y = np.full(size, np.nan, np.float32)
    interpret(gelu_like(), x, y, size)
    x64 = x.astype(np.float64)
    expected = x64 / (1 + np.exp(-1.702 * x64)) + np.tanh(x64)
    assert_close(y, expected.astype(np.float32))


def matvec() -> LoopFunction:
    """y[r] = sum_c A[r, c] * x[c] with an 8-lane accumulator and a scalar tail."""
    a, x, y = (BufferParam("A", F32, True), BufferParam("x", F32, True), BufferParam("y", F32))
    rows, cols = var("rows"), var("cols")
    acc, tail = Local("acc", LType(F32, 8)), Local("tail", LType(F32))
    cv = Let("cv", cols // 8 * 8)
    body = [acc, tail, cv, acc.store(0, broadcast(const(0.0, F32), 8)),
            loop("c", 0, cv.ref, [acc.store(0, fma(a.load(r * cols + c, 8), x.load(c, 8),
                                                    acc.load()))], step=8,
                 kind=LoopKind.VECTORIZED),
            tail.store(0, reduce(XOp.REDUCE_ADD, acc.load())),
            loop("t", cv.ref, cols, [tail.store(0, tail.load() + a.load(r * cols + var("t")) *
                                                x.load(var("t")))]),
            y.store(r, tail.load())]
    return LoopFunction("mv", (a, x, y), ("rows", "cols"),
                        loop("r", 0, rows, body, kind=LoopKind.PARALLEL))


@pytest.mark.parametrize(("rows", "cols"), [(1, 1), (7, 7), (3, 513)])
def test_matvec_matches_numpy(rows, cols):
    rng = np.random.default_rng(rows + cols)
    a, x = random_array(rng, (rows, cols), F32), random_array(rng, (cols,), F32)
    y = np.zeros(rows, np.float32)
    interpret(matvec(), a, x, y, rows, cols)
    assert_close(y, (a.astype(np.float64) @ x).astype(np.float32), reduction=True)


def _int_kernel(op: XOp, dtype: DType) -> LoopFunction:
    a, b, y = BufferParam("A", dtype, True), BufferParam("B", dtype, True), BufferParam("Y", dtype)
    return LoopFunction("k", (a, b, y), ("n",), loop("i", 0, n, [
        y.store(i, binary(op, a.load(i), b.load(i)))]))


@pytest.mark.parametrize("op", [XOp.FLOORDIV, XOp.MOD])
@pytest.mark.parametrize("dtype", [DType.i32, DType.u8])
def test_int_division_follows_python(op, dtype):
    rng = np.random.default_rng(3)
    a, b = random_array(rng, (513,), dtype), random_array(rng, (513,), dtype)
    b[:5] = 0
    y = np.zeros(513, dtype.np)
    interpret(_int_kernel(op, dtype), a, b, y, 513)
    expected = [(x // d if op is XOp.FLOORDIV else x % d) if d else 0
                for x, d in zip(a.tolist(), b.tolist())]
    assert_close(y, np.array(expected, dtype.np))


def test_float_to_int_casts_saturate():
    x_buf, y_buf = BufferParam("X", F32, True), BufferParam("Y", DType.i8)
    fn = LoopFunction("c", (x_buf, y_buf), ("n",), loop("i", 0, n, [
        y_buf.store(i, cast(x_buf.load(i), DType.i8))]))
    x = np.array([np.nan, np.inf, -np.inf, 300.0, -300.0, -1.9, 1.9, 127.5], np.float32)
    y = np.zeros(8, np.int8)
    interpret(fn, x, y, 8)
    assert_close(y, np.array([0, 127, -128, 127, -128, -1, 1, 127], np.int8))


def test_control_flow_and_thread_id():
    y = BufferParam("Y", DType.i64)
    fn = LoopFunction("cf", (y,), ("n",), block(
        loop("i", 0, n, [If(binary(XOp.LT, i, 3), y.store(i, i * 10), y.store(i, thread_id()))],
             kind=LoopKind.PARALLEL),
        loop("u", 0, 2, [y.store(var("u") + n, var("u") - 5)], kind=LoopKind.UNROLLED),
        loop("e", 5, 2, [y.store(0, const(99))])))  # runs zero times
    out = np.full(9, -1, np.int64)
    interpret(fn, out, 7)
    assert_close(out, np.array([0, 10, 20, 0, 0, 0, 0, -5, -4]))


def test_reduction_order_is_a_tree_of_halves():
    x_buf, y_buf = BufferParam("X", F32, True), BufferParam("Y", F32)
    fn = LoopFunction("t", (x_buf, y_buf), (), block(
        y_buf.store(0, reduce(XOp.REDUCE_ADD, x_buf.load(0, 8))),
        y_buf.store(1, reduce(XOp.REDUCE_MAX, x_buf.load(0, 5)))))
    x = random_array(np.random.default_rng(1), (8,), F32)
    y = np.zeros(2, np.float32)
    interpret(fn, x, y)
    h = x[:4] + x[4:]
    q = h[:2] + h[2:]
    assert y[0] == q[0] + q[1]
    assert y[1] == x[:5].max()


def test_out_of_bounds_and_uninitialised_reads_are_errors():
    x_buf, y_buf = BufferParam("X", F32, True), BufferParam("Y", F32)
    acc = Local("acc", LType(F32), 2)
    x, y = np.ones(8, np.float32), np.zeros(8, np.float32)
    cases = {
        "out of bounds": block(y_buf.store(0, reduce(XOp.REDUCE_ADD, x_buf.load(4, 8)))),
        "out of bounds \\(the buffer has 8": block(y_buf.store(8, x_buf.load(0))),
        "read before it is written": block(acc, y_buf.store(0, acc.load(1))),
        "out of range": block(acc, loop("i", 0, 3, [acc.store(i, x_buf.load(i))])),
    }
    for message, body in cases.items():
        with pytest.raises(VerifyError, match=message):
            interpret(LoopFunction("bad", (x_buf, y_buf), (), body), x, y)


def test_arguments_are_checked():
    fn = gelu_like()
    x, y = np.ones(8, np.float32), np.zeros(8, np.float32)
    with pytest.raises(GuardError, match="takes 2 arrays and 1 scalars"):
        interpret(fn, x, y)
    with pytest.raises(GuardError, match="must be a f32 array"):
        interpret(fn, x.astype(np.float16), y, 8)
    with pytest.raises(GuardError, match="overlap"):
        interpret(fn, y[:4], y[2:6], 4)
    with pytest.raises(GuardError, match="scalar n must be an int"):
        interpret(fn, x, y, True)


def test_nan_propagates_through_max_and_min():
    x_buf, y_buf = BufferParam("X", F32, True), BufferParam("Y", F32)
    fn = LoopFunction("m", (x_buf, y_buf), (), block(
        y_buf.store(0, maximum(x_buf.load(0), x_buf.load(1))),
        y_buf.store(1, maximum(x_buf.load(1), x_buf.load(0)))))
    y = np.zeros(2, np.float32)
    interpret(fn, np.array([np.nan, 1.5], np.float32), y)
    assert np.isnan(y).all()
