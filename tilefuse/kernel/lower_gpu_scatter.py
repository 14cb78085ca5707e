"""Scatters (``scatter_elements``, ``scatter_nd``: :mod:`tilefuse.ops.indexing`) lowered for the
GPU, deterministic and without atomics.

The CPU runs a scatter as one serial loop over the updates (:mod:`tilefuse.kernel.lower_gather`)
so that a repeated index keeps the last update (``reduction="none"``, NumPy's assignment) and a
combined one sees every update once, in order. The GPU keeps that order: each output element is
written by exactly one thread, which folds the updates aimed at it in update order. Results are
therefore bit-identical to the reference for every reduction and dtype (a float ``add`` sums in
the reference's order, where atomics would sum in a run-dependent one).

* **scatter_elements** (ONNX ScatterElements, ``torch.scatter`` / ``scatter_add``): a thread per
  output element ``e``. Only updates whose position equals ``e`` off the axis can hit it, so the
  thread walks the index column through ``e`` (``idx.shape[axis]`` loads) and folds each update
  whose index is ``e[axis]``::

      parallel for o in 0..N:   (e = unflatten(o))
        acc = data[o]
        if e[d] < idx.shape[d] for every d != axis:
          for j in 0..idx.shape[axis]:  p = e with axis = j
            if wrap(idx[p]) == e[axis]: acc = acc (+) upd[p]
        out[o] = acc

* **scatter_nd** (ONNX ScatterND, ``index_put``): two kernels. The first copies ``data`` to the
  output (its step produces the output); the second (a step that reads and writes the output
  buffer but lists no output of its own, so the memory plan and the simulator see one
  producer) runs a thread per (update row ``p``, inner element ``i``). The *leader* of a
  target (its first row) alone writes it: it folds the rows ``q >= p`` with the same target into
  ``data[target]`` and stores once, so no two threads write one element. The cost is quadratic in
  the number of index rows (each thread compares its row's index with every other row's; those
  loads are the same for a whole warp): right for cache updates and sparse writes of a few
  thousand rows, not for a scatter of millions of rows (that would want a sort by target).

**Out-of-range indices.** The reference raises; the kernel has no error channel, so an index out
of range (after wrapping a negative one once) is dropped: its update is written nowhere and
nothing is read or written out of bounds. This is the cuda target's one leniency for scatters,
as clamping is for gathers (:mod:`tilefuse.kernel.lower_gpu_index`).
"""

from __future__ import annotations

import math

from tilefuse.dtypes import DType
from tilefuse.errors import CompileError
from tilefuse.graph.ir import Node
from tilefuse.graph.types import normalize_axis
from tilefuse.kernel.access import dims, flatten, identifier, unflatten
from tilefuse.kernel.lower_elementwise import KernelContext
from tilefuse.kernel.lower_gather import is_gather_group
from tilefuse.kernel.scalar_expr import KernelGroupLike
from tilefuse.loop.ir import (
    BufferParam,
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
    cast,
    const,
    local_load,
    loop,
    select,
    var,
)
from tilefuse.loop.simplify import simplify

SCATTERS = frozenset({"scatter_elements", "scatter_nd"})
COPY_BYTES = 16
"""Bytes a thread copies per iteration in scatter_nd's first kernel (one 128-bit access)."""


def scatter_node(group: KernelGroupLike) -> Node | None:
    """The scatter a one-node scatter group holds, else None."""
    nodes = getattr(group, "nodes", ())
    if len(nodes) == 1 and nodes[0].op.name in SCATTERS:
        return nodes[0]
    return None


def _combine(reduction: str, old: Expr, new: Expr) -> Expr:
    """``old (+) new`` for ``reduction`` (the CPU scatter's rule: bools combine by or / and)."""
    if reduction == "none":
        return new
    op = {"add": XOp.ADD, "mul": XOp.MUL, "max": XOp.MAX, "min": XOp.MIN}[reduction]
    if old.dtype is DType.bool:
        return binary(XOp.OR if op in (XOp.ADD, XOp.MAX) else XOp.AND, old, new)
    return binary(op, old, new)


def _as(e: Expr, dtype: DType) -> Expr:
    return e if e.dtype is dtype else cast(e, dtype)


def _wrapped(raw: Expr, size: int) -> Expr:
    """An index as i64, a negative one counted from the end (once)."""
    i = _as(raw, DType.i64)
    return select(binary(XOp.LT, i, const(0)), i + size, i)


class _Scatter:
    def __init__(self, group: KernelGroupLike):
        if not is_gather_group(group) or scatter_node(group) is None:
            raise CompileError(f"kernel {getattr(group, 'name', '?')}: not a static one-node "
                               f"scatter reading buffers")
        self.group = group
        self.node = scatter_node(group)
        self.ctx = KernelContext.of(group)
        data, idx, upd = self.node.inputs
        self.data = self.ctx.buffers.inputs[data]
        self.idx = self.ctx.buffers.inputs[idx]
        self.upd = self.ctx.buffers.inputs[upd]
        out = self.ctx.buffers.outputs.get(self.node.outputs[0])
        if out is None:
            raise CompileError(f"kernel {group.name}: the scatter's output is not written")
        self.out: BufferParam = out
        self.dtype = data.dtype
        self.reduction = str(self.node.attrs["reduction"])

    def fresh(self, prefix: str) -> str:
        return self.ctx.names.fresh(prefix)

    def function(self, suffix: str, buffers: tuple[BufferParam, ...], body: list[Stmt]
                 ) -> LoopFunction:
        fn = LoopFunction(identifier(self.group.name) + suffix, buffers, (), block(*body))
        return simplify(fn)[0]

    def update(self, at: Expr) -> Expr:
        return _as(self.upd.load(at), self.dtype)


def lower_scatter_elements_gpu(group: KernelGroupLike) -> LoopFunction:
    """A ``scatter_elements`` group as one kernel, a thread per output element (module
    docstring)."""
    s = _Scatter(group)
    node = s.node
    data, idx, _ = node.inputs
    ds, ix = dims(data.shape), dims(idx.shape)
    axis = normalize_axis(node.attrs["axis"], len(ds))
    total = math.prod(ds)
    if total == 0:
        return s.function("", s.ctx.buffers.params, [])
    o, j = s.fresh("o"), s.fresh("j")
    e = unflatten(var(o), ds)
    acc = Local(s.fresh("acc"), LType(s.dtype))
    body: list[Stmt] = [acc, LocalStore(acc.name, const(0), s.data.load(var(o)))]
    if math.prod(ix):
        p = Let(s.fresh("p"), flatten(tuple(var(j) if d == axis else e[d]
                                            for d in range(len(ds))), ix))
        k = Let(s.fresh("k"), _wrapped(s.idx.load(p.ref), ds[axis]))
        hit = If(binary(XOp.EQ, k.ref, e[axis]), LocalStore(
            acc.name, const(0), _combine(s.reduction, local_load(acc), s.update(p.ref))))
        walk: Stmt = loop(j, 0, ix[axis], [p, k, hit])
        inside: Expr | None = None
        for d in range(len(ds)):
            if d != axis and ix[d] < ds[d]:
                here = binary(XOp.LT, e[d], const(ix[d]))
                inside = here if inside is None else binary(XOp.AND, inside, here)
        body.append(walk if inside is None else If(inside, walk))
    body.append(Store(s.out.name, var(o), local_load(acc)))
    return s.function("", s.ctx.buffers.params,
                      [loop(o, 0, total, body, kind=LoopKind.PARALLEL)])


def lower_scatter_nd_gpu(group: KernelGroupLike) -> tuple[LoopFunction, LoopFunction]:
    """A ``scatter_nd`` group as two kernels, run in this order: the copy of ``data`` to the
    output, then the leaders' writes (module docstring)."""
    s = _Scatter(group)
    data, idx, _ = s.node.inputs
    ds, ix = dims(data.shape), dims(idx.shape)
    depth = ix[-1]
    rows, inner = math.prod(ix[:-1]), math.prod(ds[depth:])
    total = math.prod(ds)
    lanes = max(1, COPY_BYTES // s.dtype.itemsize)
    lanes = lanes if s.dtype is not DType.bool and total % lanes == 0 else 1
    c = s.fresh("c")
    copy = s.function("_copy", (s.data, s.out), [] if not total else [
        loop(c, 0, total, [Store(s.out.name, var(c), s.data.load(var(c), lanes))], lanes,
             kind=LoopKind.PARALLEL)])
    if not rows * inner:
        return copy, s.function("_rows", s.ctx.buffers.params, [])

    def key(row: Expr) -> tuple[list[Stmt], Expr]:
        """Lets and the flat target row of index row ``row`` (-1 when out of range)."""
        lets: list[Stmt] = []
        offset: Expr = const(0)
        bad: Expr | None = None
        for d in range(depth):
            k = Let(s.fresh("k"), _wrapped(s.idx.load(row * depth + d), ds[d]))
            lets.append(k)
            out = binary(XOp.OR, binary(XOp.LT, k.ref, const(0)),
                         binary(XOp.GE, k.ref, const(ds[d])))
            bad = out if bad is None else binary(XOp.OR, bad, out)
            offset = offset * ds[d] + k.ref
        result = offset if bad is None else select(bad, const(-1), offset)
        name = s.fresh("key")
        return [*lets, Let(name, result)], var(name)

    t, q, r = s.fresh("t"), s.fresh("q"), s.fresh("r")
    p = Let(s.fresh("p"), var(t) // inner if inner > 1 else var(t))
    i = Let(s.fresh("i"), var(t) % inner if inner > 1 else const(0))
    mine_lets, mine = key(p.ref)
    first = Local(s.fresh("first"), LType(DType.bool))
    q_lets, q_key = key(var(q))
    earlier = loop(q, 0, p.ref, [*q_lets, If(binary(XOp.EQ, q_key, mine), LocalStore(
        first.name, const(0), const(False, DType.bool)))])
    acc = Local(s.fresh("acc"), LType(s.dtype))
    target = Let(s.fresh("at"), mine * inner + i.ref)
    r_lets, r_key = key(var(r))
    fold = loop(r, p.ref, rows, [*r_lets, If(binary(XOp.EQ, r_key, mine), LocalStore(
        acc.name, const(0), _combine(s.reduction, local_load(acc),
                                      s.update(var(r) * inner + i.ref))))])
    lead = block(target, LocalStore(acc.name, const(0), s.data.load(target.ref)), fold,
                 Store(s.out.name, target.ref, local_load(acc)))
    body: list[Stmt] = [
        p, i, *mine_lets, first, acc,
        LocalStore(first.name, const(0), binary(XOp.GE, mine, const(0))),
        If(local_load(first), earlier),
        If(local_load(first), lead)]
    rows_fn = s.function("_rows", s.ctx.buffers.params,
                         [loop(t, 0, rows * inner, body, kind=LoopKind.PARALLEL)])
    return copy, rows_fn


__all__ = ["SCATTERS", "lower_scatter_elements_gpu", "lower_scatter_nd_gpu", "scatter_node"]
