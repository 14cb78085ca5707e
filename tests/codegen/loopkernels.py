"""Loop-IR kernels the code generator tests share: elementwise, row reductions, a matmul
micro-kernel, and one-op kernels (a vector loop plus a scalar tail)."""

from __future__ import annotations

import numpy as np

from tilefuse.dtypes import DType
from tilefuse.loop import (
    BufferParam,
    Expr,
    Let,
    Local,
    LoopFunction,
    LoopKind,
    LType,
    XOp,
    block,
    broadcast,
    const,
    fma,
    loop,
    maximum,
    minimum,
    reduce,
    unary,
    var,
)

F32 = DType.f32
W = 16  # vector width


def relu_sigmoid(lanes: int = W, block_size: int = 256) -> LoopFunction:
    """Y = relu(2x+1) * sigmoid(x): parallel over blocks, vectorized inside, scalar tail."""
    x_buf, y_buf = BufferParam("X", F32, readonly=True), BufferParam("Y", F32)
    n, b, i, j = var("n"), var("b"), var("i"), var("j")
    main = Let("nv", (n // lanes) * lanes)
    nv = main.ref

    def body(index, width):
        x = Let(f"x{width}", x_buf.load(index, width))
        two, one, zero = (const(v, F32, width) for v in (2.0, 1.0, 0.0))
        value = maximum(two * x.ref + one, zero) * unary(XOp.SIGMOID, x.ref)
        return [x, y_buf.store(index, value)]

    inner = loop("i", b, minimum(b + block_size, nv), body(i, lanes), step=lanes,
                 kind=LoopKind.VECTORIZED)
    outer = loop("b", 0, nv, [inner], step=block_size, kind=LoopKind.PARALLEL)
    tail = loop("j", nv, n, body(j, 1))
    return LoopFunction("relu_sigmoid", (x_buf, y_buf), ("n",), block(main, outer, tail))


def relu_sigmoid_reference(x: np.ndarray) -> np.ndarray:
    x64 = x.astype(np.float64)
    return (np.maximum(2 * x64 + 1, 0) / (1 + np.exp(-x64))).astype(x.dtype)


def row_sum_max(lanes: int = W) -> LoopFunction:
    """S[r] = sum(X[r, :]), M[r] = max(X[r, :]): vector accumulators, horizontal reduce, tail."""
    x_buf = BufferParam("X", F32, readonly=True)
    s_buf, m_buf = BufferParam("S", F32), BufferParam("M", F32)
    rows, cols, r, c, t = var("rows"), var("cols"), var("r"), var("c"), var("t")
    acc_s, acc_m = Local("acc_s", LType(F32, lanes)), Local("acc_m", LType(F32, lanes))
    tot_s, tot_m = Local("tot_s", LType(F32)), Local("tot_m", LType(F32))
    base, cv = Let("base", r * cols), Let("cv", (cols // lanes) * lanes)
    v, u = Let("v", x_buf.load(base.ref + c, lanes)), Let("u", x_buf.load(base.ref + t))
    body = [
        acc_s, acc_m, tot_s, tot_m, base, cv,
        acc_s.store(0, const(0.0, F32, lanes)),
        acc_m.store(0, const(-np.inf, F32, lanes)),
        loop("c", 0, cv.ref, [v, acc_s.store(0, acc_s.load() + v.ref),
                               acc_m.store(0, maximum(acc_m.load(), v.ref))],
             step=lanes, kind=LoopKind.VECTORIZED),
        tot_s.store(0, reduce(XOp.REDUCE_ADD, acc_s.load())),
        tot_m.store(0, reduce(XOp.REDUCE_MAX, acc_m.load())),
        loop("t", cv.ref, cols, [u, tot_s.store(0, tot_s.load() + u.ref),
                                 tot_m.store(0, maximum(tot_m.load(), u.ref))]),
        s_buf.store(r, tot_s.load()),
        m_buf.store(r, tot_m.load()),
    ]
    return LoopFunction("row_sum_max", (x_buf, s_buf, m_buf), ("rows", "cols"),
                        loop("r", 0, rows, body, kind=LoopKind.PARALLEL))


def matmul_4x32() -> LoopFunction:
    """C = A @ B for M % 4 == 0 and N % 32 == 0, any K: a 4x32 register tile (8 zmm
    accumulators) per (i0, j0), FMA with A broadcast per row; parallel over row tiles."""
    a_buf, b_buf = BufferParam("A", F32, readonly=True), BufferParam("B", F32, readonly=True)
    c_buf = BufferParam("C", F32)
    m, n, k_dim = var("M"), var("N"), var("K")
    i0, j0, k, r, w = var("i0"), var("j0"), var("k"), var("r"), var("w")
    acc = Local("acc", LType(F32, W), 8)
    b0 = Let("b0", b_buf.load(k * n + j0, W))
    b1 = Let("b1", b_buf.load(k * n + j0 + W, W))
    a = Let("a", broadcast(a_buf.load((i0 + r) * k_dim + k), W))
    rows = loop("r", 0, 4, [a, acc.store(r * 2, fma(a.ref, b0.ref, acc.load(r * 2))),
                            acc.store(r * 2 + 1, fma(a.ref, b1.ref, acc.load(r * 2 + 1)))],
                kind=LoopKind.UNROLLED)
    tile = [
        acc,
        loop("z", 0, 8, [acc.store(var("z"), const(0.0, F32, W))], kind=LoopKind.UNROLLED),
        loop("k", 0, k_dim, [b0, b1, rows]),
        loop("w", 0, 4, [c_buf.store((i0 + w) * n + j0, acc.load(w * 2)),
                               c_buf.store((i0 + w) * n + j0 + W, acc.load(w * 2 + 1))],
             kind=LoopKind.UNROLLED),
    ]
    body = loop("i0", 0, m, [loop("j0", 0, n, tile, step=32)], step=4, kind=LoopKind.PARALLEL)
    return LoopFunction("matmul_4x32", (a_buf, b_buf, c_buf), ("M", "N", "K"), body)


def one_op(op: XOp, dtype: DType, out_dtype: DType | None = None, lanes: int = W,
           arity: int = 1) -> LoopFunction:
    """Y[i] = op(X0[i], X1[i], ...) over n elements: a vector loop and a scalar tail."""
    ins = tuple(BufferParam(f"X{k}", dtype, readonly=True) for k in range(arity))
    out = BufferParam("Y", out_dtype or dtype)
    n, i, j = var("n"), var("i"), var("j")

    def value(index, width):
        args = tuple(x.load(index, width) for x in ins)
        return Expr(op, LType(out.dtype, width), args)

    nv = (n // lanes) * lanes
    main = loop("i", 0, nv, [out.store(i, value(i, lanes))], step=lanes,
                kind=LoopKind.VECTORIZED)
    tail = loop("j", nv, n, [out.store(j, value(j, 1))])
    return LoopFunction(f"k_{op.value}_{dtype}", (*ins, out), ("n",), block(main, tail))
