"""Pooling (``max_pool2d``, ``avg_pool2d`` left as ops: an input that is no convolution's
activation matrix, see :mod:`tilefuse.passes.conv_lowering`) lowered for the GPU: a thread per
output element.

The CPU walks planes across threads and rows and columns inside
(:func:`tilefuse.kernel.lower_pool.lower_pool`); the GPU wants every output element busy, so
the parallel loop runs over the flat output [N, C, OH, OW] (consecutive threads take
neighbouring columns: their taps' loads coalesce) and each thread folds its window with the
CPU's code (:class:`~tilefuse.kernel.lower_pool.PoolWindow`: taps unrolled, a bounds test only
along an axis whose windows can leave the input; over ``MAX_WINDOW`` taps a loop). The
average divides by the CPU's count (``count_include_pad``, the ceil-mode overhang never
counted); f16/bf16 sums run in f32 and round once, so results equal the CPU kernel's.
"""

from __future__ import annotations

from tilefuse.kernel.lower_pool import PoolWindow
from tilefuse.kernel.scalar_expr import KernelGroupLike
from tilefuse.loop.ir import LoopFunction, LoopKind, Store, loop, var


def lower_pool_gpu(group: KernelGroupLike) -> LoopFunction:
    """The GPU loop IR of a one-node pooling group (module docstring); CompileError for any
    other group."""
    pool = PoolWindow.of(group)
    n, c, oh, ow = pool.out_shape
    total = n * c * oh * ow
    if not total:
        return pool.ctx.function([])
    o = pool.ctx.names.fresh("o")
    plane = var(o) // (oh * ow)
    taps, acc = pool.value(plane * (pool.rows.size * pool.cols.size), (var(o) // ow) % oh,
                           var(o) % ow)
    return pool.ctx.function([loop(o, 0, total, [*taps, Store(pool.out, var(o), acc)],
                                   kind=LoopKind.PARALLEL)])


__all__ = ["lower_pool_gpu"]
