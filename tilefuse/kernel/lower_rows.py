"""Row-reduction kernels: softmax, layer_norm, rms_norm and any chain of row reductions over
the trailing ``k`` axes of one domain F = [R..., N...].

Each row is one iteration of the (parallel) row loop. Inside it the group's reductions run in
*passes* over the row, by dependency level: a pass accumulates every reduction whose inputs
are known by then, in vector accumulators (``unroll`` of them, from the schedule) plus a
scalar one for the tail, reduces them horizontally and binds each per-row result to a ``let``;
later passes read those through ``overrides``. Values over the whole row are recomputed inside
each pass that needs them, with one exception (:mod:`tilefuse.kernel.row_store`): an expensive
value the write pass would recompute, such as softmax's ``exp(x - max)``, is stored by the
reduction pass computing it into the output's row, and the write pass reads it back from there
(bit-identical: the same operations in the same order). A last pass writes the full-row
outputs; per-row outputs are stored after it::

    parallel for r in 0..R:
      local acc: f32[1]; local acc1: f32x16[1]          pass 1: s0 = max(x)
      acc[0] = -inf; acc1[0] = splat(-inf)
      vectorized for i in 0..N - N%16 step 16: acc1[0] = max(acc1[0], load<16>(x, r*N + i))
      for i1 in N - N%16..N: acc[0] = max(acc[0], x[r*N + i1])
      let s0 = max(reduce_max(acc1[0]), acc[0])
      ...                                                pass 2: s1 = sum(exp(x - s0))
        let t1 = exp(load<16>(x, r*N + i2) - bcast(s0)); acc3[0] = acc3[0] + t1
        out0[r*N + i2:+16] = t1                          (stored: exp is expensive)
      ...
      vectorized for i4 ...: out0[r*N + i4:+16] = load<16>(out0, r*N + i4) / bcast(s1)

Softmax and log_softmax take 3 passes (max, sum, write), layer_norm 3 (mean, variance, write),
rms_norm 2. ``var`` takes two passes itself (mean, then centred squares), like NumPy. max/min
propagate NaN, except softmax's max on the CPU where the sum propagates it for them
(:mod:`~tilefuse.kernel.row_softmax`, which also gives ``exp(x - max)`` a cheaper exp).
``prod`` has no horizontal vector product in the loop IR: its pass is scalar.
Composite ops left in a group are decomposed here first. Division by a per-row scalar stays a
division (IEEE, like NumPy), not a multiplication by its reciprocal.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from tilefuse.codegen.scalar_ops import reduction_identity
from tilefuse.dtypes import DType
from tilefuse.errors import CompileError
from tilefuse.graph.builder import GraphBuilder
from tilefuse.graph.ir import Node, Value
from tilefuse.graph.types import normalize_axes
from tilefuse.kernel.access import Namer, dims, flatten, is_extent, squeezed, unflatten
from tilefuse.kernel.lower_elementwise import (
    KernelContext,
    fit_lanes,
    lower_elementwise,
    outer_loop,
    parallel_tile,
    run_loops,
    vector_width,
    with_lanes,
)
from tilefuse.kernel.row_softmax import softmax_rows
from tilefuse.kernel.row_store import RowShape, StoredValue, choose_stores, streams
from tilefuse.kernel.scalar_expr import ElementBuilder, KernelGroupLike, Override, work_dtype
from tilefuse.kernel.schedule import PARALLEL_MIN_ELEMENTS, SYMBOLIC_DIM_HINT
from tilefuse.loop.ir import (
    Expr,
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
    broadcast,
    cast,
    const,
    loop,
    maximum,
    minimum,
    reduce,
    select,
    var,
    walk_expr,
)
from tilefuse.ops.registry import OpKind, Trait

if TYPE_CHECKING:
    from tilefuse.kernel.schedule import Schedule

ROW_REDUCTIONS = frozenset({"sum", "mean", "max", "min", "var", "prod"})
TAIL_MIN_LANES = 4
"""The narrowest vector a reduction pass's tail runs in before single elements."""
_HORIZONTAL = {XOp.ADD: XOp.REDUCE_ADD, XOp.MAX: XOp.REDUCE_MAX, XOp.MIN: XOp.REDUCE_MIN}


@dataclass(frozen=True)
class Run:
    """A lane run of the row: the domain index of its first element, its lanes, and the
    number of trailing (row) axes it runs in."""

    index: tuple[Expr, ...]
    lanes: int
    block: int


Term = Callable[[ElementBuilder, Run, Mapping[str, Expr]], Expr]
Finish = Callable[[Expr, Mapping[str, Expr]], Expr]


@dataclass(frozen=True)
class Stage:
    """One accumulation over the row: ``combine`` of ``term`` (in dtype ``acc``) over the row,
    then ``finish`` of the total gives the per-row result named ``key`` (the value of
    ``output`` when set). ``term``/``finish`` see the results of earlier stages by key;
    ``source`` is the reduced group value (what ``term`` computes at each element)."""

    key: str
    combine: XOp
    acc: DType
    term: Term
    finish: Finish
    level: int
    output: Value | None = None
    source: Value | None = None
    nan_free: bool = False
    """A max whose NaN propagation is redundant (:mod:`~tilefuse.kernel.row_softmax`): it
    accumulates with ``select(a > b, a, b)``, one vmaxps."""


@dataclass(frozen=True)
class RowGroup:
    """A group-like record for a group whose composites were decomposed."""

    name: str
    nodes: tuple[Node, ...]
    inputs: tuple[Value, ...]
    outputs: tuple[Value, ...]


@dataclass(frozen=True)
class RowPlan:
    """The domain F = rows + row, the reduction stages and the outputs by kind."""

    rows: tuple[int, ...]
    row: tuple[int, ...]
    stages: tuple[Stage, ...]
    full_outputs: tuple[Value, ...]
    row_outputs: tuple[Value, ...]

    @property
    def levels(self) -> int:
        return max((s.level for s in self.stages), default=0)


# ----------------------------------------------------------------------------- planning


def expand_composites(group: KernelGroupLike) -> KernelGroupLike:
    """``group`` with composite ops (softmax, layer_norm, ...) replaced by their
    decompositions (same inputs and outputs by position)."""
    if not any(n.op.has(Trait.COMPOSITE) for n in group.nodes):
        return group
    builder = GraphBuilder(group.name)
    mapping: dict[Value, Value] = {}
    for node in group.nodes:
        inputs = tuple(mapping.get(v, v) for v in node.inputs)
        if node.op.has(Trait.COMPOSITE) and node.op.decompose is not None:
            outs = tuple(node.op.decompose(builder, inputs, node.attrs, node.loc))
        else:
            node = Node(node.op, inputs, node.attrs, node.outputs, node.loc)
            builder.append(node)
            outs = node.outputs
        mapping.update(zip(node.outputs, outs))
    return RowGroup(group.name, builder.nodes, tuple(group.inputs),
                    tuple(mapping.get(v, v) for v in group.outputs))


def plan_rows(group: KernelGroupLike, nan_free: frozenset[Node] = frozenset()) -> RowPlan:
    """The row structure of a ROW_REDUCTION group; CompileError when it has none. The max
    nodes ``nan_free`` need not propagate NaN (:mod:`~tilefuse.kernel.row_softmax`)."""
    reductions = [n for n in group.nodes if n.op.kind is OpKind.REDUCTION]
    if not reductions:
        raise CompileError(f"kernel {group.name}: a row-reduction kernel without reductions")
    full = dims(reductions[0].inputs[0].shape)
    k = _row_width(group, reductions[0], full)
    rows, row = full[:len(full) - k], full[len(full) - k:]
    producers = {v: n for n in group.nodes for v in n.outputs}
    stages: list[Stage] = []
    done: dict[Node, int] = {}
    for node in reductions:
        if dims(node.inputs[0].shape) != full or _row_width(group, node, full) != k:
            raise CompileError(f"kernel {group.name}: {node.op.name} over "
                               f"{node.inputs[0].type} does not reduce the rows of {list(full)}")
        level = 1 + max((done[d] for d in _reductions_before(node, producers)), default=0)
        new = _stages(node, level, math.prod(row), len(stages))
        if node in nan_free:
            new = [replace(st, nan_free=True) for st in new]
        stages.extend(new)
        done[node] = new[-1].level
    full_outputs, row_outputs = [], []
    for v in dict.fromkeys(group.outputs):
        shape = dims(v.shape)
        if shape == full:
            full_outputs.append(v)
        elif squeezed(shape) == squeezed(rows):
            row_outputs.append(v)
        else:
            raise CompileError(f"kernel {group.name}: output {v.type} is neither the domain "
                               f"{list(full)} nor one value per row")
    return RowPlan(rows, row, tuple(stages), tuple(full_outputs), tuple(row_outputs))


def _group_row_rank(group: KernelGroupLike) -> int:
    """The number of row axes of a group with reductions (its first reduction's)."""
    node = next(n for n in group.nodes if n.op.kind is OpKind.REDUCTION)
    return _row_width(group, node, dims(node.inputs[0].shape))


def _row_width(group: KernelGroupLike, node: Node, full: tuple[int, ...]) -> int:
    axes = normalize_axes(node.attrs["axes"], len(full))
    k = len(axes)
    if node.op.name not in ROW_REDUCTIONS or not k or axes != tuple(range(len(full) - k,
                                                                            len(full))):
        raise CompileError(f"kernel {group.name}: {node.op.name} {dict(node.attrs)} is not a "
                           "reduction over trailing axes")
    return k


def _reductions_before(node: Node, producers: Mapping[Value, Node]) -> set[Node]:
    """The reductions ``node``'s input depends on inside the group (not through them)."""
    found: set[Node] = set()
    seen: set[Value] = set()
    stack = list(node.inputs)
    while stack:
        v = stack.pop()
        p = producers.get(v)
        if v in seen or p is None:
            continue
        seen.add(v)
        if p.op.kind is OpKind.REDUCTION:
            found.add(p)
        else:
            stack.extend(p.inputs)
    return found


def _stages(node: Node, level: int, n: int, count: int) -> list[Stage]:
    """The stages of one reduction node (two for var)."""
    name, out = node.op.name, node.output
    acc = DType.u8 if out.dtype is DType.bool else work_dtype(out.dtype)
    (u,) = node.inputs
    key = f"s{count}"

    def term(b: ElementBuilder, run: Run, results: Mapping[str, Expr]) -> Expr:
        x = b.value(u, run.index, run.lanes, run.block)
        return x if x.dtype is acc else cast(x, acc)

    def to_out(e: Expr) -> Expr:
        return e if e.dtype is out.dtype else cast(e, out.dtype)

    combine = {"max": XOp.MAX, "min": XOp.MIN, "prod": XOp.MUL}.get(name, XOp.ADD)
    if name in ("sum", "max", "min", "prod"):
        return [Stage(key, combine, acc, term, lambda a, r: to_out(a), level, out, u)]
    if name == "mean":
        return [Stage(key, combine, acc, term, lambda a, r: to_out(a / float(n)), level, out,
                      u)]
    mean_key, divisor = f"{key}m", float(max(n - node.attrs["ddof"], 0))

    def centred(b: ElementBuilder, run: Run, results: Mapping[str, Expr]) -> Expr:
        mean = results[mean_key]
        d = b.share(term(b, run, results) - (mean if run.lanes == 1
                                              else broadcast(mean, run.lanes)))
        return d * d

    return [Stage(mean_key, XOp.ADD, acc, term, lambda a, r: a / float(n), level, None, u),
            Stage(key, XOp.ADD, acc, centred, lambda a, r: to_out(a / divisor), level + 1,
                  out, u)]


# ----------------------------------------------------------------------------- lowering


def lower_rows(group: KernelGroupLike, schedule: Schedule | None = None, *,
               store_values: bool = True, cpu_tails: bool | None = None) -> LoopFunction:
    """The loop IR of a ROW_REDUCTION group (see the module docstring): buffers are the group
    inputs (readonly), then its outputs; rows run in parallel when the schedule says so.
    ``store_values=False`` recomputes every row value instead of storing expensive ones
    (:mod:`~tilefuse.kernel.row_store`): right where arithmetic is cheap and memory is not
    (the GPU). ``cpu_tails`` (default: ``store_values``, i.e. the CPU) runs a reduction pass's
    tail in 8- and 4-lane vectors and divides by per-row values through their reciprocal
    (:func:`reciprocal_divisions`); the GPU's lanes are a warp's threads and it chooses
    reciprocals itself (``GpuTarget.reciprocal_divisors``)."""
    cpu_tails = store_values if cpu_tails is None else cpu_tails
    group = expand_composites(group)
    if not any(n.op.kind is OpKind.REDUCTION for n in group.nodes):
        return lower_elementwise(group, schedule)
    nan_free: frozenset[Node] = frozenset()
    if cpu_tails:
        group, nan_free = softmax_rows(group, _group_row_rank(group), RowGroup)
    plan = plan_rows(group, nan_free)
    ctx = KernelContext.of(group)
    lanes = fit_lanes(vector_width(schedule), math.prod(plan.row))
    unroll = dict(getattr(schedule, "unroll", ()) or ()).get("n", 1)
    shape = row_shape(group, plan)
    stored = choose_stores(group, shape, ctx.load) if store_values else ()
    stream = cpu_tails and streams(shape, lanes, stored) and all(
        s.combine in _HORIZONTAL for s in plan.stages)
    # streaming: stored values go to scratch rows (module row_store), the outputs are
    # written once, by the write pass
    scratch = {s.value: Local(ctx.names.fresh("row"), LType(s.value.dtype, lanes),
                              math.prod(plan.row) // lanes) for s in stored} if stream else {}
    finished = {s.output for s in stored if s.value == s.output and not stream}
    written = tuple(v for v in plan.full_outputs if v not in finished)
    held = frozenset() if stream else frozenset(ctx.buffers.outputs[s.output].name
                                                for s in stored)

    def row_body(r: Expr) -> list[Stmt]:
        prefix = unflatten(r, plan.rows)
        results: dict[str, Expr] = {}
        overrides: dict[Value, Override] = {}
        stmts: list[Stmt] = [*scratch.values()]
        for level in range(1, plan.levels + 1):
            stages = [s for s in plan.stages if s.level == level]
            keep = [s for s in stored if s.level == level]
            vector = lanes if all(s.combine in _HORIZONTAL for s in stages) else 1
            stmts += with_lanes(ctx, vector, lambda c, n, st=stages, kp=keep: _reduce_pass(
                c, plan, st, prefix, n, unroll, results, overrides, kp,
                TAIL_MIN_LANES if cpu_tails else n, scratch))
        if written:
            reads = {**overrides, **{s.value: _stored_reader(ctx, plan, s, scratch)
                                     for s in stored}}
            per_row = frozenset(e.arg for e in results.values() if e.op is XOp.VAR) \
                if cpu_tails else frozenset()
            stmts += with_lanes(ctx, lanes, lambda c, n: _write_pass(
                c, plan, written, prefix, n, reads, held, per_row, stream))
        return stmts + _row_stores(ctx, plan, r, overrides)

    count = math.prod(plan.rows)
    tile = parallel_tile(schedule, "r")
    if is_extent(count) and tile:
        tile = runtime_row_tile(count, plan, tile)
    body = outer_loop(ctx.names, count, tile, row_body)
    return ctx.function(body)


def runtime_row_tile(count: Expr, plan: RowPlan, tile: int) -> Expr:
    """Rows per parallel chunk when the row count is a runtime extent: the default rule (a
    thread per ``PARALLEL_MIN_ELEMENTS`` elements, at most as many threads as the schedule
    made for the hint size) evaluated at loop entry, so each size splits as its static
    compile would."""
    hint = math.prod(SYMBOLIC_DIM_HINT if is_extent(d) else d for d in plan.rows)
    most = max(1, -(-hint // tile))
    row = math.prod(plan.row)
    threads = minimum(maximum(count * row // PARALLEL_MIN_ELEMENTS, 1), most)
    return (count + (threads - 1)) // threads


def row_shape(group: KernelGroupLike, plan: RowPlan) -> RowShape:
    """What :func:`~tilefuse.kernel.row_store.choose_stores` needs of ``plan``."""
    per_row = tuple(v for n in group.nodes if n.op.kind is OpKind.REDUCTION for v in n.outputs)
    sources: dict[int, tuple[Value, ...]] = {}
    for s in plan.stages:
        if s.source is not None:
            sources[s.level] = (*sources.get(s.level, ()), s.source)
    return RowShape(plan.rows, plan.row, per_row, sources, plan.full_outputs)


def _stored_reader(ctx: KernelContext, plan: RowPlan, stored: StoredValue,
                   scratch: Mapping[Value, Local]) -> Override:
    """The write pass's read of a stored row value: a load from the output row holding it,
    or from its scratch row (whole vectors only: the row is)."""
    local = scratch.get(stored.value)
    if local is not None:
        k = len(plan.row)
        return lambda index, lanes: local.load(flatten(index[len(index) - k:], plan.row)
                                               // lanes)
    buffer = ctx.buffers.outputs[stored.output]
    full = plan.rows + plan.row
    return lambda index, lanes: buffer.load(flatten(index, full), lanes)


def _reduce_pass(ctx: KernelContext, plan: RowPlan, stages: list[Stage],
                 prefix: tuple[Expr, ...], lanes: int, unroll: int,
                 results: dict[str, Expr], overrides: dict[Value, Override],
                 stored: list[StoredValue], tail_lanes: int = TAIL_MIN_LANES,
                 scratch: Mapping[Value, Local] | None = None) -> list[Stmt]:
    """One pass over the row accumulating ``stages`` and storing the ``stored`` values it
    computes (into their ``scratch`` rows when they have one: the row is whole vectors);
    binds their results (and the results' overrides) after the loops. The tail runs in
    halving vectors down to ``tail_lanes`` lanes, then element by element."""
    scratch = scratch or {}
    k, n, full = len(plan.row), math.prod(plan.row), plan.rows + plan.row
    names = ctx.names
    unroll = max(1, min(unroll, n // lanes)) if lanes > 1 else 1
    scalar = [Local(names.fresh("acc"), LType(s.acc), 1) for s in stages]
    vector = [Local(names.fresh("acc"), LType(s.acc, lanes), unroll) for s in stages] \
        if lanes > 1 else []

    def accumulate(accs: list[Local], slot: Expr, i: Expr, width: int) -> list[Stmt]:
        b = ctx.builder(overrides)
        run = Run(prefix + unflatten(i, plan.row), width, k)
        terms = [s.term(b, run, results) for s in stages]
        stores = [LocalStore(scratch[s.value].name, i // width,
                             b.value(s.value, run.index, width, k)) if s.value in scratch
                  else Store(ctx.buffers.outputs[s.output].name, flatten(run.index, full),
                             b.value(s.value, run.index, width, k)) for s in stored]
        return [*b.lets, *(LocalStore(a.name, slot, _combine(s, a.load(slot), t))
                           for a, s, t in zip(accs, stages, terms)), *stores]

    loops = _vector_accumulation(names, n, lanes, unroll, vector, accumulate)
    whole = n - n % lanes if lanes > 1 else 0
    # the tail in halving vectors (8, then 4 lanes) before single elements: a row of 77 ran
    # 13 of its elements through the scalar exp, as long as its 4 vectors of 16 together
    narrow: list[list[Local]] = []
    width = lanes // 2
    while width >= max(tail_lanes, 2) and n - whole >= width:
        narrow.append([Local(names.fresh("acc"), LType(s.acc, width), 1) for s in stages])
        loops += _initialise(stages, narrow[-1], []) + accumulate(narrow[-1], const(0),
                                                                  const(whole), width)
        whole += width
        width //= 2
    if n > whole:
        i = names.fresh("i")
        loops.append(loop(i, whole, n, accumulate(scalar, const(0), var(i), 1)))
    stmts: list[Stmt] = [*scalar, *vector, *(a for accs in narrow for a in accs),
                         *_initialise(stages, scalar, vector), *loops]
    for pos, s in enumerate(stages):
        total = scalar[pos].load(0)
        for accs in narrow:
            total = binary(s.combine, reduce(_HORIZONTAL[s.combine], accs[pos].load(0)), total)
        if vector:
            total = _combine(s, _horizontal(s, vector[pos], unroll), total)
        let = Let(names.fresh(s.key), s.finish(total, results))
        stmts.append(let)
        results[s.key] = let.ref
        if s.output is not None:
            overrides[s.output] = let.ref
    return stmts


def _combine(stage: Stage, acc: Expr, term: Expr) -> Expr:
    """One accumulation step; a NaN-free max is ``select(acc > term, acc, term)``, which
    x86 does in one vmaxps (NaN gives ``term``)."""
    if stage.nan_free and stage.combine is XOp.MAX:
        return select(binary(XOp.GT, acc, term), acc, term)
    return binary(stage.combine, acc, term)


def _vector_accumulation(names: Namer, n: int, lanes: int, unroll: int, vector: list[Local],
                         accumulate: Callable[[list[Local], Expr, Expr, int], list[Stmt]]
                         ) -> list[Stmt]:
    """Vector loops over the whole vectors of the row: ``unroll`` accumulators in flight,
    then single vectors for what is left of whole vectors."""
    if lanes == 1:
        return []
    big, whole = n - n % (lanes * unroll), n - n % lanes
    stmts: list[Stmt] = []
    start = 0
    if unroll > 1 and big:
        i, j = names.fresh("i"), names.fresh("j")
        body = accumulate(vector, var(j), var(i) + var(j) * lanes, lanes)
        inner = loop(j, 0, unroll, body, kind=LoopKind.UNROLLED)
        stmts.append(loop(i, 0, big, [inner], lanes * unroll, LoopKind.VECTORIZED))
        start = big
    if whole > start:
        i = names.fresh("i")
        stmts.append(loop(i, start, whole, accumulate(vector, const(0), var(i), lanes), lanes,
                          LoopKind.VECTORIZED))
    return stmts


def _initialise(stages: list[Stage], scalar: list[Local], vector: list[Local]) -> list[Stmt]:
    stmts: list[Stmt] = []
    for pos, s in enumerate(stages):
        for local in [scalar[pos], *vector[pos:pos + 1]]:
            start = _identity(s.combine, s.acc, local.type.lanes)
            stmts += [LocalStore(local.name, const(j), start) for j in range(local.count)]
    return stmts


def _identity(combine: XOp, dtype: DType, lanes: int) -> Expr:
    if combine is XOp.MUL:
        return const(1, dtype, lanes)
    return const(reduction_identity(_HORIZONTAL[combine], dtype), dtype, lanes)


def _tree(combine: XOp, local: Local, count: int, step: Callable[[Expr, Expr], Expr] | None = None
          ) -> Expr:
    """The accumulators of ``local`` combined pairwise: (a0 + a1) + (a2 + a3), by ``step``
    (default: ``combine``)."""
    parts = [local.load(j) for j in range(count)]
    while len(parts) > 1:
        pairs = [step(parts[p], parts[p + 1]) if step else binary(combine, parts[p], parts[p + 1])
                 for p in range(0, len(parts) - 1, 2)]
        parts = pairs + ([parts[-1]] if len(parts) % 2 else [])
    return parts[0]


def _horizontal(stage: Stage, local: Local, count: int) -> Expr:
    """A pass's vector accumulators reduced to the row's scalar. For a NaN-free max the
    accumulators combine with one vmaxps each, and the NaN lanes (a NaN read last by a lane)
    become -inf before the horizontal max: the code generator's max keeps NumPy's NaN rule
    (compare, unordered compare, or, blend per step), and LLVM drops that once it knows no
    lane is NaN (~25 instructions on the row's critical path: the exp pass waits for them)."""
    if not (stage.nan_free and stage.combine is XOp.MAX):
        return reduce(_HORIZONTAL[stage.combine], _tree(stage.combine, local, count))
    v = _tree(stage.combine, local, count,
              lambda a, b: select(binary(XOp.GT, a, b), a, b))
    cleared = select(binary(XOp.EQ, v, v), v, const(-math.inf, v.dtype, v.lanes))
    return reduce(XOp.REDUCE_MAX, cleared)


def _write_pass(ctx: KernelContext, plan: RowPlan, outputs: tuple[Value, ...],
                prefix: tuple[Expr, ...], lanes: int, overrides: Mapping[Value, Override],
                held: frozenset[str], per_row: frozenset[object] = frozenset(),
                stream: bool = False) -> list[Stmt]:
    """The last pass: writes the full-row ``outputs`` (streaming stores when ``stream``).
    Stored values are read back through ``overrides`` from the output buffers named ``held``
    (or scratch rows); every value reading them is bound before the first store of the run
    (which may overwrite what it reads). A division by a value of the per-row results
    ``per_row`` alone becomes a product with its reciprocal (:func:`reciprocal_divisions`)."""
    k, full = len(plan.row), plan.rows + plan.row
    inputs = frozenset(p.name for p in ctx.buffers.inputs.values())

    def body(i: Expr, width: int) -> list[Stmt]:
        index = prefix + unflatten(i, plan.row)
        b = ctx.builder(overrides)
        values = [b.value(v, index, width, k) for v in outputs]
        row_values = set(per_row)   # and the lets computed from them alone (sqrt(var + eps))
        for let in b.lets:
            if _reads_only(let.value, frozenset(row_values), inputs):
                row_values.add(let.name)
        known = frozenset(row_values) if per_row else frozenset()
        values = [reciprocal_divisions(e, known) for e in values]
        b.lets[:] = [Let(let.name, reciprocal_divisions(let.value, known)) for let in b.lets]
        pinned: list[Let] = []
        for pos, e in enumerate(values):
            if e.op is not XOp.VAR and any(n.op is XOp.LOAD and n.arg in held
                                           for n in walk_expr(e)):
                pinned.append(Let(ctx.names.fresh("t"), e))
                values[pos] = pinned[-1].ref
        at = flatten(index, full)
        stores = [Store(ctx.buffers.outputs[v].name, at, e, stream and width > 1)
                  for v, e in zip(outputs, values)]
        return [*b.lets, *pinned, *stores]

    return run_loops(ctx.names, 0, math.prod(plan.row), lanes, body)


def reciprocal_divisions(e: Expr, per_row: frozenset[object]) -> Expr:
    """``e`` with every ``a / d`` whose divisor reads only the per-row results ``per_row``
    (softmax's sum, layer norm's ``sqrt(var + eps)``: constant along the row) written
    ``a * (1 / d)``: LLVM hoists the one division out of the row loop, where a vector division
    per element cost about as much as softmax's exp (vdivps is 5-10x an FMA). The product is
    within 1.5 ulp of the quotient, inside the f32 contract (:mod:`tilefuse.testing`) by far."""
    if not per_row or not e.args:
        return e
    args = tuple(reciprocal_divisions(a, per_row) for a in e.args)
    if e.op is XOp.DIV and e.dtype.is_float and _reads_only(args[1], per_row):
        one = const(1.0, args[1].dtype, args[1].lanes)
        return binary(XOp.MUL, args[0], binary(XOp.DIV, one, args[1]))
    return e if args == e.args else replace(e, args=args)


def _reads_only(e: Expr, names: frozenset[object], readonly: frozenset[object] = frozenset()
                ) -> bool:
    """Whether every variable of ``e`` (load indices included) is one of ``names`` and every
    load reads a buffer of ``readonly`` (an input: layer norm's eps): then ``e`` is the same
    all along the row."""
    return all((n.op is not XOp.LOAD or n.arg in readonly) and
               (n.op is not XOp.VAR or n.arg in names) for n in walk_expr(e))


def _row_stores(ctx: KernelContext, plan: RowPlan, r: Expr,
                overrides: Mapping[Value, Override]) -> list[Stmt]:
    """Stores of the per-row outputs (after every pass)."""
    b = ctx.builder(overrides)
    stores = []
    for v in plan.row_outputs:
        index = unflatten(r, dims(v.shape))
        stores.append(Store(ctx.buffers.outputs[v].name, flatten(index, dims(v.shape)),
                            b.value(v, index)))
    return [*b.lets, *stores]
