"""Converters for the scatter ATen ops: ``scatter`` (src, reduce), ``scatter_add``,
``scatter_reduce`` and ``index_put`` become tilefuse's ``scatter_elements`` and ``scatter_nd``
(:mod:`tilefuse.ops.indexing`: native kernels on the CPU, deterministic kernels on the GPU,
:mod:`tilefuse.kernel.lower_gpu_scatter`).

* ``scatter(x, dim, index, src)`` / ``scatter_add`` / ``scatter(..., reduce=)`` /
  ``scatter_reduce(..., "sum" | "prod" | "amax" | "amin", include_self=True)``:
  ``scatter_elements`` along ``dim`` with src cut to the index's extent (torch allows a larger
  src); ``scatter.value`` writes one number (training graphs decompose it first:
  :mod:`tilefuse.frontend.torch.aten_training`).
  ``scatter_reduce`` with ``"mean"`` or ``include_self=False`` raises :class:`Unsupported`.
* ``index_put(x, indices, values, accumulate)`` with adjacent advanced integer indices (the
  leading ones, or after full slices: ``x[:, i] = v``) is a ``scatter_nd`` of the indexed axes
  brought to the front: the indices broadcast together and stacked as coordinates, the values
  broadcast to what ``x[indices]`` would be. A repeated index keeps the last value (torch
  leaves that order undefined) or, with ``accumulate``, sums them all. Boolean masks
  (data-dependent shapes) and non-adjacent indices raise :class:`Unsupported`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import fx

from tilefuse.dtypes import DType
from tilefuse.frontend.torch.convert import Converter, Lowering, Result, Unsupported, arg

aten = torch.ops.aten

_REDUCE = {"sum": "add", "add": "add", "prod": "mul", "multiply": "mul", "amax": "max",
           "amin": "min"}


def _scatter(reduction: str | None) -> Converter:
    """scatter / scatter_add / scatter_reduce: ``reduction`` fixed, or None (read from the
    node: ``reduce=`` of scatter.reduce, the 5th argument of scatter_reduce.two)."""

    def convert(lw: Lowering, node: fx.Node) -> Result:
        how = reduction
        if how is None:
            given = str(arg(node, 4, "reduce", "none"))
            if given not in _REDUCE:
                raise Unsupported(f"scatter reduction {given!r}", op=lw.op)
            how = _REDUCE[given]
            if not bool(arg(node, 5, "include_self", True)):
                raise Unsupported("scatter_reduce with include_self=False", op=lw.op)
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
            values = lw.add("broadcast_to", [lw.operand(src, x.dtype)],
                            shape=tuple(index.shape))
        return lw.add("scatter_elements", [x, lw.cast(index, DType.i64), values],
                      axis=int(node.args[1]) % rank, reduction=how)

    return convert


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
