"""Index-driven kernels: a one-node ``take``, ``take_along_axis``, ``scatter_elements``,
``scatter_nd`` or ``topk`` group lowered to loop IR.

* **take** (embedding lookups, ONNX Gather): output [pre, j, post] = x[pre, idx[j], post]. One
  iteration per (pre, j) reads its index once and copies the contiguous ``post`` run,
  vectorised (an embedding row is one vector loop)::

      [parallel] for q in 0..P:                      (or across j when P is small)
        for j in 0..J:
          let k = idx[j];  k = k < 0 ? k + n : k          (negative indices wrap)
          if k < 0 or k >= n: index_error = (1, idx[j])   (see below)
          let s = (q·n + clamp(k, 0, n-1))·T
          vectorized for i in 0..T: out[(q·J + j)·T + i :+W] = x[s + i :+W]

* **take_along_axis** (ONNX GatherElements): each output element reads ``x`` at its own
  position with the axis replaced by its index; rows across threads, scalars.
* **scatter_elements / scatter_nd**: the output is first a copy of ``data`` (vectorised), then
  one serial loop over the updates writes or combines (``add``, ``mul``, ``max``, ``min``) each
  at its index. Serial, so that a repeated index keeps the last update as NumPy's assignment
  does (and a combined one sees every update once).
* **topk**: per row along the axis, a sorted list of the k best (value, index) pairs in locals;
  each element is inserted branch-free (k compares and selects), so a tie keeps the lower index
  first and NaN ranks above every number, as the reference's stable sort does.

**Out-of-range indices.** The references raise a ShapeError naming the op. A kernel cannot
raise, and must not read or write outside its buffers, so it clamps the index of a read into
range and drops a write, and records the bad index in its ``index_error`` buffer (two i64: a
flag and the index), which the native executable binds to an array of its own and checks
after each call: the call then raises the reference's ShapeError (op, index, axis and size,
and the user's source line), its outputs discarded. Nothing is read or written out of bounds
on the way.
"""

from __future__ import annotations

import math
import os
from typing import TYPE_CHECKING

from tilefuse.dtypes import DType
from tilefuse.errors import CompileError, ShapeError
from tilefuse.graph.ir import Node, Value
from tilefuse.graph.types import normalize_axis
from tilefuse.kernel.access import dims, flatten, identifier, unflatten
from tilefuse.kernel.lower_elementwise import (
    KernelContext,
    chunked_runs,
    fit_lanes,
    group_scalars,
    outer_loop,
    run_loops,
    vector_width,
)
from tilefuse.kernel.scalar_expr import KernelGroupLike
from tilefuse.kernel.schedule import PARALLEL_MIN_ELEMENTS
from tilefuse.loop.ir import (
    BufferParam,
    Expr,
    If,
    Let,
    Local,
    LocalStore,
    LoopFunction,
    LType,
    Stmt,
    Store,
    XOp,
    binary,
    block,
    cast,
    const,
    loop,
    maximum,
    minimum,
    select,
    unary,
    var,
)
from tilefuse.loop.simplify import simplify

TAKE_INDEX_LOCAL = 4096
"""The most indices a serial take along the last axis checks once into a local (32 KiB of
stack); more, and each row checks them again."""

if TYPE_CHECKING:
    from tilefuse.kernel.schedule import Schedule

INDEX_ERROR = "index_error"
"""The buffer (two i64: flag, index) a gather or scatter kernel records a bad index in."""
GATHER_OPS = frozenset({"take", "take_along_axis", "scatter_elements", "scatter_nd", "topk"})


def is_gather_group(group: KernelGroupLike) -> bool:
    """A one-node group of an op lowered here, with static shapes."""
    nodes = getattr(group, "nodes", ())
    if len(nodes) != 1 or nodes[0].op.name not in GATHER_OPS:
        return False
    (node,) = nodes
    values = [*node.inputs, *node.outputs]
    return all(isinstance(d, int) for v in values for d in v.shape) and \
        all(v in group.inputs for v in node.inputs)


def index_error(node: Node, bad: int) -> ShapeError:
    """The reference's error for an out-of-range index ``bad`` of ``node``."""
    x = node.inputs[0]
    if node.op.name in ("take", "take_along_axis", "scatter_elements"):
        axis = normalize_axis(node.attrs["axis"], x.type.rank)
        what = f"axis {axis} of size {x.shape[axis]}"
    else:
        what = f"data {list(x.shape)}"
    return ShapeError(f"index {bad} is out of range for {what}", op=node.op.name, loc=node.loc)


class _Kernel:
    """The context of one gather kernel: buffers (plus ``index_error``), names, threads."""

    def __init__(self, group: KernelGroupLike, schedule: Schedule | None):
        self.group = group
        (self.node,) = group.nodes
        self.ctx = KernelContext.of(group)
        self.error = BufferParam(INDEX_ERROR, DType.i64)
        self.lanes = vector_width(schedule) if schedule is not None and \
            schedule.vector_axis else 16
        self.uses_error = False

    def fresh(self, prefix: str) -> str:
        return self.ctx.names.fresh(prefix)

    def input(self, value: Value) -> BufferParam:
        return self.ctx.buffers.inputs[value]

    def output(self, value: Value) -> BufferParam | None:
        return self.ctx.buffers.outputs.get(value)

    def threads(self, elements: int) -> int:
        return max(1, min(os.cpu_count() or 1, elements // PARALLEL_MIN_ELEMENTS))

    def wrapped(self, raw: Expr, size: int) -> tuple[list[Stmt], Expr, Expr]:
        """Statements binding a loaded index wrapped (negative from the end), whether it is
        out of range (recorded in ``index_error``), and the in-range index to use."""
        self.uses_error = True
        raw = raw if raw.dtype is DType.i64 else cast(raw, DType.i64)
        r = Let(self.fresh("raw"), raw)
        k = Let(self.fresh("k"), select(binary(XOp.LT, r.ref, const(0)), r.ref + size, r.ref))
        bad = Let(self.fresh("bad"), binary(XOp.OR, binary(XOp.LT, k.ref, const(0)),
                                            binary(XOp.GE, k.ref, const(size))))
        record = If(bad.ref, block(Store(INDEX_ERROR, const(0), const(1)),
                                   Store(INDEX_ERROR, const(1), r.ref)))
        clamped = minimum(maximum(k.ref, const(0)), const(max(size - 1, 0)))
        return [r, k, bad, record], bad.ref, clamped

    def function(self, body: list[Stmt]) -> LoopFunction:
        buffers = (*self.ctx.buffers.params, *([self.error] if self.uses_error else []))
        fn = LoopFunction(identifier(self.group.name), buffers, group_scalars(self.group),
                          block(*body))
        return simplify(fn)[0]

    def copy(self, src: BufferParam, dst: BufferParam, count: int) -> list[Stmt]:
        """``dst[:count] = src[:count]``, vectorised, in parallel chunks when large."""
        lanes = fit_lanes(self.lanes, count)
        tile = -(-count // self.threads(count)) if self.threads(count) > 1 else None
        return chunked_runs(self.ctx.names, count, lanes, tile,
                            lambda i, w: [Store(dst.name, i, src.load(i, w))])

    # ---- gathers --------------------------------------------------------------------------
    def take(self) -> list[Stmt]:
        node = self.node
        x, idx = node.inputs
        shape = dims(x.shape)
        axis = normalize_axis(node.attrs["axis"], len(shape))
        n = shape[axis]
        pre, post = math.prod(shape[:axis]), math.prod(shape[axis + 1:])
        count = math.prod(dims(idx.shape))
        out = self.output(node.outputs[0])
        assert out is not None
        src_buf, idx_buf = self.input(x), self.input(idx)
        lanes = fit_lanes(self.lanes, post)
        total = pre * count * post
        threads = self.threads(total)

        def row(q: Expr, j: Expr) -> list[Stmt]:
            """Output row (q, j): ``post`` elements from x's row (q, idx[j])."""
            stmts, _, k = self.wrapped(idx_buf.load(j), n)
            base = Let(self.fresh("src"), (q * n + k) * post)
            at = Let(self.fresh("dst"), (q * count + j) * post)
            copy = run_loops(self.ctx.names, 0, post, lanes, lambda i, w: [
                Store(out.name, at.ref + i, src_buf.load(base.ref + i, w))])
            return [*stmts, base, at, *copy]

        if post == 1 and pre > 1 and threads == 1 and count <= TAKE_INDEX_LOCAL:
            return self.take_elements(pre, n, count, src_buf, idx_buf, out)
        if pre >= threads:  # threads over the leading axes, a loop over the indices inside
            tile = -(-pre // threads) if threads > 1 else None
            return outer_loop(self.ctx.names, pre, tile, lambda q: [
                loop(j, 0, count, row(q, var(j))) for j in [self.fresh("j")]])
        tile = -(-count // threads) if threads > 1 else None
        return outer_loop(self.ctx.names, pre, None, lambda q: outer_loop(
            self.ctx.names, count, tile, lambda j: row(q, j)))

    def take_elements(self, pre: int, n: int, count: int, src_buf: BufferParam,
                      idx_buf: BufferParam, out: BufferParam) -> list[Stmt]:
        """take of single elements (``post`` 1: along the last axis) for ``pre`` rows: the
        indices are wrapped, checked and clamped once, into a local, and each row is a
        branch-free loop of loads through it (checking every index in every row made it 1.6-2x
        slower than NumPy)::

            local kk: i64[count]
            for j in 0..count: (wrap, check, clamp idx[j]); kk[j] = k
            for q in 0..pre: for j in 0..count: out[q·count + j] = x[q·n + kk[j]]
        """
        kk = Local(self.fresh("kk"), LType(DType.i64), count)
        j = self.fresh("j")
        stmts, _, k = self.wrapped(idx_buf.load(var(j)), n)
        prepare = loop(j, 0, count, [*stmts, LocalStore(kk.name, var(j), k)])
        q, i = self.fresh("q"), self.fresh("j")
        row = loop(i, 0, count, [Store(out.name, var(q) * count + var(i),
                                       src_buf.load(var(q) * n + kk.load(var(i))))])
        return [kk, prepare, loop(q, 0, pre, [row])]

    def take_along_axis(self) -> list[Stmt]:
        node = self.node
        x, idx = node.inputs
        xs, ix = dims(x.shape), dims(idx.shape)
        out_v = node.outputs[0]
        os_ = dims(out_v.shape)
        axis = normalize_axis(node.attrs["axis"], len(xs))
        out = self.output(out_v)
        assert out is not None
        src_buf, idx_buf = self.input(x), self.input(idx)
        rows, width = math.prod(os_[:-1]), os_[-1] if os_ else 1
        total = math.prod(os_)
        tile = -(-rows // self.threads(total)) if self.threads(total) > 1 and rows > 1 else None

        def row(r: Expr) -> list[Stmt]:
            c = self.fresh("c")
            at = unflatten(r * width + var(c), os_)
            read = tuple(const(0) if ix[d] == 1 else at[d] for d in range(len(ix)))
            stmts, _, k = self.wrapped(idx_buf.load(flatten(read, ix)), xs[axis])
            src = tuple(k if d == axis else const(0) if xs[d] == 1 else at[d]
                        for d in range(len(xs)))
            return [loop(c, 0, width, [*stmts, Store(out.name, r * width + var(c),
                                                     src_buf.load(flatten(src, xs)))])]

        return outer_loop(self.ctx.names, rows, tile, row)

    # ---- scatters -------------------------------------------------------------------------
    def combine(self, reduction: str, old: Expr, new: Expr) -> Expr:
        if reduction == "none":
            return new
        op = {"add": XOp.ADD, "mul": XOp.MUL, "max": XOp.MAX, "min": XOp.MIN}[reduction]
        if old.dtype is DType.bool:  # add = or, mul = and, max = or, min = and
            return binary(XOp.OR if op in (XOp.ADD, XOp.MAX) else XOp.AND, old, new)
        return binary(op, old, new)

    def scatter_elements(self) -> list[Stmt]:
        node = self.node
        data, idx, upd = node.inputs
        ds, ix = dims(data.shape), dims(idx.shape)
        axis = normalize_axis(node.attrs["axis"], len(ds))
        out = self.output(node.outputs[0])
        assert out is not None
        stmts = self.copy(self.input(data), out, math.prod(ds))
        p = self.fresh("p")
        at = unflatten(var(p), ix)
        pre, bad, k = self.wrapped(self.input(idx).load(var(p)), ds[axis])
        target = Let(self.fresh("t"), flatten(tuple(k if d == axis else at[d]
                                                    for d in range(len(ds))), ds))
        value = self.input(upd).load(var(p))
        value = value if value.dtype is data.dtype else cast(value, data.dtype)
        write = Store(out.name, target.ref, self.combine(node.attrs["reduction"],
                                                         out.load(target.ref), value))
        return [*stmts, loop(p, 0, math.prod(ix), [*pre, target,
                                                   If(unary(XOp.NOT, bad), write)])]

    def scatter_nd(self) -> list[Stmt]:
        node = self.node
        data, idx, upd = node.inputs
        ds, ix = dims(data.shape), dims(idx.shape)
        depth = ix[-1]
        rows, inner = math.prod(ix[:-1]), math.prod(ds[depth:])
        out = self.output(node.outputs[0])
        assert out is not None
        idx_buf, upd_buf = self.input(idx), self.input(upd)
        stmts = self.copy(self.input(data), out, math.prod(ds))
        p = self.fresh("p")
        body: list[Stmt] = []
        offset: Expr = const(0)
        bad_any: Expr | None = None
        for d in range(depth):
            made, bad, k = self.wrapped(idx_buf.load(var(p) * depth + d), ds[d])
            body += made
            offset = offset * ds[d] + k
            bad_any = bad if bad_any is None else binary(XOp.OR, bad_any, bad)
        base = Let(self.fresh("base"), offset * inner)
        i = self.fresh("i")
        value = upd_buf.load(var(p) * inner + var(i))
        value = value if value.dtype is data.dtype else cast(value, data.dtype)
        at = base.ref + var(i)
        write = Store(out.name, at, self.combine(node.attrs["reduction"], out.load(at), value))
        copy = loop(i, 0, inner, [write])
        guarded: Stmt = copy if bad_any is None else If(unary(XOp.NOT, bad_any), copy)
        return [*stmts, loop(p, 0, rows, [*body, base, guarded])]

    # ---- topk -----------------------------------------------------------------------------
    def topk(self) -> list[Stmt]:
        node = self.node
        (x,) = node.inputs
        xs = dims(x.shape)
        axis = normalize_axis(node.attrs["axis"], len(xs))
        k, largest = node.attrs["k"], node.attrs["largest"]
        n = xs[axis]
        pre, post = math.prod(xs[:axis]), math.prod(xs[axis + 1:])
        values_out, index_out = (self.output(v) for v in node.outputs)
        src = self.input(x)
        work = DType.f32 if x.dtype in (DType.f16, DType.bf16) else x.dtype
        if k == 0 or pre * post == 0:
            return []
        rows = pre * post
        tile = -(-rows // self.threads(rows * n * k)) if self.threads(rows * n * k) > 1 \
            and rows > 1 else None

        def better(v: Expr, w: Expr) -> Expr:
            """Whether ``v`` ranks before ``w`` (not on a tie: the earlier stays first)."""
            if largest:
                take = binary(XOp.GT, v, w)
                if work.is_float:
                    take = binary(XOp.OR, take, binary(XOp.AND, unary(XOp.ISNAN, v),
                                                       unary(XOp.NOT, unary(XOp.ISNAN, w))))
                return take
            take = binary(XOp.LT, v, w)
            if work.is_float:
                take = binary(XOp.OR, take, binary(XOp.AND, unary(XOp.ISNAN, w),
                                                   unary(XOp.NOT, unary(XOp.ISNAN, v))))
            return take

        def row(r: Expr) -> list[Stmt]:
            vals = Local(self.fresh("vals"), LType(work), k)
            idxs = Local(self.fresh("idxs"), LType(DType.i64), k)
            s = self.fresh("s")
            init = loop(s, 0, k, [LocalStore(vals.name, var(s), const(0, work)),
                                  LocalStore(idxs.name, var(s), const(-1))])
            j, t = self.fresh("j"), self.fresh("t")
            base = Let(self.fresh("b"), (r // post) * (n * post) + r % post if post > 1
                       else r * n)
            v = Let(self.fresh("v"), _as(src.load(base.ref + var(j) * post), work))
            q = Let(self.fresh("q"), const(k - 1) - var(t))

            def beats(slot: Expr) -> Expr:
                return binary(XOp.OR, binary(XOp.LT, idxs.load(slot), const(0)),
                              better(v.ref, vals.load(slot)))

            here = Let(self.fresh("here"), beats(q.ref))
            prev = maximum(q.ref - 1, const(0))
            before = Let(self.fresh("before"), binary(XOp.AND, binary(XOp.GT, q.ref, const(0)),
                                                      beats(prev)))
            new_v = select(before.ref, vals.load(prev), select(here.ref, v.ref, vals.load(q.ref)))
            new_i = select(before.ref, idxs.load(prev),
                           select(here.ref, var(j), idxs.load(q.ref)))
            nv, ni = Let(self.fresh("nv"), new_v), Let(self.fresh("ni"), new_i)
            insert = loop(t, 0, k, [q, here, before, nv, ni, LocalStore(vals.name, q.ref, nv.ref),
                                    LocalStore(idxs.name, q.ref, ni.ref)])
            scan = loop(j, 0, n, [v, insert])
            stores: list[Stmt] = []
            w = self.fresh("w")
            at = (r // post) * (k * post) + r % post + var(w) * post if post > 1 else r * k + var(w)
            if values_out is not None:
                stores.append(Store(values_out.name, at, _as(vals.load(var(w)), x.dtype)))
            if index_out is not None:
                stores.append(Store(index_out.name, at, idxs.load(var(w))))
            return [vals, idxs, init, base, scan, loop(w, 0, k, stores)]

        return outer_loop(self.ctx.names, rows, tile, row)


def _as(e: Expr, dtype: DType) -> Expr:
    return e if e.dtype is dtype else cast(e, dtype)


def lower_gather(group: KernelGroupLike, schedule: Schedule | None = None) -> LoopFunction:
    """The loop IR of a one-node gather, scatter or topk group (module docstring): buffers are
    the group's inputs, its outputs, then ``index_error`` where indices are read."""
    if not is_gather_group(group):
        raise CompileError(f"kernel {group.name}: not a static one-node gather/scatter/topk")
    kernel = _Kernel(group, schedule)
    body = getattr(kernel, kernel.node.op.name)()
    return kernel.function(body)


__all__ = ["GATHER_OPS", "INDEX_ERROR", "index_error", "is_gather_group", "lower_gather"]
