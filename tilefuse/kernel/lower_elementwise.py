"""Elementwise kernels: one loop nest per output shape, vectorised, with a scalar tail.

For each output shape S (outputs whose shapes differ only in size-1 axes are written in the same
loop), the nest walks S
as ``outer`` axes (flattened into one loop variable, the parallel loop when the schedule says
so) and a trailing *block* of axes walked flat by a vectorised loop plus a scalar remainder::

    [parallel] for r in 0..prod(outer):          (absent when the block is all of S)
      vectorized for i in 0..N - N % W step W:   N = prod(block), W = schedule.vector_width
        let t0 = ...                             every value computed once, bound to a let
        out0[r*N + i:+W] = ...
      for i1 in N - N % W..N:
        (the same, one element at a time)

The block is as large as the accesses allow: all of S (one flat loop, split into parallel
chunks of the schedule's ``i`` tile) unless some operand is broadcast along it or transposed
across it; then fewer trailing axes; scalars when no block vectorises
(:class:`~tilefuse.kernel.access.NotVectorizable` drives the choice).

:func:`lower_group` dispatches a kernel group to its lowering by kind.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from tilefuse.errors import CompileError
from tilefuse.graph.ir import Value
from tilefuse.kernel.access import (
    KernelBuffers,
    LoadInput,
    Namer,
    NotVectorizable,
    as_extent,
    dims,
    flatten,
    identifier,
    is_extent,
    kernel_buffers,
    load_contiguous,
    reindex,
    reshaped_run,
    squeezed,
    symbol_scalars,
    unflatten,
)
from tilefuse.kernel.fusion import KernelKind
from tilefuse.kernel.scalar_expr import ElementBuilder, KernelGroupLike, Override
from tilefuse.kernel.schedule import PARALLEL_MIN_ELEMENTS, SYMBOLIC_DIM_HINT
from tilefuse.loop.ir import (
    Block,
    Expr,
    For,
    Let,
    LoopFunction,
    LoopKind,
    Stmt,
    Store,
    XOp,
    block,
    const,
    expr_children,
    free_vars,
    loop,
    maximum,
    minimum,
    stmt_children,
    var,
    walk_expr,
)
from tilefuse.loop.simplify import fold_index, simplify

if TYPE_CHECKING:
    from tilefuse.kernel.schedule import Schedule

DEFAULT_CHUNK = 16 * 1024
"""Elements per parallel chunk of a flat loop when the schedule names no tile."""

Body = Callable[[Expr, int], list[Stmt]]
"""``body(position, lanes)``: the statements for one lane run starting at a flat position."""


@dataclass(frozen=True)
class KernelContext:
    """What every loop body of one kernel shares: the group, its buffers, the name pool."""

    group: KernelGroupLike
    buffers: KernelBuffers
    names: Namer
    load: LoadInput

    @staticmethod
    def of(group: KernelGroupLike) -> KernelContext:
        buffers = kernel_buffers(group.inputs, group.outputs)
        return KernelContext(group, buffers, Namer(buffers.names()),
                             load_contiguous(buffers.inputs))

    def builder(self, overrides: Mapping[Value, Override] | None = None) -> ElementBuilder:
        return ElementBuilder(self.group, self.load, overrides, names=self.names)

    def function(self, body: Sequence[Stmt]) -> LoopFunction:
        fn = LoopFunction(identifier(self.group.name), self.buffers.params,
                          group_scalars(self.group), block(*body))
        return simplify(fn)[0]

    def store_body(self, outputs: Sequence[Value], index: tuple[Expr, ...], lanes: int,
                   block_axes: int, overrides: Mapping[Value, Override] | None = None,
                   shape: tuple[int, ...] | None = None) -> list[Stmt]:
        """Lets, then one store per output, for the run at ``index`` over ``shape`` (default:
        the first output's); every output has ``shape``'s squeezed form."""
        b = self.builder(overrides)
        shape = dims(outputs[0].shape) if shape is None else shape
        stores = []
        for v in outputs:
            own = dims(v.shape)
            at = index if own == shape else reindex(index, shape, own)
            run = block_axes if own == shape or lanes == 1 else reshaped_run(own, shape,
                                                                             block_axes, lanes)
            stores.append(Store(self.buffers.outputs[v].name, flatten(at, own),
                                b.value(v, at, lanes, run)))
        return [*b.lets, *stores]


def group_scalars(group: KernelGroupLike) -> tuple[str, ...]:
    """The kernel's runtime extents: one ``dim_<symbol>`` scalar per symbol in the shapes of
    the group's values (none for a static group, which lowers exactly as before)."""
    values = [*group.inputs, *group.outputs,
              *(o for n in getattr(group, "nodes", ()) for o in n.outputs)]
    return symbol_scalars(values)


# ----------------------------------------------------------------------------- schedules


def vector_width(schedule: Schedule | None) -> int:
    if schedule is None or getattr(schedule, "vector_axis", None) is None:
        return 1
    return max(1, int(schedule.vector_width))


def parallel_tile(schedule: Schedule | None, axis: str) -> int | None:
    """The tile of ``axis`` when the schedule runs it across threads (0: the whole axis, one
    chunk per iteration); None when it does not."""
    if schedule is None or axis not in schedule.parallel_axes:
        return None
    return schedule.tile(axis) or 0


def fit_lanes(lanes: int, count: int) -> int:
    """The vector width for runs of ``count`` elements: ``lanes``, or the largest power of two
    that fits when ``count`` is shorter (1: scalars)."""
    if is_extent(count) or count >= lanes:
        return lanes  # a runtime count: full vectors, the tail loop takes the rest
    return 1 << (count.bit_length() - 1) if count > 1 else 1


# ----------------------------------------------------------------------------- loops


def run_loops(names: Namer, start: int, stop: int, lanes: int, body: Body) -> list[Stmt]:
    """A vectorised loop over ``[start, stop)`` in steps of ``lanes`` (as far as whole vectors
    reach) and a scalar loop over the rest. ``body(i, lanes)`` may raise NotVectorizable for
    the vector part, before anything is emitted."""
    split = stop - (stop - start) % lanes if lanes > 1 else start
    stmts: list[Stmt] = []
    if is_extent(stop) or is_extent(start):  # runtime bounds: both loops, either may be empty
        if lanes > 1:
            i = names.fresh("i")
            stmts.append(loop(i, start, split, body(var(i), lanes), lanes, LoopKind.VECTORIZED))
        i = names.fresh("i")
        return [*stmts, loop(i, split, stop, body(var(i), 1))]
    if split > start:
        i = names.fresh("i")
        stmts.append(loop(i, start, split, body(var(i), lanes), lanes, LoopKind.VECTORIZED))
        split = _vector_tail(stmts, split, stop, lanes, body)
    if stop > split:
        i = names.fresh("i")
        stmts.append(loop(i, split, stop, body(var(i), 1)))
    return stmts


MIN_TAIL_LANES = 4
"""The narrowest vector a run's remainder is taken in before single elements."""


def _vector_tail(stmts: list[Stmt], start: int, stop: int, lanes: int, body: Body) -> int:
    """Appends to ``stmts`` the remainder ``[start, stop)`` of a vectorised run (fewer than
    ``lanes`` elements) in halving vectors, ``lanes/2`` down to :data:`MIN_TAIL_LANES`, each
    straight-line code at a constant offset; returns where single elements start. A run of
    136 channels was 8 vectors and 8 scalar iterations, as much work as the vectors in
    ShuffleNet's depthwise convolutions (nine taps each); now 8 vectors and one of 8 lanes.
    A width whose body does not vectorise leaves the rest to the scalar loop."""
    width = lanes // 2
    while width >= MIN_TAIL_LANES and stop > start:
        if stop - start >= width:
            try:
                stmts.append(block(*body(const(start), width)))
            except NotVectorizable:
                return start
            start += width
        width //= 2
    return start


def outer_loop(names: Namer, count: int, tile: int | Expr | None,
               body: Callable[[Expr], list[Stmt]]) -> list[Stmt]:
    """``body(r)`` for each ``r`` in ``[0, count)``: no loop for one iteration, a parallel loop
    when ``tile`` is not None (over tiles of ``tile`` iterations when that is smaller). With a
    runtime ``count``, ``tile`` may be a runtime expression too (evaluated at loop entry)."""
    if count == 1:
        return body(const(0))
    r = names.fresh("r")
    if is_extent(count) and (is_extent(tile) or tile):  # tiles, the last one clipped
        g, t = names.fresh("g"), names.fresh("tile")
        start = var(g) * var(t)
        inner = loop(r, start, minimum(start + var(t), count), body(var(r)))
        chunks = loop(g, 0, (count + (var(t) - 1)) // var(t), [inner], kind=LoopKind.PARALLEL)
        return [Let(t, as_extent(tile)), chunks]
    if tile is None or is_extent(count) or not 0 < tile < count:
        kind = LoopKind.SERIAL if tile is None else LoopKind.PARALLEL
        return [loop(r, 0, count, body(var(r)), kind=kind)]
    g = names.fresh("g")
    start = var(g) * tile
    inner = loop(r, start, minimum(start + tile, count), body(var(r)))
    return [loop(g, 0, -(-count // tile), [inner], kind=LoopKind.PARALLEL)]


def chunked_runs(names: Namer, count: int, lanes: int, tile: int | None,
                 body: Body, hint: int | None = None) -> list[Stmt]:
    """:func:`run_loops` over ``[0, count)``, with the vector part split into parallel chunks
    of ``tile`` elements (rounded up to whole vectors) when ``tile`` is set. A runtime
    ``count`` is chunked at loop entry (``hint``: the count the schedule's tile was chosen
    for, which bounds the threads)."""
    whole = count - count % lanes if lanes > 1 else 0
    if is_extent(count):
        return _runtime_chunked_runs(names, count, lanes, tile, body, hint)
    if tile is None or whole == 0:
        return run_loops(names, 0, count, lanes, body)
    tile = max(lanes, -(-(tile or DEFAULT_CHUNK) // lanes) * lanes)
    if tile >= whole:
        return run_loops(names, 0, count, lanes, body)
    i, g = names.fresh("i"), names.fresh("g")
    vector = body(var(i), lanes)
    start = var(g) * tile
    inner = loop(i, start, minimum(start + tile, whole), vector, lanes, LoopKind.VECTORIZED)
    chunks = loop(g, 0, -(-whole // tile), [inner], kind=LoopKind.PARALLEL)
    return [chunks, *run_loops(names, whole, count, 1, body)]


def _runtime_chunked_runs(names: Namer, count: Expr, lanes: int, tile: int | None,
                          body: Body, hint: int | None) -> list[Stmt]:
    """:func:`chunked_runs` for a runtime ``count``: the default rule evaluated at loop entry
    (a thread per ``PARALLEL_MIN_ELEMENTS`` elements, at most as many threads as the schedule
    made for ``hint`` elements), chunks of whole vectors, and the scalar tail loop from
    ``whole`` (empty when ``count`` is a multiple of ``lanes``)."""
    if tile is None or lanes == 1:
        return run_loops(names, 0, count, lanes, body)
    tile = max(lanes, -(-(tile or DEFAULT_CHUNK) // lanes) * lanes)
    most = max(1, -(-(hint or tile) // tile))
    whole = count - count % lanes
    i, g, c = names.fresh("i"), names.fresh("g"), names.fresh("chunk")
    threads = minimum(maximum(whole // PARALLEL_MIN_ELEMENTS, 1), most)
    chunk = maximum(((whole + (threads - 1)) // threads + (lanes - 1)) // lanes * lanes, lanes)
    vector = body(var(i), lanes)
    start = var(g) * var(c)
    inner = loop(i, start, minimum(start + var(c), whole), vector, lanes, LoopKind.VECTORIZED)
    chunks = loop(g, 0, (whole + (var(c) - 1)) // var(c), [inner], kind=LoopKind.PARALLEL)
    t = names.fresh("i")
    return [Let(c, chunk), chunks, loop(t, whole, count, body(var(t), 1))]


def with_lanes(ctx: KernelContext, lanes: int,
               build: Callable[[KernelContext, int], list[Stmt]]) -> list[Stmt]:
    """``build(ctx, lanes)``, or ``build(ctx, 1)`` when some run does not vectorise (names
    handed out by the failed trial are not used up)."""
    if lanes > 1:
        trial = replace(ctx, names=ctx.names.fork())
        try:
            stmts = build(trial, lanes)
        except NotVectorizable:
            pass
        else:
            ctx.names.adopt(trial.names)
            return stmts
    return build(ctx, 1)


# ----------------------------------------------------------------------------- elementwise


def lower_elementwise(group: KernelGroupLike, schedule: Schedule | None = None
                      ) -> LoopFunction:
    """The loop IR of an ELEMENTWISE group: buffers are the group inputs (readonly), then its
    outputs; one loop nest per output shape, size-1 axes aside (see the module docstring)."""
    ctx = KernelContext.of(group)
    lanes = vector_width(schedule)
    tile = parallel_tile(schedule, "i")
    nests: dict[tuple[int, ...], list[Value]] = {}
    for v in ctx.buffers.outputs:
        nests.setdefault(squeezed(dims(v.shape)), []).append(v)
    body: list[Stmt] = []
    for outputs in nests.values():
        body.extend(_nest(ctx, dims(outputs[0].shape), outputs, lanes, tile))
    return ctx.function(body)


def _nest(ctx: KernelContext, shape: tuple[int, ...], outputs: list[Value], lanes: int,
          tile: int | None) -> list[Stmt]:
    """The loops writing ``outputs`` (all of ``shape``): the largest block that vectorises,
    with vectors no longer than the block."""
    if not shape:
        return ctx.store_body(outputs, (), 1, 0)
    for b in range(len(shape), 0, -1):
        width = fit_lanes(lanes, math.prod(shape[len(shape) - b:]))
        if width == 1:
            break
        trial = replace(ctx, names=ctx.names.fork())
        try:
            stmts = _block_nest(trial, shape, outputs, b, width, tile)
        except NotVectorizable:
            continue
        ctx.names.adopt(trial.names)
        return stmts
    interleaved = _interleaved_nest(ctx, shape, outputs, tile) if lanes > 1 else None
    if interleaved is not None:
        return interleaved
    return _block_nest(ctx, shape, outputs, 1, 1, tile)


MAX_INTERLEAVE = 16
"""The largest factor ``g`` :func:`_interleaved_nest` splits the last axis by."""


def _interleaved_nest(ctx: KernelContext, shape: tuple[int, ...], outputs: list[Value],
                      tile: int | None) -> list[Stmt] | None:
    """The last axis C walked as ``[C/g, g]``: ``for i in 0..C/g`` with the ``g`` stores
    ``out[.., i*g + j]`` (j = 0..g-1) written out, for the smallest ``g`` (up to
    :data:`MAX_INTERLEAVE`) where every load, folded, reads element ``i`` of a run (unit
    stride in ``i``, or does not depend on it); None when no ``g`` does.

    For a kernel that reads through a transpose moving the lane axis by a ``[g, m]`` swap
    (ShuffleNet's channel shuffle in channels-last layout: C = g·m, out[c'] = in[(c' % g)·m
    + c' // g]), whose flat loop LLVM vectorised with gathers of the input and of every
    per-channel parameter (~3 cycles per element): here each of the g loads is contiguous in
    ``i`` and the g stores form one interleaved group, which LLVM's loop vectoriser turns
    into contiguous vector loads, shuffles and contiguous stores."""
    c = shape[-1]
    if is_extent(c) or any(is_extent(d) for d in shape):
        return None
    outer = shape[:-1]
    count = math.prod(outer)
    for g in range(2, min(MAX_INTERLEAVE, c // 2) + 1):
        if c % g:
            continue
        trial = replace(ctx, names=ctx.names.fork())
        i = trial.names.fresh("i")

        def runs(r: Expr, trial: KernelContext = trial, g: int = g, i: str = i) -> list[Stmt]:
            prefix = unflatten(r, outer)
            body: list[Stmt] = []
            for j in range(g):
                body.extend(trial.store_body(outputs, (*prefix, var(i) * g + j), 1, 1))
            return [loop(i, 0, c // g, body)]

        stmts = [_fold_addresses(st) for st in
                 outer_loop(trial.names, count, None if tile is None else 0, runs)]
        if _unit_stride_loads(stmts, i):
            ctx.names.adopt(trial.names)
            return stmts
    return None


def _fold_addresses(s: Stmt) -> Stmt:
    """``s`` with every load and store index folded by
    :func:`~tilefuse.loop.simplify.fold_index` (its div/mod rules hold for addresses only)."""
    if isinstance(s, For):
        return replace(s, body=_fold_addresses(s.body))
    if isinstance(s, Block):
        return replace(s, stmts=tuple(_fold_addresses(c) for c in s.stmts))
    if isinstance(s, Let):
        return replace(s, value=_fold_loads(s.value))
    if isinstance(s, Store):
        return replace(s, index=fold_index(s.index), value=_fold_loads(s.value))
    return s


def _fold_loads(e: Expr) -> Expr:
    if e.op is XOp.LOAD:
        return replace(e, args=(fold_index(e.args[0]), *e.args[1:]))
    if not e.args:
        return e
    args = tuple(_fold_loads(a) for a in e.args)
    return e if all(n is o for n, o in zip(args, e.args)) else replace(e, args=args)


def _unit_stride_loads(stmts: Sequence[Stmt], name: str) -> bool:
    """Whether every load under ``stmts`` has an index whose coefficient in the loop variable
    ``name`` is 0 or 1 once folded (an index through a ``let`` that depends on ``name``, or
    not affine in it, fails)."""
    dependent = {name}
    ok = True

    def visit(s: Stmt) -> None:
        nonlocal ok
        if isinstance(s, Let) and free_vars(s.value) & dependent and not s.value.dtype.is_float:
            dependent.add(s.name)
        for e in expr_children(s):
            for node in walk_expr(e):
                if node.op is XOp.LOAD:
                    index = node.args[0]
                    used = free_vars(index) & dependent
                    if used - {name} or _coefficient(index, name) not in (0, 1):
                        ok = False
        for child in stmt_children(s):
            visit(child)

    for s in stmts:
        visit(s)
    return ok


def _coefficient(e: Expr, name: str) -> int | None:
    """The coefficient of variable ``name`` in the integer expression ``e`` when ``e`` is
    affine in it (sums, differences and products by constants); None otherwise."""
    if name not in free_vars(e):
        return 0
    if e.op is XOp.VAR:
        return 1
    if e.op in (XOp.ADD, XOp.SUB):
        a, b = (_coefficient(x, name) for x in e.args)
        if a is None or b is None:
            return None
        return a + b if e.op is XOp.ADD else a - b
    if e.op is XOp.MUL:
        x, y = e.args
        if y.op is XOp.CONST:
            k = _coefficient(x, name)
            return None if k is None else k * int(y.arg)  # type: ignore[arg-type]
        if x.op is XOp.CONST:
            k = _coefficient(y, name)
            return None if k is None else k * int(x.arg)  # type: ignore[arg-type]
    return None


def _block_nest(ctx: KernelContext, shape: tuple[int, ...], outputs: list[Value], b: int,
                lanes: int, tile: int | None) -> list[Stmt]:
    outer, inner = shape[:len(shape) - b], shape[len(shape) - b:]
    count, size = math.prod(outer), math.prod(inner)

    def runs(r: Expr) -> list[Stmt]:
        prefix = unflatten(r, outer)

        def body(i: Expr, n: int) -> list[Stmt]:
            return ctx.store_body(outputs, prefix + unflatten(i, inner), n, b)

        many = is_extent(count) or count > 1
        hint = math.prod(SYMBOLIC_DIM_HINT if is_extent(d) else d for d in inner)
        return run_loops(ctx.names, 0, size, lanes, body) if many or tile is None \
            else chunked_runs(ctx.names, size, lanes, tile, body, hint)

    return outer_loop(ctx.names, count, None if tile is None else 0, runs)


# ----------------------------------------------------------------------------- dispatch


def lower_group(group: KernelGroupLike, schedule: Schedule | None = None) -> LoopFunction:
    """The loop IR of ``group`` by its kind: ELEMENTWISE, ROW_REDUCTION and REDUCTION here (the
    contraction lowering is :mod:`tilefuse.kernel.lower_matmul`); CompileError otherwise."""
    kind = getattr(group, "kind", None)
    if kind is KernelKind.ELEMENTWISE:
        return lower_elementwise(group, schedule)
    if kind is KernelKind.ROW_REDUCTION:
        from tilefuse.kernel.lower_rows import lower_rows  # lower_rows builds on this module

        return lower_rows(group, schedule)
    if kind is KernelKind.REDUCTION:
        from tilefuse.kernel.lower_pool import is_tap_reduction, lower_taps
        from tilefuse.kernel.lower_reduce import lower_reduce  # both build on this module

        return lower_taps(group, schedule) if is_tap_reduction(group) \
            else lower_reduce(group, schedule)
    shown = kind.value if isinstance(kind, KernelKind) else repr(kind)
    raise CompileError(f"kernel {group.name}: no lowering for {shown} yet")


__all__ = ["DEFAULT_CHUNK", "KernelContext", "chunked_runs", "fit_lanes", "lower_elementwise",
           "lower_group", "outer_loop", "parallel_tile", "run_loops", "vector_width",
           "with_lanes"]
