"""The loop-IR printer: golden text for a small kernel and for expressions."""

from __future__ import annotations

import math

from tilefuse.dtypes import DType
from tilefuse.loop import (
    BufferParam,
    If,
    Let,
    Local,
    LoopFunction,
    LoopKind,
    LType,
    Prefetch,
    XOp,
    binary,
    broadcast,
    cast,
    const,
    fma,
    format_expr,
    loop,
    reduce,
    thread_id,
    unary,
    var,
)
from tilefuse.loop.printer import format_stmt

F32 = DType.f32


def small_kernel() -> LoopFunction:
    a = BufferParam("A", F32, readonly=True, align=64)
    c = BufferParam("C", F32)
    i, k = var("i"), var("k")
    acc = Local("acc", LType(F32, 16), 2)
    row = Let("row", i * 768)
    body = [
        acc,
        row,
        acc.store(0, broadcast(0.0, 16)),
        loop("k", 0, 768, [acc.store(0, fma(a.load(row.ref + k, 16), broadcast(2.0, 16),
                                             acc.load(0)))], step=16,
             kind=LoopKind.VECTORIZED),
        If(binary(XOp.LT, i, var("n") - 1),
           c.store(i, reduce(XOp.REDUCE_ADD, acc.load(0))),
           c.store(i, unary(XOp.EXP, c.load(i)))),
    ]
    return LoopFunction("rowsum", (a, c), ("n",), loop("i", 0, var("n"), body, step=12,
                                                       kind=LoopKind.PARALLEL))


GOLDEN = """\
kernel rowsum(A: f32 readonly align 64, C: f32; n):
  parallel for i in 0..n step 12:
    local acc: f32x16[2]
    let row = i*768
    acc[0] = bcast<16>(0.0)
    vectorized for k in 0..768 step 16:
      acc[0] = fma(load<16>(A, row + k), bcast<16>(2.0), acc[0])
    if i < n - 1:
      C[i] = reduce_add(acc[0])
    else:
      C[i] = exp(C[i])
"""


def test_small_kernel_prints_as_golden_text():
    assert str(small_kernel()) == GOLDEN


def test_expressions_keep_their_shape():
    i, j = var("i"), var("j")
    assert format_expr((i + 1) * (j - 2)) == "(i + 1)*(j - 2)"
    assert format_expr(i - (j + 1)) == "i - (j + 1)"
    assert format_expr(i - j + 1) == "i - j + 1"
    assert format_expr(i // 4 * 4 % 3) == "i//4*4%3"
    assert format_expr(-(i + j)) == "-(i + j)"
    assert format_expr(binary(XOp.GE, i + 1, j)) == "i + 1 >= j"


def test_constants_show_their_type_when_not_the_default():
    assert format_expr(const(3)) == "3"
    assert format_expr(const(3, DType.i32)) == "3:i32"
    assert format_expr(const(2.5, F32)) == "2.5"
    assert format_expr(const(2.5, DType.f64)) == "2.5:f64"
    assert format_expr(const(math.inf, F32, 8)) == "splat<8>(inf)"
    assert format_expr(const(True, DType.bool)) == "True"


def test_other_nodes():
    x = BufferParam("X", DType.f16)
    v = x.load(var("i"), 8)
    assert format_expr(cast(v, F32)) == "cast<f32>(load<8>(X, i))"
    assert format_expr(thread_id()) == "thread_id()"
    assert format_expr(unary(XOp.ISNAN, v)) == "isnan(load<8>(X, i))"
    assert str(var("i") + 1) == "i + 1"
    assert format_stmt(Prefetch("X", var("i") + 16)) == ["prefetch X[i + 16]"]
    assert format_stmt(Prefetch("X", var("i"), locality=2)) == ["prefetch.l2 X[i]"]
