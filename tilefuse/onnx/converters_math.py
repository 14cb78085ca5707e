"""Converters for elementwise math, comparisons, logic, variadic ops, MatMul, Gemm, reductions
and ArgMax/ArgMin.

ONNX keeps an op's element type where NumPy promotes (an integer ReduceSum stays i32, an
integer Div truncates), so converters cast back where tilefuse's NumPy rules differ.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from tilefuse.dtypes import DType
from tilefuse.onnx.context import NodeContext, Tensor

Converter = Callable[[NodeContext], list[Tensor]]

_HUGE = 2**62

# ---- unary ---------------------------------------------------------------------------------

_UNARY: tuple[tuple[str, int, str], ...] = (
    ("Neg", 1, "neg"), ("Abs", 1, "abs"), ("Exp", 1, "exp"), ("Log", 1, "log"),
    ("Sqrt", 1, "sqrt"), ("Reciprocal", 1, "reciprocal"), ("Tanh", 1, "tanh"),
    ("Sigmoid", 1, "sigmoid"), ("Relu", 1, "relu"), ("Erf", 9, "erf"),
    ("Softplus", 1, "softplus"), ("Floor", 1, "floor"), ("Ceil", 1, "ceil"),
    ("Round", 11, "round"), ("Sign", 9, "sign"), ("Not", 1, "logical_not"), ("Sin", 7, "sin"),
    ("Cos", 7, "cos"), ("IsNaN", 9, "isnan"),
)


def _unary(name: str) -> Converter:
    def convert(ctx: NodeContext) -> list[Tensor]:
        return [ctx.op(name, ctx.input(0))]
    return convert


def _leaky_relu(ctx: NodeContext) -> list[Tensor]:
    x = ctx.input(0)
    alpha = ctx.scalar(ctx.attr("alpha", 0.01), x.dtype)
    return [ctx.op("where", ctx.op("lt", x, ctx.scalar(0, x.dtype)), ctx.op("mul", x, alpha), x)]


def _elu(ctx: NodeContext) -> list[Tensor]:
    x = ctx.input(0)
    neg = ctx.op("mul", ctx.op("expm1", x), ctx.scalar(ctx.attr("alpha", 1.0), x.dtype))
    return [ctx.op("where", ctx.op("gt", x, ctx.scalar(0, x.dtype)), x, neg)]


def _selu(ctx: NodeContext) -> list[Tensor]:
    x = ctx.input(0)
    alpha = ctx.attr("alpha", 1.67326319217681884765625)
    gamma = ctx.scalar(ctx.attr("gamma", 1.05070102214813232421875), x.dtype)
    neg = ctx.op("mul", ctx.op("expm1", x), ctx.scalar(alpha, x.dtype))
    return [ctx.op("mul", ctx.op("where", ctx.op("gt", x, ctx.scalar(0, x.dtype)), x, neg), gamma)]


def _celu(ctx: NodeContext) -> list[Tensor]:
    """max(0, x) + min(0, alpha·(exp(x/alpha) - 1))."""
    x = ctx.input(0)
    alpha = ctx.scalar(ctx.attr("alpha", 1.0), x.dtype)
    neg = ctx.op("mul", alpha, ctx.op("expm1", ctx.op("div", x, alpha)))
    zero = ctx.scalar(0, x.dtype)
    return [ctx.op("add", ctx.op("maximum", x, zero), ctx.op("minimum", neg, zero))]


def _thresholded_relu(ctx: NodeContext) -> list[Tensor]:
    x = ctx.input(0)
    above = ctx.op("gt", x, ctx.scalar(ctx.attr("alpha", 1.0), x.dtype))
    return [ctx.op("where", above, x, ctx.scalar(0, x.dtype))]


def _mish(ctx: NodeContext) -> list[Tensor]:
    x = ctx.input(0)
    return [ctx.op("mul", x, ctx.op("tanh", ctx.op("softplus", x)))]


def _hyperbolic(sign: str) -> Converter:
    """Sinh (sign "sub") and Cosh ("add"): (exp(x) ∓ exp(-x)) / 2."""
    def convert(ctx: NodeContext) -> list[Tensor]:
        x = ctx.input(0)
        both = ctx.op(sign, ctx.op("exp", x), ctx.op("exp", ctx.op("neg", x)))
        return [ctx.op("mul", both, ctx.scalar(0.5, x.dtype))]
    return convert


def _tan(ctx: NodeContext) -> list[Tensor]:
    x = ctx.input(0)
    return [ctx.op("div", ctx.op("sin", x), ctx.op("cos", x))]


def _hard_sigmoid_of(ctx: NodeContext, x: Tensor, alpha: float, beta: float) -> Tensor:
    y = ctx.op("add", ctx.op("mul", x, ctx.scalar(alpha, x.dtype)), ctx.scalar(beta, x.dtype))
    return ctx.op("clip", y, min=0.0, max=1.0)


def _hard_sigmoid(ctx: NodeContext) -> list[Tensor]:
    return [_hard_sigmoid_of(ctx, ctx.input(0), ctx.attr("alpha", 0.2), ctx.attr("beta", 0.5))]


def _hard_swish(ctx: NodeContext) -> list[Tensor]:
    x = ctx.input(0)
    return [ctx.op("mul", x, _hard_sigmoid_of(ctx, x, 1 / 6, 0.5))]


def _softsign(ctx: NodeContext) -> list[Tensor]:
    x = ctx.input(0)
    return [ctx.op("div", x, ctx.op("add", ctx.op("abs", x), ctx.scalar(1, x.dtype)))]


def _prelu(ctx: NodeContext) -> list[Tensor]:
    x, slope = ctx.input(0), ctx.input(1)
    neg = ctx.op("mul", x, _same(ctx, x, slope))
    return [ctx.op("where", ctx.op("lt", x, ctx.scalar(0, x.dtype)), neg, x)]


def _shrink(ctx: NodeContext) -> list[Tensor]:
    x = ctx.input(0)
    lambd, bias = float(ctx.attr("lambd", 0.5)), float(ctx.attr("bias", 0.0))
    low, high = ctx.scalar(-lambd, x.dtype), ctx.scalar(lambd, x.dtype)
    shifted_up = ctx.op("add", x, ctx.scalar(bias, x.dtype))
    shifted_down = ctx.op("sub", x, ctx.scalar(bias, x.dtype))
    inner = ctx.op("where", ctx.op("gt", x, high), shifted_down, ctx.scalar(0, x.dtype))
    return [ctx.op("where", ctx.op("lt", x, low), shifted_up, inner)]


def _gelu(ctx: NodeContext) -> list[Tensor]:
    approximate = ctx.attr("approximate", "none")
    if approximate not in ("none", "tanh"):
        raise ctx.error(f"approximate={approximate!r} is not 'none' or 'tanh'")
    return [ctx.op("gelu", ctx.input(0), approximate=approximate)]


def _cast(ctx: NodeContext) -> list[Tensor]:
    from tilefuse.onnx.tensors import to_dtype
    to = ctx.attr("to")
    if to is None:
        raise ctx.error("attribute 'to' is required")
    return [ctx.cast(ctx.input(0), to_dtype(int(to), f"{ctx.label}: 'to'"))]


def _cast_like(ctx: NodeContext) -> list[Tensor]:
    return [ctx.cast(ctx.input(0), ctx.input(1).dtype)]


def _clip_bounds(ctx: NodeContext, x: Tensor, lo: Tensor | None, hi: Tensor | None) -> Tensor:
    consts = [t.const for t in (lo, hi) if t is not None]
    if all(c is not None for c in consts):
        def bound(t: Tensor | None) -> float | int | None:
            if t is None or t.const is None:
                return None
            if t.const.size != 1:
                raise ctx.error("min and max must be scalars")
            v = t.const.reshape(()).item()
            return float(v) if x.dtype.is_float else int(v)
        return ctx.op("clip", x, min=bound(lo), max=bound(hi))
    if lo is not None:
        x = ctx.op("maximum", x, _same(ctx, x, lo))
    return x if hi is None else ctx.op("minimum", x, _same(ctx, x, hi))


def _clip_6(ctx: NodeContext) -> list[Tensor]:
    x = ctx.input(0)
    lo, hi = ctx.attr("min"), ctx.attr("max")
    return [_clip_bounds(ctx, x, None if lo is None else ctx.scalar(lo, x.dtype),
                         None if hi is None else ctx.scalar(hi, x.dtype))]


def _clip_11(ctx: NodeContext) -> list[Tensor]:
    return [_clip_bounds(ctx, ctx.input(0), ctx.optional(1), ctx.optional(2))]


# ---- binary and variadic ---------------------------------------------------------------------


def _same(ctx: NodeContext, a: Tensor, b: Tensor) -> Tensor:
    """``b``, checked to have ``a``'s dtype (ONNX requires it; NumPy would promote)."""
    if a.dtype is not b.dtype:
        raise ctx.error(f"inputs have different element types ({a.dtype}, {b.dtype})")
    return b


_BINARY: tuple[tuple[str, int, str], ...] = (
    ("Add", 7, "add"), ("Sub", 7, "sub"), ("Mul", 7, "mul"), ("Equal", 7, "eq"),
    ("Less", 7, "lt"), ("LessOrEqual", 12, "le"), ("Greater", 7, "gt"),
    ("GreaterOrEqual", 12, "ge"), ("And", 7, "logical_and"), ("Or", 7, "logical_or"),
    ("Xor", 7, "logical_xor"),
)


def _binary(name: str) -> Converter:
    def convert(ctx: NodeContext) -> list[Tensor]:
        a = ctx.input(0)
        return [ctx.op(name, a, _same(ctx, a, ctx.input(1)))]
    return convert


def _div(ctx: NodeContext) -> list[Tensor]:
    a = ctx.input(0)
    b = _same(ctx, a, ctx.input(1))
    q = ctx.op("div", a, b)
    return [q if a.dtype.is_float else ctx.cast(q, a.dtype)]  # integers truncate, as in C


def _mod(ctx: NodeContext) -> list[Tensor]:
    a = ctx.input(0)
    b = _same(ctx, a, ctx.input(1))
    if not ctx.attr("fmod", 0):
        if a.dtype.is_float:
            raise ctx.error("fmod=0 is only defined for integers")
        return [ctx.op("mod", a, b)]
    trunc = _div(ctx)[0] if not a.dtype.is_float else _trunc(ctx, ctx.op("div", a, b))
    return [ctx.op("sub", a, ctx.op("mul", trunc, b))]


def _trunc(ctx: NodeContext, q: Tensor) -> Tensor:
    zero = ctx.scalar(0, q.dtype)
    return ctx.op("where", ctx.op("lt", q, zero), ctx.op("ceil", q), ctx.op("floor", q))


def _pow(ctx: NodeContext) -> list[Tensor]:
    base, exponent = ctx.input(0), ctx.input(1)
    if base.dtype.is_float:
        return [ctx.op("pow", base, ctx.cast(exponent, base.dtype))]
    power = ctx.cast(exponent, DType.f64)
    wide = ctx.op("pow", ctx.cast(base, DType.f64), power)
    # an integral power of an int is an int that f64 pow may miss by an ulp (3**6 =
    # 728.99...); round those, truncate the rest (as a cast does)
    integral = ctx.op("eq", ctx.op("floor", power), power)
    wide = ctx.op("where", integral, ctx.op("round", wide), wide)
    return [ctx.cast(wide, base.dtype)]


def _where(ctx: NodeContext) -> list[Tensor]:
    a = ctx.input(1)
    return [ctx.op("where", ctx.cast(ctx.input(0), DType.bool), a, _same(ctx, a, ctx.input(2)))]


def _variadic(name: str, mean: bool = False) -> Converter:
    def convert(ctx: NodeContext) -> list[Tensor]:
        args = [t for t in ctx.inputs if t is not None]
        if not args:
            raise ctx.error("needs at least one input")
        acc = args[0]
        for t in args[1:]:
            acc = ctx.op(name, acc, _same(ctx, acc, t))
        if mean:
            acc = ctx.op("div", acc, ctx.scalar(len(args), acc.dtype))
        return [acc]
    return convert


# ---- MatMul, Gemm ----------------------------------------------------------------------------


def _matmul(ctx: NodeContext) -> list[Tensor]:
    a = ctx.input(0)
    return [ctx.op("matmul", a, _same(ctx, a, ctx.input(1)))]


def _gemm(ctx: NodeContext) -> list[Tensor]:
    a, b, c = ctx.input(0), ctx.input(1), ctx.optional(2)
    if a.rank != 2 or b.rank != 2:
        raise ctx.error("A and B must be matrices")
    if ctx.attr("transA", 0):
        a = ctx.op("transpose", a, perm=(1, 0))
    if ctx.attr("transB", 0):
        b = ctx.op("transpose", b, perm=(1, 0))
    y = ctx.op("matmul", a, _same(ctx, a, b))
    alpha, beta = float(ctx.attr("alpha", 1.0)), float(ctx.attr("beta", 1.0))
    if alpha != 1.0:
        y = ctx.op("mul", y, ctx.scalar(alpha, y.dtype))
    if c is not None and beta != 0.0:
        if beta != 1.0:
            c = ctx.op("mul", c, ctx.scalar(beta, c.dtype))
        y = ctx.op("add", y, _same(ctx, y, c))
    return [y]


# ---- reductions ------------------------------------------------------------------------------


Body = Callable[[NodeContext, Tensor], Tensor]


@dataclass(frozen=True)
class Reduction:
    """An ONNX reduction as ``post(op(pre(x)))``; ``op`` is a tilefuse reduction."""

    op: str
    pre: Body | None = None
    post: Body | None = None


def _reduce_common(ctx: NodeContext, r: Reduction, axes: tuple[int, ...] | None,
                   noop: bool) -> list[Tensor]:
    x = ctx.input(0)
    keepdims = bool(ctx.attr("keepdims", 1))
    if not axes:
        if noop and r.pre is None and r.post is None:
            return [x]
        axes = () if noop else None  # noop_with_empty_axes: reduce nothing
    else:
        axes = tuple(sorted({ctx.axis(a, x.rank) for a in axes}))
    y = ctx.op(r.op, x if r.pre is None else r.pre(ctx, x), axes=axes, keepdims=keepdims)
    if r.post is not None:
        y = r.post(ctx, y)
    return [ctx.cast(y, x.dtype)]  # sum/prod/mean of integers stay in their type in ONNX


def _reduce_attr(r: Reduction) -> Converter:
    def convert(ctx: NodeContext) -> list[Tensor]:
        axes = ctx.attr("axes")
        return _reduce_common(ctx, r, None if axes is None else tuple(axes),
                              bool(ctx.attr("noop_with_empty_axes", 0)))
    return convert


def _reduce_input(r: Reduction) -> Converter:
    def convert(ctx: NodeContext) -> list[Tensor]:
        return _reduce_common(ctx, r, ctx.ints_input(1, "axes"),
                              bool(ctx.attr("noop_with_empty_axes", 0)))
    return convert


def _square(ctx: NodeContext, x: Tensor) -> Tensor:
    return ctx.op("mul", x, x)


def _log_sum_exp(ctx: NodeContext) -> list[Tensor]:
    """log(sum(exp(x - max))) + max over the axes, computed stably."""
    x = ctx.input(0)
    keepdims = bool(ctx.attr("keepdims", 1))
    given = ctx.attr("axes") if ctx.opset < 18 else ctx.ints_input(1, "axes")
    if not given and ctx.attr("noop_with_empty_axes", 0):
        return [x]  # log(exp(x)) over no axes
    axes = None if not given else tuple(sorted({ctx.axis(a, x.rank) for a in given}))
    reduced = range(x.rank) if axes is None else axes
    if any(x.shape[a] == 0 for a in reduced):  # the log of an empty sum
        shape = tuple(1 if a in reduced else d for a, d in enumerate(x.shape) if keepdims
                      or a not in reduced)
        return [ctx.const(np.full(shape, -np.inf, dtype=x.dtype.np))]
    peak = ctx.op("max", x, axes=axes, keepdims=True)
    finite = ctx.op("where", ctx.op("isnan", ctx.op("sub", peak, peak)),
                    ctx.scalar(0, x.dtype), peak)  # an infinite max shifts by 0
    total = ctx.op("sum", ctx.op("exp", ctx.op("sub", x, finite)), axes=axes, keepdims=keepdims)
    shift = finite if keepdims else ctx.op("reshape", finite, shape=total.shape)
    return [ctx.op("add", ctx.op("log", total), shift)]


_REDUCE: tuple[tuple[str, int, Reduction], ...] = (
    ("ReduceSum", 13, Reduction("sum")), ("ReduceMean", 18, Reduction("mean")),
    ("ReduceMax", 18, Reduction("max")), ("ReduceMin", 18, Reduction("min")),
    ("ReduceProd", 18, Reduction("prod")),
    ("ReduceL1", 18, Reduction("sum", pre=lambda ctx, x: ctx.op("abs", x))),
    ("ReduceL2", 18, Reduction("sum", pre=_square, post=lambda ctx, y: ctx.op("sqrt", y))),
    ("ReduceSumSquare", 18, Reduction("sum", pre=_square)),
    ("ReduceLogSum", 18, Reduction("sum", post=lambda ctx, y: ctx.op("log", y))),
)


def _arg(name: str) -> Converter:
    def convert(ctx: NodeContext) -> list[Tensor]:
        x = ctx.input(0)
        axis = ctx.axis(ctx.attr("axis", 0), x.rank)
        keepdims = bool(ctx.attr("keepdims", 1))
        if not ctx.attr("select_last_index", 0):
            return [ctx.op(name, x, axis=axis, keepdims=keepdims)]
        idx = ctx.op(name, _flip(ctx, x, axis), axis=axis, keepdims=keepdims)
        return [ctx.op("sub", ctx.scalar(x.shape[axis] - 1, DType.i64), idx)]
    return convert


def _flip(ctx: NodeContext, x: Tensor, axis: int) -> Tensor:
    n = x.rank
    return ctx.op("slice", x, starts=tuple(x.shape[axis] - 1 if i == axis else 0
                                           for i in range(n)),
                  stops=tuple(-_HUGE if i == axis else _HUGE for i in range(n)),
                  steps=tuple(-1 if i == axis else 1 for i in range(n)))


def _table() -> tuple[tuple[str, int, Converter], ...]:
    rows: list[tuple[str, int, Converter]] = []
    rows += [(onnx_op, since, _unary(name)) for onnx_op, since, name in _UNARY]
    rows += [(onnx_op, since, _binary(name)) for onnx_op, since, name in _BINARY]
    for onnx_op, since, name in _REDUCE:
        rows += [(onnx_op, 1, _reduce_attr(name)), (onnx_op, since, _reduce_input(name))]
    rows += [
        ("LeakyRelu", 1, _leaky_relu), ("Elu", 1, _elu), ("Selu", 1, _selu),
        ("HardSigmoid", 1, _hard_sigmoid), ("HardSwish", 14, _hard_swish),
        ("Softsign", 1, _softsign), ("PRelu", 7, _prelu), ("Gelu", 20, _gelu),
        ("Shrink", 9, _shrink), ("Celu", 12, _celu), ("ThresholdedRelu", 10, _thresholded_relu),
        ("Mish", 18, _mish), ("Sinh", 9, _hyperbolic("sub")), ("Cosh", 9, _hyperbolic("add")),
        ("Tan", 7, _tan),
        ("Cast", 6, _cast), ("CastLike", 15, _cast_like), ("Clip", 1, _clip_6),
        ("Clip", 11, _clip_11), ("Div", 7, _div), ("Mod", 10, _mod), ("Pow", 7, _pow),
        ("Where", 9, _where), ("Sum", 1, _variadic("add")), ("Mean", 1, _variadic("add", True)),
        ("Max", 1, _variadic("maximum")), ("Min", 1, _variadic("minimum")),
        ("MatMul", 1, _matmul), ("Gemm", 7, _gemm), ("ArgMax", 1, _arg("argmax")),
        ("ArgMin", 1, _arg("argmin")), ("ReduceLogSumExp", 1, _log_sum_exp),
    ]
    return tuple(rows)


CONVERTERS: tuple[tuple[str, int, Converter], ...] = _table()
CONVERTER_GEMM: Converter = _gemm  # shared with the pre-opset-7 Gemm
