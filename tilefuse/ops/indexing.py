"""Ops that write or rank by index: scatter_elements, scatter_nd, topk.

They are opaque to fusion (one kernel each); :mod:`tilefuse.kernel.lower_gather` lowers them
natively. Indices may be negative (counted from the end); an index out of range is a
ShapeError naming the op, never a write outside the array (natively: the write is dropped and
the call raises after the kernel, :mod:`tilefuse.kernel.lower_gather`). A scatter with
``reduction="none"`` and repeated indices keeps the last update, as NumPy's assignment does;
``add``, ``mul``, ``max`` and ``min`` combine all of them.

``topk`` returns the k largest (or smallest) values along an axis in order, with their int64
indices; equal values keep their order of position (the lower index first), and NaN counts as
larger than every number, as in NumPy's sort.
"""

from __future__ import annotations

import numpy as np

from tilefuse.dtypes import INT_TYPES, DType
from tilefuse.errors import DTypeError, ShapeError
from tilefuse.graph.ir import Attrs
from tilefuse.graph.types import Shape, format_shape, normalize_axis
from tilefuse.ops.registry import AttrType, OpDef, OpKind, Trait, attr
from tilefuse.ops.rules import quiet

_REDUCE = {"none": None, "add": np.add, "mul": np.multiply, "max": np.maximum,
           "min": np.minimum}
_REDUCTION_ATTR = attr("reduction", AttrType.STR, "none", choices=tuple(_REDUCE))


def _scatter_dtype(dtypes: tuple[DType, ...], attrs: Attrs) -> tuple[DType, ...]:
    if dtypes[1] not in INT_TYPES:
        raise DTypeError(f"indices must be integers, got {dtypes[1].value}")
    return (dtypes[0],)


def _in_range(op: str, idx: np.ndarray, size: int | np.ndarray, what: str) -> np.ndarray:
    idx = idx.astype(np.int64)
    bad = (idx < -size) | (idx >= size)
    if np.any(bad):
        raise ShapeError(f"index {int(idx[bad].flat[0])} is out of range for {what}", op=op)
    return np.where(idx < 0, idx + size, idx)


def _write(out: np.ndarray, where: tuple[np.ndarray, ...], updates: np.ndarray,
           reduction: str) -> np.ndarray:
    combine = _REDUCE[reduction]
    values = updates.astype(out.dtype, copy=False)
    if combine is None:
        out[where] = values
    else:
        combine.at(out, where, values)
    return out


# ---- scatter_elements ------------------------------------------------------------------------


def _scatter_elements_rule(shapes: tuple[Shape, ...], attrs: Attrs) -> tuple[Shape, ...]:
    data, idx, updates = shapes
    normalize_axis(attrs["axis"], len(data))
    if len(idx) != len(data) or idx != updates:
        raise ShapeError(f"indices {format_shape(idx)} and updates {format_shape(updates)} "
                         f"must have one shape, of data's rank {len(data)}")
    return (data,)


def _scatter_elements_ref(data: np.ndarray, indices: np.ndarray, updates: np.ndarray, *,
                          axis: int, reduction: str) -> np.ndarray:
    axis = axis % data.ndim
    where = list(np.indices(indices.shape, sparse=True))
    where[axis] = _in_range("scatter_elements", indices, data.shape[axis], f"axis {axis} of "
                            f"size {data.shape[axis]}")
    return _write(data.copy(), tuple(np.broadcast_arrays(*where)), updates, reduction)


SCATTER_ELEMENTS = OpDef(
    "scatter_elements", OpKind.OPAQUE, 3, _scatter_elements_rule, _scatter_dtype,
    quiet(_scatter_elements_ref), attrs=(attr("axis", AttrType.INT, 0), _REDUCTION_ATTR),
    doc="data with data[..., idx[p], ...] (at axis) = updates[p] for each position p")

# ---- scatter_nd ------------------------------------------------------------------------------


def _scatter_nd_rule(shapes: tuple[Shape, ...], attrs: Attrs) -> tuple[Shape, ...]:
    data, idx, updates = shapes
    if not idx or not isinstance(idx[-1], int) or idx[-1] > len(data):
        raise ShapeError(f"indices {format_shape(idx)} need a static last dim of at most "
                         f"data's rank {len(data)}")
    expected = (*idx[:-1], *data[idx[-1]:])
    if tuple(updates) != expected:
        raise ShapeError(f"updates {format_shape(updates)} must be {format_shape(expected)} "
                         f"for data {format_shape(data)} and indices {format_shape(idx)}")
    return (data,)


def _scatter_nd_ref(data: np.ndarray, indices: np.ndarray, updates: np.ndarray, *,
                    reduction: str) -> np.ndarray:
    k = indices.shape[-1]
    sizes = np.asarray(data.shape[:k], dtype=np.int64)
    idx = _in_range("scatter_nd", indices, sizes, f"data {format_shape(data.shape)}")
    return _write(data.copy(), tuple(idx[..., j] for j in range(k)), updates, reduction)


SCATTER_ND = OpDef("scatter_nd", OpKind.OPAQUE, 3, _scatter_nd_rule, _scatter_dtype,
                   quiet(_scatter_nd_ref), attrs=(_REDUCTION_ATTR,),
                   doc="data with data[idx[p]] = updates[p], idx[p] a prefix of data's indices")

# ---- topk ------------------------------------------------------------------------------------


def _topk_rule(shapes: tuple[Shape, ...], attrs: Attrs) -> tuple[Shape, ...]:
    x, k = shapes[0], attrs["k"]
    axis = normalize_axis(attrs["axis"], len(x))
    if k < 0 or (isinstance(x[axis], int) and k > x[axis]):
        raise ShapeError(f"k={k} is outside 0..{x[axis]} for axis {axis} of {format_shape(x)}")
    out = (*x[:axis], k, *x[axis + 1:])
    return (out, out)


def _topk_dtype(dtypes: tuple[DType, ...], attrs: Attrs) -> tuple[DType, ...]:
    return (dtypes[0], DType.i64)


def _topk_ref(x: np.ndarray, *, k: int, axis: int, largest: bool) -> tuple[np.ndarray, ...]:
    axis = axis % x.ndim
    if largest:  # descending, ties by position: reverse an ascending sort of the flipped array
        n = x.shape[axis]
        order = n - 1 - np.flip(np.argsort(np.flip(x, axis), axis=axis, kind="stable"), axis)
    else:
        order = np.argsort(x, axis=axis, kind="stable")
    first = np.take(order, np.arange(k), axis=axis)
    return np.take_along_axis(x, first, axis=axis), first.astype(np.int64)


TOPK = OpDef("topk", OpKind.OPAQUE, 1, _topk_rule, _topk_dtype, quiet(_topk_ref),
             attrs=(attr("k", AttrType.INT), attr("axis", AttrType.INT, -1),
                    attr("largest", AttrType.BOOL, True)),
             traits=frozenset({Trait.MULTI_OUTPUT}),
             doc="the k largest (or smallest) values along axis, sorted, and their indices")

DEFINITIONS: tuple[OpDef, ...] = (SCATTER_ELEMENTS, SCATTER_ND, TOPK)
