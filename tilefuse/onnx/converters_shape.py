"""Converters for constants, shape computations and data movement: Constant, ConstantOfShape,
Shape, Size, Range, Reshape, Transpose, Flatten, Squeeze, Unsqueeze, Concat, Split, Slice,
Gather, Expand, Tile, Pad, Identity.

Shapes are static during conversion, so Shape and Size are constants, and the ops that consume
them fold (see :mod:`tilefuse.onnx.context`); Reshape, Expand, Slice, Pad, ... need their shape
operands constant after folding and say so otherwise.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from tilefuse.graph.types import is_static
from tilefuse.onnx.context import (
    FOLD_LIMIT,
    NodeContext,
    Tensor,
    shape_value,
    symbolic_reshape_target,
)
from tilefuse.onnx.tensors import tensor_to_array, to_dtype

Converter = Callable[[NodeContext], list[Tensor]]

_HUGE = 2**62
FILL_CONSTANT_LIMIT = 1 << 24
"""A ConstantOfShape of up to this many elements is a constant array, not a ``full`` node:
models that make their weights with it (onnx's ``light`` models) then get the treatment of
constant weights (a conv's weight folded and packed at build time)."""

# ---- constants and shapes --------------------------------------------------------------------


def _constant(ctx: NodeContext) -> list[Tensor]:
    attrs = ctx.spec.attrs
    if len(attrs) != 1:
        raise ctx.error(f"needs exactly one value attribute, got {sorted(attrs) or 'none'}")
    name, value = next(iter(attrs.items()))
    if name == "value":
        return [Tensor.constant(tensor_to_array(value, f"{ctx.label}: value"))]
    if name in ("value_float", "value_floats"):
        return [ctx.const(np.asarray(value, dtype=np.float32))]
    if name in ("value_int", "value_ints"):
        return [ctx.const(np.asarray(value, dtype=np.int64))]
    raise ctx.error(f"attribute {name!r} is not supported (strings and sparse tensors are not)")


def _constant_of_shape(ctx: NodeContext) -> list[Tensor]:
    shape = ctx.ints_input(0, "shape") or ()
    if any(d < 0 for d in shape):
        raise ctx.error(f"shape {list(shape)} has a negative dim")
    proto = ctx.attr("value")
    if proto is None:
        fill = np.zeros((), np.float32)
    else:
        fill = tensor_to_array(proto, f"{ctx.label}: value")
        if fill.size != 1:
            raise ctx.error(f"value must hold one element, got {fill.size}")
    if math.prod(shape) <= FILL_CONSTANT_LIMIT:
        return [ctx.const(np.full(shape, fill.reshape(()), dtype=fill.dtype))]
    dtype = to_dtype(_elem_type(fill), ctx.label)
    return [ctx.op("full", shape=shape, value=float(fill.reshape(()).item()), dtype=dtype)]


def _elem_type(arr: np.ndarray) -> int:
    from onnx import helper
    return int(helper.np_dtype_to_tensor_dtype(arr.dtype))


def _shape(ctx: NodeContext) -> list[Tensor]:
    shape = ctx.input(0).shape
    start, end = ctx.attr("start", 0), ctx.attr("end", None)
    return [ctx.const(shape_value(shape[start:end]))]


def _size(ctx: NodeContext) -> list[Tensor]:
    return [ctx.const(np.asarray(math.prod(ctx.input(0).shape), dtype=np.int64))]


def _range(ctx: NodeContext) -> list[Tensor]:
    values = [ctx.const_input(i, name) for i, name in enumerate(("start", "limit", "delta"))]
    if any(v is None or v.size != 1 for v in values):
        raise ctx.error("start, limit and delta must be scalars")
    start, limit, delta = (v.reshape(()).item() for v in values)  # type: ignore[union-attr]
    if delta == 0:
        raise ctx.error("delta must be nonzero")
    n = max(math.ceil((limit - start) / delta), 0)
    if n > FOLD_LIMIT * 256:
        raise ctx.error(f"the range has {n} elements, too many to fold")
    dtype = values[0].dtype  # type: ignore[union-attr]
    return [ctx.const((start + delta * np.arange(n)).astype(dtype))]


# ---- reshaping -------------------------------------------------------------------------------


def reshape_target(ctx: NodeContext, src: tuple[int, ...], spec: tuple[int, ...],
                   allowzero: bool) -> tuple[int, ...]:
    """ONNX Reshape's target: 0 copies the input dim (unless allowzero), -1 is inferred."""
    if not is_static(src) or not is_static(spec):
        return symbolic_reshape_target(ctx, src, spec, allowzero)  # type: ignore[return-value]
    dims = list(spec)
    for i, d in enumerate(dims):
        if d == 0 and not allowzero:
            if i >= len(src):
                raise ctx.error(f"shape {list(spec)} copies dim {i} of rank-{len(src)} input")
            dims[i] = src[i]
        elif d < -1:
            raise ctx.error(f"shape {list(spec)} has an invalid entry {d}")
    total = math.prod(src)
    if dims.count(-1) > 1:
        raise ctx.error(f"shape {list(spec)} has more than one -1")
    if -1 in dims:
        known = math.prod(d for d in dims if d != -1)
        if known == 0 or total % known:
            raise ctx.error(f"cannot infer the -1 in {list(spec)} from {list(src)}")
        dims[dims.index(-1)] = total // known
    if math.prod(dims) != total:
        raise ctx.error(f"cannot reshape {list(src)} ({total} elements) to {list(spec)}")
    return tuple(dims)


def _reshape(ctx: NodeContext) -> list[Tensor]:
    x = ctx.input(0)
    spec = ctx.ints_input(1, "shape")
    if spec is None:
        raise ctx.error("input 1 (shape) is required")
    target = reshape_target(ctx, x.shape, spec, bool(ctx.attr("allowzero", 0)))
    return [x if target == x.shape else ctx.op("reshape", x, shape=target)]


def _transpose(ctx: NodeContext) -> list[Tensor]:
    x = ctx.input(0)
    perm = ctx.attr("perm")
    perm = tuple(reversed(range(x.rank))) if perm is None else tuple(perm)
    return [ctx.op("transpose", x, perm=perm)]


def _flatten(ctx: NodeContext) -> list[Tensor]:
    x = ctx.input(0)
    axis = ctx.attr("axis", 1)
    if not -x.rank <= axis <= x.rank:
        raise ctx.error(f"axis {axis} is out of range for rank {x.rank}")
    axis = axis + x.rank if axis < 0 else axis
    target = (math.prod(x.shape[:axis]), math.prod(x.shape[axis:]))
    return [ctx.op("reshape", x, shape=target)]


def _squeeze_with(ctx: NodeContext, axes: tuple[int, ...] | None) -> list[Tensor]:
    x = ctx.input(0)
    if axes is not None:
        axes = tuple(sorted({ctx.axis(a, x.rank) for a in axes}))
        for a in axes:
            if x.shape[a] != 1:
                raise ctx.error(f"cannot squeeze axis {a} of size {x.shape[a]}")
    return [ctx.op("squeeze", x, axes=axes)]


def _unsqueeze_with(ctx: NodeContext, axes: tuple[int, ...] | None) -> list[Tensor]:
    x = ctx.input(0)
    if not axes:
        raise ctx.error("axes are required")
    rank = x.rank + len(axes)
    norm = sorted({ctx.axis(a, rank) for a in axes})
    if len(norm) != len(axes):
        raise ctx.error(f"axes {list(axes)} repeat an axis")
    return [ctx.op("expand_dims", x, axes=tuple(norm))]


def _concat(ctx: NodeContext) -> list[Tensor]:
    args = [t for t in ctx.inputs if t is not None]
    if not args or any(t.dtype is not args[0].dtype for t in args):
        raise ctx.error("needs inputs of one element type")
    axis = ctx.attr("axis")
    if axis is None:
        raise ctx.error("attribute 'axis' is required")
    axis = ctx.axis(axis, args[0].rank)
    return [args[0] if len(args) == 1 else ctx.op("concat", *args, axis=axis)]


def split_with(ctx: NodeContext, sizes: tuple[int, ...] | None) -> list[Tensor]:
    x = ctx.input(0)
    axis = ctx.axis(ctx.attr("axis", 0), x.rank)
    n = x.shape[axis]
    if sizes is None:
        parts = ctx.attr("num_outputs", ctx.outputs_wanted())
        if parts < 1:
            raise ctx.error(f"cannot split into {parts} parts")
        chunk = -(-n // parts)
        sizes = tuple(max(0, min(chunk, n - i * chunk)) for i in range(parts))
    if sum(sizes) != n or any(s < 0 for s in sizes):
        raise ctx.error(f"split sizes {list(sizes)} do not add up to dim {axis} ({n})")
    if len(sizes) != ctx.outputs_wanted():
        raise ctx.error(f"{len(sizes)} split sizes for {ctx.outputs_wanted()} outputs")
    return ctx.ops("split", x, axis=axis, sizes=sizes)


# ---- slicing, gathering, expanding -----------------------------------------------------------


def _slice_bounds(n: int, start: int, end: int, step: int) -> tuple[int, int]:
    """ONNX's clamping, then the equivalent NumPy slice bounds (a negative stop would wrap)."""
    start = start + n if start < 0 else start
    end = end + n if end < 0 else end
    if step > 0:
        start, end = min(max(start, 0), n), min(max(end, 0), n)
    else:
        start, end = min(max(start, 0), n - 1), min(max(end, -1), n - 1)
    return start, (end if end >= 0 else -_HUGE)


def _slice_with(ctx: NodeContext, starts: tuple[int, ...], ends: tuple[int, ...],
                axes: tuple[int, ...] | None, steps: tuple[int, ...] | None) -> list[Tensor]:
    x = ctx.input(0)
    axes = tuple(range(len(starts))) if axes is None else axes
    steps = (1,) * len(starts) if steps is None else steps
    if not len(starts) == len(ends) == len(axes) == len(steps):
        raise ctx.error("starts, ends, axes and steps differ in length")
    lo, hi, st = [0] * x.rank, [_HUGE] * x.rank, [1] * x.rank
    seen: set[int] = set()
    for s, e, a, k in zip(starts, ends, axes, steps):
        a = ctx.axis(a, x.rank)
        if a in seen or k == 0:
            raise ctx.error(f"axis {a} repeats or has step 0")
        seen.add(a)
        lo[a], hi[a] = _slice_bounds(x.shape[a], s, e, k)
        st[a] = k
    return [ctx.op("slice", x, starts=tuple(lo), stops=tuple(hi), steps=tuple(st))]


def _slice_1(ctx: NodeContext) -> list[Tensor]:
    axes = ctx.attr("axes")
    return _slice_with(ctx, tuple(ctx.attr("starts", ())), tuple(ctx.attr("ends", ())),
                       None if axes is None else tuple(axes), None)


def _slice_10(ctx: NodeContext) -> list[Tensor]:
    starts, ends = ctx.ints_input(1, "starts"), ctx.ints_input(2, "ends")
    if starts is None or ends is None:
        raise ctx.error("starts and ends are required")
    return _slice_with(ctx, starts, ends, ctx.ints_input(3, "axes"), ctx.ints_input(4, "steps"))


def _gather(ctx: NodeContext) -> list[Tensor]:
    x, idx = ctx.input(0), ctx.input(1)
    axis = ctx.axis(ctx.attr("axis", 0), x.rank)
    if idx.const is not None:
        n = x.shape[axis]
        if idx.const.size and (idx.const.min() < -n or idx.const.max() >= n):
            raise ctx.error(f"indices out of range for axis {axis} of size {n}")
    return [ctx.op("take", x, idx, axis=axis)]


def _gather_elements(ctx: NodeContext) -> list[Tensor]:
    """out[i][j][k] = x[idx[i][j][k]][j][k] (axis 0): take_along_axis over the part of x the
    indices cover (an index dim may be shorter than x's on the other axes)."""
    x, idx = ctx.input(0), ctx.input(1)
    axis = ctx.axis(ctx.attr("axis", 0), x.rank)
    if idx.rank != x.rank or any(i != axis and n > d
                                 for i, (n, d) in enumerate(zip(idx.shape, x.shape))):
        raise ctx.error(f"indices {list(idx.shape)} must have the rank of data "
                        f"{list(x.shape)} and no larger dims off axis {axis}")
    if idx.const is not None and idx.const.size:
        n = x.shape[axis]
        if idx.const.min() < -n or idx.const.max() >= n:
            raise ctx.error(f"indices out of range for axis {axis} of size {n}")
    stops = tuple(d if i == axis else n for i, (n, d) in enumerate(zip(idx.shape, x.shape)))
    if stops != x.shape:
        x = ctx.op("slice", x, starts=(0,) * x.rank, stops=stops, steps=(1,) * x.rank)
    return [ctx.op("take_along_axis", x, idx, axis=axis)]


def _trilu(ctx: NodeContext) -> list[Tensor]:
    """The upper (j - i >= k) or lower (j - i <= k) triangle of the last two dims, zeros
    elsewhere; the mask is a constant."""
    x = ctx.input(0)
    k = ctx.ints_input(1, "k") or (0,)
    if x.rank < 2 or len(k) != 1:
        raise ctx.error(f"needs a rank >= 2 input and a scalar k, got {list(x.shape)}, k {k}")
    rows, cols = x.shape[-2:]
    offset = np.arange(cols)[None, :] - np.arange(rows)[:, None]
    keep = offset >= k[0] if ctx.attr("upper", 1) else offset <= k[0]
    return [ctx.op("where", ctx.const(keep), x, ctx.scalar(0, x.dtype))]


def _expand(ctx: NodeContext) -> list[Tensor]:
    x = ctx.input(0)
    shape = ctx.ints_input(1, "shape")
    try:
        target = tuple(int(d) for d in np.broadcast_shapes(x.shape, tuple(shape or ())))
    except ValueError:
        raise ctx.error(f"cannot broadcast {list(x.shape)} with {list(shape or ())}") from None
    return [x if target == x.shape else ctx.op("broadcast_to", x, shape=target)]


def _tile(ctx: NodeContext) -> list[Tensor]:
    x = ctx.input(0)
    reps = ctx.ints_input(1, "repeats")
    if reps is None or len(reps) != x.rank or any(r < 0 for r in reps):
        raise ctx.error(f"repeats {reps} must be {x.rank} non-negative ints")
    inter = tuple(d for n in x.shape for d in (1, n))
    wide = tuple(d for r, n in zip(reps, x.shape) for d in (r, n))
    y = ctx.op("broadcast_to", ctx.op("reshape", x, shape=inter), shape=wide)
    return [ctx.op("reshape", y, shape=tuple(r * n for r, n in zip(reps, x.shape)))]


# ---- Pad -------------------------------------------------------------------------------------


def pad_with(ctx: NodeContext, pads: tuple[int, ...], mode: str, value: float,
              axes: tuple[int, ...] | None) -> list[Tensor]:
    x = ctx.input(0)
    if mode not in ("constant", "reflect", "edge"):
        raise ctx.not_compiled(f"mode {mode!r} is not compiled (constant, reflect, edge)")
    axes = tuple(range(x.rank)) if axes is None else tuple(ctx.axis(a, x.rank) for a in axes)
    if len(pads) != 2 * len(axes):
        raise ctx.error(f"pads {list(pads)} needs {2 * len(axes)} entries")
    before, after = [0] * x.rank, [0] * x.rank
    for i, a in enumerate(axes):
        before[a], after[a] = pads[i], pads[i + len(axes)]
    if any(p < 0 for p in before + after):  # negative pads crop
        stops = tuple(n + min(a, 0) for n, a in zip(x.shape, after))
        x = ctx.op("slice", x, starts=tuple(-min(b, 0) for b in before), stops=stops,
                   steps=(1,) * x.rank)
    flat = tuple(p for b, a in zip(before, after) for p in (max(b, 0), max(a, 0)))
    if not any(flat):
        return [x]
    return [ctx.op("pad", x, pads=flat, mode=mode, value=value)]


def _pad_2(ctx: NodeContext) -> list[Tensor]:
    return pad_with(ctx, tuple(ctx.attr("pads", ())), ctx.attr("mode", "constant"),
                     float(ctx.attr("value", 0.0)), None)


def _pad_11(ctx: NodeContext) -> list[Tensor]:
    pads = ctx.ints_input(1, "pads")
    fill = ctx.const_input(2, "constant_value")
    if fill is not None and fill.size != 1:
        raise ctx.error("constant_value must be a scalar")
    value = 0.0 if fill is None or fill.size == 0 else float(fill.reshape(()).item())
    return pad_with(ctx, pads or (), ctx.attr("mode", "constant"), value,
                     ctx.ints_input(3, "axes"))


def _identity(ctx: NodeContext) -> list[Tensor]:
    return [ctx.input(0)]


CONVERTERS: tuple[tuple[str, int, Converter], ...] = (
    ("Constant", 1, _constant), ("ConstantOfShape", 9, _constant_of_shape),
    ("Shape", 1, _shape), ("Size", 1, _size), ("Range", 11, _range),
    ("Reshape", 5, _reshape), ("Transpose", 1, _transpose), ("Flatten", 1, _flatten),
    ("Squeeze", 1, lambda ctx: _squeeze_with(ctx, _opt(ctx.attr("axes")))),
    ("Squeeze", 13, lambda ctx: _squeeze_with(ctx, ctx.ints_input(1, "axes"))),
    ("Unsqueeze", 1, lambda ctx: _unsqueeze_with(ctx, _opt(ctx.attr("axes")))),
    ("Unsqueeze", 13, lambda ctx: _unsqueeze_with(ctx, ctx.ints_input(1, "axes"))),
    ("Concat", 4, _concat),
    ("Split", 2, lambda ctx: split_with(ctx, _opt(ctx.attr("split")))),
    ("Split", 13, lambda ctx: split_with(ctx, ctx.ints_input(1, "split"))),
    ("Slice", 1, _slice_1), ("Slice", 10, _slice_10), ("Gather", 1, _gather),
    ("GatherElements", 11, _gather_elements), ("Trilu", 14, _trilu),
    ("Expand", 8, _expand), ("Tile", 6, _tile), ("Pad", 2, _pad_2), ("Pad", 11, _pad_11),
    ("Identity", 1, _identity),
)


def _opt(value: list[int] | None) -> tuple[int, ...] | None:
    return None if value is None else tuple(int(v) for v in value)

