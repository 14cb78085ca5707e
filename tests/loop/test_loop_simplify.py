"""Simplification golden tests: index-arithmetic folding and loop-invariant hoisting, plus the
check that a simplified kernel computes the same as the original."""

from __future__ import annotations

import numpy as np
import pytest

from tilefuse.dtypes import DType
from tilefuse.loop import (
    Block,
    BufferParam,
    If,
    Let,
    Local,
    LoopFunction,
    LType,
    XOp,
    binary,
    block,
    broadcast,
    cast,
    const,
    fold_constants,
    fold_expr,
    format_expr,
    hoist_invariants,
    interpret,
    loop,
    minimum,
    select,
    simplify,
    thread_id,
    unary,
    var,
)
from tilefuse.testing import assert_close, random_array

F32 = DType.f32
i, j, k, n = var("i"), var("j"), var("k"), var("n")


@pytest.mark.parametrize(("expr", "golden"), [
    (i * 1, "i"), (1 * i, "i"), (i + 0, "i"), (0 + i, "i"), (i - 0, "i"), (i * 0, "0"),
    (i // 1, "i"), (i % 1, "0"),
    (const(3) * 4 + 5, "17"), (const(7) // -2, "-4"), (const(-7) % 3, "2"),
    (const(100, DType.i8) + const(100, DType.i8), "-56:i8"),
    ((i + 1) + 2, "i + 3"), (2 + i, "i + 2"), (i - 3, "i + -3"), ((i - 3) + 3, "i"),
    ((i + 1) * 768 + k + 16, "i*768 + k + 784"),
    ((i * 4) * 8, "i*32"), ((i + 2) * (j + 0), "(i + 2)*j"),
    (i + (j + 5), "i + j + 5"), ((i + 5) + j, "i + j + 5"),
    (minimum(3, const(5)), "3"), (binary(XOp.LT, const(3), 4), "True"),
    (select(binary(XOp.EQ, const(1), 1), i, j), "i"),
    (broadcast(const(2), 4), "splat<4>(2)"), (cast(const(300), DType.u8), "44:u8"),
    (const(5) // 0, "5//0"),  # a zero divisor is left to the runtime rule (0)
])
def test_fold_expr_golden(expr, golden):
    assert format_expr(fold_expr(expr)) == golden


def test_float_arithmetic_is_not_folded():
    x = var("x", LType(F32))
    for e in (x * const(1.0, F32), x + const(0.0, F32), const(1.0, F32) + const(2.0, F32)):
        assert fold_expr(e) is e


def test_unchanged_trees_are_the_same_objects():
    e = i * n + j
    assert fold_expr(e) is e
    out = BufferParam("Y", DType.i64)
    fn = LoopFunction("f", (out,), ("n",), loop("i", 0, n, [out.store(i, e)]))
    assert fold_constants(fn) == (fn, False)
    assert hoist_invariants(fn) == (fn, False)


def test_dead_branches_and_empty_loops_go():
    out = BufferParam("Y", DType.i64)
    body = block(
        If(binary(XOp.LT, const(1), 2), out.store(0, i), out.store(1, i)),
        loop("j", 5, 5, [out.store(j, j)]),
        Block((Block((out.store(2, const(7)),)),)),
    )
    fn = LoopFunction("f", (out,), (), loop("i", 0, 3, [body]))
    folded, changed = fold_constants(fn)
    assert changed
    assert str(folded) == ("kernel f(Y: i64):\n"
                           "  for i in 0..3:\n"
                           "    Y[0] = i\n"
                           "    Y[2] = 7\n")


def hoisting_kernel() -> LoopFunction:
    a = BufferParam("A", F32, readonly=True)
    b, c = BufferParam("B", F32), BufferParam("C", F32)
    two = const(2.0, F32)
    value = a.load(i) * two + b.load(i)
    return LoopFunction("h", (a, b, c), ("n",), loop("i", 0, 4, [
        loop("j", 0, n, [c.store(i * n + j, value)]),
        loop("k", 0, 8, [c.store(i * 8 + k, value + unary(XOp.EXP, a.load(k)))]),
    ]))


HOISTED = """\
kernel h(A: f32 readonly, B: f32, C: f32; n):
  for i in 0..4:
    let inv0 = i*n
    for j in 0..n:
      C[inv0 + j] = A[i]*2.0 + B[i]
    let inv1 = i*8
    let inv2 = A[i]*2.0
    for k in 0..8:
      C[inv1 + k] = inv2 + B[i] + exp(A[k])
"""


def test_hoisting_golden():
    """A[i] stays in the j loop (it may run zero times); B[i] stays (B is written)."""
    hoisted, changed = hoist_invariants(hoisting_kernel())
    assert changed
    assert str(hoisted) == HOISTED


def test_invariant_lets_move_out_of_every_loop():
    out = BufferParam("Y", DType.i64)
    t = Let("t", n * 3)
    fn = LoopFunction("f", (out,), ("n",), loop("i", 0, 4, [
        loop("j", 0, 4, [t, out.store(i * 4 + j, t.ref + j)])]))
    hoisted, _ = simplify(fn)
    assert str(hoisted) == ("kernel f(Y: i64; n):\n"
                            "  let t = n*3\n"
                            "  for i in 0..4:\n"
                            "    let inv0 = i*4\n"
                            "    for j in 0..4:\n"
                            "      Y[inv0 + j] = t + j\n")


def test_guarded_loads_locals_and_thread_ids_stay():
    a, y = BufferParam("A", F32, readonly=True), BufferParam("Y", F32)
    acc = Local("acc", LType(F32))
    fn = LoopFunction("f", (a, y), ("n",), block(acc, acc.store(0, const(1.0, F32)),
                                                 loop("i", 0, 8, [
        If(binary(XOp.LT, i, 3), y.store(i, a.load(0))),
        y.store(i, acc.load(0)),
        y.store(i, cast(thread_id(), F32)),
    ])))
    assert hoist_invariants(fn) == (fn, False)


@pytest.mark.parametrize("n_value", [1, 7, 13])
def test_simplified_kernel_computes_the_same(n_value):
    rng = np.random.default_rng(n_value)
    a, b = random_array(rng, (8,), F32), random_array(rng, (8,), F32)
    size = max(4 * n_value, 32)
    expected, got = np.zeros(size, np.float32), np.zeros(size, np.float32)
    fn = hoisting_kernel()
    simplified, changed = simplify(fn)
    assert changed
    interpret(fn, a, b, expected, n_value)
    interpret(simplified, a, b, got, n_value)
    assert_close(got, expected)
    assert np.count_nonzero(expected) >= 32


def test_floor_division_of_a_multiple_plus_a_constant():
    """In an address, (q*c + k) // c = q + k // c and (q*c + k) % c = k % c for floor
    division (c > 0, any k): what makes an interleaved index i*g + j seen through a [g, m]
    transpose affine. Not in a value: a u8 x*4 wraps, (x*4 + 3) // 4 is then not x."""
    from tilefuse.dtypes import DType
    from tilefuse.loop.ir import LType, XOp, binary, const, var
    from tilefuse.loop.simplify import fold_expr, fold_index

    i = var("i")
    for c, factor, k in ((4, 4, 3), (4, 8, 5), (4, 4, -1), (3, 6, 7)):
        e = i * factor + k
        div, mod = fold_index(binary(XOp.FLOORDIV, e, const(c))), \
            fold_index(binary(XOp.MOD, e, const(c)))
        assert mod.op is XOp.CONST and mod.arg == k % c
        for value in (0, 1, 5, 37):
            assert _evaluate(div, value) == (value * factor + k) // c
    kept = fold_index(binary(XOp.MOD, i * 6 + 5, const(4)))   # 6 is no multiple of 4
    assert kept.op is XOp.MOD
    assert fold_expr(binary(XOp.MOD, i * 4 + 3, const(4))).op is XOp.MOD
    x = var("x", LType(DType.u8))
    wraps = binary(XOp.FLOORDIV, x * 4 + 3, const(4, DType.u8))
    assert fold_index(wraps).op is XOp.FLOORDIV


def _evaluate(e, value):
    from tilefuse.loop.ir import XOp

    if e.op is XOp.CONST:
        return e.arg
    if e.op is XOp.VAR:
        return value
    a, b = (_evaluate(x, value) for x in e.args)
    return {XOp.ADD: a + b, XOp.MUL: a * b, XOp.SUB: a - b}[e.op]
