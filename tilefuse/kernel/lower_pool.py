"""Pooling kernels: a one-node ``max_pool2d`` or ``avg_pool2d`` group lowered to loop IR.

The output [N, C, OH, OW] is walked plane by plane (one plane per (n, c), planes split across
threads when the kernel is large enough), then row by row and column by column; each output
element folds its window, unrolled (at most :data:`MAX_WINDOW` taps; a larger window loops
over its taps, folding into a local)::

    [parallel] for p in 0..N·C:
      for oh in 0..OH:
        for ow in 0..OW:
          h0 = oh·sh - top;  w0 = ow·sw - left
          y[p, oh, ow] = fold over (a, b) of
                         select(inside(h0 + a·dh, w0 + b·dw), x[p, clamp(h), clamp(w)], fill)

A tap's bounds test (and the clamp that keeps its load inside the plane) is emitted only along
an axis whose windows can leave the input (padding, or the ceil-mode overhang); the final
average pool of a CNN (no padding) has none. ``fill`` is -inf (or the integer minimum) for max,
0 for the sums of avg. The average divides by the taps counted: those inside the input, or with
``count_include_pad`` those inside input and padding (never the ceil-mode overhang), the
reference's rule. f16/bf16 averages sum in f32 and round once; max is exact in any type.

**Tap reductions** (:func:`is_tap_reduction`): a REDUCTION group whose anchor is a ``max``,
``sum`` or ``mean`` over axis 1 of a static [M, T, C] value computed element by element from
the group's inputs (the channels-last max pool of ``passes/conv_lowering.py``: the
``window_patches`` of the padded NHWC input reshaped to [N·OH·OW, KH·KW, C]; a global average
pool of an activation matrix). It lowers to rows across threads, the T taps unrolled (at most
:data:`MAX_WINDOW`) and vectors along the contiguous C::

    [parallel] for m in 0..M:
      vectorized for c in 0..C step W:  y[m, c:+W] = fold over t of x[m, t, c:+W]
      for c in ..C:                     (the same, one element at a time)
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np

from tilefuse.dtypes import DType
from tilefuse.errors import CompileError
from tilefuse.graph.ir import Node, Value
from tilefuse.kernel.access import NotVectorizable, dims
from tilefuse.kernel.fusion import KernelKind
from tilefuse.kernel.lower_elementwise import (
    KernelContext,
    fit_lanes,
    outer_loop,
    run_loops,
    vector_width,
)
from tilefuse.kernel.scalar_expr import ElementBuilder, KernelGroupLike, Override
from tilefuse.kernel.schedule import PARALLEL_MIN_ELEMENTS
from tilefuse.loop.ir import (
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
    maximum,
    minimum,
    select,
    var,
)
from tilefuse.ops.registry import OpKind

if TYPE_CHECKING:
    from tilefuse.kernel.schedule import Schedule

POOL_OPS = frozenset({"max_pool2d", "avg_pool2d"})
MAX_WINDOW = 256
"""The most taps a window may have to be unrolled; larger ones loop over their taps."""


TAP_OPS = frozenset({"max", "sum", "mean"})


def is_pool_group(group: KernelGroupLike) -> bool:
    """A one-node pooling group or a tap reduction: the groups :func:`lower_pool` takes."""
    return (len(group.nodes) == 1 and group.nodes[0].op.name in POOL_OPS) or \
        is_tap_reduction(group)


def _tap_anchor(group: KernelGroupLike) -> Node | None:
    anchor = getattr(group, "anchor", None)
    if getattr(group, "kind", None) is not KernelKind.REDUCTION or anchor is None or \
            anchor.op.name not in TAP_OPS or anchor is not group.nodes[-1]:
        return None
    x, y = anchor.inputs[0], anchor.outputs[0]
    if len(x.shape) != 3 or not all(isinstance(d, int) for d in x.shape) or \
            anchor.attrs["keepdims"] or tuple(anchor.attrs["axes"] or ()) not in ((1,), (-2,)):
        return None
    if y.dtype != x.dtype or not y.dtype.is_float:
        return None
    return anchor


def is_tap_reduction(group: KernelGroupLike) -> bool:
    """A max / sum / mean over axis 1 of a static float [M, T, C] value (module docstring)."""
    anchor = _tap_anchor(group)
    return anchor is not None and anchor.inputs[0].shape[1] <= MAX_WINDOW and all(
        n is anchor or n.op.kind in (OpKind.ELEMENTWISE, OpKind.MOVEMENT) for n in group.nodes)


class _Axis:
    """One spatial axis of the pooling: input size, kernel, stride, dilation, padding."""

    def __init__(self, size: int, out: int, kernel: int, stride: int, dilation: int,
                 before: int, after: int):
        self.size, self.kernel, self.stride, self.dilation = size, kernel, stride, dilation
        self.before, self.after = before, after
        last = (out - 1) * stride + (kernel - 1) * dilation - before
        self.checked = before > 0 or last >= size  # some tap can fall outside the input

    def tap(self, start: Expr, k: int) -> tuple[Expr, Expr | None]:
        """The clamped position of tap ``k`` of the window at ``start``, and whether it is
        inside the input (None: always)."""
        at = start + k * self.dilation
        if not self.checked:
            return at, None
        inside = binary(XOp.AND, binary(XOp.GE, at, 0), binary(XOp.LT, at, self.size))
        return minimum(maximum(at, 0), self.size - 1), inside

    def count(self, start: Expr, include_pad: bool) -> Expr | int:
        """How many taps of the window at ``start`` the average divides by (no dilation)."""
        if not self.checked:
            return self.kernel
        lo, hi = (-self.before, self.size + self.after) if include_pad else (0, self.size)
        return minimum(start + self.kernel, hi) - maximum(start, lo)


def _fill(dtype: DType) -> float:
    if dtype.is_float:
        return -math.inf
    return float(np.iinfo(dtype.np).min)


def _window(ctx: KernelContext, node_name: str, plane: Expr, rows: _Axis, cols: _Axis,
            h0: Expr, w0: Expr, work: DType) -> Expr:
    """The fold of the window at (h0, w0): its max, or its sum (in ``work``)."""
    buf = ctx.buffers.inputs[ctx.group.nodes[0].inputs[0]]
    is_max = node_name == "max_pool2d"
    fill = const(_fill(buf.dtype) if is_max else 0.0, work)
    acc: Expr | None = None
    for a in range(rows.kernel):
        h, h_in = rows.tap(h0, a)
        for b in range(cols.kernel):
            w, w_in = cols.tap(w0, b)
            value = buf.load(plane + h * cols.size + w)
            if value.type.dtype != work:
                value = cast(value, work)
            inside = h_in if w_in is None else w_in if h_in is None else binary(
                XOp.AND, h_in, w_in)
            if inside is not None:
                value = select(inside, value, fill)
            acc = value if acc is None else (maximum(acc, value) if is_max
                                             else binary(XOp.ADD, acc, value))
    assert acc is not None
    return acc


def lower_taps(group: KernelGroupLike, schedule: Schedule | None = None) -> LoopFunction:
    """The loop IR of a tap reduction (module docstring)."""
    anchor = _tap_anchor(group)
    if anchor is None or not is_tap_reduction(group):
        raise CompileError(f"kernel {group.name}: not a reduction over the taps of [M, T, C]")
    x, y = anchor.inputs[0], anchor.outputs[0]
    m, taps, c = dims(x.shape)
    work = DType.f32 if y.dtype in (DType.f16, DType.bf16) else y.dtype
    ctx = KernelContext.of(group)
    out = ctx.buffers.outputs[y]
    lanes = fit_lanes(vector_width(schedule) if schedule is not None and
                      schedule.vector_axis else 16, c)

    clamped_pad = _clamped_pad(group, anchor)

    def runs(row: Expr) -> list[Stmt]:
        def body(i: Expr, width: int) -> list[Stmt]:
            b = ctx.builder(_clamped_read(clamped_pad, lambda: b) if clamped_pad else None)
            values = []
            for t in range(taps):
                value = b.value(x, (row, const(t), i), width, 1)
                values.append(value if value.type.dtype == work else cast(value, work))
            acc = _tree_fold(values, anchor.op.name == "max")
            if anchor.op.name == "mean":
                acc = binary(XOp.DIV, acc, const(float(taps), work, width))
            if acc.type.dtype != y.dtype:
                acc = cast(acc, y.dtype)
            return [*b.lets, Store(out.name, row * c + i, acc)]
        return run_loops(ctx.names, 0, c, lanes, body)

    threads = max(1, min(os.cpu_count() or 1, m * taps * c // PARALLEL_MIN_ELEMENTS))
    tile = -(-m // threads) if threads > 1 and m > 1 else None
    try:
        return ctx.function(outer_loop(ctx.names, m, tile, runs))
    except NotVectorizable:  # lanes strided in some input (an NCHW input's transpose): scalars
        lanes = 1
        return ctx.function(outer_loop(ctx.names, m, tile, runs))


def _clamped_pad(group: KernelGroupLike, anchor: Node) -> Node | None:
    """The pad to read as a clamped load, with no bounds test and no select, in a max over the
    taps of a ``-inf`` padded input; None for any other group. Max is idempotent, and with unit
    dilation along each padded axis and less padding on either side than the kernel's extent,
    every window holds a real element, so a tap outside the input clamped to the nearest edge
    reads an element of its own window: the max is unchanged. (ResNet-50's first max pool,
    112x112x64: the generic pad's masks and selects cost more than the loads.)"""
    pads = [n for n in group.nodes if n.op.name == "pad"]
    windows = [n for n in group.nodes if n.op.name == "window_patches"]
    if anchor.op.name != "max" or len(pads) != 1 or len(windows) != 1:
        return None
    pad, window = pads[0], windows[0]
    readers = [n for n in group.nodes if pad.outputs[0] in n.inputs]
    if readers != [window] or pad.outputs[0] in group.outputs or \
            pad.attrs["mode"] != "constant" or pad.attrs["value"] != -math.inf:
        return None
    kernel, pp = window.attrs["kernel"], pad.attrs["pads"]
    if len(dims(pad.outputs[0].shape)) != 4 or any(pp[i] for i in (0, 1, 6, 7)) or \
            tuple(window.attrs["dilations"]) != (1, 1) or \
            any(pp[2 * a] >= kernel[a - 1] or pp[2 * a + 1] >= kernel[a - 1] for a in (1, 2)):
        return None
    return pad


def _clamped_read(pad: Node, builder: Callable[[], ElementBuilder]) -> dict[Value, Override]:
    """The override of :func:`_clamped_pad`'s pad: its source at the index clamped inside."""
    source, pp = pad.inputs[0], pad.attrs["pads"]
    shape = dims(source.shape)

    def clamped(index: tuple[Expr, ...], lanes: int) -> Expr:
        at = tuple(minimum(maximum(i - pp[2 * a], 0), shape[a] - 1)
                   if pp[2 * a] or pp[2 * a + 1] else i for a, i in enumerate(index))
        return builder().value(source, at, lanes, 1)
    return {pad.outputs[0]: clamped}


def _tree_fold(values: list[Expr], is_max: bool) -> Expr:
    """The max (or sum) of ``values`` as a balanced tree: a chain of T folds is T dependent
    steps (a NaN-propagating max is a compare and a masked move, ~4 cycles each), a tree
    log2(T); the taps' loads are independent, so the tree keeps the load ports busy."""
    while len(values) > 1:
        paired = [maximum(a, b) if is_max else binary(XOp.ADD, a, b)
                  for a, b in zip(values[::2], values[1::2])]
        values = paired + values[len(paired) * 2:]
    return values[0]


def _window_loop(ctx: KernelContext, node_name: str, plane: Expr, rows: _Axis, cols: _Axis,
                 h0: Expr, w0: Expr, work: DType) -> tuple[list[Stmt], Expr]:
    """:func:`_window` for a window over :data:`MAX_WINDOW` taps: loops over its taps (not
    unrolled) folding into a local; the statements and the fold."""
    buf = ctx.buffers.inputs[ctx.group.nodes[0].inputs[0]]
    is_max = node_name == "max_pool2d"
    fill = const(_fill(buf.dtype) if is_max else 0.0, work)
    acc = Local(ctx.names.fresh("acc"), LType(work), 1)
    a, b = ctx.names.fresh("a"), ctx.names.fresh("b")
    h, h_in = rows.tap(h0, var(a))  # type: ignore[arg-type]
    w, w_in = cols.tap(w0, var(b))  # type: ignore[arg-type]
    value = buf.load(plane + h * cols.size + w)
    if value.type.dtype != work:
        value = cast(value, work)
    inside = h_in if w_in is None else w_in if h_in is None else binary(XOp.AND, h_in, w_in)
    if inside is not None:
        value = select(inside, value, fill)
    folded = maximum(acc.load(0), value) if is_max else binary(XOp.ADD, acc.load(0), value)
    taps = loop(a, 0, rows.kernel, [loop(b, 0, cols.kernel,
                                         [LocalStore(acc.name, const(0), folded)])])
    return [acc, LocalStore(acc.name, const(0), fill), taps], acc.load(0)


class PoolWindow:
    """One ``max_pool2d`` / ``avg_pool2d`` node's window, as the CPU (a plane per task) and the
    GPU (a thread per output, :mod:`tilefuse.kernel.lower_gpu_pool`) lowerings both walk it:
    :meth:`value` is the pooled value of the output at (``i``, ``j``) of one plane."""

    def __init__(self, node: Node, ctx: KernelContext):
        x, y = node.inputs[0], node.outputs[0]
        _, _, h, w = dims(x.shape)
        self.out_shape: tuple[int, int, int, int] = dims(y.shape)  # type: ignore[assignment]
        oh, ow = self.out_shape[2:]
        kh, kw = node.attrs["kernel"]
        sh, sw = node.attrs["stride"]
        dh, dw = node.attrs.get("dilation", (1, 1))
        top, left, bottom, right = node.attrs["padding"]
        self.node, self.ctx, self.dtype = node, ctx, y.dtype
        self.rows = _Axis(h, oh, kh, sh, dh, top, bottom)
        self.cols = _Axis(w, ow, kw, sw, dw, left, right)
        self.is_max = node.op.name == "max_pool2d"
        self.work = y.dtype if self.is_max or y.dtype not in (DType.f16, DType.bf16) \
            else DType.f32
        self.out = ctx.buffers.outputs[y].name
        self.include_pad = bool(node.attrs.get("count_include_pad", False))

    @staticmethod
    def of(group: KernelGroupLike) -> PoolWindow:
        """The window of a one-node pooling group; CompileError for any other group."""
        if not (len(group.nodes) == 1 and group.nodes[0].op.name in POOL_OPS):
            raise CompileError(f"kernel {group.name}: pool lowering takes one max_pool2d or "
                               "avg_pool2d node")
        (node,) = group.nodes
        if node.inputs[0] not in group.inputs or node.outputs[0] not in group.outputs:
            raise CompileError(f"kernel {group.name}: {node.op.name} must read and write "
                               "buffers")
        return PoolWindow(node, KernelContext.of(group))

    def value(self, plane_start: Expr, i: Expr, j: Expr) -> tuple[list[Stmt], Expr]:
        """The statements (a tap loop over :data:`MAX_WINDOW` taps, else none) and the pooled
        value, in the output's dtype, of output (``i``, ``j``) of the plane whose input starts
        at ``plane_start``."""
        h0 = i * self.rows.stride - self.rows.before
        w0 = j * self.cols.stride - self.cols.before
        name, taps = self.node.op.name, []
        if self.rows.kernel * self.cols.kernel > MAX_WINDOW:
            taps, acc = _window_loop(self.ctx, name, plane_start, self.rows, self.cols, h0, w0,
                                     self.work)
        else:
            acc = _window(self.ctx, name, plane_start, self.rows, self.cols, h0, w0, self.work)
        if not self.is_max:
            count = binary(XOp.MUL, as_i64(self.rows.count(h0, self.include_pad)),
                           as_i64(self.cols.count(w0, self.include_pad)))
            acc = binary(XOp.DIV, acc, cast(count, self.work))
        return taps, acc if acc.type.dtype == self.dtype else cast(acc, self.dtype)


def lower_pool(group: KernelGroupLike, schedule: Schedule | None = None) -> LoopFunction:
    """The loop IR of a one-node pooling group or a tap reduction (see the module docstring);
    CompileError when the group is neither. A window over :data:`MAX_WINDOW` taps loops over
    them instead of unrolling."""
    if is_tap_reduction(group):
        return lower_taps(group, schedule)
    pool = PoolWindow.of(group)
    n, c, oh, ow = pool.out_shape
    h, w = pool.rows.size, pool.cols.size
    ctx = pool.ctx

    def plane_body(p: Expr) -> list[Stmt]:
        i, j = ctx.names.fresh("oh"), ctx.names.fresh("ow")
        taps, acc = pool.value(p * (h * w), var(i), var(j))
        store = Store(pool.out, (p * oh + var(i)) * ow + var(j), acc)
        return [loop(i, 0, oh, [loop(j, 0, ow, [*taps, store])])]

    planes = n * c
    taps_per_output = pool.rows.kernel * pool.cols.kernel
    threads = max(1, min(os.cpu_count() or 1,
                         planes * oh * ow * taps_per_output // PARALLEL_MIN_ELEMENTS))
    tile = -(-planes // threads) if threads > 1 and planes > 1 else None
    return ctx.function(outer_loop(ctx.names, planes, tile, plane_body))


def as_i64(value: Expr | int) -> Expr:
    return value if isinstance(value, Expr) else const(value)


__all__ = ["MAX_WINDOW", "POOL_OPS", "PoolWindow", "is_pool_group", "is_tap_reduction",
           "lower_pool", "lower_taps"]
