"""Pooling (``max_pool2d``, ``avg_pool2d`` left as ops: an input that is no convolution's
activation matrix, see :mod:`tilefuse.passes.conv_lowering`) lowered for the GPU: a thread per
output element.

The CPU walks planes across threads and rows and columns inside
(:func:`tilefuse.kernel.lower_pool.lower_pool`); the GPU wants every output element busy, so
the parallel loop runs over the flat output [N, C, OH, OW] (consecutive threads take
neighbouring columns: their taps' loads coalesce) and each thread folds its window with the
CPU's code (:func:`~tilefuse.kernel.lower_pool._window`: taps unrolled, a bounds test only
along an axis whose windows can leave the input; over ``MAX_WINDOW`` taps a loop). The
average divides by the CPU's count (``count_include_pad``, the ceil-mode overhang never
counted); f16/bf16 sums run in f32 and round once, so results equal the CPU kernel's.
"""

from __future__ import annotations

from tilefuse.dtypes import DType
from tilefuse.errors import CompileError
from tilefuse.kernel.access import dims
from tilefuse.kernel.lower_elementwise import KernelContext
from tilefuse.kernel.lower_pool import MAX_WINDOW, POOL_OPS, _Axis, _window, _window_loop, as_i64
from tilefuse.kernel.scalar_expr import KernelGroupLike
from tilefuse.loop.ir import LoopFunction, LoopKind, Stmt, Store, XOp, binary, cast, loop, var


def is_pool_op_group(group: KernelGroupLike) -> bool:
    """A one-node ``max_pool2d`` / ``avg_pool2d`` group."""
    return len(group.nodes) == 1 and group.nodes[0].op.name in POOL_OPS


def lower_pool_gpu(group: KernelGroupLike) -> LoopFunction:
    """The GPU loop IR of a one-node pooling group (module docstring)."""
    if not is_pool_op_group(group):
        raise CompileError(f"kernel {group.name}: the GPU pool lowering takes one max_pool2d "
                           f"or avg_pool2d node")
    (node,) = group.nodes
    x, y = node.inputs[0], node.outputs[0]
    if x not in group.inputs or y not in group.outputs:
        raise CompileError(f"kernel {group.name}: {node.op.name} must read and write buffers")
    n, c, h, w = dims(x.shape)
    _, _, oh, ow = dims(y.shape)
    kh, kw = node.attrs["kernel"]
    sh, sw = node.attrs["stride"]
    dh, dw = node.attrs.get("dilation", (1, 1))
    top, left, bottom, right = node.attrs["padding"]
    rows = _Axis(h, oh, kh, sh, dh, top, bottom)
    cols = _Axis(w, ow, kw, sw, dw, left, right)
    is_max = node.op.name == "max_pool2d"
    work = y.dtype if is_max or y.dtype not in (DType.f16, DType.bf16) else DType.f32
    ctx = KernelContext.of(group)
    out = ctx.buffers.outputs[y]
    include_pad = bool(node.attrs.get("count_include_pad", False))
    total = n * c * oh * ow
    if not total:
        return ctx.function([])
    o = ctx.names.fresh("o")
    plane = var(o) // (oh * ow)
    i, j = (var(o) // ow) % oh, var(o) % ow
    h0, w0 = i * sh - top, j * sw - left
    taps: list[Stmt] = []
    if kh * kw > MAX_WINDOW:
        taps, acc = _window_loop(ctx, node.op.name, plane * (h * w), rows, cols, h0, w0, work)
    else:
        acc = _window(ctx, node.op.name, plane * (h * w), rows, cols, h0, w0, work)
    if not is_max:
        count = binary(XOp.MUL, as_i64(rows.count(h0, include_pad)),
                       as_i64(cols.count(w0, include_pad)))
        acc = binary(XOp.DIV, acc, cast(count, work))
    if acc.type.dtype != y.dtype:
        acc = cast(acc, y.dtype)
    return ctx.function([loop(o, 0, total, [*taps, Store(out.name, var(o), acc)],
                              kind=LoopKind.PARALLEL)])


__all__ = ["is_pool_op_group", "lower_pool_gpu"]
