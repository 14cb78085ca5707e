"""Converters for tensor sequences inside a graph: SequenceEmpty, SequenceConstruct,
SequenceInsert, SequenceErase, SequenceAt, SequenceLength, ConcatFromSequence,
SplitToSequence.

Conversion is per signature, so a sequence's length and its tensors are known while converting:
a sequence is a :class:`TensorSequence` (a tuple of tensors) in the converter environment,
never a graph value, and its ops compile away (SequenceAt picks a tensor, ConcatFromSequence is
one ``concat`` or ``stack``). Positions must be constants after folding; given as graph inputs,
the model compiles per value of them, as for other shape operands. Sequences as graph inputs or
outputs stay unsupported (the model reader says so).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from tilefuse.dtypes import DType
from tilefuse.onnx.context import NodeContext, Tensor
from tilefuse.onnx.tensors import to_dtype

Converter = Callable[[NodeContext], list[Any]]


class TensorSequence:
    """An ONNX sequence value during conversion: its tensors and their element type."""

    __slots__ = ("dtype", "items")

    def __init__(self, items: tuple[Tensor, ...], dtype: DType):
        self.items = items
        self.dtype = dtype

    @property
    def type(self) -> str:  # how NodeContext.shapes() shows an input
        return f"seq<{self.dtype.value}>[{len(self.items)}]"


def _sequence(ctx: NodeContext, i: int) -> TensorSequence:
    seq = ctx.input(i)
    if not isinstance(seq, TensorSequence):
        raise ctx.error(f"input {i} must be a sequence")
    return seq


def _position(ctx: NodeContext, i: int, length: int, default: int, inserting: bool) -> int:
    pos = ctx.ints_input(i, "position")
    if pos is None:
        return default
    if len(pos) != 1:
        raise ctx.error("position must be a scalar")
    hi = length if inserting else length - 1
    if not -length <= pos[0] <= hi:
        raise ctx.error(f"position {pos[0]} is out of range for a sequence of {length}")
    return pos[0] + length if pos[0] < 0 else pos[0]


def _empty(ctx: NodeContext) -> list[Any]:
    code = ctx.attr("dtype")
    dtype = DType.f32 if code is None else to_dtype(int(code), f"{ctx.label}: dtype")
    return [TensorSequence((), dtype)]


def _construct(ctx: NodeContext) -> list[Any]:
    items = tuple(t for t in ctx.inputs if t is not None)
    if not items or any(t.dtype is not items[0].dtype for t in items):
        raise ctx.error("needs tensors of one element type")
    return [TensorSequence(items, items[0].dtype)]


def _insert(ctx: NodeContext) -> list[Any]:
    seq, t = _sequence(ctx, 0), ctx.input(1)
    if t.dtype is not seq.dtype:
        raise ctx.error(f"cannot insert a {t.dtype} tensor into a sequence of {seq.dtype}")
    n = len(seq.items)
    at = _position(ctx, 2, n, n, inserting=True)
    return [TensorSequence((*seq.items[:at], t, *seq.items[at:]), seq.dtype)]


def _erase(ctx: NodeContext) -> list[Any]:
    seq = _sequence(ctx, 0)
    n = len(seq.items)
    at = _position(ctx, 1, n, n - 1, inserting=False)
    return [TensorSequence(seq.items[:at] + seq.items[at + 1:], seq.dtype)]


def _at(ctx: NodeContext) -> list[Any]:
    seq = _sequence(ctx, 0)
    if ctx.optional(1) is None:
        raise ctx.error("input 1 (position) is required")
    return [seq.items[_position(ctx, 1, len(seq.items), 0, inserting=False)]]


def _length(ctx: NodeContext) -> list[Any]:
    return [ctx.const(np.asarray(len(_sequence(ctx, 0).items), dtype=np.int64))]


def _concat(ctx: NodeContext) -> list[Any]:
    seq = _sequence(ctx, 0)
    if not seq.items:
        raise ctx.error("cannot concatenate an empty sequence")
    axis = ctx.attr("axis")
    if axis is None:
        raise ctx.error("attribute 'axis' is required")
    rank = seq.items[0].rank
    if ctx.attr("new_axis", 0):
        return [ctx.op("stack", *seq.items, axis=ctx.axis(int(axis), rank + 1))]
    axis = ctx.axis(int(axis), rank)
    if len(seq.items) == 1:
        return [seq.items[0]]
    return [ctx.op("concat", *seq.items, axis=axis)]


def _split(ctx: NodeContext) -> list[Any]:
    x = ctx.input(0)
    axis = ctx.axis(int(ctx.attr("axis", 0)), x.rank)
    n = x.shape[axis]
    split = ctx.const_input(1, "split")
    keepdims = bool(ctx.attr("keepdims", 1))
    if split is None:
        sizes, squeeze = (1,) * n, not keepdims
    elif split.ndim == 0:
        chunk = int(split)
        if chunk < 1:
            raise ctx.error(f"split {chunk} must be positive")
        sizes, squeeze = tuple(min(chunk, n - i) for i in range(0, n, chunk)), False
    else:
        sizes, squeeze = tuple(int(s) for s in split.reshape(-1)), False
    if sum(sizes) != n or any(s < 0 for s in sizes):
        raise ctx.error(f"split sizes {list(sizes)} do not add up to dim {axis} ({n})")
    parts = ctx.ops("split", x, axis=axis, sizes=sizes) if len(sizes) > 1 else [x]
    if squeeze:
        parts = [ctx.op("squeeze", p, axes=(axis,)) for p in parts]
    return [TensorSequence(tuple(parts), x.dtype)]


CONVERTERS: tuple[tuple[str, int, Converter], ...] = (
    ("SequenceEmpty", 11, _empty), ("SequenceConstruct", 11, _construct),
    ("SequenceInsert", 11, _insert), ("SequenceErase", 11, _erase), ("SequenceAt", 11, _at),
    ("SequenceLength", 11, _length), ("ConcatFromSequence", 11, _concat),
    ("SplitToSequence", 11, _split),
)
