"""ONNX ConvInteger whose activation zero point is computed at run time (``quantize_dynamic``'s
DynamicQuantizeLinear makes it), on ``qconv_i8``'s raw i32 sums, exactly.

ConvInteger is ``y = conv(x - x_zero, w - w_zero)`` in i32, a zero padding of ``x - x_zero``.
With a constant zero point the converter (:func:`tilefuse.onnx.converters_quant._conv_integer`)
gives ``qconv_i8`` the centred input. A run-time zero point cannot be an attribute, so here
``qconv_i8`` reads x itself (static quantization with scale 1 and zero point 0 over x's code
range: its codes are x) and the zero point enters as a correction: the padded taps read 0,
every in-bounds tap reads x where ConvInteger reads ``x - x_zero``, so

    y = acc' - x_zero · C,   C[o, oh, ow] = the centred weight summed over the taps of
                                          window (oh, ow) inside the input (a constant)

all in exact integers (i32 sums, i64 constants). Conditions as for the constant case: a 2-D,
group-1 convolution of static u8/i8 x with a scalar zero point, a constant weight whose
centred codes fit i8, no dilation along W; otherwise the reason is returned and the converter
keeps the f64 path.
"""

from __future__ import annotations

import math

import numpy as np

from tilefuse.dtypes import DType
from tilefuse.onnx.context import NodeContext, Tensor
from tilefuse.onnx.converters_nn import _geometry, _kernel

MAX_K8 = 65536
"""The int8 kernel's largest K (:data:`tilefuse.kernel.quant_ir.MAX_K8`)."""
_RANGES = {DType.u8: (0, 255), DType.i8: (-128, 127)}


def _blocker(x: Tensor, x_zero: Tensor | None, w: Tensor, w_zero: Tensor | None,
             group: int) -> str | None:
    """Why this ConvInteger cannot run on ``qconv_i8`` with a correction, else None."""
    if x.rank != 4 or group != 1:
        return f"only 2-D convolutions with group 1 are mapped (rank {x.rank}, group {group})"
    if not all(isinstance(d, int) for d in x.shape) or x.dtype not in _RANGES:
        return f"x is {x.dtype.value} of shape {list(x.shape)}, not a static u8 or i8 tensor"
    if x_zero is None or math.prod(x_zero.shape) != 1:
        return "x's zero point is not a scalar"
    if w.const is None or w.rank != 4 or w.dtype not in _RANGES or \
            (w_zero is not None and w_zero.const is None):
        return "the weight or its zero point is not a constant u8 or i8"
    return None


def _centred_weight(w: Tensor, w_zero: Tensor | None) -> np.ndarray:
    wc = w.const.astype(np.int64)   # type: ignore[union-attr]
    if w_zero is not None:
        z = w_zero.const.astype(np.int64).reshape(-1)   # type: ignore[union-attr]
        wc = wc - (z.reshape(-1, 1, 1, 1) if z.size > 1 else z[0])
    return wc


def inside_sums(wc: np.ndarray, size: tuple[int, int], out: tuple[int, int],
                stride: tuple[int, int], dilation: tuple[int, int],
                padding: tuple[int, int, int, int]) -> np.ndarray:
    """C[o, oh, ow]: the centred weight ``wc`` [O, C, KH, KW] summed over the taps of each
    window that fall inside the input (``padding`` is (top, left, bottom, right)), int64."""
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


def conv_integer_runtime_zero(ctx: NodeContext, x: Tensor, x_zero: Tensor | None, w: Tensor,
                              w_zero: Tensor | None) -> Tensor | str:
    """The node's ConvInteger through raw ``qconv_i8`` and the zero point's correction (module
    docstring), or why it cannot."""
    why = _blocker(x, x_zero, w, w_zero, int(ctx.attr("group", 1)))
    if why is not None:
        return why
    assert x_zero is not None
    kernel = _kernel(ctx, x, tuple(w.shape[2:]))
    stride, dilation, padding = _geometry(ctx, x, kernel)
    if dilation[1] != 1:
        return f"dilation {dilation[1]} along W (the kernel reads runs along W)"
    wc = _centred_weight(w, w_zero)
    if wc.size and (wc.min() < -128 or wc.max() > 127):
        return "the centred weight w - w_zero does not fit i8"
    o, c, kh, kw = (int(d) for d in wc.shape)
    if kh * kw * c > MAX_K8:
        return f"K = {kh * kw * c} is over the int8 kernel's {MAX_K8}"
    n, _, h, wd = (int(d) for d in x.shape)
    top, left, bottom, right = padding
    oh = (h + top + bottom - dilation[0] * (kh - 1) - 1) // stride[0] + 1
    ow = (wd + left + right - dilation[1] * (kw - 1) - 1) // stride[1] + 1
    if oh < 1 or ow < 1:
        return "the window does not fit the input"
    lo, hi = _RANGES[x.dtype]
    p = ctx.op("transpose", ctx.cast(x, DType.f32), perm=(0, 2, 3, 1))
    wk = ctx.const(np.ascontiguousarray(wc.transpose(2, 3, 1, 0)).reshape(-1, o).astype(np.int8))
    acc = ctx.op("qconv_i8", p, wk, ctx.const(np.ones(o, np.float32)),
                 ctx.const(np.zeros(o, np.float32)), kernel=(kh, kw), strides=tuple(stride),
                 dilations=tuple(dilation), pads=(top, bottom, left, right), x_scale=1.0,
                 x_zero=0, x_min=lo, x_max=hi, raw=True)
    y = ctx.op("transpose", ctx.op("reshape", acc, shape=(n, oh, ow, o)), perm=(0, 3, 1, 2))
    inside = inside_sums(wc, (h, wd), (oh, ow), stride, dilation, padding)
    zero = ctx.op("reshape", ctx.cast(x_zero, DType.i32), shape=())
    return ctx.op("sub", y, ctx.op("mul", zero, ctx.const(inside.astype(np.int32))))


__all__ = ["conv_integer_runtime_zero", "inside_sums"]
