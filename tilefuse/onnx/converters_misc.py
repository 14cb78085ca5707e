"""More ONNX ops composed from tilefuse ops: RotaryEmbedding, CumProd, LpNormalization,
LpPool, IsInf, Swish, EyeLike and CenterCropPad.

RotaryEmbedding rotates pairs of each head's first ``rotary_embedding_dim`` features (the two
halves, or even/odd features when ``interleaved``) by the cached angles of each position:
``(x1, x2) -> (cos·x1 - sin·x2, sin·x1 + cos·x2)``; with ``position_ids`` the caches are
gathered per position first. CumProd is CumSum's log-step scan with products.
"""

from __future__ import annotations

import numpy as np

from tilefuse.onnx.context import NodeContext, Tensor
from tilefuse.onnx.converters_index import scan_along
from tilefuse.onnx.converters_nn import pool_with
from tilefuse.onnx.tensors import to_dtype


def _rotary_embedding(ctx: NodeContext) -> list[Tensor]:
    x, cos, sin, positions = ctx.input(0), ctx.input(1), ctx.input(2), ctx.optional(3)
    if x.rank == 4:   # [B, heads, S, D] -> [B, S, heads, D]
        x4 = ctx.op("transpose", x, perm=(0, 2, 1, 3))
    elif x.rank == 3:
        heads = int(ctx.attr("num_heads", 0))
        if heads <= 0 or x.shape[2] % heads:
            raise ctx.error(f"a 3-D input {list(x.shape)} needs num_heads dividing its last dim")
        b, s, hidden = x.shape
        x4 = ctx.op("reshape", x, shape=(b, s, heads, hidden // heads))
    else:
        raise ctx.error(f"needs a 3-D or 4-D input, got {list(x.shape)}")
    head = x4.shape[3]
    rotated = int(ctx.attr("rotary_embedding_dim", 0)) or head
    half = rotated // 2
    if positions is not None:
        cos, sin = (ctx.op("take", c, positions, axis=0) for c in (cos, sin))
    if cos.shape[-1] != half or sin.shape[-1] != half:
        raise ctx.error(f"the caches' last dim must be rotary_embedding_dim/2 = {half}")
    cos, sin = (ctx.op("expand_dims", ctx.cast(c, x.dtype), axes=(2,)) for c in (cos, sin))
    if ctx.attr("interleaved", 0):
        x1, x2 = ctx.slice_axis(x4, -1, 0, rotated, 2), ctx.slice_axis(x4, -1, 1, rotated, 2)
    else:
        x1, x2 = ctx.slice_axis(x4, -1, 0, half), ctx.slice_axis(x4, -1, half, rotated)
    real = ctx.op("sub", ctx.op("mul", cos, x1), ctx.op("mul", sin, x2))
    imag = ctx.op("add", ctx.op("mul", sin, x1), ctx.op("mul", cos, x2))
    if ctx.attr("interleaved", 0):
        pairs = ctx.op("stack", real, imag, axis=-1)
        out = ctx.op("reshape", pairs, shape=(*x4.shape[:3], rotated))
    else:
        out = ctx.op("concat", real, imag, axis=-1)
    if rotated < head:
        out = ctx.op("concat", out, ctx.slice_axis(x4, -1, rotated, head), axis=-1)
    if x.rank == 4:
        return [ctx.op("transpose", out, perm=(0, 2, 1, 3))]
    return [ctx.op("reshape", out, shape=x.shape)]


def _cum_prod(ctx: NodeContext) -> list[Tensor]:
    return [scan_along(ctx, "mul", 1)]


def _lp_norm_of(ctx: NodeContext, x: Tensor, p: int, axes: tuple[int, ...]) -> Tensor:
    if p == 1:
        return ctx.op("sum", ctx.op("abs", x), axes=axes, keepdims=True)
    if p == 2:
        return ctx.op("sqrt", ctx.op("sum", ctx.op("mul", x, x), axes=axes, keepdims=True))
    raise ctx.error(f"p={p} is not supported (1 or 2)")


def _lp_normalization(ctx: NodeContext) -> list[Tensor]:
    x = ctx.input(0)
    axis = ctx.axis(ctx.attr("axis", -1), x.rank)
    norm = _lp_norm_of(ctx, x, int(ctx.attr("p", 2)), (axis,))
    zero = ctx.op("eq", norm, ctx.scalar(0, x.dtype))  # a zero vector stays zero
    safe = ctx.op("where", zero, ctx.scalar(1, x.dtype), norm)
    return [ctx.op("div", x, safe)]


def _lp_pool(ctx: NodeContext) -> list[Tensor]:
    """(Σ |x|^p over each window)^(1/p): an average pool of |x|^p (padding counted) times
    the window size, then the root."""
    x, p = ctx.input(0), int(ctx.attr("p", 2))
    if p < 1:
        raise ctx.error(f"p={p} must be a positive integer")
    powered = ctx.op("pow", ctx.op("abs", x), ctx.scalar(p, x.dtype))
    window = int(np.prod(ctx.attr("kernel_shape")))
    mean = pool_with(ctx, "avg_pool2d", powered, count_include_pad=True, zero_pad_first=True)
    total = ctx.op("mul", mean, ctx.scalar(window, x.dtype))
    return [ctx.op("pow", total, ctx.scalar(1.0 / p, x.dtype))]


def _is_inf(ctx: NodeContext) -> list[Tensor]:
    x = ctx.input(0)
    if not x.dtype.is_float:
        return [ctx.const(np.zeros(x.shape, dtype=bool))]
    tests = []
    if ctx.attr("detect_positive", 1):
        tests.append(ctx.op("eq", x, ctx.scalar(np.inf, x.dtype)))
    if ctx.attr("detect_negative", 1):
        tests.append(ctx.op("eq", x, ctx.scalar(-np.inf, x.dtype)))
    if not tests:
        return [ctx.const(np.zeros(x.shape, dtype=bool))]
    return [tests[0] if len(tests) == 1 else ctx.op("logical_or", *tests)]


def _swish(ctx: NodeContext) -> list[Tensor]:
    x = ctx.input(0)
    alpha = ctx.scalar(float(ctx.attr("alpha", 1.0)), x.dtype)
    return [ctx.op("mul", x, ctx.op("sigmoid", ctx.op("mul", x, alpha)))]


def _eye_like(ctx: NodeContext) -> list[Tensor]:
    x = ctx.input(0)
    if x.rank != 2:
        raise ctx.error(f"needs a 2-D input, got {list(x.shape)}")
    given = ctx.attr("dtype")
    dtype = x.dtype if given is None else to_dtype(int(given), "dtype")
    eye = np.eye(x.shape[0], x.shape[1], k=int(ctx.attr("k", 0)))
    return [ctx.const(eye.astype(dtype.np))]


def _center_crop_pad(ctx: NodeContext) -> list[Tensor]:
    x = ctx.input(0)
    shape = ctx.ints_input(1, "shape")
    axes = tuple(ctx.axis(a, x.rank) for a in (ctx.attr("axes") or range(x.rank)))
    if shape is None or len(shape) != len(axes):
        raise ctx.error(f"needs one target size per axis ({len(axes)})")
    starts, stops, pads = [0] * x.rank, list(x.shape), [0] * (2 * x.rank)
    for a, want in zip(axes, shape):
        have = x.shape[a]
        if want < have:       # crop: the centre, the extra element on the right
            starts[a] = (have - want) // 2
            stops[a] = starts[a] + want
        elif want > have:     # pad with zeros: the extra element on the right
            pads[2 * a] = (want - have) // 2
            pads[2 * a + 1] = want - have - pads[2 * a]
    y = ctx.op("slice", x, starts=tuple(starts), stops=tuple(stops), steps=(1,) * x.rank)
    if any(pads):
        y = ctx.op("pad", y, pads=tuple(pads), mode="constant", value=0.0)
    return [y]


CONVERTERS = (
    ("RotaryEmbedding", 23, _rotary_embedding), ("CumProd", 26, _cum_prod),
    ("LpNormalization", 1, _lp_normalization), ("LpPool", 2, _lp_pool),
    ("IsInf", 10, _is_inf), ("Swish", 24, _swish), ("EyeLike", 9, _eye_like),
    ("CenterCropPad", 18, _center_crop_pad),
)
