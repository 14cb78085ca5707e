"""ONNX's linear quantization ops, built from tilefuse ops: QuantizeLinear, DequantizeLinear,
DynamicQuantizeLinear, MatMulInteger, QLinearMatMul, ConvInteger and QLinearConv.

Quantized types are u8, i8 and i16 (tilefuse has no u16, int4 or float8 types: models using
them are refused by the importer's type check). A scale or zero point is a scalar, a vector
along ``axis``, or (``block_size``) one value per block of ``axis``, repeated over the block.
Quantizing rounds half to even (``round``), adds the zero point and saturates; integer products
accumulate exactly in i32 (i8 and u8 products of any realistic K fit); integer convolutions run
tilefuse's float conv2d in f64 on the centred operands, which is exact while the sums stay below
2^53 (zero padding of ``x - x_zero`` is padding ``x`` with its zero point, as the operators
define it); a 2-D ConvInteger with a constant weight runs on ``qconv_i8``'s raw i32 sums
instead (VNNI, exact; x's zero point computed at run time, as DynamicQuantizeLinear makes it,
is a correction: :mod:`tilefuse.onnx.conv_integer`). The QLinear ops then rescale by
``a_scale · b_scale / y_scale`` in f32 and requantize.
"""

from __future__ import annotations

import math

import numpy as np

from tilefuse.dtypes import DType
from tilefuse.log import get_logger
from tilefuse.onnx.context import NodeContext, Tensor
from tilefuse.onnx.converters_nn import _geometry as conv_geometry
from tilefuse.onnx.converters_nn import conv_with
from tilefuse.onnx.model import ModelInfo
from tilefuse.onnx.tensors import to_dtype
from tilefuse.passes.quantize import QuantizeOptions
from tilefuse.target import Target

_LOG = get_logger("passes")
_RANGES = {DType.u8: (0, 255), DType.i8: (-128, 127), DType.i16: (-32768, 32767)}


def _broadcastable(ctx: NodeContext, p: Tensor, shape: tuple[int, ...], axis: int,
           block: int) -> Tensor:
    """A scale or zero point shaped to broadcast against a tensor of ``shape``."""
    if p.rank == 0 or (p.rank == 1 and p.shape[0] == 1 and not block):
        return ctx.op("reshape", p, shape=())
    rank = len(shape)
    axis = ctx.axis(axis, rank)
    if not block:
        if p.rank != 1 or p.shape[0] != shape[axis]:
            raise ctx.error(f"a per-axis parameter {list(p.shape)} needs {shape[axis]} values "
                            f"(axis {axis} of {list(shape)})")
        dims = [1] * rank
        dims[axis] = shape[axis]
        return ctx.op("reshape", p, shape=tuple(dims))
    blocks = -(-shape[axis] // block)
    if p.rank != rank or p.shape[axis] != blocks:
        raise ctx.error(f"a blocked parameter {list(p.shape)} needs {blocks} blocks of "
                        f"{block} along axis {axis} of {list(shape)}")
    split = (*p.shape[:axis + 1], 1, *p.shape[axis + 1:])
    wide = (*p.shape[:axis + 1], block, *p.shape[axis + 1:])
    joined = (*p.shape[:axis], blocks * block, *p.shape[axis + 1:])
    rep = ctx.op("reshape", ctx.op("broadcast_to", ctx.op("reshape", p, shape=split),
                                   shape=wide), shape=joined)
    return rep if blocks * block == shape[axis] else ctx.slice_axis(rep, axis, 0, shape[axis])


def _saturate(ctx: NodeContext, y: Tensor, dtype: DType) -> Tensor:
    if dtype not in _RANGES:
        raise ctx.error(f"quantizing to {dtype.value} is not supported (u8, i8, i16)")
    lo, hi = _RANGES[dtype]
    return ctx.cast(ctx.op("clip", ctx.op("round", y), min=float(lo), max=float(hi)), dtype)


def quantize(ctx: NodeContext, x: Tensor, scale: Tensor, zero: Tensor | None,
             dtype: DType) -> Tensor:
    """saturate(round(x / scale) + zero), computed in f32 (f64 for f64 inputs); on constants
    (QDQ weights stored in f32) computed here at any size, with the same roundings."""
    work = DType.f64 if x.dtype is DType.f64 else DType.f32
    if x.const is not None and scale.const is not None and (zero is None
                                                             or zero.const is not None) \
            and dtype in _RANGES:
        w = work.np
        y = np.rint(x.const.astype(w) / scale.const.astype(w))
        if zero is not None:
            y = y + zero.const.astype(w)
        lo, hi = _RANGES[dtype]
        return ctx.const(np.clip(np.rint(y), lo, hi).astype(dtype.np))
    y = ctx.op("round", ctx.op("div", ctx.cast(x, work), ctx.cast(scale, work)))
    if zero is not None:
        y = ctx.op("add", y, ctx.cast(zero, work))
    return _saturate(ctx, y, dtype)


def _quantize_linear(ctx: NodeContext) -> list[Tensor]:
    x, scale, zero = ctx.input(0), ctx.input(1), ctx.optional(2)
    axis, block = int(ctx.attr("axis", 1)), int(ctx.attr("block_size", 0))
    given = ctx.attr("output_dtype")
    dtype = zero.dtype if zero is not None else (
        to_dtype(int(given), "output_dtype") if given else DType.u8)
    s = _broadcastable(ctx, scale, x.shape, axis, block)
    z = None if zero is None else _broadcastable(ctx, zero, x.shape, axis, block)
    return [quantize(ctx, x, s, z, dtype)]


def dequantize(ctx: NodeContext, x: Tensor, scale: Tensor, zero: Tensor | None) -> Tensor:
    """(x - zero) · scale in f32, in scale's dtype. A constant x (a QDQ model's weights) is
    dequantized here, at any size, with the same f32 roundings: the convolution or product
    reading it then has a constant f32 weight, which conv_lowering and the quantize pass need
    (import-time folding alone stops at small tensors)."""
    if x.const is not None and scale.const is not None and (zero is None
                                                             or zero.const is not None):
        dx = x.const.astype(np.float32)
        if zero is not None:
            dx = dx - zero.const.astype(np.float32)
        y = (dx * scale.const.astype(np.float32)).astype(scale.dtype.np)
        return ctx.const(y)
    dx = ctx.cast(x, DType.f32)
    if zero is not None:
        dx = ctx.op("sub", dx, ctx.cast(zero, DType.f32))
    return ctx.cast(ctx.op("mul", dx, ctx.cast(scale, DType.f32)), scale.dtype)


def _dequantize_linear(ctx: NodeContext) -> list[Tensor]:
    x, scale, zero = ctx.input(0), ctx.input(1), ctx.optional(2)
    axis, block = int(ctx.attr("axis", 1)), int(ctx.attr("block_size", 0))
    y = dequantize(ctx, x, _broadcastable(ctx, scale, x.shape, axis, block),
                   None if zero is None else _broadcastable(ctx, zero, x.shape, axis, block))
    given = ctx.attr("output_dtype")
    return [ctx.cast(y, to_dtype(int(given), "output_dtype")) if given else y]


def _dynamic_quantize_linear(ctx: NodeContext) -> list[Tensor]:
    """u8 quantization over [min(0, min x), max(0, max x)]: y, its scale and zero point.
    An f32 input of at least 4096 elements is one ``dynamic_quantize_u8`` (a native kernel:
    min/max in parallel chunks, then the codes), else it is built from tilefuse ops."""
    if ctx.input(0).dtype is DType.f32 and ctx.input(0).const is None \
            and math.prod(ctx.input(0).shape) >= 4096:
        return ctx.ops("dynamic_quantize_u8", ctx.input(0))
    x = ctx.cast(ctx.input(0), DType.f32)
    zero = ctx.scalar(0, DType.f32)
    lo = ctx.op("minimum", ctx.op("min", x), zero)
    hi = ctx.op("maximum", ctx.op("max", x), zero)
    scale = ctx.op("div", ctx.op("sub", hi, lo), ctx.scalar(255, DType.f32))
    point = _saturate(ctx, ctx.op("neg", ctx.op("div", lo, scale)), DType.u8)
    return [quantize(ctx, x, scale, point, DType.u8), scale, point]


def _centred(ctx: NodeContext, t: Tensor, zero: Tensor | None) -> Tensor:
    """t - zero in i32."""
    wide = ctx.cast(t, DType.i32)
    return wide if zero is None else ctx.op("sub", wide, ctx.cast(zero, DType.i32))


def _row_zero(ctx: NodeContext, a: Tensor, zero: Tensor | None) -> Tensor | None:
    """A's zero point: a scalar, or one per row (M) of the last two dims."""
    if zero is None or zero.rank == 0 or zero.shape == (1,):
        return zero
    return ctx.op("reshape", zero, shape=(*zero.shape, 1))


def _native_weight(a: Tensor, a_zero: Tensor | None, b: Tensor, b_zero: Tensor | None
                   ) -> np.ndarray | None:
    """The i8 weight of an integer product the VNNI kernel runs exactly (``matmul_u8s8``): u8
    activations with a scalar zero point, a constant 2-D i8 weight whose zero point is absent
    or 0, big enough to pay (else None: the product stays a plain i32 matmul)."""
    if a.dtype is not DType.u8 or b.const is None or b.dtype is not DType.i8 or b.rank != 2 \
            or a.rank < 1 or b.const.size < 4096:
        return None
    if a_zero is not None and (a_zero.dtype is not DType.u8 or math.prod(a_zero.shape) != 1):
        return None
    if b_zero is not None and (b_zero.const is None or np.any(b_zero.const != 0)):
        return None
    return b.const


def _integer_product(ctx: NodeContext, a: Tensor, a_zero: Tensor | None, b: Tensor,
                     b_zero: Tensor | None) -> Tensor:
    """(a - a_zero) @ (b - b_zero) in i32: on the VNNI kernel when it can, else a matmul."""
    if _native_weight(a, a_zero, b, b_zero) is not None:
        zero = ctx.scalar(0, DType.u8) if a_zero is None else \
            ctx.op("reshape", a_zero, shape=())
        return ctx.op("matmul_u8s8", a, zero, b)
    return ctx.op("matmul", _centred(ctx, a, _row_zero(ctx, a, a_zero)), _centred(ctx, b, b_zero))


def _matmul_integer(ctx: NodeContext) -> list[Tensor]:
    return [_integer_product(ctx, ctx.input(0), ctx.optional(2), ctx.input(1), ctx.optional(3))]


def _requantize(ctx: NodeContext, acc: Tensor, factor: Tensor, y_zero: Tensor | None,
                like: DType) -> Tensor:
    y = ctx.op("mul", ctx.cast(acc, DType.f32), factor)
    if y_zero is not None:
        y = ctx.op("add", y, ctx.cast(y_zero, DType.f32))
    return _saturate(ctx, y, y_zero.dtype if y_zero is not None else like)


def _conv_centred(ctx: NodeContext, x: Tensor, x_zero: Tensor | None, w: Tensor,
                  w_zero: Tensor | None) -> Tensor:
    """The exact integer convolution of (x - x_zero) by (w - w_zero), as f64."""
    xc = ctx.cast(_centred(ctx, x, x_zero), DType.f64)
    if w_zero is not None and w_zero.rank == 1 and w_zero.shape[0] > 1:  # per output channel
        w_zero = ctx.op("reshape", w_zero, shape=(w_zero.shape[0], *(1,) * (w.rank - 1)))
    wc = ctx.cast(_centred(ctx, w, w_zero), DType.f64)
    return conv_with(ctx, xc, wc, None)


def _conv_integer_codes(ctx: NodeContext, x: Tensor, x_zero: Tensor | None, w: Tensor,
                        w_zero: Tensor | None) -> np.ndarray | str:
    """The centred weight codes ``w - w_zero`` as i8 [O, C, KH, KW] when ``qconv_i8`` can run
    this ConvInteger exactly, else why not."""
    if x.rank != 4 or int(ctx.attr("group", 1)) != 1:
        return f"only 2-D convolutions with group 1 are mapped (rank {x.rank})"
    if x.dtype not in (DType.u8, DType.i8) or not all(isinstance(d, int) for d in x.shape):
        return f"x is {x.dtype.value} of shape {list(x.shape)}, not a static u8 or i8 tensor"
    if x_zero is not None and (x_zero.const is None or x_zero.const.size != 1):
        return "x's zero point is not a constant scalar"
    if w.const is None or w.rank != 4 or (w_zero is not None and w_zero.const is None):
        return "the weight or its zero point is not a constant"
    wz = np.zeros(1, np.int32) if w_zero is None else w_zero.const.astype(np.int32)
    wc = w.const.astype(np.int32) - wz.reshape(-1, *(1,) * (w.rank - 1) if wz.size > 1 else ())
    if wc.size and (wc.min() < -128 or wc.max() > 127):
        return "the centred weight w - w_zero does not fit i8"
    if tuple(_ints_attr(ctx, "dilations"))[1:] not in ((), (1,)):
        return "a dilation along W (qconv_i8 reads runs along W)"
    return wc.astype(np.int8)


def _ints_attr(ctx: NodeContext, name: str) -> tuple[int, ...]:
    return tuple(int(v) for v in (ctx.attr(name) or (1, 1)))


def _conv_integer(ctx: NodeContext) -> list[Tensor]:
    """(x - x_zero) * (w - w_zero) in exact i32: on ``qconv_i8`` (VNNI, u8 codes read in place
    from the NHWC input, raw i32 sums) when the weight is a constant whose centred codes fit
    i8, else tilefuse's conv2d in f64 on the centred operands (exact below 2^53)."""
    x, x_zero, w, w_zero = ctx.input(0), ctx.optional(2), ctx.input(1), ctx.optional(3)
    codes = _conv_integer_codes(ctx, x, x_zero, w, w_zero)
    if isinstance(codes, str):   # a zero point computed at run time: a correction
        from tilefuse.onnx.conv_integer import conv_integer_runtime_zero

        native = conv_integer_runtime_zero(ctx, x, x_zero, w, w_zero)
        if not isinstance(native, str):
            return [native]
        _LOG.info("%s stays on the exact f64 path: %s", ctx.label, codes)
        return [ctx.cast(_conv_centred(ctx, x, x_zero, w, w_zero), DType.i32)]
    o, c, kh, kw = codes.shape
    stride, dilation, (top, left, bottom, right) = conv_geometry(ctx, x, (kh, kw))
    z = 0 if x_zero is None else int(x_zero.const.reshape(()))
    lo, hi = _RANGES[x.dtype]
    # the centred input x - z in f32 (exact): its zero padding is x's zero point, and with
    # scale 1 and zero point z the row phase's codes are x's own
    xc = ctx.cast(x, DType.f32)
    if z:
        xc = ctx.op("sub", xc, ctx.scalar(z, DType.f32))
    p = ctx.op("transpose", xc, perm=(0, 2, 3, 1))
    wk = ctx.const(np.ascontiguousarray(codes.transpose(2, 3, 1, 0).reshape(kh * kw * c, o)))
    y = ctx.op("qconv_i8", p, wk, ctx.const(np.ones(o, np.float32)),
               ctx.const(np.zeros(o, np.float32)), kernel=(kh, kw), strides=stride,
               dilations=dilation, pads=(top, bottom, left, right), x_scale=1.0, x_zero=z,
               x_min=lo, x_max=hi, raw=True)
    n, _, h, wd = x.shape
    oh = (h + top + bottom - dilation[0] * (kh - 1) - 1) // stride[0] + 1
    ow = (wd + left + right - dilation[1] * (kw - 1) - 1) // stride[1] + 1
    y = ctx.op("reshape", y, shape=(n, oh, ow, o))
    return [ctx.op("transpose", y, perm=(0, 3, 1, 2))]


def _scalar_const(t: Tensor | None) -> bool:
    return t is None or (t.const is not None and t.const.size == 1)


def _qdq_conv_blocker(x: Tensor, x_scale: Tensor, x_zero: Tensor | None, w: Tensor,
                      w_scale: Tensor, w_zero: Tensor | None, y_scale: Tensor,
                      y_zero: Tensor | None, bias: Tensor | None, group: int) -> str | None:
    """Why a QLinearConv cannot take the QDQ form (:func:`_qlinear_conv_qdq`), else None."""
    if x.rank != 4 or group != 1:
        return f"only 2-D convolutions with group 1 are mapped (rank {x.rank}, group {group})"
    if x.dtype not in (DType.u8, DType.i8):
        return f"x is {x.dtype.value}, not u8 or i8"
    if not all(_scalar_const(t) for t in (x_scale, x_zero, y_scale, y_zero)):
        return "x or y has a run-time or per-channel scale / zero point"
    if y_zero is not None and y_zero.dtype not in (DType.u8, DType.i8):
        return f"y is {y_zero.dtype.value}, not u8 or i8"
    if w.const is None or w.dtype is not DType.i8 or w_scale.const is None \
            or (w_zero is not None and (w_zero.const is None or np.any(w_zero.const != 0))):
        return "the weight is not a constant symmetric i8 tensor"
    if w.const.size and int(w.const.min()) < -127:
        return "the weight has code -128 (the int8 kernels' weight codes are -127..127)"
    if bias is not None and bias.const is None:
        return "the bias is not a constant"
    return None


def _qlinear_conv_qdq(ctx: NodeContext, x: Tensor, x_scale: Tensor, x_zero: Tensor | None,
                      w: Tensor, w_scale: Tensor, y_scale: Tensor, y_zero: Tensor | None,
                      bias: Tensor | None) -> Tensor:
    """QLinearConv as DequantizeLinear -> Conv -> QuantizeLinear, the form the "qdq" quantize
    pipeline maps onto ``qconv_i8`` (the weight's codes are recovered exactly from its
    dequantized grid, the requantize is fused into the kernel's epilogue). The i32 bias is
    dequantized at x_scale · w_scale. The f32 rescale rounds differently from onnxruntime's
    (one multiply by x_scale · w_scale / y_scale), so codes agree within one step."""
    def scalar(t: Tensor | None) -> Tensor | None:
        return None if t is None else ctx.op("reshape", t, shape=())

    xd = dequantize(ctx, x, scalar(x_scale), scalar(x_zero))
    ws = w_scale.const.astype(np.float32).reshape(-1)
    wd = dequantize(ctx, w, ctx.const(ws.reshape(-1, 1, 1, 1)), None)
    b = None
    if bias is not None:
        xs = np.float32(x_scale.const.reshape(()))
        b = ctx.const((bias.const.astype(np.float32) * (xs * ws)).astype(np.float32))
    y = conv_with(ctx, xd, wd, b)
    dtype = y_zero.dtype if y_zero is not None else x.dtype
    return quantize(ctx, y, scalar(y_scale), scalar(y_zero), dtype)


def _qlinear_conv(ctx: NodeContext) -> list[Tensor]:
    x, x_scale, x_zero = ctx.input(0), ctx.input(1), ctx.optional(2)
    w, w_scale, w_zero = ctx.input(3), ctx.input(4), ctx.optional(5)
    y_scale, y_zero, bias = ctx.input(6), ctx.optional(7), ctx.optional(8)
    why = _qdq_conv_blocker(x, x_scale, x_zero, w, w_scale, w_zero, y_scale, y_zero, bias,
                            int(ctx.attr("group", 1)))
    if why is None:
        return [_qlinear_conv_qdq(ctx, x, x_scale, x_zero, w, w_scale, y_scale, y_zero, bias)]
    _LOG.info("%s stays on the exact f64 path: %s", ctx.label, why)
    acc = _conv_centred(ctx, x, x_zero, w, w_zero)
    if bias is not None:  # i32, already at scale x_scale · w_scale
        acc = ctx.op("add", acc, ctx.op("reshape", ctx.cast(bias, DType.f64),
                                        shape=(bias.shape[0], *(1,) * (x.rank - 2))))
    w_s = ctx.cast(w_scale, DType.f32)
    if w_s.rank == 1 and w_s.shape[0] > 1:
        w_s = ctx.op("reshape", w_s, shape=(w_s.shape[0], *(1,) * (x.rank - 2)))
    factor = ctx.op("div", ctx.op("mul", ctx.cast(x_scale, DType.f32), w_s),
                    ctx.cast(y_scale, DType.f32))
    return [_requantize(ctx, acc, factor, y_zero, x.dtype)]


def _qlinear_matmul(ctx: NodeContext) -> list[Tensor]:
    a, a_scale, a_zero = ctx.input(0), ctx.input(1), ctx.optional(2)
    b, b_scale, b_zero = ctx.input(3), ctx.input(4), ctx.optional(5)
    y_scale, y_zero = ctx.input(6), ctx.optional(7)
    product = _integer_product(ctx, a, a_zero, b, b_zero)
    factor = ctx.op("div", ctx.op("mul", ctx.cast(a_scale, DType.f32),
                                  ctx.cast(b_scale, DType.f32)), ctx.cast(y_scale, DType.f32))
    return [_requantize(ctx, product, factor, y_zero, a.dtype)]


def qdq_default(info: ModelInfo, target: Target) -> QuantizeOptions | None:
    """The quantization an ONNX model gets when the caller names none: "qdq" on the CPU when
    a QuantizeLinear's output feeds a DequantizeLinear (a QDQ model, as onnxruntime's
    ``quantize_static`` writes them: its products then run on the int8 kernels with the
    pairs' static scales) or the model has MatMulInteger / QLinearMatMul (as
    ``quantize_dynamic`` writes them: the rescale after each integer product is fused into
    it) or QLinearConv (``quantize_static`` with QOperator: it is written as a QDQ conv);
    else none (``quantize="none"`` keeps a QDQ model in f32)."""
    if target.is_cuda:
        return None
    quantized = {o for n in info.nodes if n.op_type == "QuantizeLinear" for o in n.outputs}
    if any(n.op_type in ("MatMulInteger", "QLinearMatMul", "QLinearConv") or (
            n.op_type == "DequantizeLinear" and n.inputs and n.inputs[0] in quantized)
           for n in info.nodes):
        return QuantizeOptions("qdq")
    return None


CONVERTERS = (
    ("QuantizeLinear", 10, _quantize_linear), ("DequantizeLinear", 10, _dequantize_linear),
    ("DynamicQuantizeLinear", 11, _dynamic_quantize_linear),
    ("MatMulInteger", 10, _matmul_integer), ("QLinearMatMul", 10, _qlinear_matmul),
    ("ConvInteger", 10, _conv_integer), ("QLinearConv", 10, _qlinear_conv),
)
