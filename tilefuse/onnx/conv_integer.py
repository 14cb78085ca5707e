"""ONNX ConvInteger on the int8 convolution kernel ``qconv_i8`` (VNNI on the CPU), exactly.

ConvInteger is ``y = conv(x - x_zero, w - w_zero)`` in i32 (u8 or i8 operands; a zero padding of
``x - x_zero``). The general converter computes it in f64 (exact below 2^53, but an f64
convolution). When the weight is a constant whose centred codes ``w - w_zero`` are in
-127..127 (the int8 kernels' weight codes), x is u8 or i8 with a scalar zero point (a constant,
or computed at run time as ``quantize_dynamic``'s DynamicQuantizeLinear does) and the convolution
is 2-D with group 1, it runs on ``qconv_i8``:

* ``qconv_i8`` quantizes its NHWC f32 input statically with scale 1 and zero point 0 over x's
  code range, so its codes are x itself, and its i32 sums ``acc'`` are the exact products of
  x (zero padded) by the centred weight. It writes ``f32(acc') · 1 + 0``, exact while
  ``|acc'| <= 2^24``: the input channels are split into as few chunks as keep every output
  channel's worst case (x at the end of its range that maximises the sum) within that bound,
  one ``qconv_i8`` a chunk, their exact i32 values added.
* The zero point enters as a correction: the padded taps read x = 0, and every in-bounds tap
  reads x where ConvInteger reads ``x - x_zero``, so ``y = acc' - x_zero · C`` with
  ``C[o, oh, ow]`` the sum of the centred weight over the taps of window (oh, ow) that fall
  inside the input (a constant, computed here in integers).

The result is bit-exact (tests/onnx/test_conv_integer.py compares with NumPy int32 sums). Other
ConvIntegers keep the f64 path, logged on the ``passes`` topic with the reason.
"""

from __future__ import annotations

import itertools
import math

import numpy as np

from tilefuse.dtypes import DType
from tilefuse.onnx.context import NodeContext, Tensor
from tilefuse.onnx.converters_nn import _geometry, _kernel

F32_EXACT = 1 << 24
"""The largest magnitude below which every integer is an f32."""
MAX_K8 = 65536
"""The int8 kernel's largest K (:data:`tilefuse.kernel.quant_ir.MAX_K8`)."""
_RANGES = {DType.u8: (0, 255), DType.i8: (-128, 127)}


def _blocker(x: Tensor, x_zero: Tensor | None, w: Tensor, w_zero: Tensor | None,
             group: int) -> str | None:
    """Why this ConvInteger cannot run on ``qconv_i8``, else None."""
    if x.rank != 4 or group != 1:
        return f"only 2-D convolutions with group 1 are mapped (rank {x.rank}, group {group})"
    if not all(isinstance(d, int) for d in x.shape):
        return f"x has symbolic dims {list(x.shape)}"
    if x.dtype not in _RANGES:
        return f"x is {x.dtype.value}, not u8 or i8"
    if x_zero is not None and math.prod(x_zero.shape) != 1:
        return "x's zero point is not a scalar"
    if w.const is None or w.dtype not in _RANGES:
        return "the weight is not a constant u8 or i8 tensor"
    if w_zero is not None and w_zero.const is None:
        return "the weight's zero point is not a constant"
    return None


def _centred_weight(w: Tensor, w_zero: Tensor | None) -> np.ndarray:
    wc = w.const.astype(np.int64)   # type: ignore[union-attr]
    if w_zero is not None:
        z = w_zero.const.astype(np.int64).reshape(-1)   # type: ignore[union-attr]
        wc = wc - (z.reshape(-1, 1, 1, 1) if z.size > 1 else z[0])
    return wc


def _chunks(wt: np.ndarray, lo: int, hi: int) -> list[tuple[int, int]] | None:
    """The fewest channel ranges of ``wt`` [KH, KW, C, O] whose sums stay exact in f32 for
    codes in [lo, hi] (and within the kernel's K); None when a single channel does not."""
    kh, kw, c, _ = wt.shape
    pos = np.clip(wt, 0, None).sum(axis=(0, 1))       # [C, O]
    neg = np.clip(-wt, 0, None).sum(axis=(0, 1))
    for count in range(1, c + 1):
        bounds = np.linspace(0, c, count + 1).astype(int)
        ranges = [(int(a), int(b)) for a, b in itertools.pairwise(bounds) if b > a]
        worst = max(max(np.max(np.abs(hi * pos[a:b].sum(0) - lo * neg[a:b].sum(0))),
                        np.max(np.abs(lo * pos[a:b].sum(0) - hi * neg[a:b].sum(0))))
                    for a, b in ranges)
        if worst <= F32_EXACT and max(b - a for a, b in ranges) * kh * kw <= MAX_K8:
            return ranges
    return None


def _inside_sums(wc: np.ndarray, size: tuple[int, int], out: tuple[int, int],
                 stride: tuple[int, int], dilation: tuple[int, int],
                 padding: tuple[int, int, int, int]) -> np.ndarray:
    """C[o, oh, ow]: the centred weight summed over the taps of each window inside the input
    (int64)."""
    top, left = padding[0], padding[1]
    per_tap = wc.sum(axis=1)   # [O, KH, KW]
    _, kh, kw = per_tap.shape
    result = np.zeros((wc.shape[0], *out), np.int64)
    for a in range(kh):
        rows = np.arange(out[0]) * stride[0] + a * dilation[0] - top
        row_in = (rows >= 0) & (rows < size[0])
        for b in range(kw):
            cols = np.arange(out[1]) * stride[1] + b * dilation[1] - left
            col_in = (cols >= 0) & (cols < size[1])
            mask = row_in[:, None] & col_in[None, :]
            result += per_tap[:, a, b][:, None, None] * mask[None]
    return result


def conv_integer_native(ctx: NodeContext, x: Tensor, x_zero: Tensor | None, w: Tensor,
                        w_zero: Tensor | None) -> Tensor | str:
    """The node's ConvInteger through ``qconv_i8`` (module docstring), or why it cannot."""
    why = _blocker(x, x_zero, w, w_zero, int(ctx.attr("group", 1)))
    if why is not None:
        return why
    if w.rank != x.rank:
        return "X and W differ in rank"
    kernel = _kernel(ctx, x, tuple(w.shape[2:]))
    stride, dilation, padding = _geometry(ctx, x, kernel)
    if dilation[1] != 1:
        return f"dilation {dilation[1]} along W (the kernel reads runs along W)"
    wc = _centred_weight(w, w_zero)
    if wc.size and (wc.min() < -127 or wc.max() > 127):
        return "the centred weight codes leave -127..127"
    lo, hi = _RANGES[x.dtype]
    wt = wc.transpose(2, 3, 1, 0)   # [KH, KW, C, O]: the window's row order
    ranges = _chunks(wt, lo, hi)
    if ranges is None:
        return "one channel's sums can exceed 2^24 (not exact through f32)"
    n, c, h, wd = (int(d) for d in x.shape)
    o = int(wc.shape[0])
    top, left, bottom, right = padding
    oh = (h + top + bottom - dilation[0] * (kernel[0] - 1) - 1) // stride[0] + 1
    ow = (wd + left + right - dilation[1] * (kernel[1] - 1) - 1) // stride[1] + 1
    if oh < 1 or ow < 1:
        return "the window does not fit the input"
    p = ctx.op("transpose", ctx.cast(x, DType.f32), perm=(0, 2, 3, 1))
    ones, zeros = ctx.const(np.ones(o, np.float32)), ctx.const(np.zeros(o, np.float32))
    attrs = {"kernel": tuple(kernel), "strides": tuple(stride), "dilations": tuple(dilation),
             "pads": (top, bottom, left, right), "x_scale": 1.0, "x_zero": 0, "x_min": lo,
             "x_max": hi}
    acc: Tensor | None = None
    for a, b in ranges:
        part = p if (a, b) == (0, c) else ctx.op(
            "slice", p, starts=(0, 0, 0, a), stops=(n, h, wd, b), steps=(1, 1, 1, 1))
        wq = ctx.const(np.ascontiguousarray(wt[:, :, a:b, :]).reshape(-1, o).astype(np.int8))
        y = ctx.cast(ctx.op("qconv_i8", part, wq, ones, zeros, **attrs), DType.i32)
        acc = y if acc is None else ctx.op("add", acc, y)
    assert acc is not None
    y = ctx.op("transpose", ctx.op("reshape", acc, shape=(n, oh, ow, o)), perm=(0, 3, 1, 2))
    if x_zero is not None:
        inside = _inside_sums(wc, (h, wd), (oh, ow), stride, dilation, padding)
        zero = ctx.op("reshape", ctx.cast(x_zero, DType.i32), shape=())
        y = ctx.op("sub", y, ctx.op("mul", zero, ctx.const(inside.astype(np.int32))))
    return y


__all__ = ["conv_integer_native"]
