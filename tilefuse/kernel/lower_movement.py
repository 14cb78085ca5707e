"""Data-movement kernels: a single-node MOVEMENT group lowered to copy loops.

Every op is written as a list of *pieces*. A piece is a box of one output (a range per axis of
the output's loop shape) and what each element of it holds: an element of one input, found by an
index map from the output index, or a constant (constant padding). The boxes of one output are
disjoint and cover it, so each output element is written exactly once. A piece is one loop nest::

    [parallel] for r in 0..prod(box[:-1]):        (the outer axes of the box, flattened)
      vectorized for i in 0..n - n % W step W:    n = box[-1]; only when the input is
        out[...] = load(in, src(...), W)          contiguous along the last axis
      for i in ..n:
        out[...] = load(in, src(...))

The ops: ``concat`` (one piece per input), ``split`` (one per output), ``stack`` (one per
input, the new axis fixed), ``slice`` (``start + step * i`` per axis, negative steps too),
``pad`` (the interior a shifted copy; the border boxes a constant, or the input at a clamped
(``edge``) or reflected (``reflect``) index), ``transpose`` (a permuted index),
``broadcast_to`` (size-1 axes read at 0), and ``reshape``/``squeeze``/``expand_dims`` (one flat
copy). ``take`` and ``take_along_axis`` are :mod:`tilefuse.kernel.lower_gather`'s (an out-of-range
index must raise: that module's kernels record it for the executable to check).

A piece runs across threads when its output box holds at least
:data:`MOVEMENT_MIN_ELEMENTS` elements per thread (movement groups have no tuned schedule; a
schedule naming a vector width is honoured).
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from typing import TYPE_CHECKING

from tilefuse.dtypes import DType
from tilefuse.errors import CompileError
from tilefuse.graph.ir import Node, Value
from tilefuse.kernel.access import dims, flatten, unflatten
from tilefuse.kernel.lower_elementwise import (
    KernelContext,
    chunked_runs,
    fit_lanes,
    outer_loop,
    run_loops,
)
from tilefuse.kernel.scalar_expr import KernelGroupLike
from tilefuse.kernel.schedule import PARALLEL_MIN_ELEMENTS
from tilefuse.loop.ir import (
    Expr,
    LoopFunction,
    Stmt,
    Store,
    broadcast,
    cast,
    const,
    maximum,
    minimum,
)

if TYPE_CHECKING:
    from tilefuse.kernel.schedule import Schedule

Index = tuple[Expr, ...]
IndexMap = Callable[[Index], Index]

LOWERED_OPS = frozenset({"concat", "split", "stack", "slice", "pad", "transpose", "broadcast_to",
                         "reshape", "squeeze", "expand_dims"})


@dataclass(frozen=True)
class Piece:
    """A box of ``output`` (``lo``/``hi`` per axis of ``shape``, the loop view of the output:
    its own shape, or flat for an order-preserving copy). Its elements are ``source`` read at
    ``src(index)`` (an index over ``source_shape``), or ``fill`` when ``source`` is None.
    ``contiguous``: consecutive last-axis indices read consecutive source elements."""

    output: Value
    shape: tuple[int, ...]
    lo: tuple[int, ...]
    hi: tuple[int, ...]
    source: Value | None = None
    source_shape: tuple[int, ...] = ()
    src: IndexMap | None = None
    contiguous: bool = True
    fill: float = 0.0

    @property
    def extents(self) -> tuple[int, ...]:
        return tuple(h - lo for lo, h in zip(self.lo, self.hi))


# ----------------------------------------------------------------------------- pieces per op


def _whole(v: Value) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]:
    shape = dims(v.shape)
    return shape, (0,) * len(shape), shape


def _shifted(axis: int, offset: int) -> IndexMap:
    """Index map: the same index with ``offset`` added on ``axis``."""
    return lambda ix: tuple(i + offset if a == axis else i for a, i in enumerate(ix))


def _concat(node: Node) -> list[Piece]:
    out = node.output
    shape = dims(out.shape)
    axis = node.attrs["axis"] % len(shape)
    pieces, start = [], 0
    for v in node.inputs:
        n = dims(v.shape)[axis]
        lo = tuple(start if a == axis else 0 for a in range(len(shape)))
        hi = tuple(start + n if a == axis else d for a, d in enumerate(shape))
        if n:
            pieces.append(Piece(out, shape, lo, hi, v, dims(v.shape), _shifted(axis, -start)))
        start += n
    return pieces


def _split(node: Node) -> list[Piece]:
    x = node.inputs[0]
    rank = len(dims(x.shape))
    axis = node.attrs["axis"] % rank
    pieces, start = [], 0
    for out in node.outputs:
        shape, lo, hi = _whole(out)
        pieces.append(Piece(out, shape, lo, hi, x, dims(x.shape), _shifted(axis, start)))
        start += shape[axis]
    return pieces


def _stack(node: Node) -> list[Piece]:
    out = node.output
    shape = dims(out.shape)
    axis = node.attrs["axis"] % len(shape)
    contiguous = axis != len(shape) - 1

    def drop(ix: Index) -> Index:
        return ix[:axis] + ix[axis + 1:]

    pieces = []
    for k, v in enumerate(node.inputs):
        lo = tuple(k if a == axis else 0 for a in range(len(shape)))
        hi = tuple(k + 1 if a == axis else d for a, d in enumerate(shape))
        pieces.append(Piece(out, shape, lo, hi, v, dims(v.shape), drop, contiguous))
    return pieces


def _slice(node: Node) -> list[Piece]:
    x, out = node.inputs[0], node.output
    src_shape = dims(x.shape)
    shape, lo, hi = _whole(out)
    attrs = node.attrs
    ranges = [range(*slice(b, e, s).indices(n)) for n, b, e, s in
              zip(src_shape, attrs["starts"], attrs["stops"], attrs["steps"])]

    def src(ix: Index) -> Index:
        return tuple(i * r.step + r.start for i, r in zip(ix, ranges))

    contiguous = not shape or ranges[-1].step == 1 or shape[-1] == 1
    return [Piece(out, shape, lo, hi, x, src_shape, src, contiguous)]


def _transpose(node: Node) -> list[Piece]:
    x, out = node.inputs[0], node.output
    shape, lo, hi = _whole(out)
    perm = [p % len(shape) for p in node.attrs["perm"]]
    inverse = [perm.index(a) for a in range(len(perm))]

    def src(ix: Index) -> Index:
        return tuple(ix[inverse[a]] for a in range(len(ix)))

    contiguous = not shape or perm[-1] == len(shape) - 1 or shape[-1] == 1
    return [Piece(out, shape, lo, hi, x, dims(x.shape), src, contiguous)]


def _broadcast_to(node: Node) -> list[Piece]:
    x, out = node.inputs[0], node.output
    shape, lo, hi = _whole(out)
    src_shape = dims(x.shape)
    offset = len(shape) - len(src_shape)

    def src(ix: Index) -> Index:
        return tuple(const(0) if d == 1 else ix[offset + a] for a, d in enumerate(src_shape))

    contiguous = not shape or shape[-1] == 1 or (bool(src_shape) and src_shape[-1] == shape[-1])
    return [Piece(out, shape, lo, hi, x, src_shape, src, contiguous)]


def _flat_copy(node: Node) -> list[Piece]:
    x, out = node.inputs[0], node.output
    n = math.prod(dims(out.shape))
    return [Piece(out, (n,), (0,), (n,), x, (n,), lambda ix: ix)]


PIECES: dict[str, Callable[[Node], list[Piece]]] = {
    "concat": _concat, "split": _split, "stack": _stack, "slice": _slice,
    "transpose": _transpose, "broadcast_to": _broadcast_to, "reshape": _flat_copy,
    "squeeze": _flat_copy, "expand_dims": _flat_copy,
}


# ----------------------------------------------------------------------------- pad


def _edge(i: Expr, n: int) -> Expr:
    return minimum(maximum(i, 0), n - 1)


def _reflect(i: Expr, n: int) -> Expr:
    """np.pad's 'reflect' (edge not repeated) at any distance: period 2(n-1)."""
    if n == 1:
        return const(0)
    period = 2 * (n - 1)
    m = i % period
    return minimum(m, period - m)


def _pad(node: Node) -> list[Piece]:
    x, out = node.inputs[0], node.output
    src_shape = dims(x.shape)
    shape = dims(out.shape)
    pads, mode = node.attrs["pads"], node.attrs["mode"]
    before = [pads[2 * a] for a in range(len(shape))]
    inner_lo = tuple(before)
    inner_hi = tuple(b + n for b, n in zip(before, src_shape))
    pieces = []
    if all(h > lo for lo, h in zip(inner_lo, inner_hi)):
        shift = lambda ix: tuple(i - b for i, b in zip(ix, before))  # noqa: E731
        pieces.append(Piece(out, shape, inner_lo, inner_hi, x, src_shape, shift))
    fold = _edge if mode == "edge" else _reflect

    def border(ix: Index) -> Index:
        return tuple(fold(i - b, n) for i, b, n in zip(ix, before, src_shape))

    for a in range(len(shape)):  # axes < a inside, axis a outside, axes > a whole
        for lo_a, hi_a in ((0, inner_lo[a]), (inner_hi[a], shape[a])):
            lo = (*inner_lo[:a], lo_a, *(0,) * (len(shape) - a - 1))
            hi = (*inner_hi[:a], hi_a, *shape[a + 1:])
            if any(h <= lo_ for lo_, h in zip(lo, hi)):
                continue
            if mode == "constant":
                pieces.append(Piece(out, shape, lo, hi, fill=node.attrs["value"]))
            else:
                pieces.append(Piece(out, shape, lo, hi, x, src_shape, border, False))
    return pieces


PIECES["pad"] = _pad


# ----------------------------------------------------------------------------- loops


@cache
def _host_lanes(itemsize: int) -> int:
    from tilefuse.codegen.target import host_target

    return min(32, host_target().vector_lanes(itemsize))


def _lanes(schedule: Schedule | None, dtype: DType) -> int:
    width = getattr(schedule, "vector_width", 0) if schedule is not None else 0
    if width and getattr(schedule, "vector_axis", None) is not None:
        return int(width)
    return _host_lanes(dtype.itemsize)


MOVEMENT_MIN_ELEMENTS = PARALLEL_MIN_ELEMENTS // 4
"""Elements per thread from which a piece's copy is split across threads: a quarter of the
elementwise rule's, since a copy does no arithmetic and each piece of a concat is its own loop
(ShuffleNet's 4-way concat, pieces of 3136x28 f32, ran serial under the elementwise rule)."""


def _threads(elements: int) -> int:
    return max(1, min(os.cpu_count() or 1, elements // MOVEMENT_MIN_ELEMENTS))


def _fill_value(piece: Piece, lanes: int) -> Expr:
    dtype = piece.output.dtype
    if dtype.is_int and not math.isfinite(piece.fill):
        raise CompileError(f"pad value {piece.fill} does not convert to {dtype}")
    value = const(piece.fill, dtype)  # truncates toward zero for ints, as astype does
    return value if lanes == 1 else broadcast(value, lanes)


def _piece_stmts(ctx: KernelContext, piece: Piece, lanes: int) -> list[Stmt]:
    out_buf = ctx.buffers.outputs[piece.output]
    ext = piece.extents
    if not piece.shape:
        return [Store(out_buf.name, const(0), _element(ctx, piece, (), 1))]
    outer, inner = ext[:-1], ext[-1]
    can_vector = piece.source is None or piece.contiguous
    width = fit_lanes(lanes, inner) if can_vector else 1
    threads = _threads(math.prod(ext))
    count = math.prod(outer)

    def rows(r: Expr) -> list[Stmt]:
        prefix = tuple(i + lo for i, lo in zip(unflatten(r, outer), piece.lo))

        def body(i: Expr, n: int) -> list[Stmt]:
            ix = (*prefix, i + piece.lo[-1])
            return [Store(out_buf.name, flatten(ix, piece.shape), _element(ctx, piece, ix, n))]

        if count == 1 and threads > 1:
            tile = -(-inner // threads)
            return chunked_runs(ctx.names, inner, width, tile, body)
        return run_loops(ctx.names, 0, inner, width, body)

    tile = None
    if threads > 1 and count > 1:
        tile = -(-count // threads)
    return outer_loop(ctx.names, count, tile, rows)


def _element(ctx: KernelContext, piece: Piece, ix: Index, lanes: int) -> Expr:
    if piece.source is None:
        return _fill_value(piece, lanes)
    assert piece.src is not None
    buf = ctx.buffers.inputs[piece.source]
    value = buf.load(flatten(piece.src(ix), piece.source_shape), lanes)
    if buf.dtype != piece.output.dtype:
        value = cast(value, piece.output.dtype)
    return value


def lower_movement(group: KernelGroupLike, schedule: Schedule | None = None) -> LoopFunction:
    """The loop IR of a one-node MOVEMENT group (see the module docstring); CompileError for
    ops not lowered here (``take``, ``take_along_axis``: :mod:`.lower_gather`)."""
    if len(group.nodes) != 1:
        raise CompileError(f"kernel {group.name}: movement lowering takes one node, got "
                           f"{len(group.nodes)}")
    (node,) = group.nodes
    make = PIECES.get(node.op.name)
    if make is None:
        raise CompileError(f"kernel {group.name}: no native lowering for {node.op.name}")
    missing = [v for v in node.inputs if v not in group.inputs]
    if missing or any(v not in group.outputs for v in node.outputs):
        raise CompileError(f"kernel {group.name}: {node.op.name} must read and write buffers")
    ctx = KernelContext.of(group)
    lanes = _lanes(schedule, node.outputs[0].dtype)
    body: list[Stmt] = []
    for piece in make(node):
        if math.prod(piece.extents) > 0:
            body.extend(_piece_stmts(ctx, piece, lanes))
    return ctx.function(body)


__all__ = ["LOWERED_OPS", "Piece", "lower_movement"]
