"""Reduction kernels: a REDUCTION group (a sum, mean, max, min, prod, var, argmax or argmin over
any set of axes that is not a row reduction, with the prologue computing its input element by
element) lowered to loop IR.

The anchor's input F is walked in one of two ways, picked by its last (contiguous) axis:

* **Kept last axis** (a column sum, ``x.sum(axis=0)``, ``argmax(axis=0)``): vectors run along
  the kept last axis, ``unroll`` of them per run (independent accumulator chains, several
  cache lines walked down the reduced axes together), and each lane folds its own column::

      [parallel] for o in 0..prod(kept outer axes):
        vectorized for c in 0..C step W·U:       (then single vectors, then scalars)
          local acc: f32xW[U] = identity
          for r0 in 0..F[a0]: for r1 ...:       every reduced axis, in memory order
            unrolled for j in 0..U: acc[j] = acc[j] ⊕ x[o, r.., c + j·W :+W]
          y[o·C + c + j·W :+W] = finish(acc[j])

* **Reduced last axis** (``x.sum(axis=(0, 2))``, ``argmax(axis=-1)``, a full arg-reduction):
  each output element is one (parallel) iteration; the trailing run of reduced axes is
  accumulated as a row is in :mod:`tilefuse.kernel.lower_rows` (vector accumulators, a scalar
  tail, one horizontal reduce at the end) inside loops over the other reduced axes.

``var`` takes two passes (the mean, then centred squares) like NumPy; ``mean`` divides the sum
once. Accumulation is in the output's working type (f32 for f16/bf16, i64 for integer sums,
f64 for integer means), as the references do. max/min propagate NaN. Arg-reductions keep the
value and the index of the best element and take a new one only when it is strictly better or
the first NaN (NumPy's rule: the first maximum, or the first NaN). Along a reduced last axis
they are one vector pass (:meth:`_Lowering.arg_row_vector`: per lane the best value and its
index; rows holding a NaN or an infinity are done again by the exact scalar rule), or 8
interleaved scalar chains for rows shorter than two vectors;
``prod`` (no horizontal product in the loop IR) runs one element at a time there. The index
is the flat position over the reduced axes (over all of F for ``axis=None``).
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from tilefuse.codegen.scalar_ops import reduction_identity
from tilefuse.dtypes import DType
from tilefuse.errors import CompileError
from tilefuse.graph.ir import Node, Value
from tilefuse.kernel.access import dims, flatten, unflatten
from tilefuse.kernel.classify import ARG_REDUCTIONS, AXIS_REDUCTIONS, reduced_axes
from tilefuse.kernel.fusion import KernelKind
from tilefuse.kernel.lower_elementwise import (
    KernelContext,
    fit_lanes,
    outer_loop,
    vector_width,
    with_lanes,
)
from tilefuse.kernel.scalar_expr import ElementBuilder, KernelGroupLike, work_dtype
from tilefuse.kernel.schedule import PARALLEL_MIN_ELEMENTS
from tilefuse.loop.ir import (
    Expr,
    If,
    Let,
    Local,
    LocalStore,
    LoopFunction,
    LoopKind,
    LType,
    Stmt,
    Store,
    XOp,
    binary,
    block,
    broadcast,
    cast,
    const,
    iota,
    loop,
    minimum,
    reduce,
    select,
    unary,
    var,
)

if TYPE_CHECKING:
    from tilefuse.kernel.schedule import Schedule

REDUCE_OPS = AXIS_REDUCTIONS | ARG_REDUCTIONS
_COMBINE = {"sum": XOp.ADD, "mean": XOp.ADD, "var": XOp.ADD, "prod": XOp.MUL,
            "max": XOp.MAX, "min": XOp.MIN}
_HORIZONTAL = {XOp.ADD: XOp.REDUCE_ADD, XOp.MAX: XOp.REDUCE_MAX, XOp.MIN: XOp.REDUCE_MIN}
UNROLL = 4
"""Vectors per run in the kept-last-axis walk: independent accumulator chains (an add's
latency is ~4 cycles) and four cache lines walked down the reduced axes at once."""
ARG_UNROLL = 2
"""Vector chains of an arg-reduction's row pass: with 4 (UNROLL) LLVM's full unrolling of a
512-element row spilled the index vectors; 2 ran argmax over 128x512 in 4.4 µs, 4 in 5.3
(NumPy 4.4)."""
ARG_CHAINS = 8
"""Interleaved (value, index) chains of an arg-reduction along a reduced last axis."""


def reduce_anchor(group: KernelGroupLike) -> Node | None:
    """The anchor of a REDUCTION group this module lowers (its last node, the group's only
    output), or None."""
    anchor = getattr(group, "anchor", None)
    if getattr(group, "kind", None) is not KernelKind.REDUCTION or anchor is None:
        return None
    if anchor.op.name not in REDUCE_OPS or anchor is not group.nodes[-1]:
        return None
    if tuple(group.outputs) != (anchor.outputs[0],):
        return None
    return anchor


def is_reduce_group(group: KernelGroupLike) -> bool:
    """A REDUCTION group :func:`lower_reduce` takes (static shapes)."""
    anchor = reduce_anchor(group)
    return anchor is not None and all(isinstance(d, int) for d in anchor.inputs[0].shape)


@dataclass(frozen=True)
class _Stage:
    """One fold over the reduced axes: ``term`` at each element (given the previous stage's
    result, broadcast to the run), combined with ``combine`` (None: an arg-reduction) in
    ``acc``, then ``finish`` of the total."""

    combine: XOp | None
    acc: DType
    term: Callable[[ElementBuilder, tuple[Expr, ...], int, int, Expr | None], Expr]
    finish: Callable[[Expr], Expr]


def _stages(anchor: Node, count: int) -> list[_Stage]:
    """The folds of ``anchor`` over ``count`` reduced elements (two for var)."""
    name, out = anchor.op.name, anchor.outputs[0]
    (x,) = anchor.inputs
    if name in ARG_REDUCTIONS:
        acc = DType.u8 if x.dtype is DType.bool else work_dtype(x.dtype)
    else:
        acc = DType.u8 if out.dtype is DType.bool else work_dtype(out.dtype)

    def term(b: ElementBuilder, index: tuple[Expr, ...], lanes: int, block: int,
             prev: Expr | None) -> Expr:
        e = b.value(x, index, lanes, block)
        return e if e.dtype is acc else cast(e, acc)

    def to_out(e: Expr) -> Expr:
        return e if e.dtype is out.dtype else cast(e, out.dtype)

    if name in ARG_REDUCTIONS:
        return [_Stage(None, acc, term, lambda e: e)]
    if name in ("sum", "max", "min", "prod"):
        return [_Stage(_COMBINE[name], acc, term, to_out)]
    if name == "mean":
        return [_Stage(XOp.ADD, acc, term, lambda e: to_out(e / float(count)))]
    divisor = float(max(count - anchor.attrs["ddof"], 0))

    def centred(b: ElementBuilder, index: tuple[Expr, ...], lanes: int, block: int,
                prev: Expr | None) -> Expr:
        assert prev is not None
        d = b.share(term(b, index, lanes, block, None) - prev)
        return d * d

    return [_Stage(XOp.ADD, acc, term, lambda e: e / float(count)),
            _Stage(XOp.ADD, acc, centred, lambda e: to_out(e / divisor))]


def _identity(stage: _Stage, largest: bool, lanes: int) -> Expr:
    if stage.combine is XOp.MUL:
        return const(1, stage.acc, lanes)
    if stage.combine is None:  # arg: the worst value, so that the first element is taken
        return const(reduction_identity(XOp.REDUCE_MAX if largest else XOp.REDUCE_MIN,
                                        stage.acc), stage.acc, lanes)
    return const(reduction_identity(_HORIZONTAL[stage.combine], stage.acc), stage.acc, lanes)


def _better(new: Expr, best: Expr, largest: bool) -> Expr:
    """Whether an arg-reduction takes ``new`` over ``best``: strictly better, or the first
    NaN (NumPy's argmax/argmin)."""
    if new.dtype.is_float:
        # (new > best or isnan(new)) and not isnan(best), written as one unordered compare
        # and one ordered one (two vector compares, where the three of the spelled-out rule
        # and their "or" made argmax 2-3x slower than NumPy's)
        worse_or_equal = binary(XOp.LE if largest else XOp.GE, new, best)
        return binary(XOp.AND, unary(XOp.NOT, worse_or_equal),
                      unary(XOp.NOT, unary(XOp.ISNAN, best)))
    return binary(XOp.GT if largest else XOp.LT, new, best)


class _Lowering:
    """Shared state of one group's lowering: the walk over F and the stores."""

    def __init__(self, group: KernelGroupLike, schedule: Schedule | None):
        anchor = reduce_anchor(group)
        if anchor is None:
            raise CompileError(f"kernel {group.name}: not a reduction kernel this lowering "
                               "takes (one anchor, last, the only output)")
        self.anchor = anchor
        self.x: Value = anchor.inputs[0]
        self.y: Value = anchor.outputs[0]
        self.shape = dims(self.x.shape)
        self.axes = reduced_axes(anchor) or ()
        self.count = math.prod(self.shape[a] for a in self.axes)
        self.kept = tuple(a for a in range(len(self.shape)) if a not in self.axes)
        self.arg = anchor.op.name in ARG_REDUCTIONS
        self.largest = anchor.op.name == "argmax"
        self.stages = _stages(anchor, self.count)
        self.ctx = KernelContext.of(group)
        self.out = self.ctx.buffers.outputs[self.y]
        self.lanes = vector_width(schedule) if schedule is not None else 16
        total = math.prod(self.shape)
        self.threads = max(1, min(os.cpu_count() or 1, total // PARALLEL_MIN_ELEMENTS))

    # ---- pieces ---------------------------------------------------------------------------
    def fresh(self, prefix: str) -> str:
        return self.ctx.names.fresh(prefix)

    def position(self, index: tuple[Expr, ...]) -> Expr:
        """An arg-reduction's index of the element at ``index``: flat over the reduced axes."""
        return flatten(tuple(index[a] for a in self.axes), tuple(self.shape[a] for a in self.axes))

    def fold(self, stage: _Stage, acc: Local, slot: Expr, index_local: Local | None,
             term: Expr, position: Expr) -> list[Stmt]:
        """``acc[slot] ⊕= term`` (an arg-reduction also keeps the index)."""
        if stage.combine is not None:
            return [LocalStore(acc.name, slot, binary(stage.combine, acc.load(slot), term))]
        assert index_local is not None
        best = acc.load(slot)
        take = Let(self.fresh("take"), _better(term, best, self.largest))
        at = position if term.lanes == 1 else broadcast(position, term.lanes)
        return [take, LocalStore(acc.name, slot, select(take.ref, term, best)),
                LocalStore(index_local.name, slot, select(take.ref, at, index_local.load(slot)))]

    def nest(self, axes: tuple[int, ...], body: Callable[[dict[int, Expr]], list[Stmt]]
             ) -> list[Stmt]:
        """Serial loops over ``axes`` (outermost first); ``body`` gets their variables."""
        names = {a: self.fresh("r") for a in axes}
        stmts = body({a: var(n) for a, n in names.items()})
        for a in reversed(axes):
            stmts = [loop(names[a], 0, self.shape[a], stmts)]
        return stmts

    # ---- kept last axis -------------------------------------------------------------------
    def kept_last(self) -> list[Stmt]:
        rank = len(self.shape)
        c = self.shape[-1]
        outer = self.kept[:-1]
        outer_shape = tuple(self.shape[a] for a in outer)
        o_count = math.prod(outer_shape)
        lanes = fit_lanes(self.lanes, c)

        def runs(ctx: KernelContext, width: int, o: Expr, start: Expr | int, stop: Expr | int
                 ) -> list[Stmt]:
            """The runs over columns [start, stop): unrolled vectors, vectors, scalars."""
            self.ctx = ctx
            prefix = dict(zip(outer, unflatten(o, outer_shape)))
            stmts: list[Stmt] = []
            steps = [(width * UNROLL, UNROLL), (width, 1)] if width > 1 else []
            at = start
            for step, unroll in steps:
                if isinstance(stop, int) and isinstance(at, int):
                    end = stop - (stop - at) % step
                    if end <= at:
                        continue
                else:
                    end = stop - (stop - at) % step
                i = self.fresh("c")
                stmts.append(loop(i, at, end, self.column_run(prefix, var(i), width, unroll, o,
                                                              c, rank),
                                  step, LoopKind.VECTORIZED))
                at = end
            i = self.fresh("c")
            stmts.append(loop(i, at, stop, self.column_run(prefix, var(i), 1, 1, o, c, rank)))
            return stmts

        def build(ctx: KernelContext, width: int) -> list[Stmt]:
            if o_count == 1 and self.threads > 1 and c >= 2 * width * UNROLL:
                # one row of outputs: split the columns across threads
                chunk = max(width * UNROLL, -(-c // self.threads) // (width * UNROLL)
                            * (width * UNROLL))
                g = self.fresh("g")
                start = var(g) * chunk
                body = runs(ctx, width, const(0), start, minimum(start + chunk, c))
                return [loop(g, 0, -(-c // chunk), body, kind=LoopKind.PARALLEL)]
            tile = -(-o_count // self.threads) if self.threads > 1 and o_count > 1 else None
            return outer_loop(ctx.names, o_count, tile,
                              lambda o: runs(ctx, width, o, 0, c))

        return with_lanes(self.ctx, lanes, build)

    def column_run(self, prefix: dict[int, Expr], col: Expr, width: int, unroll: int, o: Expr,
                   c: int, rank: int) -> list[Stmt]:
        """One run of ``width``·``unroll`` columns starting at ``col``: every stage folded over
        the reduced axes, then the stores."""
        stmts: list[Stmt] = []
        prev: list[Expr] | None = None
        results: list[Expr] = []
        for stage in self.stages:
            acc = Local(self.fresh("acc"), LType(stage.acc, width), unroll)
            idx = Local(self.fresh("idx"), LType(DType.i64, width), unroll) if self.arg else None
            stmts += [acc, *([idx] if idx else [])]
            for j in range(unroll):
                stmts.append(LocalStore(acc.name, const(j), _identity(stage, self.largest,
                                                                      width)))
                if idx is not None:
                    stmts.append(LocalStore(idx.name, const(j), const(0, DType.i64, width)))

            def inner(red: dict[int, Expr], stage: _Stage = stage, acc: Local = acc,
                      idx: Local | None = idx, prev: list[Expr] | None = prev) -> list[Stmt]:
                b = self.ctx.builder()
                body: list[Stmt] = []
                for j in range(unroll):
                    index = tuple(red[a] if a in red else prefix[a] if a in prefix
                                  else col + j * width for a in range(rank))
                    term = stage.term(b, index, width, 1, prev[j] if prev else None)
                    body += self.fold(stage, acc, const(j), idx, term,
                                      self.position(index) if self.arg else const(0))
                return [*b.lets, *body]

            stmts += self.nest(self.axes, inner)
            results = []
            for j in range(unroll):
                source = idx.load(j) if idx is not None else acc.load(j)
                let = Let(self.fresh("s"), stage.finish(source) if idx is None else source)
                stmts.append(let)
                results.append(let.ref)
            prev = results
        for j in range(unroll):
            stmts.append(Store(self.out.name, o * c + col + j * width, results[j]))
        return stmts

    # ---- reduced last axis ----------------------------------------------------------------
    def reduced_last(self) -> list[Stmt]:
        rank = len(self.shape)
        trailing: list[int] = []
        for a in reversed(range(rank)):
            if a not in self.axes:
                break
            trailing.insert(0, a)
        inner = tuple(trailing)
        outer_red = tuple(a for a in self.axes if a not in inner)
        inner_shape = tuple(self.shape[a] for a in inner)
        n = math.prod(inner_shape)
        kept_shape = tuple(self.shape[a] for a in self.kept)
        o_count = math.prod(kept_shape)
        horizontal = self.arg or all(s.combine in _HORIZONTAL for s in self.stages)
        lanes = self.lanes
        if self.arg:  # the schedule sized vectors for the i64 output; the values are narrower
            lanes = min(64, lanes * 8 // self.stages[0].acc.itemsize)
        lanes = fit_lanes(lanes, n) if horizontal else 1

        def element(ctx: KernelContext, width: int, o: Expr) -> list[Stmt]:
            self.ctx = ctx
            prefix = dict(zip(self.kept, unflatten(o, kept_shape)))
            if self.arg:  # one axis, or all: always the trailing ones
                made, result = self.arg_row_vector(self.stages[0], prefix, inner, inner_shape,
                                                   n, width) if width > 1 and n >= 2 * width \
                    else self.arg_row(self.stages[0], prefix, inner, inner_shape, n)
                return [*made, Store(self.out.name, o, result)]
            stmts: list[Stmt] = []
            prev: Expr | None = None
            for stage in self.stages:
                made, prev = self.row_pass(stage, prefix, outer_red, inner, inner_shape, n,
                                           width, prev)
                stmts += made
            assert prev is not None
            return [*stmts, Store(self.out.name, o, prev)]

        tile = -(-o_count // self.threads) if self.threads > 1 and o_count > 1 else None
        return with_lanes(self.ctx, lanes, lambda ctx, width: outer_loop(
            ctx.names, o_count, tile, lambda o: element(ctx, width, o)))

    def row_pass(self, stage: _Stage, prefix: dict[int, Expr], outer_red: tuple[int, ...],
                 inner: tuple[int, ...], inner_shape: tuple[int, ...], n: int, width: int,
                 prev: Expr | None) -> tuple[list[Stmt], Expr]:
        """One fold of an output element: loops over ``outer_red``, and inside them the
        trailing reduced run (vectors, then a scalar tail); returns the finished result."""
        rank = len(self.shape)
        scalar = Local(self.fresh("acc"), LType(stage.acc), 1)
        idx = Local(self.fresh("idx"), LType(DType.i64), 1) if self.arg else None
        vector = Local(self.fresh("acc"), LType(stage.acc, width), 1) if width > 1 else None
        stmts: list[Stmt] = [scalar, *([idx] if idx else []), *([vector] if vector else [])]
        stmts.append(LocalStore(scalar.name, const(0), _identity(stage, self.largest, 1)))
        if idx is not None:
            stmts.append(LocalStore(idx.name, const(0), const(0)))
        if vector is not None:
            stmts.append(LocalStore(vector.name, const(0), _identity(stage, self.largest, width)))

        def at(red: dict[int, Expr], i: Expr) -> tuple[Expr, ...]:
            within = dict(zip(inner, unflatten(i, inner_shape)))
            return tuple(red[a] if a in red else within[a] if a in within else prefix[a]
                         for a in range(rank))

        def body(red: dict[int, Expr]) -> list[Stmt]:
            out: list[Stmt] = []
            whole = n - n % width if width > 1 else 0
            if vector is not None and whole:
                i = self.fresh("i")
                b = self.ctx.builder()
                index = at(red, var(i))
                term = stage.term(b, index, width, len(inner),
                                  broadcast(prev, width) if prev is not None else None)
                out.append(loop(i, 0, whole, [*b.lets, *self.fold(
                    stage, vector, const(0), None, term, const(0))], width, LoopKind.VECTORIZED))
            if n > whole:
                i = self.fresh("i")
                b = self.ctx.builder()
                index = at(red, var(i))
                term = stage.term(b, index, 1, len(inner), prev)
                out.append(loop(i, whole, n, [*b.lets, *self.fold(
                    stage, scalar, const(0), idx, term,
                    self.position(index) if self.arg else const(0))]))
            return out

        stmts += self.nest(outer_red, body)
        if idx is not None:
            result = idx.load(0)
        else:
            total = scalar.load(0)
            if vector is not None:
                assert stage.combine is not None
                total = binary(stage.combine, reduce(_HORIZONTAL[stage.combine], vector.load(0)),
                               total)
            result = stage.finish(total)
        let = Let(self.fresh("s"), result)
        return [*stmts, let], let.ref

    def arg_row(self, stage: _Stage, prefix: dict[int, Expr], inner: tuple[int, ...],
                inner_shape: tuple[int, ...], n: int) -> tuple[list[Stmt], Expr]:
        """An arg-reduction over the trailing run of ``n`` elements: :data:`ARG_CHAINS`
        interleaved (value, index) chains (element i feeds chain i % chains: a compare and
        select chain is latency bound), merged at the end by value, ties to the lower index."""
        rank = len(self.shape)
        chains = ARG_CHAINS if n >= 4 * ARG_CHAINS else 1
        vals = Local(self.fresh("acc"), LType(stage.acc), chains)
        idxs = Local(self.fresh("idx"), LType(DType.i64), chains)
        stmts: list[Stmt] = [vals, idxs]
        for j in range(chains):
            stmts += [LocalStore(vals.name, const(j), _identity(stage, self.largest, 1)),
                      LocalStore(idxs.name, const(j), const(0))]

        def step(i: Expr, chain: int) -> list[Stmt]:
            within = dict(zip(inner, unflatten(i, inner_shape)))
            index = tuple(within[a] if a in within else prefix[a] for a in range(rank))
            b = self.ctx.builder()
            term = stage.term(b, index, 1, len(inner), None)
            return [*b.lets, *self.fold(stage, vals, const(chain), idxs, term, i)]

        whole = n - n % chains if chains > 1 else 0
        if chains > 1:
            i = self.fresh("i")
            body = [s for j in range(chains) for s in step(var(i) + j, j)]
            stmts.append(loop(i, 0, whole, body, chains))
        if n > whole:
            i = self.fresh("i")
            stmts.append(loop(i, whole, n, step(var(i), 0)))
        best_v, best_i = vals.load(0), idxs.load(0)
        for j in range(1, chains):
            v, k = vals.load(j), idxs.load(j)
            same = binary(XOp.EQ, v, best_v)
            if v.dtype.is_float:
                same = binary(XOp.OR, same, binary(XOp.AND, unary(XOp.ISNAN, v),
                                                   unary(XOp.ISNAN, best_v)))
            take = Let(self.fresh("take"), binary(XOp.OR, _better(v, best_v, self.largest),
                                                  binary(XOp.AND, same, binary(XOp.LT, k, best_i))))
            nv, ni = Let(self.fresh("v"), select(take.ref, v, best_v)), \
                Let(self.fresh("k"), select(take.ref, k, best_i))
            stmts += [take, nv, ni]
            best_v, best_i = nv.ref, ni.ref
        let = Let(self.fresh("s"), best_i)
        return [*stmts, let], let.ref

    def arg_row_vector(self, stage: _Stage, prefix: dict[int, Expr], inner: tuple[int, ...],
                       inner_shape: tuple[int, ...], n: int, width: int
                       ) -> tuple[list[Stmt], Expr]:
        """An arg-reduction over the trailing run in one vector pass. Each lane keeps its best
        value and that element's index (``bcast(i) + iota``: strictly better), in ``unroll``
        chains; each lane holds the first index of its own best, so the answer is the least
        index among the lanes holding the overall best ``m``. The scalar tail comes after
        every vector, so it wins only when strictly better. Floats: the lanes also sum
        ``x - x``, NaN once the row held a NaN or an infinity; such a row is done again
        element by element with the exact rule (the first NaN wins), so the vector pass
        needs one ordered compare per vector instead of NumPy's rule's two."""
        rank = len(self.shape)
        whole = n - n % width
        unroll = max(1, min(ARG_UNROLL, n // (2 * width)))
        big = n - n % (width * unroll)
        # indices in i32 lanes where they fit: as wide as the values' lanes (one register and
        # one mask per select; i64 lanes took two of each and spilled masks)
        at = DType.i32 if n < 2 ** 31 else DType.i64
        lanes = iota(width, at)

        def term(i: Expr, count: int) -> tuple[list[Stmt], Expr]:
            within = dict(zip(inner, unflatten(i, inner_shape)))
            index = tuple(within[a] if a in within else prefix[a] for a in range(rank))
            b = self.ctx.builder()
            return list(b.lets), stage.term(b, index, count, len(inner), None)

        vals = Local(self.fresh("acc"), LType(stage.acc, width), unroll)
        idxs = Local(self.fresh("at"), LType(at, width), unroll)
        stmts: list[Stmt] = [vals, idxs]
        # floats: the vector pass takes strictly better values only (one ordered compare per
        # vector, where NumPy's NaN rule took a second one on the accumulator) and sums
        # x - x per lane, which is NaN once the row held a NaN (or an infinity); such a row
        # is then done again by the exact rule, element by element (below)
        poison = Local(self.fresh("nan"), LType(stage.acc, width), unroll) \
            if stage.acc.is_float else None
        if poison is not None:
            stmts.append(poison)
        for j in range(unroll):
            stmts += [LocalStore(vals.name, const(j), _identity(stage, self.largest, width)),
                      LocalStore(idxs.name, const(j), const(0, at, width))]
            if poison is not None:
                stmts.append(LocalStore(poison.name, const(j), const(0.0, stage.acc, width)))

        def update(j: int, i: Expr) -> list[Stmt]:
            lets, e = term(i, width)
            best = vals.load(j)
            if poison is None:
                rule = _better(e, best, self.largest)
            else:
                rule = binary(XOp.GT if self.largest else XOp.LT, e, best)
            take = Let(self.fresh("take"), rule)
            where = broadcast(i if at is DType.i64 else cast(i, at), width) + lanes
            marks = [] if poison is None else [
                LocalStore(poison.name, const(j), poison.load(j) + (e - e))]
            return [*lets, take, LocalStore(vals.name, const(j), select(take.ref, e, best)),
                    LocalStore(idxs.name, const(j), select(take.ref, where, idxs.load(j))),
                    *marks]

        if unroll > 1:
            i = self.fresh("i")
            body = [st for j in range(unroll) for st in update(j, var(i) + j * width)]
            stmts.append(loop(i, 0, big, body, width * unroll, LoopKind.VECTORIZED))
        if whole > (big if unroll > 1 else 0):
            i = self.fresh("i")
            stmts.append(loop(i, big if unroll > 1 else 0, whole, update(0, var(i)), width,
                              LoopKind.VECTORIZED))
        combine = XOp.MAX if self.largest else XOp.MIN
        best: Expr = vals.load(0)
        for j in range(1, unroll):
            if poison is None:
                best = binary(combine, best, vals.load(j))
            else:   # no lane holds NaN (only strictly better values were taken): one vmaxps
                rule = binary(XOp.GT if self.largest else XOp.LT, best, vals.load(j))
                best = select(rule, best, vals.load(j))
        if poison is not None:   # and LLVM drops the horizontal max's unordered compares
            best = select(binary(XOp.EQ, best, best), best, _identity(stage, self.largest,
                                                                      width))
        m = Let(self.fresh("m"), reduce(_HORIZONTAL[combine], best))
        stmts.append(m)

        def matches(e: Expr) -> Expr:
            target = m.ref if e.lanes == 1 else broadcast(m.ref, e.lanes)
            eq = binary(XOp.EQ, e, target)
            if e.dtype.is_float and poison is None:
                eq = binary(XOp.OR, eq, binary(XOp.AND, unary(XOp.ISNAN, e),
                                               unary(XOp.ISNAN, target)))
            return eq

        earliest: Expr | None = None
        for j in range(unroll):
            cand = select(matches(vals.load(j)), idxs.load(j), const(n, at, width))
            earliest = cand if earliest is None else minimum(earliest, cand)
        assert earliest is not None
        first = reduce(XOp.REDUCE_MIN, earliest)
        found = Let(self.fresh("found"), first if at is DType.i64 else cast(first, DType.i64))
        stmts.append(found)
        tail_v = Local(self.fresh("acc"), LType(stage.acc), 1)
        tail_i = Local(self.fresh("idx"), LType(DType.i64), 1)
        stmts += [tail_v, tail_i, LocalStore(tail_v.name, const(0), m.ref),
                  LocalStore(tail_i.name, const(0), found.ref)]
        if n > whole:
            i = self.fresh("i")
            lets, e = term(var(i), 1)
            stmts.append(loop(i, whole, n, [*lets, *self.fold(stage, tail_v, const(0), tail_i,
                                                             e, var(i))]))
        if poison is not None and whole:
            total = poison.load(0)
            for j in range(1, unroll):
                total = total + poison.load(j)
            i = self.fresh("i")
            lets, e = term(var(i), 1)
            exact = [LocalStore(tail_v.name, const(0), _identity(stage, self.largest, 1)),
                     LocalStore(tail_i.name, const(0), const(0)),
                     loop(i, 0, n, [*lets, *self.fold(stage, tail_v, const(0), tail_i, e,
                                                      var(i))])]
            stmts.append(If(unary(XOp.ISNAN, reduce(XOp.REDUCE_ADD, total)), block(*exact)))
        let = Let(self.fresh("s"), tail_i.load(0))
        return [*stmts, let], let.ref

    def function(self) -> LoopFunction:
        if not self.shape:  # a rank-0 input: its one element
            b = self.ctx.builder()
            stage = self.stages[-1]
            if self.arg:
                value = const(0)
            elif len(self.stages) == 2:  # var of one element: (x - x)² / divisor
                mean = self.stages[0].finish(self.stages[0].term(b, (), 1, 0, None))
                value = stage.finish(stage.term(b, (), 1, 0, mean))
            else:
                value = stage.finish(stage.term(b, (), 1, 0, None))
            return self.ctx.function([*b.lets, Store(self.out.name, const(0), value)])
        if len(self.shape) - 1 in self.axes:
            return self.ctx.function(self.reduced_last())
        return self.ctx.function(self.kept_last())


def lower_reduce(group: KernelGroupLike, schedule: Schedule | None = None) -> LoopFunction:
    """The loop IR of a REDUCTION group (module docstring): buffers are the group inputs
    (readonly), then its output; CompileError for a group it does not take."""
    if not is_reduce_group(group):
        raise CompileError(f"kernel {group.name}: not a static reduction kernel")
    return _Lowering(group, schedule).function()
