"""REDUCTION groups (a reduction over axes that are not trailing rows, pooling windows,
``argmax`` / ``argmin``, ``var``) lowered for the GPU: a thread per output element.

The parallel loop runs over the output's elements; each thread folds the reduced elements in a
serial loop, its input computed in place by the group's prologue (a ``pad`` and
``window_patches`` of max pooling, a cast, ...: index arithmetic through the elementwise
builder), then applies the group's epilogue to the result and stores every output. The fold
starts from the first reduced element (no identity needed: ``max`` of floats, ``prod``, ...)
and runs in the accumulator dtype of the CPU's row lowering (f32 for f16/bf16). ``argmax`` keeps
the first index of the largest value, a NaN counting as largest (NumPy's rule), and ``argmin``
likewise. ``var`` takes NumPy's two passes (the mean, then the sum of centred squares, divided by
``max(N - ddof, 0)``).

This is the right shape for many small folds (pooling windows, a channel ``argmax``) and a poor
one for a few long folds (a full sum of a large tensor is one thread); the CPU keeps every such
group on the host, so it is still the first device lowering they have.
"""

from __future__ import annotations

import math

from tilefuse.dtypes import DType
from tilefuse.errors import CompileError
from tilefuse.graph.types import normalize_axis
from tilefuse.kernel.access import dims, flatten, unflatten
from tilefuse.kernel.classify import reduced_axes
from tilefuse.kernel.fusion import KernelGroup
from tilefuse.kernel.lower_gpu_index import GatherContext
from tilefuse.kernel.scalar_expr import work_dtype
from tilefuse.loop.ir import (
    Block,
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
    cast,
    const,
    local_load,
    loop,
    select,
    var,
)

FOLDS = {"sum": XOp.ADD, "mean": XOp.ADD, "max": XOp.MAX, "min": XOp.MIN, "prod": XOp.MUL}
ARGS = {"argmax": XOp.GT, "argmin": XOp.LT}


def lower_reduction_gpu(group: KernelGroup) -> LoopFunction:
    """The loop IR of a REDUCTION group (module docstring); CompileError for anchors it does
    not fold (none)."""
    anchor = group.anchor
    name = anchor.op.name if anchor is not None else "none"
    if anchor is None or (name not in FOLDS and name not in ARGS and name != "var"):
        raise CompileError(f"kernel {group.name}: no GPU lowering for a {name} reduction")
    (x,) = anchor.inputs
    shape = dims(x.shape)
    axes = set(reduced_axes(anchor) or ())
    reduced = [shape[a] for a in sorted(axes)]
    count = math.prod(reduced)
    if count == 0:
        raise CompileError(f"kernel {group.name}: a {name} over no elements")
    out = anchor.output
    out_shape = dims(out.shape)
    ctx = GatherContext.of(group)
    o = ctx.names.fresh("o")
    out_index = unflatten(var(o), out_shape) if out_shape else ()
    keepdims = len(out_shape) == len(shape)
    kept = [a for a in range(len(shape)) if a not in axes]
    from_out = {a: out_index[a] if keepdims else out_index[i] for i, a in enumerate(kept)}

    def term(r: Expr | int) -> tuple[list[Stmt], Expr]:
        """The lets and value of the reduced element ``r`` (flat over the reduced axes)."""
        red = iter(unflatten(r if isinstance(r, Expr) else const(r), reduced))
        index = tuple(next(red) if a in axes else from_out[a] for a in range(len(shape)))
        b = ctx.builder()
        v = b.value(x, index)
        return b.lets, v

    body: list[Stmt] = []
    if name == "var":   # two passes as NumPy: the mean, then the centred squares
        acc_dtype = work_dtype(out.dtype)
        acc = Local(ctx.names.fresh("acc"), LType(acc_dtype))
        r, r2 = ctx.names.fresh("r"), ctx.names.fresh("r")
        lets, v = term(var(r))
        body += [acc, LocalStore(acc.name, const(0), const(0, acc_dtype)),
                 loop(r, 0, count, [*lets, LocalStore(acc.name, const(0), binary(
                     XOp.ADD, local_load(acc), _as(v, acc_dtype)))])]
        mean = ctx.names.fresh("mean")
        body.append(Let(mean, local_load(acc) / float(count)))
        lets, v = term(var(r2))
        d = _as(v, acc_dtype) - var(mean, LType(acc_dtype))
        body += [LocalStore(acc.name, const(0), const(0, acc_dtype)),
                 loop(r2, 0, count, [*lets, LocalStore(acc.name, const(0), binary(
                     XOp.ADD, local_load(acc), d * d))])]
        divisor = float(max(count - int(anchor.attrs["ddof"]), 0))
        result = _as(local_load(acc) / divisor, out.dtype)
    elif name in FOLDS:
        acc_dtype = DType.u8 if out.dtype is DType.bool else work_dtype(out.dtype)
        acc = Local(ctx.names.fresh("acc"), LType(acc_dtype))
        lets0, v0 = term(0)
        body += [acc, *lets0, LocalStore(acc.name, const(0), _as(v0, acc_dtype))]
        r = ctx.names.fresh("r")
        lets, v = term(var(r))
        folded = binary(FOLDS[name], local_load(acc), _as(v, acc_dtype))
        body.append(loop(r, 1, count, [*lets, LocalStore(acc.name, const(0), folded)]))
        result = local_load(acc)
        if name == "mean":
            result = result / float(count)
        result = _as(result, out.dtype)
    else:
        best_dtype = work_dtype(x.dtype) if x.dtype is not DType.bool else DType.u8
        best = Local(ctx.names.fresh("best"), LType(best_dtype))
        where = Local(ctx.names.fresh("at"), LType(DType.i64))
        lets0, v0 = term(0)
        body += [best, where, *lets0, LocalStore(best.name, const(0), _as(v0, best_dtype)),
                 LocalStore(where.name, const(0), const(0))]
        r = ctx.names.fresh("r")
        lets, v = term(var(r))
        t = ctx.names.fresh("v")
        value = var(t, LType(best_dtype))
        old = local_load(best)
        better = binary(ARGS[name], value, old)
        if best_dtype.is_float:
            better = binary(XOp.OR, better, binary(XOp.AND, binary(XOp.NE, value, value),
                                                   binary(XOp.EQ, old, old)))
        f = ctx.names.fresh("take")
        body.append(loop(r, 1, count, [
            *lets, Let(t, _as(v, best_dtype)), Let(f, better),
            LocalStore(best.name, const(0), select(var(f, LType(DType.bool)), value, old)),
            LocalStore(where.name, const(0), select(var(f, LType(DType.bool)), var(r),
                                                    local_load(where)))]))
        result = _as(local_load(where), out.dtype)
    res = ctx.names.fresh("res")
    body.append(Let(res, result))
    body += ctx.store_body(list(group.outputs), out_index, 1, 0,
                           overrides={out: var(res, LType(out.dtype))}, shape=out_shape)
    total = max(1, math.prod(out_shape))
    return ctx.function([loop(o, 0, total, body, kind=LoopKind.PARALLEL)])


def _as(e: Expr, dtype: DType) -> Expr:
    return e if e.dtype is dtype else cast(e, dtype)




def lower_topk_gpu(group: KernelGroup) -> LoopFunction:
    """A ``topk`` group: a thread per input element counts the elements ranked before it along
    the axis (better, or equal at a lower index: a stable order, NaN the largest as in NumPy's
    sort) and, when that rank is under k, writes its value and index at that rank. Quadratic in
    the axis length, and every output element written exactly once."""
    (node,) = group.nodes
    (x,) = node.inputs
    if x not in group.inputs:
        raise CompileError(f"kernel {group.name}: topk must read a buffer")
    shape = dims(x.shape)
    axis = normalize_axis(node.attrs["axis"], len(shape))
    k, n, largest = int(node.attrs["k"]), shape[axis], bool(node.attrs["largest"])
    ctx = GatherContext.of(group)
    wide = work_dtype(x.dtype) if x.dtype.is_float else x.dtype
    p, j = ctx.names.fresh("p"), ctx.names.fresh("j")
    index = unflatten(var(p), shape)
    v_name, u_name, rank = ctx.names.fresh("v"), ctx.names.fresh("u"), ctx.names.fresh("rank")
    v = var(v_name, LType(wide))
    u = var(u_name, LType(wide))
    other = tuple(var(j) if a == axis else e for a, e in enumerate(index))
    if largest:
        better = binary(XOp.GT, u, v)
    else:
        better = binary(XOp.LT, u, v)
    same = binary(XOp.EQ, u, v)
    if wide.is_float:
        u_nan, v_nan = binary(XOp.NE, u, u), binary(XOp.NE, v, v)
        worse_nan = binary(XOp.AND, u_nan, binary(XOp.EQ, v, v)) if largest else \
            binary(XOp.AND, v_nan, binary(XOp.EQ, u, u))
        better = binary(XOp.OR, better, worse_nan)
        same = binary(XOp.OR, same, binary(XOp.AND, u_nan, v_nan))
    before = binary(XOp.OR, better, binary(XOp.AND, same, binary(XOp.LT, var(j), index[axis])))
    counter = Local(rank, LType(DType.i64))
    at = flatten(tuple(local_load(counter) if a == axis else e for a, e in enumerate(index)),
                 (*shape[:axis], k, *shape[axis + 1:]))
    stores: list[Stmt] = []
    values, indices = node.outputs
    for out, value in ((values, var(v_name, LType(wide))), (indices, index[axis])):
        if out in ctx.buffers.outputs:
            stores.append(Store(ctx.buffers.outputs[out].name, at, _as(value, out.dtype)))
    body: list[Stmt] = [
        Let(v_name, _as(ctx.load(x, index, 1), wide)), counter,
        LocalStore(rank, const(0), const(0)),
        loop(j, 0, n, [Let(u_name, _as(ctx.load(x, other, 1), wide)),
                       LocalStore(rank, const(0), local_load(counter)
                                  + cast(before, DType.i64))]),
        If(binary(XOp.LT, local_load(counter), const(k)), Block(tuple(stores)))]
    return ctx.function([loop(p, 0, max(1, math.prod(shape)), body, kind=LoopKind.PARALLEL)])


__all__ = ["lower_reduction_gpu", "lower_topk_gpu"]
