"""Long column sums split in two for the GPU: more threads, shorter folds.

The GPU lowers a reduction over axes that are not trailing (a ``sum`` over the rows of a
``[4096, 768]`` gradient: a bias's or a layer norm's weight gradient) as a thread per output
element folding the reduced elements in a serial loop
(:mod:`tilefuse.kernel.lower_gpu_reduce`). With few outputs and a long fold that is a handful
of blocks on a GPU of 132 SMs, each thread waiting on 4096 loads in turn: GPT-2 small's
backward has ~100 such kernels, and they were most of its step time.

:func:`split_long_sums` rewrites such a ``sum`` (reduced count >= :data:`MIN_FOLD`, at most
:data:`MAX_OUTPUTS` outputs, not a row reduction) as two: one reduced axis ``n`` is viewed as
``[s, n / s]`` (a reshape), the first sum folds everything but the ``s`` axis (``s`` times the
threads, each fold ``s`` times shorter), the second folds the ``s`` partial sums. The partial
sums are f32 for a half-precision sum (the one-kernel fold accumulated in f32 too), cast back
after the second sum. ``s`` is the largest divisor of ``n`` that keeps the first sum at most
:data:`TARGET_THREADS` outputs and each of its folds at least :data:`MIN_PART` long.
"""

from __future__ import annotations

import math

from tilefuse.dtypes import DType
from tilefuse.graph.builder import GraphBuilder
from tilefuse.graph.ir import Graph, Node, Value
from tilefuse.kernel.classify import reduced_axes, row_width

MIN_FOLD = 256
"""Reduced counts below this stay one kernel."""
MAX_OUTPUTS = 16384
"""Sums with more outputs than this already fill the GPU with a thread per output."""
TARGET_THREADS = 65536
"""The most outputs the first (partial) sum gets."""
MIN_PART = 16
"""The shortest fold the first sum's threads get."""
HALF = frozenset({DType.f16, DType.bf16})


def _static(shape: tuple) -> bool:
    return all(isinstance(d, int) for d in shape)


def _split(node: Node) -> tuple[int, int] | None:
    """(axis, s) to split ``node``'s input at, or None to leave it one kernel."""
    if node.op.name != "sum" or row_width(node) or not node.inputs:
        return None
    x = node.inputs[0]
    shape = tuple(x.shape)
    if not _static(shape) or not _static(tuple(node.outputs[0].shape)):
        return None
    axes = reduced_axes(node) or ()
    count = math.prod(shape[a] for a in axes)
    outputs = math.prod(shape) // max(count, 1)
    if count < MIN_FOLD or outputs > MAX_OUTPUTS or outputs == 0:
        return None
    best: tuple[int, int] | None = None
    for a in axes:
        n = shape[a]
        for s in range(n, 1, -1):
            if n % s or s * outputs > TARGET_THREADS or count // s < MIN_PART:
                continue
            if best is None or s > best[1]:
                best = (a, s)
            break
    return best


def split_long_sums(graph: Graph) -> Graph:
    """``graph`` with each long, narrow non-row ``sum`` as two sums (module docstring); the
    same graph when there is none."""
    plans = {node: _split(node) for node in graph.nodes}
    if not any(plans.values()):
        return graph
    b = GraphBuilder(graph.name)
    renamed: dict[Value, Value] = {v: b.input(v.type, v.name) for v in graph.inputs}
    for node in graph.nodes:
        inputs = tuple(renamed.get(v, v) for v in node.inputs)
        plan = plans[node]
        if plan is None:
            b.append(node if inputs == node.inputs else
                     Node(node.op, inputs, node.attrs, node.outputs, node.loc))
            continue
        axis, s = plan
        (x,) = inputs
        shape = tuple(x.shape)
        axes = reduced_axes(node) or ()
        out = node.outputs[0]
        if x.dtype in HALF:
            x = b.add1("cast", [x], {"dtype": DType.f32}, node.loc)
        split = (*shape[:axis], s, shape[axis] // s, *shape[axis + 1:])
        x = b.add1("reshape", [x], {"shape": split}, node.loc)
        # in the split shape, axis stays s's position; axes after it move by one
        first_axes = tuple(a + 1 if a >= axis else a for a in axes)
        partial = b.add1("sum", [x], {"axes": first_axes, "keepdims": False}, node.loc)
        s_axis = sum(1 for a in range(axis) if a not in axes)   # s among the kept axes
        total = b.add1("sum", [partial], {"axes": (s_axis,), "keepdims": False}, node.loc)
        if total.dtype is not out.dtype:
            total = b.add1("cast", [total], {"dtype": out.dtype}, node.loc)
        if tuple(total.shape) != tuple(out.shape):
            total = b.add1("reshape", [total], {"shape": tuple(out.shape)}, node.loc)
        renamed[out] = total
    return b.build([renamed.get(v, v) for v in graph.outputs])


__all__ = ["split_long_sums"]
