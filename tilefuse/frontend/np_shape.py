"""NumPy data movement on tracers: reshape, transpose, squeeze, concatenate, split, pad, take,
broadcast_to, and the ``*_like`` constructors."""

from __future__ import annotations

import itertools
import operator
from typing import Any

import numpy as np

from tilefuse.dtypes import DType, from_numpy, promote_all
from tilefuse.errors import ShapeError, TraceError
from tilefuse.frontend.np_math import UNSET, astype, cast, coerce
from tilefuse.frontend.source import user_loc
from tilefuse.frontend.tracer import TraceContext, Tracer
from tilefuse.graph.types import Sym, normalize_axis


def _ints(value: Any, what: str) -> tuple[int, ...]:
    """An int or a sequence of ints as a tuple; a traced value is data-dependent (TraceError)."""
    items = value if isinstance(value, (tuple, list)) else (value,)
    try:
        return tuple(operator.index(v) for v in items)
    except TypeError:
        raise TraceError(f"{what} must be ints, got {value!r}", loc=user_loc()) from None


def _dims(value: Any, what: str) -> tuple[int | Sym, ...]:
    """Like :func:`_ints`, but symbolic sizes (``x.shape[0]`` of a dynamic dim) pass too."""
    items = value if isinstance(value, (tuple, list)) else (value,)
    if any(isinstance(v, Sym) for v in items):
        return tuple(v if isinstance(v, Sym) else _ints(v, what)[0] for v in items)
    return _ints(value, what)


def _only_c_order(name: str, order: Any) -> None:
    if order not in ("C", None):
        raise TraceError(f"{name}(..., order={order!r}) is not supported; only C order",
                         loc=user_loc())


def _axes(axis: Any, rank: int) -> tuple[int, ...]:
    """Normalised axes in the given order; ShapeError on repeats."""
    axes = tuple(normalize_axis(a, rank) for a in _ints(axis, "axes"))
    if len(set(axes)) != len(axes):
        raise ShapeError(f"repeated axis in {list(_ints(axis, 'axes'))}")
    return axes


def _one(ctx: TraceContext, a: Any) -> Tracer:
    (x,) = coerce(ctx, [a])
    return x


# ---- reshape and axis permutations -----------------------------------------------------------


def reshape(ctx: TraceContext, a: Any, shape: Any = UNSET, order: Any = "C", *,
            newshape: Any = UNSET, copy: Any = None) -> Tracer:
    _only_c_order("np.reshape", order)
    target = _dims(newshape if shape is UNSET else shape, "reshape's shape")
    x = _one(ctx, a)
    if target == x.shape:
        return x
    return ctx.emit1("reshape", [x], {"shape": target})


def ravel(ctx: TraceContext, a: Any, order: Any = "C") -> Tracer:
    _only_c_order("np.ravel", order)
    x = _one(ctx, a)
    return x if x.ndim == 1 else ctx.emit1("reshape", [x], {"shape": (-1,)})


def transpose(ctx: TraceContext, a: Any, axes: Any = None) -> Tracer:
    x = _one(ctx, a)
    perm = tuple(reversed(range(x.ndim))) if axes is None else _axes(axes, x.ndim)
    if len(perm) != x.ndim:
        raise ShapeError(f"axes {list(perm)} do not match the rank {x.ndim}")
    if perm == tuple(range(x.ndim)):
        return x
    return ctx.emit1("transpose", [x], {"perm": perm})


def swapaxes(ctx: TraceContext, a: Any, axis1: Any, axis2: Any) -> Tracer:
    x = _one(ctx, a)
    perm = list(range(x.ndim))
    i, j = normalize_axis(axis1, x.ndim), normalize_axis(axis2, x.ndim)
    perm[i], perm[j] = perm[j], perm[i]
    return transpose(ctx, x, tuple(perm))


def moveaxis(ctx: TraceContext, a: Any, source: Any, destination: Any) -> Tracer:
    x = _one(ctx, a)
    src, dst = _axes(source, x.ndim), _axes(destination, x.ndim)
    if len(src) != len(dst):
        raise ShapeError("source and destination need the same number of axes")
    rest = [i for i in range(x.ndim) if i not in src]
    for d, s in sorted(zip(dst, src)):
        rest.insert(d, s)
    return transpose(ctx, x, tuple(rest))


def expand_dims(ctx: TraceContext, a: Any, axis: Any) -> Tracer:
    x = _one(ctx, a)
    axes = _axes(axis, x.ndim + len(_ints(axis, "axes")))
    return ctx.emit1("expand_dims", [x], {"axes": tuple(sorted(axes))})


def squeeze(ctx: TraceContext, a: Any, axis: Any = None) -> Tracer:
    x = _one(ctx, a)
    if axis is None:
        axes = tuple(i for i, d in enumerate(x.shape) if d == 1)
    else:
        axes = tuple(sorted(_axes(axis, x.ndim)))
        for i in axes:
            if x.shape[i] != 1:
                raise ShapeError(f"cannot squeeze axis {i} of size {x.shape[i]}")
    return ctx.emit1("squeeze", [x], {"axes": axes}) if axes else x


def broadcast_to(ctx: TraceContext, array: Any, shape: Any, subok: Any = False) -> Tracer:
    x = _one(ctx, array)
    target = _dims(shape, "broadcast_to's shape")
    if target == x.shape:
        return x
    return ctx.emit1("broadcast_to", [x], {"shape": target})


# ---- joining and splitting -------------------------------------------------------------------


def _joined(ctx: TraceContext, arrays: Any, dtype: Any) -> list[Tracer]:
    if isinstance(arrays, Tracer):
        arrays = list(arrays)
    if not isinstance(arrays, (list, tuple)) or not arrays:
        raise ShapeError("needs a non-empty list or tuple of arrays")
    tracers = coerce(ctx, arrays)
    target = from_numpy(dtype) if dtype is not None else promote_all(
        [t.value.dtype for t in tracers])
    return [cast(t, target) for t in tracers]


def concatenate(ctx: TraceContext, arrays: Any, axis: Any = 0, out: Any = None, *,
                dtype: Any = None, casting: Any = "same_kind") -> Tracer:
    if out is not None:
        raise TraceError("np.concatenate(..., out=...) is not supported", loc=user_loc())
    tracers = _joined(ctx, arrays, dtype)
    if axis is None:
        tracers = [ravel(ctx, t) for t in tracers]
        axis = 0
    if len(tracers) == 1:
        return tracers[0]
    return ctx.emit1("concat", tracers, {"axis": normalize_axis(axis, tracers[0].ndim)})


def stack(ctx: TraceContext, arrays: Any, axis: Any = 0, out: Any = None, *,
          dtype: Any = None, casting: Any = "same_kind") -> Tracer:
    if out is not None:
        raise TraceError("np.stack(..., out=...) is not supported", loc=user_loc())
    tracers = _joined(ctx, arrays, dtype)
    return ctx.emit1("stack", tracers, {"axis": normalize_axis(axis, tracers[0].ndim + 1)})


def _pieces(ctx: TraceContext, x: Tracer, axis: int, bounds: list[int]) -> list[Tracer]:
    """x cut along ``axis`` at the (non-decreasing) boundaries ``bounds`` (0 … dim)."""
    sizes = tuple(b - a for a, b in itertools.pairwise(bounds))
    if len(sizes) == 1:
        return [x]
    return list(ctx.emit("split", [x], {"axis": axis, "sizes": sizes}))


def split(ctx: TraceContext, ary: Any, indices_or_sections: Any, axis: Any = 0) -> list[Tracer]:
    x = _one(ctx, ary)
    axis = normalize_axis(axis, x.ndim)
    dim = x.shape[axis]
    if not isinstance(indices_or_sections, (list, tuple, np.ndarray)):
        sections = _ints(indices_or_sections, "sections")[0]
        if sections <= 0 or dim % sections:
            raise ShapeError(f"array split does not result in an equal division: {dim} into "
                             f"{sections}")
        return _pieces(ctx, x, axis, [i * (dim // sections) for i in range(sections + 1)])
    cuts = [slice(i).indices(dim)[1] for i in _ints(list(indices_or_sections), "indices")]
    bounds = [0, *cuts, dim]
    if all(a <= b for a, b in itertools.pairwise(bounds)):
        return _pieces(ctx, x, axis, bounds)
    index = [slice(None)] * x.ndim  # overlapping pieces: one slice each, like NumPy
    pieces = []
    for start, stop in itertools.pairwise(bounds):
        index[axis] = slice(start, stop)
        pieces.append(x[tuple(index)])
    return pieces


def array_split(ctx: TraceContext, ary: Any, indices_or_sections: Any,
                axis: Any = 0) -> list[Tracer]:
    if isinstance(indices_or_sections, (list, tuple, np.ndarray)):
        return split(ctx, ary, indices_or_sections, axis)
    x = _one(ctx, ary)
    axis = normalize_axis(axis, x.ndim)
    sections = _ints(indices_or_sections, "sections")[0]
    if sections <= 0:
        raise ShapeError(f"number of sections must be larger than 0, got {sections}")
    base, extra = divmod(x.shape[axis], sections)
    bounds = [0]
    for i in range(sections):
        bounds.append(bounds[-1] + base + (1 if i < extra else 0))
    return _pieces(ctx, x, axis, bounds)


def pad(ctx: TraceContext, array: Any, pad_width: Any, mode: Any = "constant",
        **kwargs: Any) -> Tracer:
    x = _one(ctx, array)
    value = kwargs.pop("constant_values", 0)
    if kwargs:
        raise TraceError(f"np.pad(..., {next(iter(kwargs))}=...) is not supported",
                         loc=user_loc())
    if not isinstance(mode, str):
        raise TraceError("np.pad with a callable mode is not supported", loc=user_loc())
    try:
        widths = np.broadcast_to(np.asarray(pad_width), (x.ndim, 2))
    except ValueError:
        raise ShapeError(f"pad_width {pad_width!r} does not fit rank {x.ndim}") from None
    if widths.dtype.kind not in "iu":
        raise TraceError(f"pad_width must hold ints, got {pad_width!r}", loc=user_loc())
    values = np.unique(np.asarray(value))
    if values.size != 1:
        raise TraceError("np.pad with different constant_values per side is not supported",
                         loc=user_loc())
    attrs = {"pads": tuple(int(w) for w in widths.reshape(-1)), "mode": mode,
             "value": float(values[0])}
    return ctx.emit1("pad", [x], attrs)


# ---- gathers ---------------------------------------------------------------------------------


def index_tracer(ctx: TraceContext, indices: Any) -> Tracer:
    """Indices as an integer tracer (constants from ints, lists or arrays)."""
    if isinstance(indices, (int, np.integer)) and not isinstance(indices, (bool, np.bool_)):
        indices = np.asarray(indices, dtype=np.int64)
    (idx,) = coerce(ctx, [indices])
    if not idx.value.dtype.is_int:
        raise TraceError(f"indices must be integers, got {idx.value.dtype.value}"
                         + (" (boolean masks have a data-dependent shape)"
                            if idx.value.dtype is DType.bool else ""), loc=user_loc())
    return idx


def take(ctx: TraceContext, a: Any, indices: Any, axis: Any = None, out: Any = None,
         mode: Any = "raise") -> Tracer:
    if out is not None or mode != "raise":
        raise TraceError("np.take with out= or mode= is not supported", loc=user_loc())
    x = _one(ctx, a)
    if axis is None:
        x, axis = ravel(ctx, x), 0
    return ctx.emit1("take", [x, index_tracer(ctx, indices)],
                     {"axis": normalize_axis(axis, x.ndim)})


def take_along_axis(ctx: TraceContext, arr: Any, indices: Any, axis: Any = -1) -> Tracer:
    x = _one(ctx, arr)
    if axis is None:
        x, axis = ravel(ctx, x), 0
    return ctx.emit1("take_along_axis", [x, index_tracer(ctx, indices)],
                     {"axis": normalize_axis(axis, x.ndim)})


# ---- constructors ----------------------------------------------------------------------------


def _full(ctx: TraceContext, a: Any, fill: Any, dtype: Any, shape: Any) -> Tracer:
    x = _one(ctx, a)
    target = x.value.dtype if dtype is None else from_numpy(dtype)
    dims = x.shape if shape is None else _ints(shape, "shape")
    if isinstance(fill, Tracer):
        return broadcast_to(ctx, astype(fill, target.np), dims)
    value = np.asarray(fill).astype(target.np).item()
    return ctx.emit1("full", [], {"shape": dims, "value": float(value), "dtype": target})


def zeros_like(ctx: TraceContext, a: Any, dtype: Any = None, order: Any = "K",
               subok: Any = True, shape: Any = None, *, device: Any = None) -> Tracer:
    return _full(ctx, a, 0, dtype, shape)


def ones_like(ctx: TraceContext, a: Any, dtype: Any = None, order: Any = "K",
              subok: Any = True, shape: Any = None, *, device: Any = None) -> Tracer:
    return _full(ctx, a, 1, dtype, shape)


def full_like(ctx: TraceContext, a: Any, fill_value: Any, dtype: Any = None, order: Any = "K",
              subok: Any = True, shape: Any = None, *, device: Any = None) -> Tracer:
    return _full(ctx, a, fill_value, dtype, shape)


def static_shape(ctx: TraceContext, a: Any) -> tuple[int, ...]:
    return _one(ctx, a).shape


def static_ndim(ctx: TraceContext, a: Any) -> int:
    return _one(ctx, a).ndim


def static_size(ctx: TraceContext, a: Any, axis: Any = None) -> int:
    x = _one(ctx, a)
    return x.size if axis is None else x.shape[normalize_axis(axis, x.ndim)]


def copy(ctx: TraceContext, a: Any, order: Any = "K", subok: Any = False) -> Tracer:
    return _one(ctx, a)


def result_type(ctx: TraceContext, *arrays_and_dtypes: Any) -> np.dtype:
    parts = [a.dtype if isinstance(a, Tracer) else a for a in arrays_and_dtypes]
    return np.result_type(*parts)
