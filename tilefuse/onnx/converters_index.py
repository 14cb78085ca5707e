"""Converters that compare positions with indices: OneHot, Hardmax, CumSum; scatters and TopK
(tilefuse's scatter_elements, scatter_nd and topk ops); and Einsum, DepthToSpace and
SpaceToDepth, which are rearrangements of existing ops.

CumSum and CumProd are tilefuse's ``cumsum`` / ``cumprod`` scan ops (:mod:`tilefuse.ops.scan`,
the one definition the torch frontend uses too: a sequential running value, so integers stay
exact and an inf or NaN reaches only the positions after it), between flips for ``reverse``
and a shift by one for ``exclusive`` (``scan_along``); integer results are cast back to the
input's dtype (the scan runs integers in i64).
"""

from __future__ import annotations

import numpy as np

from tilefuse.dtypes import DType
from tilefuse.onnx.context import NodeContext, Tensor

MAX_DEPTH = 1 << 24
"""OneHot's largest depth (a guard against a hostile constant)."""


def _along(rank: int, axis: int, values: np.ndarray) -> np.ndarray:
    """A 1-D array shaped to broadcast along ``axis`` of a rank-``rank`` tensor."""
    shape = [1] * rank
    shape[axis] = len(values)
    return values.reshape(shape)


def _one_hot(ctx: NodeContext) -> list[Tensor]:
    indices, values = ctx.input(0), ctx.input(2)
    depth = ctx.const_input(1, "depth")
    if depth is None or depth.size != 1 or values.shape != (2,):
        raise ctx.error("needs a scalar depth and values [off, on]")
    n = int(depth.reshape(-1)[0])
    if not 0 < n <= MAX_DEPTH:
        raise ctx.error(f"depth {n} is outside 1..{MAX_DEPTH}")
    rank = indices.rank + 1
    axis = ctx.axis(ctx.attr("axis", -1), rank)
    idx = ctx.cast(indices, DType.i64)
    idx = ctx.op("where", ctx.op("lt", idx, ctx.scalar(0, DType.i64)),
                 ctx.op("add", idx, ctx.scalar(n, DType.i64)), idx)  # -1 means depth - 1
    hot = ctx.op("eq", ctx.op("expand_dims", idx, axes=(axis,)),
                 ctx.const(_along(rank, axis, np.arange(n, dtype=np.int64))))
    off, on = (ctx.slice_axis(values, 0, i, i + 1) for i in (0, 1))
    return [ctx.op("where", hot, ctx.op("reshape", on, shape=()),
                   ctx.op("reshape", off, shape=()))]


def _hardmax_along(ctx: NodeContext, x: Tensor, axis: int) -> Tensor:
    first = ctx.op("argmax", x, axis=axis, keepdims=True)
    hot = ctx.op("eq", first, ctx.const(_along(x.rank, axis,
                                               np.arange(x.shape[axis], dtype=np.int64))))
    return ctx.cast(hot, x.dtype)


def _hardmax_1(ctx: NodeContext) -> list[Tensor]:
    """Before opset 13: over the input coerced to 2-D at ``axis`` (default 1)."""
    x = ctx.input(0)
    axis = ctx.axis(ctx.attr("axis", 1), x.rank)
    flat = ctx.op("reshape", x, shape=(int(np.prod(x.shape[:axis])), int(np.prod(x.shape[axis:]))))
    return [ctx.op("reshape", _hardmax_along(ctx, flat, 1), shape=x.shape)]


def _hardmax_13(ctx: NodeContext) -> list[Tensor]:
    x = ctx.input(0)
    return [_hardmax_along(ctx, x, ctx.axis(ctx.attr("axis", -1), x.rank))]


def _shifted(ctx: NodeContext, x: Tensor, axis: int, by: int, fill: float) -> Tensor:
    """x moved ``by`` positions towards higher indices along ``axis``, ``fill`` coming in."""
    n = x.shape[axis]
    if by >= n:
        return ctx.const(np.full(x.shape, fill, dtype=x.dtype.np))
    kept = ctx.slice_axis(x, axis, 0, n - by)
    filled = list(x.shape)
    filled[axis] = by
    return ctx.op("concat", ctx.const(np.full(filled, fill, dtype=x.dtype.np)), kept, axis=axis)


def _flip(ctx: NodeContext, x: Tensor, axis: int) -> Tensor:
    return ctx.slice_axis(x, axis, x.shape[axis] - 1, -(2**62), -1)


def scan_along(ctx: NodeContext, op: str, identity: float) -> Tensor:
    """The node's inclusive (or ``exclusive``, or ``reverse``) scan of input 0 by ``op`` along
    the axis of input 1: CumSum ("add", 0) and CumProd ("mul", 1)."""
    x = ctx.input(0)
    given = ctx.ints_input(1, "axis")
    if not given or len(given) != 1:
        raise ctx.error("needs a scalar axis")
    axis = ctx.axis(given[0], x.rank)
    reverse = bool(ctx.attr("reverse", 0))
    y = _flip(ctx, x, axis) if reverse else x
    if ctx.attr("exclusive", 0):
        y = _shifted(ctx, y, axis, 1, identity)
    scan = {"add": "cumsum", "mul": "cumprod"}[op]
    y = ctx.cast(ctx.op(scan, y, axis=axis), x.dtype)
    return _flip(ctx, y, axis) if reverse else y


def _cum_sum(ctx: NodeContext) -> list[Tensor]:
    return [scan_along(ctx, "add", 0)]


def _einsum(ctx: NodeContext) -> list[Tensor]:
    equation = ctx.attr("equation")
    if not isinstance(equation, str):
        raise ctx.error("needs an equation")
    return [ctx.op("einsum", *(ctx.input(i) for i in range(len(ctx.inputs))),
                   equation=equation.replace(" ", ""))]


def _depth_to_space(ctx: NodeContext) -> list[Tensor]:
    x, b = ctx.input(0), int(ctx.attr("blocksize", 0))
    if x.rank != 4 or b < 1 or x.shape[1] % (b * b):
        raise ctx.error(f"needs an NCHW input whose channels divide by blocksize² ({b}²)")
    n, c, h, w = x.shape
    if ctx.attr("mode", "DCR") == "CRD":
        split, perm = (n, c // (b * b), b, b, h, w), (0, 1, 4, 2, 5, 3)
    else:
        split, perm = (n, b, b, c // (b * b), h, w), (0, 3, 4, 1, 5, 2)
    moved = ctx.op("transpose", ctx.op("reshape", x, shape=split), perm=perm)
    return [ctx.op("reshape", moved, shape=(n, c // (b * b), h * b, w * b))]


def _space_to_depth(ctx: NodeContext) -> list[Tensor]:
    x, b = ctx.input(0), int(ctx.attr("blocksize", 0))
    if x.rank != 4 or b < 1 or x.shape[2] % b or x.shape[3] % b:
        raise ctx.error(f"needs an NCHW input whose height and width divide by blocksize {b}")
    n, c, h, w = x.shape
    split = ctx.op("reshape", x, shape=(n, c, h // b, b, w // b, b))
    crd = ctx.attr("mode", "DCR") == "CRD"  # channel-major blocks (the mode attribute is new)
    moved = ctx.op("transpose", split, perm=(0, 1, 3, 5, 2, 4) if crd else (0, 3, 5, 1, 2, 4))
    return [ctx.op("reshape", moved, shape=(n, c * b * b, h // b, w // b))]


def _scatter_elements(ctx: NodeContext) -> list[Tensor]:
    data = ctx.input(0)
    return [ctx.op("scatter_elements", data, ctx.input(1), ctx.cast(ctx.input(2), data.dtype),
                   axis=ctx.axis(ctx.attr("axis", 0), data.rank),
                   reduction=ctx.attr("reduction", "none"))]


def _scatter_nd(ctx: NodeContext) -> list[Tensor]:
    data = ctx.input(0)
    return [ctx.op("scatter_nd", data, ctx.input(1), ctx.cast(ctx.input(2), data.dtype),
                   reduction=ctx.attr("reduction", "none"))]


def _top_k(ctx: NodeContext) -> list[Tensor]:
    x = ctx.input(0)
    if ctx.opset < 10:
        k = ctx.attr("k")
    else:
        given = ctx.ints_input(1, "K")
        k = given[0] if given and len(given) == 1 else None
    if k is None:
        raise ctx.error("needs a scalar K")
    return ctx.ops("topk", x, k=int(k), axis=ctx.axis(ctx.attr("axis", -1), x.rank),
                   largest=bool(ctx.attr("largest", 1)))


CONVERTERS = (
    ("ScatterElements", 11, _scatter_elements), ("Scatter", 9, _scatter_elements),
    ("ScatterND", 11, _scatter_nd), ("TopK", 1, _top_k),
    ("OneHot", 9, _one_hot), ("Hardmax", 1, _hardmax_1), ("Hardmax", 13, _hardmax_13),
    ("CumSum", 11, _cum_sum), ("Einsum", 12, _einsum),
    ("DepthToSpace", 1, _depth_to_space), ("SpaceToDepth", 1, _space_to_depth),
)
