"""Which row values a row-reduction kernel stores instead of recomputing.

A row kernel (:mod:`tilefuse.kernel.lower_rows`) runs its reductions in passes over the row and
then a write pass; values over the row are recomputed in every pass that needs them. When the
write pass would recompute an *expensive* value that a reduction pass already computes (softmax's
``e = exp(x - max)``: computed in the sum pass, needed again for ``e / sum``), the reduction pass
stores it into the output's row instead, and the write pass reads it back and finishes
(``out = stored / sum``). The output row is written anyway, and one row (a few KiB) is still in
L1/L2 when the write pass reads it.

The rule, per full-row output ``o`` (one with the domain's shape):

1. **Chain.** Walk back from ``o`` through elementwise nodes while exactly one operand varies
   along the row and has the domain's shape; every other operand must be uniform along the row
   (a per-row scalar: a reduction result, a [R..., 1...] input, a constant). The values on
   that walk (``o`` included) are the candidates: ``o`` is an elementwise function of each of
   them and of per-row scalars only.
2. **Computed earlier.** The candidate nearest ``o`` that some reduction pass computes at the
   same element (through elementwise nodes of the domain's shape only), with ``o``'s dtype (the
   buffer holds it exactly: f32 in f32) and not read at another element by the write pass.
3. **Cost.** Its recomputation costs more than :data:`RECOMPUTE_MAX_OPS` ops per element,
   counted on the loop-IR expression from the inputs and per-row scalars (arithmetic, compare,
   select and cast 1; division, square roots, pow and transcendentals :data:`EXPENSIVE_OP`;
   loads, constants and broadcasts 0; work that does not vary along the row 0).
   A value of <= 2 ops is cheaper to recompute than to store and load back.
4. **Size.** The row fits in :data:`STORE_ROW_BYTES` (so that reading it back hits the cache).

The stored value is the very expression the pass computes, so results are bit-identical to
recomputing it. Otherwise the value is recomputed as before.

**Streaming.** A row kernel whose full-row outputs are large (:data:`STREAM_MIN_BYTES`) is
not read back soon: its write pass stores them with non-temporal (streaming) stores, which go
to memory without first reading each line (the write-allocate read, a third of a row kernel's
traffic) and without evicting the input from the cache (:func:`streams`). A value stored for
the write pass then goes to a scratch row on the stack (:data:`SCRATCH_ROW_BYTES`, in L1)
instead of the output's row, so that the output is written once, by the write pass.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from tilefuse.graph.ir import Node, Value
from tilefuse.kernel.access import LoadInput, dims, unflatten
from tilefuse.kernel.scalar_expr import ElementBuilder, KernelGroupLike
from tilefuse.loop.ir import UNARY_MATH, Expr, LType, XOp, var
from tilefuse.ops.registry import OpKind

RECOMPUTE_MAX_OPS = 2
"""A row value costing at most this many ops per element is recomputed, never stored."""

EXPENSIVE_OP = 8
"""The weight of a division, square root, pow or transcendental (``vdivps`` and an exp are
each ~10-20x a multiply)."""

STORE_ROW_BYTES = 1 << 20
"""Rows longer than this (in bytes of the output) are recomputed: reading them back would
miss the cache."""

STREAM_MIN_BYTES: int | None = None
"""Full-row outputs of at least this many bytes in all are stored streaming (see the module
docstring). None: half the host's L3 (:func:`stream_min_bytes`). Measured on the 2-core EPYC
(2026-12-03, busy host, kernels alone, interleaved): softmax 12x512x512 (12 MiB out, in and
out together fit the 32 MiB L3) ran 2.4-5.7x *slower* streaming, as its output no longer
stays in the L3 between calls; 64x512x512 softmax (64 MiB) 0.61x and layer norm 8192x2048
0.79x of the regular stores; layer norm 2048x768 (6 MiB) 0.73-1.09x (noise)."""

SCRATCH_ROW_BYTES = 16 << 10
"""The longest row (bytes) a stored value keeps in a scratch row on the stack when the
kernel streams its outputs (L1 holds it); longer rows do not stream."""

STREAM_ALIGN = 64
"""Rows stream only when each starts on this boundary (a whole zmm store's alignment) in a
buffer that does (tilefuse's outputs and arena slots)."""

_FREE = frozenset({XOp.CONST, XOp.VAR, XOp.THREAD_ID, XOp.LOAD, XOp.LOCAL_LOAD,
                   XOp.BROADCAST})
_EXPENSIVE = (UNARY_MATH - {XOp.FLOOR, XOp.CEIL, XOp.ROUND}) | {XOp.DIV, XOp.POW, XOp.MOD,
                                                                  XOp.FLOORDIV}


@dataclass(frozen=True)
class StoredValue:
    """Row value ``value`` is computed and stored by reduction pass ``level`` into the row of
    output ``output``'s buffer; the write pass loads it from there."""

    value: Value
    output: Value
    level: int


@dataclass(frozen=True)
class RowShape:
    """What the choice needs of a row plan: the domain F = rows + row, the per-row results
    (reduction outputs), each reduction pass's inputs by level, and the full-row outputs."""

    rows: tuple[int, ...]
    row: tuple[int, ...]
    per_row: tuple[Value, ...]
    sources: Mapping[int, tuple[Value, ...]]
    full_outputs: tuple[Value, ...]

    @property
    def full(self) -> tuple[int, ...]:
        return self.rows + self.row


def choose_stores(group: KernelGroupLike, shape: RowShape, load: LoadInput
                  ) -> tuple[StoredValue, ...]:
    """The values to store (see the module docstring), at most one per full-row output."""
    producers = {v: n for n in group.nodes for v in n.outputs}
    stops = frozenset(shape.per_row) | frozenset(group.inputs)
    varying = row_varying(group, shape)
    computed = {level: _aligned_cone(sources, producers, stops, shape.full)
                for level, sources in shape.sources.items()}
    misaligned = _misaligned(shape.full_outputs, producers, stops, shape.full)
    chosen: dict[Value, StoredValue] = {}
    # outputs computed by a pass first: such a value is stored in its own buffer, then done
    for out in sorted(shape.full_outputs,
                      key=lambda o: not any(o in cone for cone in computed.values())):
        if out.dtype.itemsize * math.prod(shape.row) > STORE_ROW_BYTES:
            continue
        for v in _chain(out, producers, shape, varying):
            levels = [level for level, cone in computed.items() if v in cone]
            if not levels or v.dtype is not out.dtype or v in misaligned:
                continue
            if v not in chosen and row_cost(group, v, shape, load,
                                            varying) > RECOMPUTE_MAX_OPS:
                chosen[v] = StoredValue(v, out, max(levels))
            break
    return tuple(chosen.values())


def row_cost(group: KernelGroupLike, v: Value, shape: RowShape, load: LoadInput,
             varying: frozenset[Value]) -> int:
    """Ops per element to compute ``v`` from the inputs and the per-row results; work that
    does not vary along the row (reads nothing of ``varying``) is not counted."""
    overrides = {p: var(f"_row{n}", LType(p.dtype)) for n, p in enumerate(shape.per_row)}
    moving: set[Expr] = set()

    def marked_load(u: Value, index: tuple[Expr, ...], lanes: int) -> Expr:
        e = load(u, index, lanes)
        if u in varying:
            moving.add(e)
        return e

    builder = ElementBuilder(group, marked_load, overrides)
    expr = builder.value(v, unflatten(var("_r"), shape.rows) + unflatten(var("_i"), shape.row))
    for e in _post_order(expr):
        if e in moving or any(a in moving for a in e.args):
            moving.add(e)
    return sum(_weight(e) for e in _post_order(expr) if e in moving)


def _weight(e: Expr) -> int:
    if e.op in _FREE:
        return 0
    return EXPENSIVE_OP if e.op in _EXPENSIVE else 1


def _post_order(root: Expr) -> list[Expr]:
    """The distinct sub-expressions of ``root``, each after its arguments."""
    order: list[Expr] = []
    seen: set[Expr] = set()
    stack: list[tuple[Expr, bool]] = [(root, False)]
    while stack:
        e, expanded = stack.pop()
        if e in seen:
            continue
        if expanded:
            seen.add(e)
            order.append(e)
            continue
        stack.append((e, True))
        stack.extend((a, False) for a in e.args if a not in seen)
    return order


def row_varying(group: KernelGroupLike, shape: RowShape) -> frozenset[Value]:
    """The group values that vary along the row: inputs and fills with the domain's shape or
    a non-1 axis under the row's axes (NumPy-aligned on the right), and every value computed
    from one of those other than through a reduction."""
    k = len(shape.row)

    def by_shape(u: Value) -> bool:
        own = dims(u.shape)
        return own == shape.full or any(d != 1 for d in own[max(0, len(own) - k):])

    found = {u for u in group.inputs if by_shape(u)}
    for node in group.nodes:
        if node.op.kind is OpKind.REDUCTION:
            continue
        if any(u in found for u in node.inputs) or (not node.inputs and
                                                   any(by_shape(u) for u in node.outputs)):
            found.update(node.outputs)
    return frozenset(found)


def _chain(out: Value, producers: Mapping[Value, Node], shape: RowShape,
           varying: frozenset[Value]) -> list[Value]:
    """``out`` and the values it is an elementwise function of, with per-row scalars only
    besides (rule 1), nearest first; only elementwise results are listed."""
    chain: list[Value] = []
    v = out
    while True:
        node = producers.get(v)
        if node is None or node.op.kind is not OpKind.ELEMENTWISE:
            return chain
        chain.append(v)
        moving = list(dict.fromkeys(u for u in node.inputs if u in varying))
        if len(moving) != 1 or dims(moving[0].shape) != shape.full:
            return chain
        v = moving[0]


def _walk(roots: Iterable[Value], producers: Mapping[Value, Node], stops: frozenset[Value],
          full: tuple[int, ...]) -> set[tuple[Value, bool]]:
    """Every (value, aligned) reached from ``roots`` (taken as aligned) through the group's
    nodes up to ``stops``; aligned: read at the root's element, through elementwise nodes of
    the domain's shape only."""
    seen: set[tuple[Value, bool]] = set()
    stack = [(v, True) for v in roots]
    while stack:
        v, aligned = stack.pop()
        if (v, aligned) in seen:
            continue
        seen.add((v, aligned))
        node = producers.get(v)
        if node is None or v in stops:
            continue
        keep = aligned and node.op.kind is OpKind.ELEMENTWISE and dims(v.shape) == full
        stack.extend((u, keep and dims(u.shape) == full) for u in node.inputs)
    return seen


def _aligned_cone(sources: Iterable[Value], producers: Mapping[Value, Node],
                  stops: frozenset[Value], full: tuple[int, ...]) -> frozenset[Value]:
    """The values a pass accumulating ``sources`` computes at the element it accumulates."""
    return frozenset(v for v, aligned in _walk(sources, producers, stops, full) if aligned)


def _misaligned(outputs: Iterable[Value], producers: Mapping[Value, Node],
                stops: frozenset[Value], full: tuple[int, ...]) -> frozenset[Value]:
    """The values the write pass reads at an element other than the one it writes."""
    return frozenset(v for v, aligned in _walk(outputs, producers, stops, full)
                     if not aligned)


def streams(shape: RowShape, lanes: int, stored: Iterable[StoredValue]) -> bool:
    """Whether a CPU row kernel of ``shape`` run in ``lanes``-wide vectors stores its full-row
    outputs streaming (module docstring): static shapes; float outputs of
    :data:`STREAM_MIN_BYTES` or more in all, whose rows are whole vectors starting on
    :data:`STREAM_ALIGN`-byte boundaries; every stored value's row fits the scratch row."""
    if not shape.full_outputs or not all(isinstance(d, int) for d in shape.full):
        return False
    n = math.prod(shape.row)
    if lanes < 2 or n % lanes:
        return False
    for out in shape.full_outputs:
        size = out.dtype.itemsize
        if not out.dtype.is_float or n * size % STREAM_ALIGN or size * lanes not in (16, 32, 64):
            return False
    total = sum(o.dtype.itemsize * math.prod(shape.full) for o in shape.full_outputs)
    if total < stream_min_bytes():
        return False
    return all(s.value.dtype.itemsize * n <= SCRATCH_ROW_BYTES for s in stored)


def stream_min_bytes() -> int:
    """:data:`STREAM_MIN_BYTES`, or half the L3 of this host: output beyond that would not
    stay in the cache until it is read (it would evict the input, too)."""
    if STREAM_MIN_BYTES is not None:
        return STREAM_MIN_BYTES
    return _half_l3()


@functools.cache
def _half_l3() -> int:
    from tilefuse.tune.bandwidth import cache_sizes

    return cache_sizes().get("L3", 32 << 20) // 2
