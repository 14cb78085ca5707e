"""``tracer[key]``: NumPy basic indexing plus one integer-array index.

Ints, slices (any step), None and Ellipsis lower to one ``slice`` node, then ``squeeze`` for the
int axes and ``expand_dims`` for the None axes. One integer array (traced or constant) along an
axis lowers to ``take``; as in NumPy, when ints and the array are not adjacent in the key, the
array's dims come first (a ``transpose``). Boolean masks have a data-dependent shape: TraceError.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from tilefuse.errors import ShapeError, TraceError
from tilefuse.frontend.source import user_loc
from tilefuse.frontend.tracer import Tracer


@dataclass(frozen=True)
class _Item:
    kind: str          # "int", "slice", "none", "array", "ellipsis"
    value: Any = None


def _error(x: Tracer, cls: type, message: str) -> Exception:
    return cls(message, op="getitem", inputs=(str(x.value.type),), loc=user_loc())


def _array_item(x: Tracer, item: Any) -> _Item:
    """An index array (list, ndarray or tracer) as an "array" item, or an "int" for 0-d ones."""
    if isinstance(item, Tracer):
        x.ctx.check(item)
        if item.value.dtype.is_bool:
            raise _error(x, TraceError, "boolean mask indexing has a data-dependent shape and "
                         "cannot be traced; use np.where")
        if not item.value.dtype.is_int:
            raise _error(x, TraceError, f"index arrays must be integers, got {item.value.type}")
        return _Item("array", item)
    array = np.asarray(item)
    if array.dtype == np.bool_:
        raise _error(x, TraceError, "boolean mask indexing has a data-dependent shape and "
                     "cannot be traced; use np.where")
    if array.size == 0 and array.dtype.kind == "f":
        array = array.astype(np.intp)
    if array.dtype.kind not in "iu":
        raise _error(x, TraceError, f"index arrays must be integers, got {array.dtype}")
    if array.ndim == 0:
        return _Item("int", int(array))
    return _Item("array", array)


def _classify(x: Tracer, key: Any) -> list[_Item]:
    items: list[_Item] = []
    for item in key if isinstance(key, tuple) else (key,):
        if item is None:
            items.append(_Item("none"))
        elif item is Ellipsis:
            items.append(_Item("ellipsis"))
        elif isinstance(item, slice):
            items.append(_Item("slice", item))
        elif isinstance(item, (bool, np.bool_)):
            raise _error(x, TraceError, "a bool index is a boolean mask, which has a "
                         "data-dependent shape and cannot be traced")
        elif isinstance(item, (int, np.integer)):
            items.append(_Item("int", int(item)))
        elif isinstance(item, (Tracer, np.ndarray, list, tuple)):
            items.append(_array_item(x, item))
        else:
            raise _error(x, TraceError, f"unsupported index {item!r} of type "
                         f"{type(item).__name__}")
    return _expand_ellipsis(x, items)


def _expand_ellipsis(x: Tracer, items: list[_Item]) -> list[_Item]:
    ellipses = [i for i, it in enumerate(items) if it.kind == "ellipsis"]
    if len(ellipses) > 1:
        raise _error(x, ShapeError, "an index can only have a single ellipsis ('...')")
    used = sum(1 for it in items if it.kind in ("int", "slice", "array"))
    if used > x.ndim:
        raise _error(x, ShapeError, f"too many indices: the array has {x.ndim} dims, but "
                     f"{used} were indexed")
    fill = [_Item("slice", slice(None))] * (x.ndim - used)
    if not ellipses:
        return items + fill
    at = ellipses[0]
    return items[:at] + fill + items[at + 1:]


def _slice_bounds(x: Tracer, s: slice, dim: int) -> tuple[int, int, int]:
    """Normalised (start, stop, step) that mean the same under Python slice semantics."""
    try:
        start, stop, step = s.indices(dim)
    except ValueError as err:
        raise _error(x, ShapeError, f"invalid slice {s}: {err}") from None
    if step < 0:  # a -1 bound from indices() means "before 0", which a slice writes as -dim-1
        start = start if start >= 0 else -dim - 1
        stop = stop if stop >= 0 else -dim - 1
    return start, stop, step


def _int_bounds(x: Tracer, i: int, axis: int, dim: int) -> tuple[int, int, int]:
    if not -dim <= i < dim:
        raise _error(x, ShapeError, f"index {i} is out of bounds for axis {axis} with size {dim}")
    i %= dim
    return i, i + 1, 1


def _index_tracer(x: Tracer, value: Any, axis: int, dim: int) -> Tracer:
    if isinstance(value, Tracer):
        return value
    if value.size and not (-dim <= value.min() and value.max() < dim):
        bad = value[(value < -dim) | (value >= dim)].flat[0]
        raise _error(x, ShapeError, f"index {bad} is out of bounds for axis {axis} with size "
                     f"{dim}")
    return x.ctx.constant(value)


def getitem(x: Tracer, key: Any) -> Tracer:
    """``x[key]`` recorded as slice / squeeze / take / transpose / expand_dims nodes."""
    x.ctx.check(x)
    items = _classify(x, key)
    ctx = x.ctx
    bounds, int_axes, arrays = [], [], []
    axis = 0
    for item in items:
        if item.kind == "none":
            continue
        dim = x.shape[axis]
        if item.kind == "int":
            bounds.append(_int_bounds(x, item.value, axis, dim))
            int_axes.append(axis)
        elif item.kind == "slice":
            bounds.append(_slice_bounds(x, item.value, dim))
        else:
            bounds.append((0, dim, 1))
            arrays.append((axis, _index_tracer(x, item.value, axis, dim)))
        axis += 1
    if len(arrays) > 1:
        raise _error(x, TraceError, "indexing with more than one integer array is not "
                     "supported; use np.take or np.take_along_axis")
    result = x
    if any(b != (0, d, 1) for b, d in zip(bounds, x.shape)):
        starts, stops, steps = zip(*bounds)
        result = ctx.emit1("slice", [result], {"starts": starts, "stops": stops, "steps": steps})
    if int_axes:
        result = ctx.emit1("squeeze", [result], {"axes": tuple(int_axes)})
    labels = [it.kind for it in items if it.kind in ("slice", "none")]
    if arrays:
        result, labels = _take(result, items, arrays[0], int_axes)
    none_axes = tuple(i for i, label in enumerate(labels) if label == "none")
    if none_axes:
        result = ctx.emit1("expand_dims", [result], {"axes": none_axes})
    return result


def _take(x: Tracer, items: list[_Item], array: tuple[int, Tracer],
          int_axes: list[int]) -> tuple[Tracer, list[str]]:
    """Gathers along the array-indexed axis; returns the result and the output dims' labels."""
    axis, indices = array
    at = axis - sum(1 for a in int_axes if a < axis)
    result = x.ctx.emit1("take", [x, indices], {"axis": at})
    k = indices.ndim
    labels: list[str] = []
    for it in items:
        if it.kind == "array":
            labels += ["array"] * k
        elif it.kind in ("slice", "none"):
            labels.append(it.kind)
    advanced = [i for i, it in enumerate(items) if it.kind in ("int", "array")]
    if advanced[-1] - advanced[0] + 1 != len(advanced):  # not adjacent: array dims go first
        perm = list(range(at, at + k)) + [i for i in range(result.ndim)
                                          if not at <= i < at + k]
        result = x.ctx.emit1("transpose", [result], {"perm": tuple(perm)})
        labels = ["array"] * k + [label for label in labels if label != "array"]
    return result, labels
