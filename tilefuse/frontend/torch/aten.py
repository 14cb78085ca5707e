"""The ATen → tilefuse converter table: :data:`ATEN_CONVERTERS`, one read-only mapping from an
ATen overload (``torch.ops.aten.add.Tensor``) to a converter.

A converter ``(lowering, node) -> value | tuple`` reads the node's arguments (see
:func:`~tilefuse.frontend.torch.convert.arg`), adds tilefuse ops through the lowering and returns
the result value (a tuple, with ``None`` for results nobody reads, for multi-output ops). Result
dtypes follow torch, not NumPy: every converter takes its result dtype from the node's recorded
fake tensor and casts its operands to it first, so NumPy promotion inside tilefuse never has a
say (``int / int`` is f32 as in torch; a Python scalar never widens a tensor).
A converter raises :class:`Unsupported` for arguments it cannot express; that node then runs
in torch.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import Any

import numpy as np
import torch
from torch import fx

from tilefuse.dtypes import DType
from tilefuse.frontend.torch.aten_attention import sdpa_converters
from tilefuse.frontend.torch.aten_index import index_converters
from tilefuse.frontend.torch.aten_scatter import scatter_converters
from tilefuse.frontend.torch.aten_training import training_converters
from tilefuse.frontend.torch.convert import (
    Converter,
    Lowering,
    Result,
    Unsupported,
    arg,
    meta_type,
    to_dtype,
    used_outputs,
)
from tilefuse.graph.ir import Value

aten = torch.ops.aten

# ---- elementwise -----------------------------------------------------------------------------


def _unary(op: str, **attrs: Any) -> Converter:
    """``op(x)`` computed in the result dtype (``exp`` of an int tensor is f32, as in torch)."""
    def convert(lw: Lowering, node: fx.Node) -> Result:
        out = lw.out_type.dtype
        return lw.add(op, [lw.cast(lw.tensor(node.args[0]), out)], **attrs)
    return convert


def _binary(op: str) -> Converter:
    """``op(a, b)`` with tensor or scalar operands, both cast to the result dtype first."""
    def convert(lw: Lowering, node: fx.Node) -> Result:
        out = lw.out_type.dtype
        return lw.add(op, [lw.operand(node.args[0], out), lw.operand(node.args[1], out)])
    return convert


def _add_sub(op: str) -> Converter:
    """add/sub with torch's ``alpha``: a + alpha·b."""
    def convert(lw: Lowering, node: fx.Node) -> Result:
        out = lw.out_type.dtype
        a, b = lw.operand(node.args[0], out), node.args[1]
        alpha = arg(node, 2, "alpha", 1)
        if alpha != 1:
            if not isinstance(b, fx.Node):
                b = b * alpha
            else:
                return lw.add(op, [a, lw.add("mul", [lw.operand(b, out),
                                                      lw.operand(alpha, out)])])
        return lw.add(op, [a, lw.operand(b, out)])
    return convert


def _div(lw: Lowering, node: fx.Node) -> Result:
    mode = node.kwargs.get("rounding_mode")
    out = lw.out_type.dtype
    a, b = lw.operand(node.args[0], out), lw.operand(node.args[1], out)
    if mode is None:
        return lw.add("div", [a, b])
    if mode == "floor":
        return lw.add("floordiv", [a, b])
    if mode == "trunc" and out.is_float:
        q = lw.add("div", [a, b])
        negative = lw.add("lt", [q, lw.operand(0.0, out)])
        return lw.add("where", [negative, lw.add("ceil", [q]), lw.add("floor", [q])])
    raise Unsupported(f"rounding_mode={mode!r} is not supported", op=lw.op)


def _pow_scalar(lw: Lowering, node: fx.Node) -> Result:
    """aten.pow.Scalar: a Python number raised to a tensor."""
    out = lw.out_type.dtype
    return lw.add("pow", [lw.operand(node.args[0], out), lw.operand(node.args[1], out)])


def _compare(op: str) -> Converter:
    """Comparisons: operands cast to their torch-promoted common dtype; the result is bool."""
    def convert(lw: Lowering, node: fx.Node) -> Result:
        a, b = node.args[0], node.args[1]
        metas = [x.meta["val"] if isinstance(x, fx.Node) else x for x in (a, b)]
        common = to_dtype(torch.result_type(*metas), lw.op)
        return lw.add(op, [lw.operand(a, common), lw.operand(b, common)])
    return convert


def _logical(op: str) -> Converter:
    def convert(lw: Lowering, node: fx.Node) -> Result:
        return lw.add(op, [lw.tensor(a) for a in node.args[:2]])
    return convert


def _logical_not(lw: Lowering, node: fx.Node) -> Result:
    return lw.add("logical_not", [lw.tensor(node.args[0])])


def _gelu(lw: Lowering, node: fx.Node) -> Result:
    approximate = node.kwargs.get("approximate", arg(node, 1, "approximate", "none"))
    out = lw.out_type.dtype
    return lw.add("gelu", [lw.cast(lw.tensor(node.args[0]), out)], approximate=approximate)


def _where(lw: Lowering, node: fx.Node) -> Result:
    out = lw.out_type.dtype
    cond = lw.cast(lw.tensor(node.args[0]), DType.bool)
    return lw.add("where", [cond, lw.operand(node.args[1], out), lw.operand(node.args[2], out)])


def _clamp(lw: Lowering, node: fx.Node) -> Result:
    """clamp with scalar bounds (clip) or tensor bounds (maximum / minimum)."""
    out = lw.out_type.dtype
    x = lw.cast(lw.tensor(node.args[0]), out)
    lo, hi = arg(node, 1, "min"), arg(node, 2, "max")
    if not isinstance(lo, fx.Node) and not isinstance(hi, fx.Node):
        return lw.add("clip", [x], min=lo, max=hi)
    if lo is not None:
        x = lw.add("maximum", [x, lw.operand(lo, out)])
    if hi is not None:
        x = lw.add("minimum", [x, lw.operand(hi, out)])
    return x


# ---- contractions ----------------------------------------------------------------------------


def _matmul(lw: Lowering, node: fx.Node) -> Result:
    out = lw.out_type.dtype
    if any(0 in meta_type(x).shape for x in node.args[:2]):   # an empty contraction: zeros
        return lw.add("full", [], shape=lw.out_type.shape, value=0.0, dtype=out)
    return lw.add("matmul", [lw.operand(node.args[0], out), lw.operand(node.args[1], out)])


def _addmm(lw: Lowering, node: fx.Node) -> Result:
    """beta·bias + alpha·(a @ b)."""
    out = lw.out_type.dtype
    bias, a, b = (lw.operand(x, out) for x in node.args[:3])
    beta, alpha = node.kwargs.get("beta", 1), node.kwargs.get("alpha", 1)
    product = lw.add("matmul", [a, b])
    if alpha != 1:
        product = lw.add("mul", [product, lw.operand(alpha, out)])
    if beta == 0:
        return product
    if beta != 1:
        bias = lw.add("mul", [bias, lw.operand(beta, out)])
    return lw.add("add", [product, bias])


def _convolution(lw: Lowering, node: fx.Node) -> Result:
    """aten.convolution, 1-D and 2-D, not transposed (1-D runs as 2-D with a unit height)."""
    x, w, bias, stride, padding, dilation, transposed, _, groups = node.args[:9]
    if transposed:
        raise Unsupported("transposed convolution is not supported", op=lw.op)
    xt, out = meta_type(x), lw.out_type
    spatial = len(xt.shape) - 2
    if spatial not in (1, 2):
        raise Unsupported(f"{spatial}-D convolution is not supported (1-D and 2-D are)", op=lw.op)
    xv, wv = lw.cast(lw.tensor(x), out.dtype), lw.cast(lw.tensor(w), out.dtype)
    inputs = [xv, wv] if bias is None else [xv, wv, lw.cast(lw.tensor(bias), out.dtype)]
    stride, padding, dilation = list(stride), list(padding), list(dilation)
    if spatial == 1:
        inputs[0] = lw.reshape(xv, (*xt.shape[:2], 1, xt.shape[2]))
        inputs[1] = lw.reshape(wv, (*wv.shape[:2], 1, wv.shape[2]))
        stride, padding, dilation = [1, *stride], [0, *padding], [1, *dilation]
    y = lw.add("conv2d", inputs, stride=tuple(stride), dilation=tuple(dilation),
               padding=(padding[0], padding[1], padding[0], padding[1]), groups=int(groups))
    return lw.reshape(y, out.shape)


# ---- normalisation and softmax ---------------------------------------------------------------


def _softmax(op: str) -> Converter:
    """softmax / log_softmax; a 0-d tensor runs as a 1-element vector."""
    def convert(lw: Lowering, node: fx.Node) -> Result:
        out = lw.out_type
        x = lw.cast(lw.tensor(node.args[0]), out.dtype)
        if len(x.shape) == 0:
            y = lw.add(op, [lw.reshape(x, (1,))], axis=0)
            return lw.reshape(y, out.shape)
        return lw.add(op, [x], axis=int(node.args[1]) % len(x.shape))
    return convert


def _ones_or(lw: Lowering, a: Any, shape: tuple[int, ...], dtype: DType, fill: float) -> Value:
    if a is None:
        return lw.add("full", [], shape=shape, value=fill, dtype=dtype)
    return lw.cast(lw.tensor(a), dtype)


def _layer_norm(lw: Lowering, node: fx.Node) -> Result:
    """native_layer_norm → (y, mean, rstd); mean and rstd are computed only when read."""
    x_node, normalized, weight, bias, eps = node.args[:5]
    out = lw.out_type.dtype
    x = lw.cast(lw.tensor(x_node), out)
    shape = tuple(int(d) for d in normalized)
    w, b = _ones_or(lw, weight, shape, out, 1.0), _ones_or(lw, bias, shape, out, 0.0)
    y = lw.add("layer_norm", [x, w, b], eps=float(eps))
    used = used_outputs(node)
    if not used & {1, 2}:
        return (y, None, None)
    axes = tuple(range(len(x.shape) - len(shape), len(x.shape)))
    mean = lw.add("mean", [x], axes=axes, keepdims=True)
    var = lw.add("var", [x], axes=axes, keepdims=True)
    rstd = lw.add("rsqrt", [lw.add("add", [var, lw.operand(float(eps), out)])])
    return (y, mean, rstd)


def _group_norm(lw: Lowering, node: fx.Node) -> Result:
    """native_group_norm(x, weight, bias, N, C, HxW, group, eps) → (y, mean, rstd); the saved
    mean / rstd (training's) are not computed."""
    x_node, weight, bias, _, channels, _, groups, eps = node.args[:8]
    if used_outputs(node) & {1, 2}:
        raise Unsupported("group_norm's saved mean / rstd are read", op=lw.op)
    out = lw.out_type.dtype
    x = lw.cast(lw.tensor(x_node), out)
    c = (int(channels),)
    w, b = _ones_or(lw, weight, c, out, 1.0), _ones_or(lw, bias, c, out, 0.0)
    return (lw.add("group_norm", [x, w, b], groups=int(groups), eps=float(eps)), None, None)


def _batch_norm_eval(lw: Lowering, node: fx.Node, x_node: Any, weight: Any, bias: Any,
                     mean: Any, var: Any, eps: float) -> Result:
    """(x - mean) · rsqrt(var + eps) · weight + bias per channel (dim 1); extra results unused."""
    if used_outputs(node) & {1, 2}:
        raise Unsupported("batch_norm's saved mean / invstd are read", op=lw.op)
    out = lw.out_type.dtype
    x = lw.cast(lw.tensor(x_node), out)
    channels = x.shape[1]
    per_channel = (channels,) + (1,) * (len(x.shape) - 2)

    def channel(a: Any, fill: float) -> Value:
        return lw.reshape(_ones_or(lw, a, (channels,), out, fill), per_channel)

    scale = lw.add("rsqrt", [lw.add("add", [channel(var, 1.0), lw.operand(float(eps), out)])])
    scale = lw.add("mul", [scale, channel(weight, 1.0)])
    centred = lw.add("sub", [x, channel(mean, 0.0)])
    return (lw.add("add", [lw.add("mul", [centred, scale]), channel(bias, 0.0)]), None, None)


def _native_batch_norm(lw: Lowering, node: fx.Node) -> Result:
    x, weight, bias, mean, var, training, _, eps = node.args[:8]
    if training or mean is None or var is None:
        raise Unsupported("batch_norm in training mode runs in torch", op=lw.op)
    return _batch_norm_eval(lw, node, x, weight, bias, mean, var, eps)


def _batch_norm_no_training(lw: Lowering, node: fx.Node) -> Result:
    x, weight, bias, mean, var, _, eps = node.args[:7]
    return _batch_norm_eval(lw, node, x, weight, bias, mean, var, eps)


# ---- reductions ------------------------------------------------------------------------------


def _axes(dims: Any, rank: int) -> tuple[int, ...] | None:
    """ATen's reduction dims: None or [] mean every axis."""
    if dims is None or (isinstance(dims, (list, tuple)) and len(dims) == 0):
        return None
    if isinstance(dims, int):
        dims = [dims]
    return tuple(int(d) % max(rank, 1) for d in dims)


def _reduce(op: str) -> Converter:
    """sum / mean / amax / amin over dims, computed in the result dtype (sum of bool is i64)."""
    def convert(lw: Lowering, node: fx.Node) -> Result:
        out = lw.out_type.dtype
        x = lw.cast(lw.tensor(node.args[0]), out)
        axes = _axes(arg(node, 1, "dim"), len(x.shape))
        return lw.add(op, [x], axes=axes, keepdims=bool(arg(node, 2, "keepdim", False)))
    return convert


def _var(lw: Lowering, node: fx.Node) -> Result:
    out = lw.out_type.dtype
    x = lw.cast(lw.tensor(node.args[0]), out)
    correction = node.kwargs.get("correction", 1)
    correction = 1 if correction is None else correction
    if float(correction) != int(correction):
        raise Unsupported(f"a fractional correction ({correction}) is not supported", op=lw.op)
    axes = _axes(arg(node, 1, "dim"), len(x.shape))
    return lw.add("var", [x], axes=axes, keepdims=bool(node.kwargs.get("keepdim", False)),
                  ddof=int(correction))


def _any(lw: Lowering, node: fx.Node) -> Result:
    """any(x, dim): max of (x != 0) as u8, back to bool."""
    x = lw.cast(lw.cast(lw.tensor(node.args[0]), DType.bool), DType.u8)
    axes = _axes(arg(node, 1, "dim"), len(x.shape))
    folded = lw.add("max", [x], axes=axes, keepdims=bool(arg(node, 2, "keepdim", False)))
    return lw.cast(folded, DType.bool)


def _arg_reduce(op: str) -> Converter:
    def convert(lw: Lowering, node: fx.Node) -> Result:
        dim = arg(node, 1, "dim")
        return lw.add(op, [lw.tensor(node.args[0])], axis=dim,
                      keepdims=bool(arg(node, 2, "keepdim", False)))
    return convert


# ---- movement --------------------------------------------------------------------------------


def _to_result_shape(lw: Lowering, node: fx.Node) -> Result:
    """view / reshape / squeeze / unsqueeze / flatten: a reshape to the recorded result shape."""
    return lw.reshape(lw.tensor(node.args[0]), lw.out_type.shape)


def _permute(lw: Lowering, node: fx.Node) -> Result:
    x = lw.tensor(node.args[0])
    rank = len(x.shape)
    return lw.add("transpose", [x], perm=tuple(int(d) % rank for d in node.args[1]))


def _transpose(lw: Lowering, node: fx.Node) -> Result:
    x = lw.tensor(node.args[0])
    rank = len(x.shape)
    if rank < 2:
        return x
    d0, d1 = (int(node.args[1]) % rank, int(node.args[2]) % rank) if len(node.args) > 1 \
        else (0, 1)
    perm = list(range(rank))
    perm[d0], perm[d1] = perm[d1], perm[d0]
    return lw.add("transpose", [x], perm=tuple(perm))


def _expand(lw: Lowering, node: fx.Node) -> Result:
    x, shape = lw.tensor(node.args[0]), lw.out_type.shape
    return x if x.shape == shape else lw.add("broadcast_to", [x], shape=shape)


def _cat(lw: Lowering, node: fx.Node) -> Result:
    out = lw.out_type
    parts = [lw.cast(lw.tensor(t), out.dtype) for t in node.args[0]]
    parts = [p for p in parts if not (len(p.shape) == 1 and p.shape[0] == 0)] or parts[:1]
    dim = int(arg(node, 1, "dim", 0)) % len(out.shape)
    return parts[0] if len(parts) == 1 else lw.add("concat", parts, axis=dim)


def _split(lw: Lowering, node: fx.Node) -> Result:
    """split.Tensor and split_with_sizes: the sizes are read off the recorded results."""
    x = lw.tensor(node.args[0])
    dim = int(arg(node, 2, "dim", 0)) % len(x.shape)
    sizes = tuple(int(v.shape[dim]) for v in node.meta["val"])
    if len(sizes) == 1:
        return (x,)
    return lw.add_multi("split", [x], axis=dim, sizes=sizes)


def _slice_attrs(shape: Sequence[int], dim: int, start: int, stop: int,
                 step: int) -> dict[str, tuple[int, ...]]:
    starts, stops, steps = [0] * len(shape), list(shape), [1] * len(shape)
    starts[dim], stops[dim], steps[dim] = start, stop, step
    return {"starts": tuple(starts), "stops": tuple(stops), "steps": tuple(steps)}


def _slice(lw: Lowering, node: fx.Node) -> Result:
    x = lw.tensor(node.args[0])
    dim = int(arg(node, 1, "dim", 0)) % len(x.shape)
    start, end = arg(node, 2, "start"), arg(node, 3, "end")
    step = int(arg(node, 4, "step", 1))
    begin, stop, _ = slice(start, end, step).indices(int(x.shape[dim]))
    if begin == 0 and stop == x.shape[dim] and step == 1:
        return x
    return lw.add("slice", [x], **_slice_attrs(x.shape, dim, begin, max(stop, begin), step))


def _select(lw: Lowering, node: fx.Node) -> Result:
    x = lw.tensor(node.args[0])
    dim = int(node.args[1]) % len(x.shape)
    index = int(node.args[2]) % int(x.shape[dim])
    piece = lw.add("slice", [x], **_slice_attrs(x.shape, dim, index, index + 1, 1))
    return lw.reshape(piece, lw.out_type.shape)


def _index_select(lw: Lowering, node: fx.Node) -> Result:
    """index_select; a 0-d source runs as a 1-element vector (its index is 0-d or [1])."""
    x, index = lw.tensor(node.args[0]), lw.tensor(node.args[2])
    if len(x.shape) == 0:
        picked = lw.add("take", [lw.reshape(x, (1,)), lw.reshape(index, (1,))], axis=0)
        return lw.reshape(picked, lw.out_type.shape)
    return lw.add("take", [x, index], axis=int(node.args[1]) % len(x.shape))


def _embedding(lw: Lowering, node: fx.Node) -> Result:
    return lw.add("take", [lw.tensor(node.args[0]), lw.tensor(node.args[1])], axis=0)


def _constant_pad(lw: Lowering, node: fx.Node) -> Result:
    """constant_pad_nd: pad pairs run from the last dim backwards; negative pads crop (no)."""
    x, pad = lw.tensor(node.args[0]), [int(p) for p in node.args[1]]
    rank = len(x.shape)
    pads = [0] * (2 * rank)
    for i in range(len(pad) // 2):
        axis = rank - 1 - i
        pads[2 * axis], pads[2 * axis + 1] = pad[2 * i], pad[2 * i + 1]
    if min(pads, default=0) < 0:   # crop first: the negative pads, as a slice
        starts = tuple(max(-pads[2 * a], 0) for a in range(rank))
        stops = tuple(int(x.shape[a]) - max(-pads[2 * a + 1], 0) for a in range(rank))
        x = lw.add("slice", [x], starts=starts, stops=tuple(max(s, b) for s, b in
                                                            zip(stops, starts, strict=True)),
                   steps=(1,) * rank)
        pads = [max(p, 0) for p in pads]
    if not any(pads):
        return x
    return lw.add("pad", [x], pads=tuple(pads), value=float(arg(node, 2, "value", 0.0)))


def _identity(lw: Lowering, node: fx.Node) -> Result:
    """clone / detach / alias / lift_fresh_copy: the same value (copies are free here)."""
    return lw.tensor(node.args[0])


def _to_copy(lw: Lowering, node: fx.Node) -> Result:
    device = node.kwargs.get("device")
    source = node.args[0].meta.get("val") if isinstance(node.args[0], fx.Node) else None
    here = source.device.type if isinstance(source, torch.Tensor) else "cpu"
    if device is not None and torch.device(device).type != here:
        raise Unsupported(f"a copy from {here} to {device} is not supported", op=lw.op)
    return lw.cast(lw.tensor(node.args[0]), lw.out_type.dtype)


# ---- pooling ---------------------------------------------------------------------------------


def _pair(v: Any, default: Sequence[int]) -> tuple[int, int]:
    v = list(v) if isinstance(v, (list, tuple)) else [v]
    v = v or list(default)
    return (int(v[0]), int(v[-1]))


def _max_pool(lw: Lowering, node: fx.Node) -> Result:
    if 1 in used_outputs(node):
        raise Unsupported("max_pool2d's indices are read", op=lw.op)
    x = lw.tensor(node.args[0])
    unbatched = len(x.shape) == 3
    if unbatched:
        x = lw.reshape(x, (1, *x.shape))
    kernel = _pair(node.args[1], ())
    stride = _pair(arg(node, 2, "stride", []), kernel)
    pad = _pair(arg(node, 3, "padding", 0), (0,))
    y = lw.add("max_pool2d", [x], kernel=kernel, stride=stride,
               padding=(pad[0], pad[1], pad[0], pad[1]),
               dilation=_pair(arg(node, 4, "dilation", 1), (1,)),
               ceil_mode=bool(arg(node, 5, "ceil_mode", False)))
    return (lw.reshape(y, y.shape[1:]) if unbatched else y, None)


def _avg_pool(lw: Lowering, node: fx.Node) -> Result:
    if arg(node, 6, "divisor_override") is not None:
        raise Unsupported("avg_pool2d's divisor_override is not supported", op=lw.op)
    x = lw.tensor(node.args[0])
    kernel = _pair(node.args[1], ())
    pad = _pair(arg(node, 3, "padding", 0), (0,))
    return lw.add("avg_pool2d", [x], kernel=kernel,
                  stride=_pair(arg(node, 2, "stride", []), kernel),
                  padding=(pad[0], pad[1], pad[0], pad[1]),
                  ceil_mode=bool(arg(node, 4, "ceil_mode", False)),
                  count_include_pad=bool(arg(node, 5, "count_include_pad", True)))


def _adaptive_avg_pool(lw: Lowering, node: fx.Node) -> Result:
    """_adaptive_avg_pool2d when each output cell averages an equal, disjoint window."""
    x = lw.tensor(node.args[0])
    (h, w), (oh, ow) = x.shape[-2:], lw.out_type.shape[-2:]
    if h % oh or w % ow or len(x.shape) != 4:
        raise Unsupported(f"adaptive pooling {h}x{w} -> {oh}x{ow} has uneven windows",
                          op=lw.op)
    if (oh, ow) == (1, 1):
        return lw.add("mean", [x], axes=(2, 3), keepdims=True)
    kernel = (h // oh, w // ow)
    return lw.add("avg_pool2d", [x], kernel=kernel, stride=kernel)


# ---- sources ---------------------------------------------------------------------------------


def _full(lw: Lowering, node: fx.Node) -> Result:
    """full / full_like / empty (as zeros) / scalar_tensor: a constant-valued tensor."""
    out = lw.out_type
    value = 0.0 if "empty" in lw.op else node.args[0] if "scalar_tensor" in lw.op \
        else node.args[1]
    if isinstance(value, fx.Node):
        raise Unsupported("a fill value computed at run time is not supported", op=lw.op)
    if out.dtype.is_int and isinstance(value, float) and not float(value).is_integer():
        raise Unsupported(f"fill value {value} does not fit {out.dtype}", op=lw.op)
    if not math.isfinite(float(value)) or abs(float(value)) >= 2**53:
        return lw.constant(np.full(out.shape, value).astype(out.dtype.np))
    return lw.add("full", [], shape=out.shape, value=float(value), dtype=out.dtype)


def _arange(lw: Lowering, node: fx.Node) -> Result:
    """arange.default (end) and arange.start_step (start, end, step)."""
    values = [a for a in node.args if not isinstance(a, fx.Node)]
    start, end, step = (0, values[0], 1) if len(values) == 1 else \
        (values[0], values[1], values[2] if len(values) > 2 else 1)
    out = lw.out_type
    values_np = np.arange(start, end, step, dtype=np.float64)
    if values_np.shape != out.shape:
        raise Unsupported("arange length disagrees with the traced result", op=lw.op)
    return lw.add("arange", [], start=float(start), stop=float(end), step=float(step),
                  dtype=out.dtype)


def _getitem(lw: Lowering, node: fx.Node) -> Result:
    source, index = node.args
    values = lw.env.get(source) if isinstance(source, fx.Node) else None
    if not isinstance(values, tuple):
        raise Unsupported("getitem of something that is not a converted multi-output op",
                          op="getitem")
    value = values[index]
    if value is None:
        raise Unsupported(f"result {index} of {source.name} is not computed", op="getitem")
    return value


def _table() -> Mapping[Any, Converter]:
    unary = {
        aten.neg.default: "neg", aten.exp.default: "exp", aten.log.default: "log",
        aten.sqrt.default: "sqrt", aten.rsqrt.default: "rsqrt", aten.tanh.default: "tanh",
        aten.sigmoid.default: "sigmoid", aten.relu.default: "relu", aten.silu.default: "silu",
        aten.erf.default: "erf", aten.abs.default: "abs", aten.reciprocal.default: "reciprocal",
        aten.expm1.default: "expm1", aten.log1p.default: "log1p", aten.sin.default: "sin",
        aten.cos.default: "cos", aten.floor.default: "floor", aten.ceil.default: "ceil",
        aten.sign.default: "sign",
    }
    binary = {
        aten.mul.Tensor: "mul", aten.mul.Scalar: "mul", aten.maximum.default: "maximum",
        aten.minimum.default: "minimum", aten.pow.Tensor_Tensor: "pow",
        aten.pow.Tensor_Scalar: "pow", aten.remainder.Tensor: "mod",
        aten.remainder.Scalar: "mod",
    }
    compare = {getattr(aten, name).Tensor: name for name in ("eq", "ne", "lt", "le", "gt", "ge")}
    compare.update({getattr(aten, name).Scalar: name
                    for name in ("eq", "ne", "lt", "le", "gt", "ge")})
    table: dict[Any, Converter] = {k: _unary(v) for k, v in unary.items()}
    table.update({k: _binary(v) for k, v in binary.items()})
    table.update({k: _compare(v) for k, v in compare.items()})
    table.update({
        aten.add.Tensor: _add_sub("add"), aten.add.Scalar: _add_sub("add"),
        aten.sub.Tensor: _add_sub("sub"), aten.sub.Scalar: _add_sub("sub"),
        aten.rsub.Scalar: _rsub, aten.rsub.Tensor: _rsub,
        aten.div.Tensor: _div, aten.div.Scalar: _div, aten.div.Tensor_mode: _div,
        aten.pow.Scalar: _pow_scalar, aten.gelu.default: _gelu, aten.where.self: _where,
        aten.clamp.default: _clamp, aten.clamp.Tensor: _clamp,
        aten.logical_not.default: _logical_not, aten.logical_and.default: _logical("logical_and"),
        aten.logical_or.default: _logical("logical_or"),
        aten.logical_xor.default: _logical("logical_xor"),
        aten.mm.default: _matmul, aten.bmm.default: _matmul, aten.matmul.default: _matmul,
        aten.addmm.default: _addmm, aten.convolution.default: _convolution,
        aten._softmax.default: _softmax("softmax"),
        aten._log_softmax.default: _softmax("log_softmax"),
        aten.native_layer_norm.default: _layer_norm,
        aten.native_group_norm.default: _group_norm,
        aten.native_batch_norm.default: _native_batch_norm,
        aten._native_batch_norm_legit_no_training.default: _batch_norm_no_training,
        aten.sum.dim_IntList: _reduce("sum"), aten.sum.default: _reduce("sum"),
        aten.mean.dim: _reduce("mean"), aten.mean.default: _reduce("mean"),
        aten.amax.default: _reduce("max"), aten.amin.default: _reduce("min"),
        aten.var.correction: _var, aten.any.dim: _any, aten.any.dims: _any,
        aten.any.default: _any,
        aten.argmax.default: _arg_reduce("argmax"), aten.argmin.default: _arg_reduce("argmin"),
        aten.permute.default: _permute, aten.t.default: _transpose,
        aten.transpose.int: _transpose, aten.expand.default: _expand, aten.cat.default: _cat,
        aten.split.Tensor: _split, aten.split_with_sizes.default: _split,
        aten.slice.Tensor: _slice, aten.select.int: _select,
        aten.index_select.default: _index_select, aten.embedding.default: _embedding,
        aten.constant_pad_nd.default: _constant_pad,
        aten._to_copy.default: _to_copy, aten.max_pool2d_with_indices.default: _max_pool,
        aten.avg_pool2d.default: _avg_pool, aten._adaptive_avg_pool2d.default: _adaptive_avg_pool,
        aten.full.default: _full, aten.full_like.default: _full, aten.scalar_tensor.default: _full,
        aten.empty.memory_format: _full, aten.arange.default: _arange,
        aten.arange.start_step: _arange, aten.arange.start: _arange,
        operator.getitem: _getitem,
    })
    table.update(sdpa_converters())   # the fused SDPA ops of traced CUDA tensors
    table.update(index_converters())  # bitwise, index, gather, cumsum, topk
    table.update(scatter_converters())  # scatter, scatter_add, scatter_reduce, index_put
    table.update(training_converters())   # backward ops of training graphs
    for view in (aten.view.default, aten._unsafe_view.default, aten.reshape.default,
                 aten.unsqueeze.default, aten.squeeze.dims, aten.squeeze.dim,
                 aten.squeeze.default, aten.flatten.using_ints):
        table[view] = _to_result_shape
    for same in (aten.clone.default, aten.detach.default, aten.alias.default,
                 aten.lift_fresh_copy.default, aten.contiguous.default):
        table[same] = _identity
    return MappingProxyType(table)


def _rsub(lw: Lowering, node: fx.Node) -> Result:
    """rsub(a, b, alpha) = b - alpha·a."""
    out = lw.out_type.dtype
    a = lw.operand(node.args[0], out)
    alpha = arg(node, 2, "alpha", 1)
    if alpha != 1:
        a = lw.add("mul", [a, lw.operand(alpha, out)])
    return lw.add("sub", [lw.operand(node.args[1], out), a])


ATEN_CONVERTERS: Mapping[Any, Converter] = _table()
"""ATen overload (and ``operator.getitem``) → converter; read-only."""

COMPUTE_FREE: frozenset[Any] = frozenset(
    k for k, v in ATEN_CONVERTERS.items()
    if v in (_to_result_shape, _identity, _getitem, _permute, _transpose, _expand))
"""Converters that only rename or re-view data: a region made only of these stays in torch."""

RESULT_SHAPED: frozenset[Any] = frozenset(
    k for k, v in ATEN_CONVERTERS.items() if v in (_to_result_shape, _expand))
"""Converters that read only the recorded result shape, never their size arguments (so they
take sizes computed at run time, the SymInts of a dynamic graph)."""
