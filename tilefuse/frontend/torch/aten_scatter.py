"""Converters for the scatter ATen ops: ``scatter`` (src, reduce), ``scatter_add``,
``scatter_reduce`` and ``index_put`` become tilefuse's ``scatter_elements`` and ``scatter_nd``
(:mod:`tilefuse.ops.indexing`: native kernels on the CPU, deterministic kernels on the GPU,
:mod:`tilefuse.kernel.lower_gpu_scatter`).

* ``scatter(x, dim, index, src)`` / ``scatter_add`` / ``scatter(..., reduce=)`` /
  ``scatter_reduce(..., "sum" | "prod" | "amax" | "amin")``: ``scatter_elements`` along
  ``dim`` with src cut to the index's extent (torch allows a larger src); ``scatter.value``
  writes one number (training graphs decompose it first:
  :mod:`tilefuse.frontend.torch.aten_training`). ``include_self=False`` first writes the
  reduction's identity at every target (a scatter without reduction); ``"mean"`` (floats) is
  the scattered sums over the scattered counts.
* ``index_put(x, indices, values, accumulate)`` with adjacent advanced integer indices (the
  leading ones, or after full slices: ``x[:, i] = v``) is a ``scatter_nd`` of the indexed axes
  brought to the front: the indices broadcast together and stacked as coordinates, the values
  broadcast to what ``x[indices]`` would be. A repeated index keeps the last value (torch
  leaves that order undefined) or, with ``accumulate``, sums them all. Boolean masks
  (data-dependent shapes) and non-adjacent indices raise :class:`Unsupported`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch
from torch import fx

from tilefuse.dtypes import DType
from tilefuse.frontend.torch.convert import Converter, Lowering, Result, Unsupported, arg
from tilefuse.graph.ir import Value

aten = torch.ops.aten

_REDUCE = {"sum": "add", "add": "add", "prod": "mul", "multiply": "mul", "amax": "max",
           "amin": "min"}


def _scatter(reduction: str | None) -> Converter:
    """scatter / scatter_add / scatter_reduce: ``reduction`` fixed, or None (read from the
    node: ``reduce=`` of scatter.reduce, the 5th argument of scatter_reduce.two)."""

    def convert(lw: Lowering, node: fx.Node) -> Result:
        how = reduction
        include_self = True
        if how is None:
            how = str(arg(node, 4, "reduce", "none"))
            if how not in _REDUCE and how != "mean":
                raise Unsupported(f"scatter reduction {how!r}", op=lw.op)
            include_self = bool(arg(node, 5, "include_self", True))
        x, index = lw.tensor(node.args[0]), lw.tensor(node.args[2])
        rank = len(x.shape)
        if rank == 0 or len(index.shape) != rank:
            raise Unsupported("scatter needs an index of x's rank (and rank >= 1)", op=lw.op)
        src = node.args[3]
        if isinstance(src, fx.Node):
            values = lw.cast(lw.tensor(src), x.dtype)
            if tuple(values.shape) != tuple(index.shape):
                values = lw.add("slice", [values], starts=[0] * rank,
                                stops=[int(d) for d in index.shape], steps=[1] * rank)
        else:   # a Python number: the value at every index
            values = _filled(lw, src, x.dtype, index)
        index = lw.cast(index, DType.i64)
        axis = int(node.args[1]) % rank

        def scatter(data: Value, updates: Value, kind: str) -> Value:
            return lw.add("scatter_elements", [data, index, updates], axis=axis,
                          reduction=kind)

        if how == "mean":   # the sums over the counts (x itself counted with include_self)
            if not x.dtype.is_float:
                raise Unsupported("scatter_reduce 'mean' of integers (a floor division)",
                                  op=lw.op)
            base, counts = x, _filled(lw, 1, x.dtype, x)
            if not include_self:
                zeros = _filled(lw, 0, x.dtype, index)
                base, counts = scatter(x, zeros, "none"), scatter(counts, zeros, "none")
            ones = _filled(lw, 1, x.dtype, index)
            return lw.add("div", [scatter(base, values, "add"), scatter(counts, ones, "add")])
        kind = _REDUCE.get(how, how)
        if not include_self:   # the targets start from the reduction's identity
            x = scatter(x, _filled(lw, _identity(kind, x.dtype), x.dtype, index), "none")
        return scatter(x, values, kind)

    return convert


def _filled(lw: Lowering, value: float | int | bool, dtype: DType, like: Value) -> Value:
    """``value`` broadcast to ``like``'s shape, in ``dtype``."""
    return lw.add("broadcast_to", [lw.operand(value, dtype)], shape=tuple(like.shape))


def _identity(kind: str, dtype: DType) -> float | int:
    """The start of a reduction (``add``, ``mul``, ``max``, ``min``) in ``dtype``."""
    if kind in ("add", "mul"):
        return 0 if kind == "add" else 1
    if dtype.is_float:
        return -math.inf if kind == "max" else math.inf
    info = np.iinfo(dtype.np)
    return int(info.min) if kind == "max" else int(info.max)


def _index_put(lw: Lowering, node: fx.Node) -> Result:
    """x[indices] = values (or += with accumulate) as a ``scatter_nd`` (module docstring)."""
    x = lw.tensor(node.args[0])
    given = list(node.args[1])
    accumulate = bool(arg(node, 3, "accumulate", False))
    at = [i for i, a in enumerate(given) if a is not None]
    if not at or at != list(range(at[0], at[0] + len(at))):
        raise Unsupported("index_put needs adjacent advanced indices", op=lw.op)
    indices = [lw.tensor(given[i]) for i in at]
    if any(v.dtype in (DType.bool, DType.u8) for v in indices):
        raise Unsupported("boolean mask indices (data-dependent shapes)", op=lw.op)
    shape = [int(d) for d in x.shape]
    first, count = at[0], len(at)
    batch = tuple(int(d) for d in torch.broadcast_shapes(
        *(tuple(int(d) for d in v.shape) for v in indices)))
    pre, post = shape[:first], shape[first + count:]
    coords = []
    for idx in indices:
        idx = lw.cast(idx, DType.i64)
        if tuple(idx.shape) != batch:
            idx = lw.add("broadcast_to", [idx], shape=batch)
        coords.append(lw.add("expand_dims", [idx], axes=(len(batch),)))
    coord = coords[0] if count == 1 else lw.add("concat", coords, axis=len(batch))
    values = lw.operand(node.args[2], x.dtype) if not isinstance(node.args[2], fx.Node) \
        else lw.cast(lw.tensor(node.args[2]), x.dtype)
    viewed = (*pre, *batch, *post)   # what x[indices] is, values broadcast to it
    if tuple(values.shape) != viewed:
        values = lw.add("broadcast_to", [values], shape=viewed)
    moved = x
    if first:   # the indexed axes first, for x and the values alike
        perm = [*range(first, first + count), *range(first), *range(first + count, len(shape))]
        moved = lw.add("transpose", [x], perm=tuple(perm))
        b = len(batch)
        values = lw.add("transpose", [values], perm=(
            *range(first, first + b), *range(first), *range(first + b, len(viewed))))
    out = lw.add("scatter_nd", [moved, coord, values],
                 reduction="add" if accumulate else "none")
    if first:
        back = [0] * len(shape)
        for position, axis in enumerate(perm):
            back[axis] = position
        out = lw.add("transpose", [out], perm=tuple(back))
    return out


def scatter_converters() -> Mapping[Any, Converter]:
    """The converters of this module, for :data:`~tilefuse.frontend.torch.aten.ATEN_CONVERTERS`."""
    return {
        aten.scatter.src: _scatter("none"),
        aten.scatter.value: _scatter("none"),
        aten.scatter.reduce: _scatter(None),
        aten.scatter_add.default: _scatter("add"),
        aten.scatter_reduce.two: _scatter(None),
        aten.index_put.default: _index_put,
    }


__all__ = ["scatter_converters"]
