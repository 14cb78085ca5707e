"""Data movement and sources: reshape, transpose, broadcast_to, expand_dims, squeeze, slice,
concat, split, stack, pad, take, take_along_axis, constant, arange, full.

Shapes given as attributes (reshape, broadcast_to, full) may hold symbols (:class:`Sym`). A
reference can only allocate concrete sizes: it resolves a symbol from its input where it can
(reshape's single unknown, broadcast_to's aligned input dim) and otherwise needs its caller to have
substituted the symbols' bound sizes into the attributes.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from tilefuse.dtypes import INT_TYPES, DType
from tilefuse.errors import AttrError, DTypeError, ShapeError
from tilefuse.graph.ir import Attrs
from tilefuse.graph.types import (
    Dim,
    Shape,
    Sym,
    SymProduct,
    broadcast_shapes,
    format_shape,
    normalize_axes,
    normalize_axis,
    static_dim,
)
from tilefuse.ops import vjp
from tilefuse.ops.registry import AttrType, OpDef, OpKind, Trait, attr
from tilefuse.ops.rules import (
    as_dtype,
    check_shape_attr,
    concrete_shape,
    dtype_of,
    promoted,
    quiet,
    same_dtype,
)

_MOVE = OpKind.MOVEMENT

# ---- reshape ---------------------------------------------------------------------------------


def _check_reshape_target(target: object) -> tuple[Dim, ...]:
    if not isinstance(target, tuple):
        raise AttrError(f"shape must be a tuple of ints and symbols, got {target!r}")
    for d in target:
        if isinstance(d, bool) or not isinstance(d, (int, Sym)) or (isinstance(d, int) and d < -1):
            raise AttrError(f"shape entries must be ints >= -1 or symbols, got {d!r}")
    if sum(1 for d in target if d == -1) > 1:
        raise AttrError(f"shape {format_shape(target)} has more than one -1")
    return target


def infer_reshape(src: Shape, target: tuple[Dim, ...]) -> Shape:
    """The concrete target shape of reshaping ``src`` (a -1 is inferred); ShapeError when the
    element counts differ. Counts are compared as symbolic products (``768*batch``)."""
    total = SymProduct.of(src)
    known = SymProduct.of([d for d in target if d != -1])
    if -1 in target:
        quotient = total.divide(known)
        dim = quotient.as_dim() if quotient is not None else None
        if dim is None:
            raise ShapeError(f"cannot infer the -1 in {format_shape(target)} from "
                             f"{format_shape(src)} ({total} elements)")
        return tuple(dim if d == -1 else d for d in target)
    if total != known and not (total.coeff == 0 and known.coeff == 0):
        raise ShapeError(f"cannot reshape {format_shape(src)} ({total} elements) to "
                         f"{format_shape(target)} ({known} elements)")
    return target


def _reshape_rule(shapes: tuple[Shape, ...], attrs: Attrs) -> tuple[Shape, ...]:
    return (infer_reshape(shapes[0], _check_reshape_target(attrs["shape"])),)


def _reshape_ref(x: np.ndarray, shape: tuple[Dim, ...]) -> np.ndarray:
    dims = [-1 if isinstance(d, Sym) else d for d in shape]
    if dims.count(-1) > 1:
        concrete_shape(tuple(d for d in shape if d != -1))  # raises, naming the symbol
    return x.reshape(dims)


def _reshape_back(d: Any, ins: Any, out: Any, g: Any, **attrs: Any) -> tuple[Any, ...]:
    """The rule of every op that only changes the shape (reshape, expand_dims, squeeze)."""
    return (d.op("reshape", g, shape=tuple(ins[0].type.shape)),)


RESHAPE = OpDef("reshape", _MOVE, 1, _reshape_rule, same_dtype, _reshape_ref,
                attrs=(attr("shape", AttrType.ANY),), vjp=_reshape_back,
                doc="same elements in row-major order; at most one -1 entry is inferred")

# ---- transpose, broadcast_to, expand_dims, squeeze -------------------------------------------


def _transpose_rule(shapes: tuple[Shape, ...], attrs: Attrs) -> tuple[Shape, ...]:
    shape, perm = shapes[0], attrs["perm"]
    if len(perm) != len(shape):
        raise ShapeError(f"perm {list(perm)} has {len(perm)} entries for rank {len(shape)}")
    axes = [normalize_axis(p, len(shape)) for p in perm]
    if len(set(axes)) != len(axes):
        raise ShapeError(f"perm {list(perm)} is not a permutation")
    return (tuple(shape[a] for a in axes),)


def _transpose_vjp(d: Any, ins: Any, out: Any, g: Any, perm: tuple[int, ...]) -> tuple[Any, ...]:
    inverse = np.argsort([normalize_axis(p, len(perm)) for p in perm])
    return (d.op("transpose", g, perm=tuple(int(i) for i in inverse)),)


TRANSPOSE = OpDef("transpose", _MOVE, 1, _transpose_rule, same_dtype,
                  lambda x, perm: np.transpose(x, perm), attrs=(attr("perm", AttrType.INTS),),
                  vjp=_transpose_vjp,
                  doc="out.shape[i] = x.shape[perm[i]]")


def _broadcasts_to(d: Dim, target: Dim) -> bool:
    """Whether an input dim can broadcast to a target dim (a symbol may stand for 1 or n)."""
    return d == 1 or d == target or (isinstance(d, Sym) and isinstance(target, int))


def _broadcast_to_rule(shapes: tuple[Shape, ...], attrs: Attrs) -> tuple[Shape, ...]:
    src, target = shapes[0], check_shape_attr(attrs["shape"])
    offset = len(target) - len(src)
    if offset < 0 or not all(_broadcasts_to(d, target[offset + i]) for i, d in enumerate(src)):
        raise ShapeError(f"cannot broadcast {format_shape(src)} to {format_shape(target)}")
    return (target,)


def _broadcast_to_ref(x: np.ndarray, shape: tuple[Dim, ...]) -> np.ndarray:
    offset = len(shape) - x.ndim
    dims = tuple(x.shape[i - offset] if isinstance(d, Sym) and i >= offset
                 and x.shape[i - offset] != 1 else d for i, d in enumerate(shape))
    return np.broadcast_to(x, concrete_shape(dims, "broadcast_to's shape")).copy()


BROADCAST_TO = OpDef("broadcast_to", _MOVE, 1, _broadcast_to_rule, same_dtype, _broadcast_to_ref,
                     attrs=(attr("shape", AttrType.ANY),),
                     vjp=lambda d, ins, out, g, shape: (d.sum_to(g, ins[0]),),
                     doc="NumPy broadcasting to a shape")


def _expand_dims_rule(shapes: tuple[Shape, ...], attrs: Attrs) -> tuple[Shape, ...]:
    shape, axes = shapes[0], attrs["axes"]
    new = normalize_axes(axes, len(shape) + len(axes))
    rest = iter(shape)
    return (tuple(1 if i in new else next(rest) for i in range(len(shape) + len(axes))),)


EXPAND_DIMS = OpDef("expand_dims", _MOVE, 1, _expand_dims_rule, same_dtype,
                    lambda x, axes: np.expand_dims(x, axes), attrs=(attr("axes", AttrType.INTS),),
                    vjp=_reshape_back,
                    doc="inserts size-1 axes; axes index the result")


def _squeeze_axes(shape: Shape, axes: tuple[int, ...] | None) -> tuple[int, ...]:
    if axes is None:
        if any(isinstance(d, Sym) for d in shape):
            raise ShapeError(f"squeeze without axes needs a static shape, got {format_shape(shape)}"
                             "; name the axes")
        return tuple(i for i, d in enumerate(shape) if d == 1)
    norm = normalize_axes(axes, len(shape))
    for a in norm:
        if isinstance(shape[a], int) and shape[a] != 1:
            raise ShapeError(f"cannot squeeze axis {a} of size {shape[a]}")
    return norm


def _squeeze_rule(shapes: tuple[Shape, ...], attrs: Attrs) -> tuple[Shape, ...]:
    drop = _squeeze_axes(shapes[0], attrs["axes"])
    return (tuple(d for i, d in enumerate(shapes[0]) if i not in drop),)


def _squeeze_ref(x: np.ndarray, axes: tuple[int, ...] | None) -> np.ndarray:
    return np.squeeze(x, _squeeze_axes(x.shape, axes))


SQUEEZE = OpDef("squeeze", _MOVE, 1, _squeeze_rule, same_dtype, _squeeze_ref,
                attrs=(attr("axes", AttrType.OPT_INTS, None),), vjp=_reshape_back,
                doc="removes size-1 axes (all of them when axes is None)")

# ---- slice -----------------------------------------------------------------------------------

_HUGE = 2**62  # a bound at least this large means "to the end" (as INT64_MAX does in ONNX)


def slice_length(dim: Dim, start: int, stop: int, step: int) -> Dim:
    """len(range(n)[start:stop:step]) for a dim n; a whole-axis slice keeps a symbolic dim."""
    if step == 0:
        raise ShapeError("slice step must be nonzero")
    if isinstance(dim, Sym):
        forward = step == 1 and start == 0 and stop >= _HUGE
        backward = step == -1 and (start == -1 or start >= _HUGE) and stop <= -_HUGE
        if forward or backward:
            return dim
    n = static_dim(dim, "a partially sliced dimension")
    return len(range(*slice(start, stop, step).indices(n)))


def _slice_rule(shapes: tuple[Shape, ...], attrs: Attrs) -> tuple[Shape, ...]:
    shape = shapes[0]
    starts, stops, steps = attrs["starts"], attrs["stops"], attrs["steps"]
    if not len(starts) == len(stops) == len(steps) == len(shape):
        raise ShapeError(f"starts/stops/steps need one entry per axis ({len(shape)}), got "
                         f"{len(starts)}/{len(stops)}/{len(steps)}")
    return (tuple(slice_length(*args) for args in zip(shape, starts, stops, steps)),)


SLICE = OpDef("slice", _MOVE, 1, _slice_rule, same_dtype,
              lambda x, starts, stops, steps: x[tuple(map(slice, starts, stops, steps))],
              attrs=(attr("starts", AttrType.INTS), attr("stops", AttrType.INTS),
                     attr("steps", AttrType.INTS)), vjp=vjp.slice_vjp,
              doc="x[start:stop:step] per axis, NumPy semantics (negative steps, clamping)")

# ---- concat, split, stack --------------------------------------------------------------------


def _same_rank(shapes: tuple[Shape, ...]) -> int:
    if not shapes:
        raise ShapeError("needs at least one input")
    rank = len(shapes[0])
    if any(len(s) != rank for s in shapes):
        raise ShapeError("inputs differ in rank: " + ", ".join(map(format_shape, shapes)))
    return rank


def _concat_rule(shapes: tuple[Shape, ...], attrs: Attrs) -> tuple[Shape, ...]:
    rank = _same_rank(shapes)
    axis = normalize_axis(attrs["axis"], rank)
    for i in range(rank):
        if i != axis and any(s[i] != shapes[0][i] for s in shapes):
            raise ShapeError(f"dim {i} differs between inputs "
                             + ", ".join(map(format_shape, shapes)))
    if len(shapes) == 1:
        total: Dim = shapes[0][axis]
    else:
        total = sum(static_dim(s[axis], "a concatenated dimension") for s in shapes)
    return ((*shapes[0][:axis], total, *shapes[0][axis + 1:]),)


def _concat_ref(*arrays: np.ndarray, axis: int) -> np.ndarray:
    (out,) = promoted(tuple(dtype_of(a) for a in arrays), {})  # type: ignore[arg-type]
    return np.concatenate([a.astype(out.np, copy=False) for a in arrays], axis=axis)


CONCAT = OpDef("concat", _MOVE, None, _concat_rule, promoted, _concat_ref,
               attrs=(attr("axis", AttrType.INT, 0),), vjp=vjp.concat_vjp,
               doc="joins along an existing axis; inputs are promoted to one dtype")


def _stack_rule(shapes: tuple[Shape, ...], attrs: Attrs) -> tuple[Shape, ...]:
    rank = _same_rank(shapes)
    if any(s != shapes[0] for s in shapes):
        raise ShapeError("stack needs equal shapes, got " + ", ".join(map(format_shape, shapes)))
    axis = normalize_axis(attrs["axis"], rank + 1)
    return ((*shapes[0][:axis], len(shapes), *shapes[0][axis:]),)


def _stack_ref(*arrays: np.ndarray, axis: int) -> np.ndarray:
    (out,) = promoted(tuple(dtype_of(a) for a in arrays), {})  # type: ignore[arg-type]
    return np.stack([a.astype(out.np, copy=False) for a in arrays], axis=axis)


STACK = OpDef("stack", _MOVE, None, _stack_rule, promoted, _stack_ref,
              attrs=(attr("axis", AttrType.INT, 0),), doc="joins along a new axis",
              vjp=vjp.stack_vjp)


def _split_rule(shapes: tuple[Shape, ...], attrs: Attrs) -> tuple[Shape, ...]:
    shape, sizes = shapes[0], attrs["sizes"]
    axis = normalize_axis(attrs["axis"], len(shape))
    if not sizes or any(s < 0 for s in sizes):
        raise ShapeError(f"sizes must be a non-empty list of non-negative ints, got {list(sizes)}")
    if len(sizes) == 1 and isinstance(shape[axis], Sym):
        return (shape,)
    if sum(sizes) != static_dim(shape[axis], "a split dimension"):
        raise ShapeError(f"sizes {list(sizes)} do not add up to dim {axis} of "
                         f"{format_shape(shape)}")
    return tuple((*shape[:axis], s, *shape[axis + 1:]) for s in sizes)


def _split_ref(x: np.ndarray, axis: int, sizes: tuple[int, ...]) -> tuple[np.ndarray, ...]:
    return tuple(np.split(x, np.cumsum(sizes)[:-1], axis=axis))


SPLIT = OpDef("split", _MOVE, 1, _split_rule,
              lambda dtypes, attrs: (dtypes[0],) * len(attrs["sizes"]), _split_ref,
              attrs=(attr("axis", AttrType.INT, 0), attr("sizes", AttrType.INTS)),
              traits=frozenset({Trait.MULTI_OUTPUT}), vjp=vjp.split_vjp,
              doc="cuts into consecutive pieces of the given sizes; one output per piece")

# ---- pad -------------------------------------------------------------------------------------


def _pad_rule(shapes: tuple[Shape, ...], attrs: Attrs) -> tuple[Shape, ...]:
    shape, pads = shapes[0], attrs["pads"]
    if len(pads) != 2 * len(shape):
        raise ShapeError(f"pads needs 2*rank = {2 * len(shape)} entries, got {len(pads)}")
    if any(p < 0 for p in pads):
        raise AttrError(f"pads must be non-negative, got {list(pads)}")
    out: list[Dim] = []
    for i, d in enumerate(shape):
        before, after = pads[2 * i], pads[2 * i + 1]
        if before == after == 0:
            out.append(d)
            continue
        n = static_dim(d, "a padded dimension")
        if n == 0 and attrs["mode"] != "constant":
            raise ShapeError(f"{attrs['mode']} padding cannot extend the empty axis {i}")
        out.append(n + before + after)
    return (tuple(out),)


def _pad_ref(x: np.ndarray, pads: tuple[int, ...], mode: str, value: float) -> np.ndarray:
    width = [(pads[2 * i], pads[2 * i + 1]) for i in range(x.ndim)]
    if mode == "constant":
        fill = np.asarray(value).astype(x.dtype)
        return np.pad(x, width, mode="constant", constant_values=fill)
    return np.pad(x, width, mode=mode)


PAD = OpDef("pad", _MOVE, 1, _pad_rule, same_dtype, quiet(_pad_ref),
            attrs=(attr("pads", AttrType.INTS),
                   attr("mode", AttrType.STR, "constant", choices=("constant", "reflect", "edge")),
                   attr("value", AttrType.FLOAT, 0.0)), vjp=vjp.pad_vjp,
            doc="pads = (before_0, after_0, before_1, after_1, ...); reflect excludes the edge "
                "(np.pad 'reflect'); value fills constant padding, cast to x's dtype")

# ---- gathers ---------------------------------------------------------------------------------


def _gather_dtype(dtypes: tuple[DType, ...], attrs: Attrs) -> tuple[DType, ...]:
    if dtypes[1] not in INT_TYPES:
        raise DTypeError(f"indices must be integers, got {dtypes[1].value}")
    return (dtypes[0],)


def _check_indices(op: str, indices: np.ndarray, size: int, axis: int) -> np.ndarray:
    idx = indices.astype(np.int64)
    bad = (idx < -size) | (idx >= size)
    if bad.any():
        raise ShapeError(f"index {int(idx[bad].flat[0])} is out of range for axis {axis} of "
                         f"size {size}", op=op)
    return idx


def _take_rule(shapes: tuple[Shape, ...], attrs: Attrs) -> tuple[Shape, ...]:
    x, idx = shapes
    axis = normalize_axis(attrs["axis"], len(x))
    return (x[:axis] + idx + x[axis + 1:],)


def _take_ref(x: np.ndarray, indices: np.ndarray, axis: int) -> np.ndarray:
    axis = axis % x.ndim
    return np.take(x, _check_indices("take", indices, x.shape[axis], axis), axis=axis)


TAKE = OpDef("take", _MOVE, 2, _take_rule, _gather_dtype, _take_ref,
             attrs=(attr("axis", AttrType.INT),), vjp=vjp.take_vjp,
             doc="np.take along one axis; negative indices wrap, out-of-range ones are errors")


def _take_along_rule(shapes: tuple[Shape, ...], attrs: Attrs) -> tuple[Shape, ...]:
    x, idx = shapes
    if len(idx) != len(x):
        raise ShapeError(f"indices need the rank of x ({len(x)}), got {len(idx)}")
    axis = normalize_axis(attrs["axis"], len(x))
    return (broadcast_shapes(idx, (*x[:axis], 1, *x[axis + 1:])),)


def _take_along_ref(x: np.ndarray, indices: np.ndarray, axis: int) -> np.ndarray:
    axis = axis % x.ndim
    idx = _check_indices("take_along_axis", indices, x.shape[axis], axis)
    return np.take_along_axis(x, idx, axis=axis)


TAKE_ALONG_AXIS = OpDef("take_along_axis", _MOVE, 2, _take_along_rule, _gather_dtype,
                        _take_along_ref, attrs=(attr("axis", AttrType.INT),),
                        vjp=vjp.take_along_axis_vjp,
                        doc="np.take_along_axis; other dims of indices broadcast against x")

# ---- sources ---------------------------------------------------------------------------------

_SOURCE = OpKind.SOURCE

CONSTANT = OpDef("constant", _SOURCE, 0, lambda shapes, attrs: (attrs["value"].type.shape,),
                 lambda dtypes, attrs: (attrs["value"].dtype,),
                 lambda value: np.array(value.array),
                 attrs=(attr("value", AttrType.LITERAL),), doc="the literal array")


def arange_length(start: float, stop: float, step: float) -> int:
    """The number of elements of arange(start, stop, step): max(0, ceil((stop-start)/step))."""
    if step == 0 or not all(map(math.isfinite, (start, stop, step))):
        raise AttrError(f"arange needs finite bounds and a nonzero step, got "
                        f"start={start}, stop={stop}, step={step}")
    return max(0, math.ceil((stop - start) / step))


ARANGE = OpDef("arange", _SOURCE, 0,
               lambda shapes, attrs: ((arange_length(attrs["start"], attrs["stop"],
                                                     attrs["step"]),),),
               lambda dtypes, attrs: (attrs["dtype"],),
               quiet(lambda start, stop, step, dtype: as_dtype(
                   start + step * np.arange(arange_length(start, stop, step), dtype=np.float64),
                   dtype)),
               attrs=(attr("start", AttrType.FLOAT, 0.0), attr("stop", AttrType.FLOAT),
                      attr("step", AttrType.FLOAT, 1.0), attr("dtype", AttrType.DTYPE)),
               doc="start + i·step for i < ceil((stop-start)/step), computed in f64, then cast")


def _full_ref(shape: tuple[Dim, ...], value: float, dtype: DType) -> np.ndarray:
    return np.full(concrete_shape(shape, "full's shape"), value).astype(dtype.np)


FULL = OpDef("full", _SOURCE, 0, lambda shapes, attrs: (check_shape_attr(attrs["shape"]),),
             lambda dtypes, attrs: (attrs["dtype"],), quiet(_full_ref),
             attrs=(attr("shape", AttrType.ANY), attr("value", AttrType.FLOAT),
                    attr("dtype", AttrType.DTYPE)),
             doc="a tensor of one value (cast to dtype)")

# ---- window_patches (im2col) -----------------------------------------------------------------


def _window_rule(shapes: tuple[Shape, ...], attrs: Attrs) -> tuple[Shape, ...]:
    (shape,) = shapes
    if len(shape) != 4:
        raise ShapeError(f"window_patches takes an NHWC input [N, H, W, C], got "
                         f"{format_shape(shape)}")
    kernel, strides, dilations = attrs["kernel"], attrs["strides"], attrs["dilations"]
    if not len(kernel) == len(strides) == len(dilations) == 2 or \
            min(*kernel, *strides, *dilations) < 1:
        raise AttrError(f"kernel, strides and dilations must be 2 positive ints each, got "
                        f"{list(kernel)}, {list(strides)}, {list(dilations)}")
    n, h, w, c = shape
    out = []
    for size, k, s, d, what in ((h, kernel[0], strides[0], dilations[0], "H"),
                                (w, kernel[1], strides[1], dilations[1], "W")):
        span = d * (k - 1) + 1
        extent = static_dim(size, f"the {what} of a window_patches input")
        if extent < span:
            raise ShapeError(f"a {k}-tap window of dilation {d} needs {what} >= {span}, got "
                             f"{extent}")
        out.append((extent - span) // s + 1)
    return ((n, out[0], out[1], kernel[0], kernel[1], c),)


def _window_ref(x: np.ndarray, kernel: tuple[int, ...], strides: tuple[int, ...],
                dilations: tuple[int, ...]) -> np.ndarray:
    (_, h, w, _), (kh, kw), (sh, sw), (dh, dw) = x.shape, kernel, strides, dilations
    oh, ow = (h - dh * (kh - 1) - 1) // sh + 1, (w - dw * (kw - 1) - 1) // sw + 1
    rows = np.arange(oh)[:, None] * sh + np.arange(kh)[None, :] * dh     # [oh, kh]
    cols = np.arange(ow)[:, None] * sw + np.arange(kw)[None, :] * dw     # [ow, kw]
    return x[:, rows[:, None, :, None], cols[None, :, None, :], :]       # [n, oh, ow, kh, kw, c]


WINDOW_PATCHES = OpDef(
    "window_patches", _MOVE, 1, _window_rule, same_dtype, _window_ref,
    attrs=(attr("kernel", AttrType.INTS), attr("strides", AttrType.INTS, (1, 1)),
           attr("dilations", AttrType.INTS, (1, 1))),
    doc="every KH×KW window of an NHWC input (im2col): out[n, i, j, a, b, c] = "
        "x[n, i·sh + a·dh, j·sw + b·dw, c]; an index remap, so it fuses into the kernel that "
        "reads it (a matmul packs its A operand through it)")


DEFINITIONS: tuple[OpDef, ...] = (
    RESHAPE, TRANSPOSE, BROADCAST_TO, EXPAND_DIMS, SQUEEZE, SLICE, CONCAT, STACK, SPLIT, PAD,
    TAKE, TAKE_ALONG_AXIS, CONSTANT, ARANGE, FULL, WINDOW_PATCHES,
)
