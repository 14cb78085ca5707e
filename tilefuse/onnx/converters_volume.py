"""3-D convolution and pooling, and transposed convolution, built from tilefuse's 2-D ops.

tilefuse's window ops are 2-D (``conv2d``, ``max_pool2d``, ``avg_pool2d`` on NCHW). A 3-D
window over [N, C, D, H, W] is a sum (conv, avg) or maximum (max) over its KD depth taps of 2-D
windows: tap ``kd`` reads the depth slice ``kd·dd + od·sd`` of the depth-padded input for every
output depth ``od`` (one strided ``slice``), whose planes go through the 2-D op at once. The
average divides the sum of the per-tap 2-D averages by the depth taps counted (the 2-D count is
the same for every tap, so this is the 3-D average). A constant weight's per-tap slices fold at
import, so each 2-D conv still has a constant weight (and goes through im2col + matmul).

``ConvTranspose`` (1-D and 2-D) is the convolution of the input with zeros inserted between its
elements (stride - 1 per gap), padded by ``dilation·(k-1) - pad`` (plus ``output_padding`` at
the end), with the weight flipped and its in/out channel axes swapped per group.
"""

from __future__ import annotations

import math

import numpy as np

from tilefuse.onnx.context import NodeContext, Tensor
from tilefuse.ops.nn import window_out

_HUGE = 2**62


def _depth_taps(ctx: NodeContext, x: Tensor, kd: int, sd: int, dd: int, out_d: int
                ) -> list[Tensor]:
    """For each depth tap, the input slice [N, C, out_d, H, W] it reads (x already padded)."""
    taps = []
    for k in range(kd):
        start = k * dd
        taps.append(ctx.op("slice", x, starts=(0, 0, start, 0, 0),
                           stops=(_HUGE, _HUGE, start + (out_d - 1) * sd + 1, _HUGE, _HUGE),
                           steps=(1, 1, sd, 1, 1)))
    return taps


def _pad_depth(ctx: NodeContext, x: Tensor, before: int, after: int, value: float) -> Tensor:
    if not before and not after:
        return x
    return ctx.op("pad", x, pads=(0, 0, 0, 0, before, after, 0, 0, 0, 0), mode="constant",
                  value=value)


def conv3d(ctx: NodeContext, x: Tensor, w: Tensor, b: Tensor | None, strides: tuple[int, ...],
           dilations: tuple[int, ...], pads: tuple[int, ...], groups: int) -> Tensor:
    n, o = x.shape[0], w.shape[0]
    kd = w.shape[2]
    out_d = window_out(x.shape[2], kd, strides[0], dilations[0], pads[0], pads[3])
    xp = _pad_depth(ctx, x, pads[0], pads[3], 0.0)
    total: Tensor | None = None
    for k, tap in enumerate(_depth_taps(ctx, xp, kd, strides[0], dilations[0], out_d)):
        planes = ctx.op("transpose", tap, perm=(0, 2, 1, 3, 4))  # [N, Do, C, H, W]
        planes = ctx.op("reshape", planes, shape=(n * out_d, *planes.shape[2:]))
        wk = ctx.op("slice", w, starts=(0, 0, k, 0, 0), stops=(_HUGE, _HUGE, k + 1, _HUGE, _HUGE),
                    steps=(1,) * 5)
        wk = ctx.op("reshape", wk, shape=(w.shape[0], w.shape[1], *w.shape[3:]))
        y = ctx.op("conv2d", planes, wk, stride=strides[1:], dilation=dilations[1:],
                   padding=(pads[1], pads[2], pads[4], pads[5]), groups=groups)
        total = y if total is None else ctx.op("add", total, y)
    assert total is not None
    y = ctx.op("reshape", total, shape=(n, out_d, o, *total.shape[2:]))
    y = ctx.op("transpose", y, perm=(0, 2, 1, 3, 4))
    if b is not None:
        y = ctx.op("add", y, ctx.op("reshape", b, shape=(o, 1, 1, 1)))
    return y


def pool3d(ctx: NodeContext, name: str, x: Tensor, kernel: tuple[int, ...],
           strides: tuple[int, ...], dilations: tuple[int, ...], pads: tuple[int, ...],
           ceil_mode: bool, include_pad: bool) -> Tensor:
    n, c, d = x.shape[:3]
    kd, sd, dd = kernel[0], strides[0], dilations[0]
    out_d = window_out(d, kd, sd, dd, pads[0], pads[3], ceil_mode)
    overhang = max(0, (out_d - 1) * sd + dd * (kd - 1) + 1 - (d + pads[0] + pads[3]))
    fill = -math.inf if name == "max_pool2d" else 0.0
    xp = _pad_depth(ctx, x, pads[0], pads[3] + overhang, fill)
    attrs = {"kernel": kernel[1:], "stride": strides[1:], "ceil_mode": ceil_mode,
             "padding": (pads[1], pads[2], pads[4], pads[5])}
    if name == "max_pool2d":
        attrs["dilation"] = dilations[1:]
    else:
        attrs["count_include_pad"] = include_pad
    acc: Tensor | None = None
    for tap in _depth_taps(ctx, xp, kd, sd, dd, out_d):
        planes = ctx.op("reshape", tap, shape=(n, c * out_d, *tap.shape[3:]))
        y = ctx.op(name, planes, **attrs)
        acc = y if acc is None else ctx.op("maximum" if name == "max_pool2d" else "add", acc, y)
    assert acc is not None
    if name == "avg_pool2d":
        lo, hi = (-pads[0], d + pads[3]) if include_pad else (0, d)
        starts = np.arange(out_d) * sd - pads[0]
        counts = np.minimum(starts + kd, hi) - np.maximum(starts, lo)
        per_depth = np.repeat(counts.astype(x.dtype.np)[None, :], c, axis=0).reshape(1, -1, 1, 1)
        acc = ctx.op("div", acc, ctx.const(per_depth))
    return ctx.op("reshape", acc, shape=(n, c, out_d, *acc.shape[2:]))


def _insert_zeros(ctx: NodeContext, x: Tensor, axis: int, stride: int) -> Tensor:
    """x with ``stride - 1`` zeros between neighbours along ``axis``."""
    if stride == 1 or x.shape[axis] <= 1:
        return x
    spread = ctx.op("expand_dims", x, axes=(axis + 1,))
    zeros_shape = (*x.shape[:axis + 1], stride - 1, *x.shape[axis + 1:])
    spread = ctx.op("concat", spread, ctx.const_zeros(zeros_shape, x.dtype), axis=axis + 1)
    n = x.shape[axis]
    flat = ctx.op("reshape", spread, shape=(*x.shape[:axis], n * stride, *x.shape[axis + 1:]))
    stops = tuple((n - 1) * stride + 1 if a == axis else _HUGE for a in range(x.rank))
    return ctx.op("slice", flat, starts=(0,) * x.rank, stops=stops, steps=(1,) * x.rank)


def conv_transpose2d(ctx: NodeContext, x: Tensor, w: Tensor, b: Tensor | None,
                     strides: tuple[int, int], dilations: tuple[int, int],
                     pads: tuple[int, int, int, int], extra: tuple[int, int],
                     groups: int) -> Tensor:
    """x [N, C, H, W], w [C, O/groups, KH, KW]; pads (top, left, bottom, right) of the
    transposed conv; ``extra`` the output_padding rows and columns (added at the end)."""
    c, og, kh, kw = w.shape
    if c % groups or x.shape[1] != c:
        raise ctx.error(f"W {list(w.shape)} does not match X channels {x.shape[1]} with "
                        f"group={groups}")
    flipped = ctx.op("slice", w, starts=(0, 0, kh - 1, kw - 1), stops=(_HUGE, _HUGE, -_HUGE,
                                                                          -_HUGE),
                     steps=(1, 1, -1, -1))
    cg = c // groups
    wt = ctx.op("reshape", flipped, shape=(groups, cg, og, kh, kw))
    wt = ctx.op("transpose", wt, perm=(0, 2, 1, 3, 4))
    wt = ctx.op("reshape", wt, shape=(groups * og, cg, kh, kw))
    spread = _insert_zeros(ctx, _insert_zeros(ctx, x, 2, strides[0]), 3, strides[1])
    span = (dilations[0] * (kh - 1), dilations[1] * (kw - 1))
    padding = (span[0] - pads[0], span[1] - pads[1], span[0] - pads[2] + extra[0],
               span[1] - pads[3] + extra[1])
    if min(padding) < 0:
        raise ctx.error(f"pads {list(pads)} larger than the dilated kernel are not supported")
    args = [spread, wt] if b is None else [spread, wt, b]
    return ctx.op("conv2d", *args, stride=(1, 1), dilation=dilations, padding=padding,
                  groups=groups)
