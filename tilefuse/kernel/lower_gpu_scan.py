"""Scans (``cumsum``, ``cumprod``: :mod:`tilefuse.ops.scan`) lowered for the GPU: a thread per
line.

The input [pre, n, post] (``n`` the scanned axis) has ``pre·post`` independent lines; the
parallel loop runs over them (consecutive threads take neighbouring columns when ``post`` > 1,
so their loads coalesce) and each thread walks its line in order, keeping the running value
in the CPU scan's working type (i64 for integers and bools, f32 for f16/bf16; each output
rounded once) and storing every prefix::

    parallel for l in 0..pre·post:
      acc = identity
      for t in 0..n:
        acc = acc ⊕ x[(l / post · n + t)·post + l % post];  y[same] = acc

The order of the operations is NumPy's, so results match the CPU's kernel exactly. The work
is serial along the axis: right for position ids and masks (a few thousand elements a line),
not for one very long line, which would want a block-wide parallel scan.
"""

from __future__ import annotations

from tilefuse.kernel.lower_scan import scan_parts
from tilefuse.kernel.scalar_expr import KernelGroupLike
from tilefuse.loop.ir import (
    Local,
    LocalStore,
    LoopFunction,
    LoopKind,
    LType,
    Store,
    binary,
    cast,
    const,
    loop,
    var,
)


def lower_scan_gpu(group: KernelGroupLike) -> LoopFunction:
    """The GPU loop IR of a one-node scan group (module docstring)."""
    s = scan_parts(group)
    y, pre, n, post, combine, acc_type = s.y, s.pre, s.n, s.post, s.combine, s.acc_type
    ctx, src, out = s.ctx, s.src, s.out
    if not pre * n * post:
        return ctx.function([])
    line, t = ctx.names.fresh("l"), ctx.names.fresh("t")
    acc = Local(ctx.names.fresh("acc"), LType(acc_type), 1)
    lv = var(line)
    at = (lv // post * n + var(t)) * post + lv % post if post > 1 else lv * n + var(t)
    value = src.load(at, 1)
    value = value if value.dtype is acc_type else cast(value, acc_type)
    step = binary(combine, acc.load(0), value)
    stored = acc.load(0) if acc_type is y.dtype else cast(acc.load(0), y.dtype)
    body = [acc, LocalStore(acc.name, const(0), const(1 if combine.name == "MUL" else 0,
                                                       acc_type)),
            loop(t, 0, n, [LocalStore(acc.name, const(0), step), Store(out.name, at, stored)])]
    return ctx.function([loop(line, 0, pre * post, body, kind=LoopKind.PARALLEL)])


__all__ = ["lower_scan_gpu"]
