"""Composite ops: softmax, log_softmax, layer_norm, rms_norm, group_norm.

Each has a NumPy reference and a ``decompose(builder, inputs, attrs, loc)`` that rebuilds it from
simpler registered ops and returns its output values. Both compute f16/bf16 in f32 and round once
at the end (the decomposition casts up first and back last), so that fusing the decomposition
reproduces the reference, not a chain of low-precision roundings. Softmax and log_softmax
subtract the row maximum first, so large inputs do not overflow.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from tilefuse.dtypes import FLOAT_TYPES, DType, promote_all
from tilefuse.errors import ShapeError, SourceLoc
from tilefuse.graph.ir import Attrs, Value
from tilefuse.graph.types import Shape, format_shape, normalize_axis
from tilefuse.ops import vjp
from tilefuse.ops.registry import AttrType, OpDef, OpKind, Trait, attr
from tilefuse.ops.rules import (
    LOW_PRECISION_TYPES,
    as_dtype,
    dtype_of,
    promoted,
    quiet,
    work_dtype,
)

_COMPOSITE = frozenset({Trait.COMPOSITE})

# ---- shared decomposition helpers ------------------------------------------------------------


class _Emitter:
    """Appends ops to a builder with one source location, in one working dtype."""

    def __init__(self, builder: Any, loc: SourceLoc | None, out: DType):
        self.builder, self.loc, self.out = builder, loc, out
        self.work = DType.f32 if out in LOW_PRECISION_TYPES else out

    def op(self, name: str, *inputs: Value, **attrs: Any) -> Value:
        return self.builder.add1(name, list(inputs), attrs, self.loc)

    def widen(self, v: Value) -> Value:
        return v if v.dtype is self.work else self.op("cast", v, dtype=self.work)

    def narrow(self, v: Value) -> Value:
        return v if v.dtype is self.out else self.op("cast", v, dtype=self.out)

    def scalar(self, value: float) -> Value:
        return self.op("full", shape=(), value=value, dtype=self.work)


def _out_dtype(inputs: Sequence[Value]) -> DType:
    return promote_all(tuple(v.dtype for v in inputs))


def _trailing_axes(x_rank: int, k: int) -> tuple[int, ...]:
    return tuple(range(x_rank - k, x_rank))


# ---- softmax, log_softmax --------------------------------------------------------------------


def _softmax_rule(shapes: tuple[Shape, ...], attrs: Attrs) -> tuple[Shape, ...]:
    x = shapes[0]
    axis = normalize_axis(attrs["axis"], len(x))
    if x[axis] == 0:
        raise ShapeError(f"cannot normalise over the empty axis {axis}")
    return (x,)


def _softmax_ref(x: np.ndarray, axis: int) -> np.ndarray:
    wide = x.astype(work_dtype(dtype_of(x)))
    e = np.exp(wide - wide.max(axis=axis, keepdims=True))
    return as_dtype(e / e.sum(axis=axis, keepdims=True), dtype_of(x))


def _log_softmax_ref(x: np.ndarray, axis: int) -> np.ndarray:
    wide = x.astype(work_dtype(dtype_of(x)))
    shifted = wide - wide.max(axis=axis, keepdims=True)
    return as_dtype(shifted - np.log(np.exp(shifted).sum(axis=axis, keepdims=True)), dtype_of(x))


def _shifted(em: _Emitter, x: Value, axis: int) -> tuple[Value, Value]:
    """x - max(x) along axis, and exp of it."""
    m = em.op("max", x, axes=(axis,), keepdims=True)
    d = em.op("sub", x, m)
    return d, em.op("exp", d)


def _softmax_decompose(builder: Any, inputs: Sequence[Value], attrs: Attrs,
                       loc: SourceLoc | None = None) -> tuple[Value, ...]:
    em = _Emitter(builder, loc, _out_dtype(inputs))
    _, e = _shifted(em, em.widen(inputs[0]), attrs["axis"])
    s = em.op("sum", e, axes=(attrs["axis"],), keepdims=True)
    return (em.narrow(em.op("div", e, s)),)


def _log_softmax_decompose(builder: Any, inputs: Sequence[Value], attrs: Attrs,
                           loc: SourceLoc | None = None) -> tuple[Value, ...]:
    em = _Emitter(builder, loc, _out_dtype(inputs))
    d, e = _shifted(em, em.widen(inputs[0]), attrs["axis"])
    lse = em.op("log", em.op("sum", e, axes=(attrs["axis"],), keepdims=True))
    return (em.narrow(em.op("sub", d, lse)),)


_AXIS = (attr("axis", AttrType.INT, -1),)

SOFTMAX = OpDef("softmax", OpKind.REDUCTION, 1, _softmax_rule, promoted, quiet(_softmax_ref),
                attrs=_AXIS, traits=_COMPOSITE, accepts=FLOAT_TYPES,
                decompose=_softmax_decompose, vjp=vjp.softmax_vjp,
                doc="exp(x - max) / sum(exp(x - max)) along axis")
LOG_SOFTMAX = OpDef("log_softmax", OpKind.REDUCTION, 1, _softmax_rule, promoted,
                    quiet(_log_softmax_ref), attrs=_AXIS, traits=_COMPOSITE,
                    accepts=FLOAT_TYPES, decompose=_log_softmax_decompose,
                    vjp=vjp.log_softmax_vjp,
                    doc="(x - max) - log(sum(exp(x - max))) along axis")

# ---- layer_norm, rms_norm --------------------------------------------------------------------


def _norm_rule(shapes: tuple[Shape, ...], attrs: Attrs) -> tuple[Shape, ...]:
    """x, then weight (and bias) with exactly x's trailing shape."""
    x, params = shapes[0], shapes[1:]
    k = len(params[0])
    if k == 0 or k > len(x) or x[len(x) - k:] != params[0]:
        raise ShapeError(f"weight {format_shape(params[0])} must be a non-empty trailing part "
                         f"of x's shape {format_shape(x)}")
    if any(p != params[0] for p in params[1:]):
        raise ShapeError(f"bias {format_shape(params[1])} must have weight's shape "
                         f"{format_shape(params[0])}")
    if any(d == 0 for d in params[0]):
        raise ShapeError(f"cannot normalise over the empty dims {format_shape(params[0])}")
    return (x,)


def _layer_norm_ref(x: np.ndarray, weight: np.ndarray, bias: np.ndarray,
                    eps: float) -> np.ndarray:
    out = promote_all((dtype_of(x), dtype_of(weight), dtype_of(bias)))
    w = work_dtype(out)
    xw = x.astype(w)
    axes = _trailing_axes(x.ndim, weight.ndim)
    centred = xw - xw.mean(axis=axes, keepdims=True)
    var = (centred * centred).mean(axis=axes, keepdims=True)
    y = centred / np.sqrt(var + w.type(eps)) * weight.astype(w) + bias.astype(w)
    return as_dtype(y, out)


def _rms_norm_ref(x: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
    out = promote_all((dtype_of(x), dtype_of(weight)))
    w = work_dtype(out)
    xw = x.astype(w)
    axes = _trailing_axes(x.ndim, weight.ndim)
    ms = (xw * xw).mean(axis=axes, keepdims=True)
    return as_dtype(xw / np.sqrt(ms + w.type(eps)) * weight.astype(w), out)


def _layer_norm_decompose(builder: Any, inputs: Sequence[Value], attrs: Attrs,
                          loc: SourceLoc | None = None) -> tuple[Value, ...]:
    em = _Emitter(builder, loc, _out_dtype(inputs))
    x, weight, bias = (em.widen(v) for v in inputs)
    axes = _trailing_axes(x.type.rank, weight.type.rank)
    centred = em.op("sub", x, em.op("mean", x, axes=axes, keepdims=True))
    var = em.op("mean", em.op("mul", centred, centred), axes=axes, keepdims=True)
    inv = em.op("rsqrt", em.op("add", var, em.scalar(attrs["eps"])))
    y = em.op("add", em.op("mul", em.op("mul", centred, inv), weight), bias)
    return (em.narrow(y),)


def _rms_norm_decompose(builder: Any, inputs: Sequence[Value], attrs: Attrs,
                        loc: SourceLoc | None = None) -> tuple[Value, ...]:
    em = _Emitter(builder, loc, _out_dtype(inputs))
    x, weight = (em.widen(v) for v in inputs)
    axes = _trailing_axes(x.type.rank, weight.type.rank)
    ms = em.op("mean", em.op("mul", x, x), axes=axes, keepdims=True)
    inv = em.op("rsqrt", em.op("add", ms, em.scalar(attrs["eps"])))
    return (em.narrow(em.op("mul", em.op("mul", x, inv), weight)),)


LAYER_NORM = OpDef("layer_norm", OpKind.REDUCTION, 3, _norm_rule, promoted,
                   quiet(_layer_norm_ref), attrs=(attr("eps", AttrType.FLOAT, 1e-5),),
                   traits=_COMPOSITE, accepts=FLOAT_TYPES, decompose=_layer_norm_decompose,
                   doc="(x - mean) / sqrt(var + eps) · weight + bias over the trailing "
                       "weight.ndim dims (biased variance, as torch)")
RMS_NORM = OpDef("rms_norm", OpKind.REDUCTION, 2, _norm_rule, promoted, quiet(_rms_norm_ref),
                 attrs=(attr("eps", AttrType.FLOAT, 1e-6),), traits=_COMPOSITE,
                 accepts=FLOAT_TYPES, decompose=_rms_norm_decompose,
                 doc="x / sqrt(mean(x²) + eps) · weight over the trailing weight.ndim dims")


# ---- group_norm ------------------------------------------------------------------------------


def _group_norm_rule(shapes: tuple[Shape, ...], attrs: Attrs) -> tuple[Shape, ...]:
    """x [N, C, spatial...] with static C and spatial dims; weight and bias [C]; ``groups``
    divides C."""
    x, weight, bias = shapes
    groups = attrs["groups"]
    if len(x) < 2:
        raise ShapeError(f"x {format_shape(x)} needs at least [N, C]")
    channels = x[1]
    if not all(isinstance(d, int) for d in x[1:]):
        raise ShapeError(f"x {format_shape(x)} needs static channel and spatial dims")
    if groups < 1 or channels % groups:  # type: ignore[operator]
        raise ShapeError(f"groups={groups} must divide the {channels} channels of x "
                         f"{format_shape(x)}")
    if weight != (channels,) or bias != (channels,):
        raise ShapeError(f"weight {format_shape(weight)} and bias {format_shape(bias)} must "
                         f"both be [{channels}] (one per channel)")
    if any(d == 0 for d in x[1:]):
        raise ShapeError(f"cannot normalise the empty groups of x {format_shape(x)}")
    return (x,)


def _group_norm_ref(x: np.ndarray, weight: np.ndarray, bias: np.ndarray, groups: int,
                    eps: float) -> np.ndarray:
    out = promote_all((dtype_of(x), dtype_of(weight), dtype_of(bias)))
    w = work_dtype(out)
    grouped = x.astype(w).reshape(x.shape[0], groups, -1)
    centred = grouped - grouped.mean(axis=2, keepdims=True)
    var = (centred * centred).mean(axis=2, keepdims=True)
    norm = (centred / np.sqrt(var + w.type(eps))).reshape(x.shape)
    per_channel = (x.shape[1],) + (1,) * (x.ndim - 2)
    y = norm * weight.astype(w).reshape(per_channel) + bias.astype(w).reshape(per_channel)
    return as_dtype(y, out)


def _group_norm_decompose(builder: Any, inputs: Sequence[Value], attrs: Attrs,
                          loc: SourceLoc | None = None) -> tuple[Value, ...]:
    """x viewed as [N, groups, rest], each row normalised as layer_norm does, viewed back, then
    the per-channel affine."""
    em = _Emitter(builder, loc, _out_dtype(inputs))
    x, weight, bias = (em.widen(v) for v in inputs)
    shape = tuple(x.type.shape)
    groups = attrs["groups"]
    rest = 1
    for d in shape[1:]:
        rest *= int(d)  # type: ignore[arg-type]
    grouped = em.op("reshape", x, shape=(shape[0], groups, rest // groups))
    centred = em.op("sub", grouped, em.op("mean", grouped, axes=(2,), keepdims=True))
    var = em.op("mean", em.op("mul", centred, centred), axes=(2,), keepdims=True)
    inv = em.op("rsqrt", em.op("add", var, em.scalar(attrs["eps"])))
    norm = em.op("reshape", em.op("mul", centred, inv), shape=shape)
    per_channel = (shape[1],) + (1,) * (len(shape) - 2)
    y = em.op("add", em.op("mul", norm, em.op("reshape", weight, shape=per_channel)),
              em.op("reshape", bias, shape=per_channel))
    return (em.narrow(y),)


GROUP_NORM = OpDef("group_norm", OpKind.REDUCTION, 3, _group_norm_rule, promoted,
                   quiet(_group_norm_ref),
                   attrs=(attr("groups", AttrType.INT), attr("eps", AttrType.FLOAT, 1e-5)),
                   traits=_COMPOSITE, accepts=FLOAT_TYPES, decompose=_group_norm_decompose,
                   doc="x [N, C, ...] in ``groups`` groups of channels, each normalised over its "
                       "channels and spatial dims (biased variance), then · weight[c] + bias[c]")

DEFINITIONS: tuple[OpDef, ...] = (SOFTMAX, LOG_SOFTMAX, LAYER_NORM, RMS_NORM, GROUP_NORM)
