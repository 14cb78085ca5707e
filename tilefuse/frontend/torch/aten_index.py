"""Converters for the indexing, bitwise and scan ATen ops that real models' mask and position
code uses (Hugging Face GPT-2, BERT and Llama build their causal and padding masks with
``bitwise_and``, ``index`` and ``cumsum``; BERT reads its buffers with ``gather``).

* ``bitwise_and`` / ``or`` / ``xor`` / ``not`` of bool tensors are the logical ops; of integer
  tensors they raise :class:`Unsupported` (tilefuse has no integer bit ops), and run in torch.
* ``index.Tensor`` with one advanced index, or several adjacent ones (broadcast together, folded
  into one flat index over the axes they index), is a ``take``; bool masks (data-dependent
  shapes) and non-adjacent advanced indices raise :class:`Unsupported`.
* ``gather(x, dim, index)`` is ``take_along_axis`` of x cut to the index's extent on the other
  axes (torch allows an index smaller than x there).
* ``cumsum(x, dim)`` is the ``cumsum`` scan op (:mod:`tilefuse.ops.scan`: a native kernel on the
  CPU, a thread per line on the GPU).
* ``topk`` (sorted) is the ``topk`` op; ``repeat`` a broadcast between two reshapes.
* ``as_strided`` / ``as_strided_`` that only re-lays the tensor out (same sizes, offset 0,
  strides of a dense permutation: the channels-last restride the decomposition of
  ``adaptive_avg_pool2d`` emits) is the tensor itself (tilefuse values have no strides); any
  other ``as_strided`` raises :class:`Unsupported`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import torch
from torch import fx

from tilefuse.dtypes import DType
from tilefuse.frontend.torch.convert import Converter, Lowering, Result, Unsupported, arg
from tilefuse.graph.ir import Value

aten = torch.ops.aten

def _bitwise(op: str) -> Converter:
    def convert(lw: Lowering, node: fx.Node) -> Result:
        if lw.out_type.dtype is not DType.bool:
            raise Unsupported(f"bitwise ops on {lw.out_type.dtype} tensors (only bool)",
                              op=lw.op)
        return lw.add(op, [lw.operand(a, DType.bool) for a in node.args[:2]])
    return convert


def _bitwise_not(lw: Lowering, node: fx.Node) -> Result:
    if lw.out_type.dtype is not DType.bool:
        raise Unsupported(f"bitwise_not of {lw.out_type.dtype} tensors (only bool)", op=lw.op)
    return lw.add("logical_not", [lw.tensor(node.args[0])])


def _index(lw: Lowering, node: fx.Node) -> Result:
    """x[..., idx, ...]: adjacent advanced integer indices as one ``take``."""
    x = lw.tensor(node.args[0])
    given = list(node.args[1])
    at = [i for i, a in enumerate(given) if a is not None]
    if not at or at != list(range(at[0], at[0] + len(at))):
        raise Unsupported("advanced indices must be adjacent", op=lw.op)
    indices = [lw.tensor(given[i]) for i in at]
    if any(v.dtype is DType.bool or v.dtype is DType.u8 for v in indices):
        raise Unsupported("boolean mask indices (data-dependent shapes)", op=lw.op)
    shape = [int(d) for d in x.shape]
    first, count = at[0], len(at)
    if count == 1:
        return lw.add("take", [x, indices[0]], axis=first)
    out_index = lw.out_type.shape[first:len(lw.out_type.shape) - (len(shape) - first - count)]
    flat: Value | None = None
    for axis, idx in zip(range(first, first + count), indices):
        idx = lw.cast(idx, DType.i64)
        size = shape[axis]
        wrapped = lw.add("where", [lw.add("lt", [idx, _i64(lw, 0)]),
                                   lw.add("add", [idx, _i64(lw, size)]), idx])
        flat = wrapped if flat is None else lw.add("add", [lw.add("mul", [flat, _i64(lw, size)]),
                                                          wrapped])
    assert flat is not None
    flat = lw.add("broadcast_to", [flat], shape=tuple(out_index)) \
        if tuple(flat.shape) != tuple(out_index) else flat
    merged = lw.reshape(x, (*shape[:first], int(np.prod(shape[first:first + count])),
                            *shape[first + count:]))
    return lw.add("take", [merged, flat], axis=first)


def _i64(lw: Lowering, value: int) -> Value:
    return lw.constant(np.array(value, np.int64))


def _gather(lw: Lowering, node: fx.Node) -> Result:
    x, index = lw.tensor(node.args[0]), lw.tensor(node.args[2])
    if bool(arg(node, 3, "sparse_grad", False)):
        raise Unsupported("sparse_grad", op=lw.op)
    rank = len(x.shape)
    dim = int(node.args[1]) % max(rank, 1)
    if rank == 0 or len(index.shape) != rank:
        raise Unsupported("gather needs index of x's rank (and rank >= 1)", op=lw.op)
    stops = [int(i) if a != dim else int(d) for a, (i, d) in enumerate(zip(index.shape, x.shape))]
    if stops != [int(d) for d in x.shape]:
        x = lw.add("slice", [x], starts=[0] * rank, stops=stops, steps=[1] * rank)
    return lw.add("take_along_axis", [x, index], axis=dim)


def _cumsum(lw: Lowering, node: fx.Node) -> Result:
    """cumsum(x, dim[, dtype]): the ``cumsum`` scan op (integers run in i64, as torch's do;
    an other requested integer dtype is a cast of the result)."""
    out = lw.out_type.dtype
    x = lw.cast(lw.tensor(node.args[0]), out)
    if len(x.shape) == 0:
        return x
    return lw.cast(lw.add("cumsum", [x], axis=int(node.args[1]) % len(x.shape)), out)


def _topk(lw: Lowering, node: fx.Node) -> Result:
    x = lw.tensor(node.args[0])
    if not bool(arg(node, 4, "sorted", True)):
        raise Unsupported("unsorted topk", op=lw.op)
    values, indices = lw.add_multi("topk", [x], k=int(node.args[1]),
                                   axis=int(arg(node, 2, "dim", -1)),
                                   largest=bool(arg(node, 3, "largest", True)))
    return values, indices


def _repeat(lw: Lowering, node: fx.Node) -> Result:
    """repeat(x, reps): x (leading 1s added to reps' rank) interleaved with the repeat counts,
    broadcast and merged: ``[r0, s0, r1, s1, ...] -> [r0*s0, r1*s1, ...]``."""
    x = lw.tensor(node.args[0])
    reps = [int(r) for r in node.args[1]]
    shape = [1] * (len(reps) - len(x.shape)) + [int(d) for d in x.shape]
    spread = [d for s in shape for d in (1, s)]
    tiled = [d for r, s in zip(reps, shape) for d in (r, s)]
    wide = lw.add("broadcast_to", [lw.reshape(x, spread)], shape=tuple(tiled))
    return lw.reshape(wide, [r * s for r, s in zip(reps, shape)])


def _dense_permutation(sizes: list[int], strides: list[int]) -> bool:
    """Whether ``strides`` lay ``sizes`` out densely in some dimension order (size-1 dims
    may have any stride)."""
    expected = 1
    for size, stride in sorted((p for p in zip(sizes, strides) if p[0] != 1),
                               key=lambda p: p[1]):
        if stride != expected:
            return False
        expected *= size
    return True


def _as_strided(lw: Lowering, node: fx.Node) -> Result:
    source = node.args[0]
    sizes, strides = list(node.args[1]), list(node.args[2])
    offset = arg(node, 3, "storage_offset", 0) or 0
    shape = list(lw.tensor(source).shape)
    if shape != sizes or offset != 0 or not _dense_permutation(sizes, strides):
        raise Unsupported(f"as_strided of {shape} to sizes {sizes}, strides {strides}, "
                          f"offset {offset}: only a restride of the same elements converts")
    return lw.tensor(source)


def index_converters() -> Mapping[Any, Converter]:
    """The converters of this module, for :data:`~tilefuse.frontend.torch.aten.ATEN_CONVERTERS`."""
    return {
        aten.bitwise_and.Tensor: _bitwise("logical_and"),
        aten.bitwise_or.Tensor: _bitwise("logical_or"),
        aten.bitwise_xor.Tensor: _bitwise("logical_xor"),
        aten.bitwise_and.Scalar: _bitwise("logical_and"),
        aten.bitwise_or.Scalar: _bitwise("logical_or"),
        aten.bitwise_not.default: _bitwise_not,
        aten.index.Tensor: _index,
        aten.gather.default: _gather,
        aten.cumsum.default: _cumsum,
        aten.topk.default: _topk,
        aten.repeat.default: _repeat,
        aten.as_strided.default: _as_strided,
        aten.as_strided_.default: _as_strided,
    }


__all__ = ["index_converters"]
