"""Converters for neural-network ops: Softmax, LogSoftmax, LayerNormalization,
GroupNormalization, MeanVarianceNormalization, BatchNormalization (inference), Conv, MaxPool,
AveragePool, GlobalAveragePool, GlobalMaxPool, Dropout (inference).

Convolution and pooling map onto tilefuse's NCHW ``conv2d`` / ``max_pool2d`` / ``avg_pool2d``;
1-D ones get a unit height axis. ONNX pads are ``[begin..., end...]``; tilefuse's are
``(top, left, bottom, right)``.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from tilefuse.dtypes import DType
from tilefuse.onnx import converters_volume as volume
from tilefuse.onnx.context import NodeContext, Tensor

Converter = Callable[[NodeContext], list[Tensor]]

# ---- softmax ---------------------------------------------------------------------------------


def _softmax_1(name: str) -> Converter:
    """Before opset 13: the input is coerced to 2-D at ``axis`` (default 1)."""
    def convert(ctx: NodeContext) -> list[Tensor]:
        x = ctx.input(0)
        axis = ctx.axis(ctx.attr("axis", 1), x.rank) if x.rank else 0
        flat = (math.prod(x.shape[:axis]), math.prod(x.shape[axis:]))
        y = ctx.op(name, ctx.op("reshape", x, shape=flat), axis=1)
        return [ctx.op("reshape", y, shape=x.shape)]
    return convert


def _softmax_13(name: str) -> Converter:
    def convert(ctx: NodeContext) -> list[Tensor]:
        x = ctx.input(0)
        return [ctx.op(name, x, axis=ctx.axis(ctx.attr("axis", -1), x.rank))]
    return convert


# ---- normalisations --------------------------------------------------------------------------


def _layer_norm(ctx: NodeContext) -> list[Tensor]:
    x, scale, bias = ctx.input(0), ctx.input(1), ctx.optional(2)
    axis = ctx.axis(ctx.attr("axis", -1), x.rank)
    eps = float(ctx.attr("epsilon", 1e-5))
    norm = x.shape[axis:]
    scale = _broadcast(ctx, scale, norm)
    bias = ctx.const_zeros(norm, x.dtype) if bias is None else _broadcast(ctx, bias, norm)
    outs = [ctx.op("layer_norm", x, scale, bias, eps=eps)]
    if ctx.outputs_wanted() > 1:  # Mean and InvStdDev, in the stash type (f32)
        axes = tuple(range(axis, x.rank))
        wide = ctx.cast(x, DType.f32)
        mean = ctx.op("mean", wide, axes=axes, keepdims=True)
        var = ctx.op("var", wide, axes=axes, keepdims=True)
        inv = ctx.op("rsqrt", ctx.op("add", var, ctx.scalar(eps, DType.f32)))
        outs += [mean, inv]
    return outs


def _rms_norm(ctx: NodeContext) -> list[Tensor]:
    """x / sqrt(mean(x²) + epsilon) · scale over the dims from ``axis`` on, computed in f32
    for narrower floats (the stash type) as tilefuse's rms_norm does."""
    x, scale = ctx.input(0), ctx.input(1)
    axis = ctx.axis(ctx.attr("axis", -1), x.rank)
    eps = float(ctx.attr("epsilon", 1e-5))
    return [ctx.op("rms_norm", x, _broadcast(ctx, scale, x.shape[axis:]), eps=eps)]


def _broadcast(ctx: NodeContext, t: Tensor, shape: tuple[int, ...]) -> Tensor:
    """A scale or bias over the normalised dims ``shape``: broadcast to them, after dropping
    leading unit dims beyond their rank (a [1, H] scale of an [N, S, H] input normalised over H)."""
    extra = t.rank - len(shape)
    if extra > 0 and all(d == 1 for d in t.shape[:extra]):
        t = ctx.op("reshape", t, shape=t.shape[extra:])
    return t if t.shape == shape else ctx.op("broadcast_to", t, shape=shape)


def _batch_norm(ctx: NodeContext) -> list[Tensor]:
    if ctx.attr("training_mode", 0) or not ctx.attr("spatial", 1):
        raise ctx.not_compiled("only inference mode (training_mode=0, spatial=1) is compiled")
    if ctx.outputs_wanted() > 1 and any(ctx.spec.outputs[1:]):
        raise ctx.error("running mean/var outputs exist only in training mode")
    x, scale, bias, mean, var = (ctx.input(i) for i in range(5))
    if x.rank < 2:
        raise ctx.error("input must have a channel axis")
    eps = ctx.scalar(float(ctx.attr("epsilon", 1e-5)), var.dtype)
    factor = ctx.op("mul", scale, ctx.op("rsqrt", ctx.op("add", var, eps)))
    shift = ctx.op("sub", bias, ctx.op("mul", mean, factor))
    per_channel = (x.shape[1],) + (1,) * (x.rank - 2)
    factor = ctx.cast(ctx.op("reshape", factor, shape=per_channel), x.dtype)
    shift = ctx.cast(ctx.op("reshape", shift, shape=per_channel), x.dtype)
    return [ctx.op("add", ctx.op("mul", x, factor), shift)]


def _instance_norm(ctx: NodeContext) -> list[Tensor]:
    x, scale, bias = ctx.input(0), ctx.input(1), ctx.input(2)
    if x.rank < 3 or scale.shape != (x.shape[1],) or bias.shape != (x.shape[1],):
        raise ctx.error("needs input [N, C, spatial...] with scale and B of shape [C]")
    axes = tuple(range(2, x.rank))
    wide = ctx.cast(x, DType.f32) if x.dtype in (DType.f16, DType.bf16) else x
    mean = ctx.op("mean", wide, axes=axes, keepdims=True)
    var = ctx.op("var", wide, axes=axes, keepdims=True)
    eps = ctx.scalar(float(ctx.attr("epsilon", 1e-5)), wide.dtype)
    norm = ctx.op("mul", ctx.op("sub", wide, mean), ctx.op("rsqrt", ctx.op("add", var, eps)))
    per_channel = (x.shape[1],) + (1,) * (x.rank - 2)
    scale = ctx.cast(ctx.op("reshape", scale, shape=per_channel), wide.dtype)
    bias = ctx.cast(ctx.op("reshape", bias, shape=per_channel), wide.dtype)
    return [ctx.cast(ctx.op("add", ctx.op("mul", norm, scale), bias), x.dtype)]


def _group_norm(per_channel: bool) -> Converter:
    """GroupNormalization: opset 18 gives scale and bias per group ([num_groups], repeated over
    each group's channels here), opset 21 per channel ([C]); computed in f32 for narrower floats
    (opset 21's default stash type) by tilefuse's ``group_norm``, whose shape rule checks the
    rest (rank, groups dividing C, per-channel scale and bias)."""
    def convert(ctx: NodeContext) -> list[Tensor]:
        x, scale, bias = ctx.input(0), ctx.input(1), ctx.input(2)
        groups = ctx.attr("num_groups")
        if groups is None:
            raise ctx.error("attribute 'num_groups' is required")
        if ctx.attr("stash_type", 1) != 1:
            raise ctx.error("only stash_type=1 (float32) is supported")
        groups = int(groups)
        if not per_channel:
            if scale.shape != (groups,) or bias.shape != (groups,):
                raise ctx.error(f"scale and bias must have shape [{groups}] (one per group)")
            if x.rank < 2 or groups < 1 or x.shape[1] % groups:
                raise ctx.error(f"num_groups={groups} must divide the channels of x")
            per_group = x.shape[1] // groups
            scale, bias = (ctx.op("reshape", ctx.op("broadcast_to", ctx.op(
                "reshape", t, shape=(groups, 1)), shape=(groups, per_group)),
                shape=(x.shape[1],)) for t in (scale, bias))
        eps = float(ctx.attr("epsilon", 1e-5))
        scale, bias = ctx.cast(scale, x.dtype), ctx.cast(bias, x.dtype)
        return [ctx.op("group_norm", x, scale, bias, groups=groups, eps=eps)]
    return convert


def _mean_variance_norm(ctx: NodeContext) -> list[Tensor]:
    """MeanVarianceNormalization: ``(x - mean) / (sqrt(var) + 1e-9)`` over ``axes`` (default
    [0, 2, 3]; population variance, as the ONNX function body computes it)."""
    x = ctx.input(0)
    if not x.dtype.is_float:
        raise ctx.error("needs a float input")
    axes = tuple(sorted({ctx.axis(int(a), x.rank) for a in ctx.attr("axes", [0, 2, 3])}))
    wide = ctx.cast(x, DType.f32) if x.dtype in (DType.f16, DType.bf16) else x
    mean = ctx.op("mean", wide, axes=axes, keepdims=True)
    std = ctx.op("sqrt", ctx.op("var", wide, axes=axes, keepdims=True))
    eps = ctx.scalar(1e-9, wide.dtype)
    return [ctx.cast(ctx.op("div", ctx.op("sub", wide, mean), ctx.op("add", std, eps)), x.dtype)]


def _lrn(ctx: NodeContext) -> list[Tensor]:
    """Local response normalisation across channels: ``x / (bias + alpha/size · Σ x²)^beta``,
    the sum over ``size`` neighbouring channels. The windowed sum is an average pool over the
    channel axis (x² viewed as [N, 1, C, rest]; zero padding counted), times ``size``."""
    x = ctx.input(0)
    size = ctx.attr("size")
    if size is None or int(size) < 1:
        raise ctx.error("attribute 'size' (a positive int) is required")
    size = int(size)
    if x.rank < 2 or not x.dtype.is_float:
        raise ctx.error("needs a float input [N, C, ...]")
    before, after = (size - 1) // 2, size // 2
    n, c = x.shape[0], x.shape[1]
    rest = math.prod(x.shape[2:])
    square = ctx.op("reshape", ctx.op("mul", x, x), shape=(n, 1, c, rest))
    mean = ctx.op("avg_pool2d", square, kernel=(size, 1), stride=(1, 1),
                  padding=(before, 0, after, 0), count_include_pad=True, ceil_mode=False)
    mean = ctx.op("reshape", mean, shape=x.shape)
    alpha, beta = float(ctx.attr("alpha", 1e-4)), float(ctx.attr("beta", 0.75))
    base = ctx.op("add", ctx.op("mul", mean, ctx.scalar(alpha, x.dtype)),
                  ctx.scalar(float(ctx.attr("bias", 1.0)), x.dtype))
    return [ctx.op("div", x, ctx.op("pow", base, ctx.scalar(beta, x.dtype)))]


# ---- convolution and pooling -----------------------------------------------------------------


def _ints(ctx: NodeContext, name: str, n: int, default: int) -> tuple[int, ...]:
    value = ctx.attr(name)
    if value is None:
        return (default,) * n
    if len(value) != n:
        raise ctx.error(f"{name} {list(value)} needs {n} entries")
    return tuple(int(v) for v in value)


def _padding(ctx: NodeContext, spatial: tuple[int, ...], kernel: tuple[int, ...],
             strides: tuple[int, ...], dilations: tuple[int, ...]) -> tuple[int, ...]:
    """ONNX pads ``[begin..., end...]`` from ``pads`` or ``auto_pad``."""
    auto = ctx.attr("auto_pad", "NOTSET")
    n = len(spatial)
    if auto == "NOTSET":
        return _ints(ctx, "pads", 2 * n, 0)
    if auto == "VALID":
        return (0,) * (2 * n)
    if auto not in ("SAME_UPPER", "SAME_LOWER"):
        raise ctx.error(f"auto_pad {auto!r} is not NOTSET, VALID, SAME_UPPER or SAME_LOWER")
    begins, ends = [], []
    for size, k, s, d in zip(spatial, kernel, strides, dilations):
        out = -(-size // s)
        total = max(0, (out - 1) * s + (k - 1) * d + 1 - size)
        small = total // 2
        begins.append(small if auto == "SAME_UPPER" else total - small)
        ends.append(total - begins[-1])
    return (*begins, *ends)


def _to_2d(ctx: NodeContext, x: Tensor) -> tuple[Tensor, bool]:
    """x as NCHW: rank-3 inputs (1-D convolution or pooling) get a unit height axis."""
    if x.rank == 4:
        return x, False
    if x.rank == 3:
        return ctx.op("expand_dims", x, axes=(2,)), True
    raise ctx.error(f"only 1-D and 2-D windows are supported (input rank {x.rank})")


def _geometry(ctx: NodeContext, x: Tensor, kernel: tuple[int, ...]
              ) -> tuple[tuple[int, int], tuple[int, int], tuple[int, int, int, int]]:
    """Strides, dilations and (top, left, bottom, right) padding for the 2-D op."""
    n = x.rank - 2
    strides = _ints(ctx, "strides", n, 1)
    dilations = _ints(ctx, "dilations", n, 1)
    pads = _padding(ctx, x.shape[2:], kernel, strides, dilations)
    if n == 1:
        return (1, strides[0]), (1, dilations[0]), (0, pads[0], 0, pads[1])
    return ((strides[0], strides[1]), (dilations[0], dilations[1]),
            (pads[0], pads[1], pads[2], pads[3]))


def _nd_geometry(ctx: NodeContext, x: Tensor, kernel: tuple[int, ...]
                 ) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]:
    """Strides, dilations and ONNX pads ``[begin..., end...]`` over all spatial axes."""
    n = x.rank - 2
    strides, dilations = _ints(ctx, "strides", n, 1), _ints(ctx, "dilations", n, 1)
    return strides, dilations, _padding(ctx, x.shape[2:], kernel, strides, dilations)


def _conv_transpose(ctx: NodeContext) -> list[Tensor]:
    x, w, b = ctx.input(0), ctx.input(1), ctx.optional(2)
    if w.rank != x.rank:
        raise ctx.error(f"the weight's rank {w.rank} is not the input's {x.rank}")
    if x.rank not in (3, 4):
        raise ctx.not_compiled(f"only 1-D and 2-D transposed convolutions are compiled "
                               f"(input rank {x.rank})")
    n = x.rank - 2
    kernel = _kernel(ctx, x, w.shape[2:])
    if kernel != w.shape[2:]:
        raise ctx.error(f"kernel_shape {list(kernel)} differs from W {list(w.shape)}")
    strides, dilations = _ints(ctx, "strides", n, 1), _ints(ctx, "dilations", n, 1)
    extra = _ints(ctx, "output_padding", n, 0)
    pads, extra = _transpose_pads(ctx, x.shape[2:], kernel, strides, dilations, extra)
    x2, squeezed = _to_2d(ctx, x)
    w2, _ = _to_2d(ctx, w)
    if squeezed:
        strides, dilations, extra = (1, *strides), (1, *dilations), (0, *extra)
        pads = (0, pads[0], 0, pads[1])
    y = volume.conv_transpose2d(ctx, x2, w2, b, strides, dilations, pads, extra,  # type: ignore
                                int(ctx.attr("group", 1)))
    return [ctx.op("squeeze", y, axes=(2,)) if squeezed else y]


def _transpose_pads(ctx: NodeContext, spatial: tuple[int, ...], kernel: tuple[int, ...],
                    strides: tuple[int, ...], dilations: tuple[int, ...],
                    extra: tuple[int, ...]) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """ConvTranspose's pads ``[begin..., end...]`` and output padding: given, or from
    ``output_shape`` / ``auto_pad`` (the total split as the operator's doc says; an output
    larger than the unpadded one grows the output padding)."""
    auto = ctx.attr("auto_pad", "NOTSET")
    out_shape = ctx.attr("output_shape")
    if out_shape is None and auto in ("NOTSET", "VALID"):
        pads = _ints(ctx, "pads", 2 * len(spatial), 0) if auto == "NOTSET" else \
            (0,) * (2 * len(spatial))
        return pads, extra
    if auto not in ("NOTSET", "SAME_UPPER", "SAME_LOWER"):
        raise ctx.error(f"auto_pad {auto!r} is not NOTSET, VALID, SAME_UPPER or SAME_LOWER")
    wanted = tuple(out_shape)[-len(spatial):] if out_shape is not None else tuple(
        size * s for size, s in zip(spatial, strides))
    begins, ends, grown = [], [], []
    for size, k, s, d, e, want in zip(spatial, kernel, strides, dilations, extra, wanted):
        total = s * (size - 1) + e + (k - 1) * d + 1 - int(want)
        grown.append(e - min(total, 0))
        total = max(total, 0)
        upper = auto == "SAME_UPPER"
        begins.append(total // 2 if upper else total - total // 2)
        ends.append(total - begins[-1])
    return (*begins, *ends), tuple(grown)


def _kernel(ctx: NodeContext, x: Tensor, default: tuple[int, ...] | None) -> tuple[int, ...]:
    value = ctx.attr("kernel_shape")
    if value is None:
        if default is None:
            raise ctx.error("attribute 'kernel_shape' is required")
        return default
    if len(value) != x.rank - 2:
        raise ctx.error(f"kernel_shape {list(value)} needs {x.rank - 2} entries")
    return tuple(int(v) for v in value)


def _conv(ctx: NodeContext) -> list[Tensor]:
    return [conv_with(ctx, ctx.input(0), ctx.input(1), ctx.optional(2))]


def conv_with(ctx: NodeContext, x: Tensor, w: Tensor, b: Tensor | None) -> Tensor:
    """The node's convolution (its attributes: pads, strides, dilations, group) of x by w."""
    if w.rank != x.rank:
        raise ctx.error("X and W must have the same rank")
    _kernel(ctx, x, w.shape[2:])
    if x.rank == 5:
        strides, dilations, pads = _nd_geometry(ctx, x, w.shape[2:])
        return volume.conv3d(ctx, x, w, b, strides, dilations, pads, int(ctx.attr("group", 1)))
    stride, dilation, padding = _geometry(ctx, x, w.shape[2:])
    x2, squeezed = _to_2d(ctx, x)
    w2, _ = _to_2d(ctx, w)
    args = [x2, w2] if b is None else [x2, w2, b]
    y = ctx.op("conv2d", *args, stride=stride, padding=padding, dilation=dilation,
               groups=int(ctx.attr("group", 1)))
    return ctx.op("squeeze", y, axes=(2,)) if squeezed else y


def _pool(name: str) -> Converter:
    def convert(ctx: NodeContext) -> list[Tensor]:
        if ctx.outputs_wanted() > 1 and ctx.spec.outputs[1]:
            raise ctx.not_compiled("the Indices output is not compiled")
        return [pool_with(ctx, name, ctx.input(0))]
    return convert


def pool_with(ctx: NodeContext, name: str, x: Tensor, count_include_pad: bool | None = None,
              zero_pad_first: bool = False) -> Tensor:
    """The node's pooling (kernel_shape, pads, strides, dilations, ceil_mode) of x by ``name``
    (max_pool2d or avg_pool2d); ``count_include_pad`` overrides the node's attribute;
    ``zero_pad_first`` pads x with zeros explicitly (any pad width) instead of in the pool."""
    include = bool(ctx.attr("count_include_pad", 0)) if count_include_pad is None \
        else count_include_pad
    kernel = _kernel(ctx, x, None)
    if x.rank == 5:
        if name == "avg_pool2d" and ctx.attr("dilations") is not None \
                and any(d != 1 for d in ctx.attr("dilations")):
            raise ctx.not_compiled("AveragePool with dilations is not compiled")
        strides, dilations, pads = _nd_geometry(ctx, x, kernel)
        return volume.pool3d(ctx, name, x, kernel, strides, dilations, pads,
                             bool(ctx.attr("ceil_mode", 0)), include)
    stride, dilation, padding = _geometry(ctx, x, kernel)
    x2, squeezed = _to_2d(ctx, x)
    window = ((1,) if squeezed else ()) + kernel
    spans = [d * (k - 1) + 1 for k, d in zip(window, dilation)]
    top, left, bottom, right = padding
    wide = max(top, bottom) > spans[0] // 2 or max(left, right) > spans[1] // 2
    ceil_mode = bool(ctx.attr("ceil_mode", 0))
    count_scale = None
    if (zero_pad_first or (wide and not ceil_mode)) and any(padding):
        # pads wider than half the window (which the pool ops refuse): pad explicitly
        x2, count_scale = _pad_for_pool(ctx, name, x2, padding, window, stride, include)
        padding = (0, 0, 0, 0)
    attrs = {"kernel": window, "stride": stride, "padding": padding, "ceil_mode": ceil_mode}
    if name == "max_pool2d":
        attrs["dilation"] = dilation
    elif dilation != (1, 1):
        raise ctx.not_compiled("AveragePool with dilations is not compiled")
    else:
        attrs["count_include_pad"] = include
    y = ctx.op(name, x2, **attrs)
    if count_scale is not None:
        y = ctx.op("mul", y, ctx.const(count_scale.astype(y.dtype.np)))
    return ctx.op("squeeze", y, axes=(2,)) if squeezed else y


def _pad_for_pool(ctx: NodeContext, name: str, x: Tensor, padding: tuple[int, ...],
                  window: tuple[int, ...], stride: tuple[int, ...],
                  include: bool) -> tuple[Tensor, np.ndarray | None]:
    """x padded for the pool (-inf for max, zeros for average) and, for an average that
    excludes the padding, the per-window factor window size / valid count."""
    top, left, bottom, right = padding
    fill = -np.inf if name == "max_pool2d" else 0.0
    padded = ctx.op("pad", x, pads=(0, 0, 0, 0, top, bottom, left, right), mode="constant",
                    value=fill)
    if name == "max_pool2d" or include:
        return padded, None
    valid = np.pad(np.ones(x.shape[2:]), ((top, bottom), (left, right)))
    kh, kw = window
    out_h = (valid.shape[0] - kh) // stride[0] + 1
    out_w = (valid.shape[1] - kw) // stride[1] + 1
    counts = np.array([[valid[i * stride[0]:i * stride[0] + kh,
                              j * stride[1]:j * stride[1] + kw].sum() for j in range(out_w)]
                       for i in range(out_h)])
    return padded, (kh * kw) / np.maximum(counts, 1)


def _global_pool(name: str) -> Converter:
    def convert(ctx: NodeContext) -> list[Tensor]:
        x = ctx.input(0)
        if x.rank < 3:
            raise ctx.error("input needs spatial axes")
        return [ctx.op(name, x, axes=tuple(range(2, x.rank)), keepdims=True)]
    return convert


def _dropout(ctx: NodeContext) -> list[Tensor]:
    x = ctx.input(0)
    training = ctx.const_input(2, "training_mode")
    if ctx.attr("is_test", 1) == 0 or (training is not None and bool(training.reshape(-1)[0])):
        raise ctx.error("training mode is not supported; export the model for inference")
    outs = [x]
    if ctx.outputs_wanted() > 1 and ctx.spec.outputs[1]:
        outs.append(ctx.op("full", shape=x.shape, value=1.0, dtype=DType.bool))
    return outs


CONVERTERS: tuple[tuple[str, int, Converter], ...] = (
    ("Softmax", 1, _softmax_1("softmax")), ("Softmax", 13, _softmax_13("softmax")),
    ("LogSoftmax", 1, _softmax_1("log_softmax")),
    ("LogSoftmax", 13, _softmax_13("log_softmax")),
    ("LayerNormalization", 17, _layer_norm), ("BatchNormalization", 7, _batch_norm),
    ("RMSNormalization", 23, _rms_norm),
    ("GroupNormalization", 18, _group_norm(per_channel=False)),
    ("GroupNormalization", 21, _group_norm(per_channel=True)),
    ("Conv", 1, _conv), ("MaxPool", 1, _pool("max_pool2d")),
    ("AveragePool", 1, _pool("avg_pool2d")),
    ("GlobalAveragePool", 1, _global_pool("mean")), ("GlobalMaxPool", 1, _global_pool("max")),
    ("Dropout", 7, _dropout), ("InstanceNormalization", 1, _instance_norm),
    ("LRN", 1, _lrn), ("MeanVarianceNormalization", 9, _mean_variance_norm),
    ("ConvTranspose", 1, _conv_transpose),
)
CONVERTER_BATCH_NORM: Converter = _batch_norm  # shared with the pre-opset-7 form
