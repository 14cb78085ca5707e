"""Scan kernels: a one-node ``cumsum`` or ``cumprod`` group lowered to loop IR.

The input [pre, n, post] (``n`` the scanned axis) is walked line by line along the axis. When
``post`` > 1 the lines are its columns and vectors run along them (``W`` neighbouring lines
scanned together, each lane its own running value)::

    [parallel] for q in 0..pre:
      vectorized for c in 0..post step W:          (then scalars)
        local acc: T×W = identity
        for t in 0..n:
          acc = acc ⊕ x[(q·n + t)·post + c :+W];  y[(q·n + t)·post + c :+W] = acc

When ``post`` is 1 (the last axis) each line is a scalar running value. The order of the
operations is NumPy's (one element after another), so float results match it exactly; the
running value is kept in the reference's working type (i64 for integers and bools, f32 for
f16/bf16, each output rounded once).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING

from tilefuse.dtypes import DType
from tilefuse.errors import CompileError
from tilefuse.graph.types import normalize_axis
from tilefuse.kernel.access import dims
from tilefuse.kernel.lower_elementwise import (
    KernelContext,
    fit_lanes,
    outer_loop,
    run_loops,
    vector_width,
)
from tilefuse.kernel.scalar_expr import KernelGroupLike, work_dtype
from tilefuse.kernel.schedule import PARALLEL_MIN_ELEMENTS
from tilefuse.loop.ir import (
    BufferParam,
    Expr,
    Local,
    LocalStore,
    LoopFunction,
    LType,
    Stmt,
    Store,
    XOp,
    binary,
    cast,
    const,
    loop,
    var,
)

if TYPE_CHECKING:
    from tilefuse.graph.ir import Value
    from tilefuse.kernel.schedule import Schedule

SCAN_OPS = {"cumsum": XOp.ADD, "cumprod": XOp.MUL}


def is_scan_group(group: KernelGroupLike) -> bool:
    """A one-node cumsum/cumprod group with static shapes reading and writing buffers."""
    nodes = getattr(group, "nodes", ())
    if len(nodes) != 1 or nodes[0].op.name not in SCAN_OPS:
        return False
    (node,) = nodes
    return all(isinstance(d, int) for d in node.inputs[0].shape) and \
        node.inputs[0] in group.inputs and node.outputs[0] in group.outputs


@dataclass(frozen=True)
class ScanParts:
    """What the CPU and GPU scan lowerings both start from: the scan seen as ``[pre, n, post]``
    lines along its axis, its combining op and accumulator type, and the kernel's buffers."""

    y: Value
    pre: int
    n: int
    post: int
    combine: XOp
    acc_type: DType
    ctx: KernelContext
    src: BufferParam
    out: BufferParam


def scan_parts(group: KernelGroupLike) -> ScanParts:
    """:class:`ScanParts` of a scan group; CompileError unless it is one."""
    if not is_scan_group(group):
        raise CompileError(f"kernel {group.name}: not a static one-node cumsum/cumprod")
    (node,) = group.nodes
    x, y = node.inputs[0], node.outputs[0]
    shape = dims(x.shape)
    axis = normalize_axis(node.attrs["axis"], len(shape)) if shape else 0
    n = shape[axis] if shape else 1
    pre, post = math.prod(shape[:axis]), math.prod(shape[axis + 1:])
    combine = SCAN_OPS[node.op.name]
    acc_type = work_dtype(y.dtype)
    ctx = KernelContext.of(group)
    src, out = ctx.buffers.inputs[x], ctx.buffers.outputs[y]
    return ScanParts(y, pre, n, post, combine, acc_type, ctx, src, out)


def lower_scan(group: KernelGroupLike, schedule: Schedule | None = None) -> LoopFunction:
    """The loop IR of a scan group (module docstring)."""
    s = scan_parts(group)
    y, pre, n, post, combine, acc_type = s.y, s.pre, s.n, s.post, s.combine, s.acc_type
    ctx, src, out = s.ctx, s.src, s.out
    total = pre * n * post
    threads = max(1, min(os.cpu_count() or 1, total // PARALLEL_MIN_ELEMENTS))
    lanes = fit_lanes(vector_width(schedule) if schedule is not None and
                      schedule.vector_axis else 16, post)

    def lines(q: Expr) -> list[Stmt]:
        def body(c: Expr, width: int) -> list[Stmt]:
            acc = Local(ctx.names.fresh("acc"), LType(acc_type, width), 1)
            start = const(1 if combine is XOp.MUL else 0, acc_type, width)
            t = ctx.names.fresh("t")
            at = (q * n + var(t)) * post + c
            value = src.load(at, width)
            value = value if value.dtype is acc_type else cast(value, acc_type)
            step = binary(combine, acc.load(0), value)
            stored = acc.load(0) if acc_type is y.dtype else cast(acc.load(0), y.dtype)
            return [acc, LocalStore(acc.name, const(0), start),
                    loop(t, 0, n, [LocalStore(acc.name, const(0), step),
                                   Store(out.name, at, stored)])]
        return run_loops(ctx.names, 0, post, lanes, body)

    tile = -(-pre // threads) if threads > 1 and pre > 1 else None
    return ctx.function(outer_loop(ctx.names, pre, tile, lines) if total else [])


__all__ = ["SCAN_OPS", "is_scan_group", "lower_scan"]
