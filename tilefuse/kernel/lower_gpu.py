"""Kernel groups lowered for the GPU execution model (:mod:`tilefuse.codegen.llvm_nvptx`).

The loop IR is the CPU's; what differs is the shape of the nest a GPU wants:

* **elementwise**: one parallel loop over the flat output index, one element per iteration
  (16 bytes per iteration, as one vector access, for flat kernels whose operands all have the
  output's layout).
  The grid-stride mapping gives consecutive threads consecutive elements, so every load of an
  operand with the output's layout is coalesced; broadcast operands are read through the
  index arithmetic. (The CPU nest instead walks rows of vectors per thread.)
* **row reductions** (softmax, layer norm, ...): the CPU row lowering with rows as the
  parallel loop and a vector width of 32·k, compiled with vectors spread over warps
  (:mod:`tilefuse.codegen.simt`): a warp per row, coalesced 16-byte accesses, reductions by
  warp shuffles; values are recomputed rather than stored between passes (softmax's exp costs
  one special-function instruction, a stored row a write and a read of DRAM). Rows whose length
  is not a multiple of 32 (but at least 32) take one element a thread a warp iteration and end
  in a scalar tail of ``n % 32`` elements that every thread of the warp computes alike (a
  decode step's softmax over 2049 keys); shorter ones fall back to a thread per row.
* **movement**: the CPU lowering with the flat domain as the parallel loop, scalar code.

:func:`gpu_schedule` is the schedule data those lowerings take; :func:`lower_group_gpu`
dispatches, raising CompileError for kinds with no GPU lowering (contractions today), which the
executable then runs on the host.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from tilefuse.errors import CompileError
from tilefuse.graph.ir import Value
from tilefuse.kernel.access import NotVectorizable, dims, squeezed, unflatten
from tilefuse.kernel.fusion import KernelGroup, KernelKind
from tilefuse.kernel.lower_elementwise import KernelContext
from tilefuse.kernel.lower_gpu_index import GatherContext, flat_movement, has_gather
from tilefuse.kernel.schedule import Schedule, iteration_axes
from tilefuse.loop.ir import (
    Block,
    Expr,
    For,
    If,
    LoopFunction,
    LoopKind,
    Stmt,
    XOp,
    expr_children,
    loop,
    var,
    walk_expr,
    walk_stmts,
)
from tilefuse.loop.verify import MAX_UNROLL
from tilefuse.ops.registry import OpKind

GPU_KINDS = frozenset({KernelKind.ELEMENTWISE, KernelKind.ROW_REDUCTION, KernelKind.MOVEMENT,
                       KernelKind.REDUCTION})


WARP = 32


@dataclass(frozen=True)
class GpuLowered:
    """A kernel's GPU loop IR and how its vectors map to threads: ``simt_width`` 1 means
    per-thread vectors; 32 means every vector spans a warp (:mod:`tilefuse.codegen.simt`)."""

    fn: LoopFunction
    simt_width: int = 1
    block: int | None = None
    """Threads per block when the lowering needs other than the target's default."""


def gpu_schedule(group: KernelGroup, row_unroll: int = 4) -> Schedule:
    """Row reductions: a warp per row, each thread holding up to 16 bytes of every row vector
    (vector width 32·k with the row length a multiple of it), ``row_unroll`` accumulators in
    flight; movement: one element per thread."""
    if group.kind is KernelKind.ROW_REDUCTION:
        width = _row_vector_width(group)
        unroll = (("n", row_unroll),) if width > 1 and row_unroll > 1 else ()
        return Schedule(KernelKind.ROW_REDUCTION, order=("r", "n"), parallel_axes=("r",),
                        vector_axis="n" if width > 1 else None, vector_width=width,
                        unroll=unroll)
    if group.kind is KernelKind.MOVEMENT:
        # scalars named explicitly: without a vector axis the movement lowering takes the
        # host's lanes, and a piece at an odd offset (a pad's copy) then stores vectors the GPU
        # faults on (CUDA_ERROR_MISALIGNED_ADDRESS; found by the GPU fuzzer)
        return Schedule(group.kind, order=("i",), parallel_axes=("i",), vector_axis="i",
                        vector_width=1)
    if group.kind is KernelKind.ELEMENTWISE:
        return Schedule(group.kind, order=("i",), parallel_axes=("i",))
    raise CompileError(f"kernel {group.name}: no GPU lowering for {group.kind.value} kernels "
                       f"yet")


def _row_vector_width(group: KernelGroup) -> int:
    """The vector width of a row reduction's passes: 32·k with the row a multiple of it; a
    row of another length of at least 32 (GPT-2's 50257-token vocabulary) still a warp per
    row, an element a thread, its last ``n % 32`` elements a uniform scalar tail (a thread
    per row was uncoalesced, and far slower on the loss of a language model)."""
    n = iteration_axes(group).get("n")
    if not isinstance(n, int) or n < WARP:
        return 1
    if n % WARP:
        # one element a thread: rows at odd offsets allow no wider access; the tail of n % 32
        # elements is scalar (uniform over the warp). A thread per row was 0.26 ms for a
        # decode step's softmax of 16 x 2049 on an H200.
        return WARP
    itemsize = min(v.dtype.itemsize for v in group.inputs)
    per_thread = max(1, GPU_VECTOR_BYTES // itemsize)
    while n % (WARP * per_thread):
        per_thread //= 2
    return WARP * per_thread


GPU_VECTOR_BYTES = 16
"""One 128-bit access per thread and iteration when the operands allow it."""

REGISTER_ROW = 128
"""Rows of at most this many elements per warp thread are held in registers: every loop over
the row is unrolled, so each pass reads the same SSA values and LLVM's GVN folds the passes'
loads (and recomputed values such as softmax's ``exp``) into one read of the row."""


LONG_ROW_BLOCK = 128

REGISTER_ROW_DIVISIONS = 64
"""The most integer divisions (index arithmetic of a movement prologue: a reshape/transpose
read inside the row) times unrolled trips a register row may hold. Each is per lane of a warp
vector once unrolled: the whole-tensor min/max of a DynamicQuantizeLinear fused with the
previous convolution's NCHW dequantize (14 divisions, 32 trips) took 30 s of NVPTX emission
unrolled, 0.04 s as a loop."""


def _index_divisions(fn: LoopFunction) -> int:
    return sum(1 for s in walk_stmts(fn.body) for c in expr_children(s) for e in walk_expr(c)
               if e.op in (XOp.DIV, XOp.MOD, XOp.FLOORDIV) and not e.type.dtype.is_float)



def unroll_constant_loops(s: Stmt) -> Stmt:
    """``s`` with every non-parallel loop of constant bounds marked ``unrolled`` (the code
    generator then emits one copy of the body per iteration), except loops of more than
    ``MAX_UNROLL`` trips (a row kernel's loop over other rows, say), which stay loops."""
    if isinstance(s, Block):
        return Block(tuple(unroll_constant_loops(c) for c in s.stmts))
    if isinstance(s, If):
        return If(s.cond, unroll_constant_loops(s.then),
                  None if s.else_ is None else unroll_constant_loops(s.else_))
    if isinstance(s, For):
        body = unroll_constant_loops(s.body)
        constant = s.start.op is XOp.CONST and s.stop.op is XOp.CONST and \
            -(-(s.stop.arg - s.start.arg) // s.step) <= MAX_UNROLL  # type: ignore[operator]
        kind = LoopKind.UNROLLED if constant and s.kind is not LoopKind.PARALLEL else s.kind
        return replace(s, body=body, kind=kind)
    return s


def lower_elementwise_gpu(group: KernelGroup, unroll: int = 1,
                          context: type[KernelContext] = KernelContext) -> GpuLowered:
    """One parallel loop per output shape over the flat index (module docstring); vectors of
    16 bytes when every operand has the output's layout (or is one element). With ``unroll``
    > 1 such kernels are in warp form (:mod:`tilefuse.codegen.simt`): each warp iteration
    covers ``unroll`` consecutive warp-wide runs of 16 bytes a thread, so every thread has
    ``unroll`` independent 16-byte loads in flight."""
    try:
        return _lower_elementwise_gpu(group, unroll, context, vectors=True)
    except NotVectorizable:   # a remap the planned runs do not fit: an element a thread
        return _lower_elementwise_gpu(group, unroll, context, vectors=False)


def _lower_elementwise_gpu(group: KernelGroup, unroll: int, context: type[KernelContext],
                           vectors: bool) -> GpuLowered:
    ctx = context.of(group)
    nests: dict[tuple[int, ...], list[Value]] = {}
    for v in ctx.buffers.outputs:
        nests.setdefault(squeezed(dims(v.shape)), []).append(v)
    plans = {key: _vector_plan(group, outputs, dims(outputs[0].shape))
             if key and vectors else (1, 0) for key, outputs in nests.items()}
    warp = unroll > 1 and all(
        key and lanes > 1 and (axes == len(dims(nests[key][0].shape))
                               or key[-1] % (WARP * lanes) == 0)
        for key, (lanes, axes) in plans.items())
    body: list[Stmt] = []
    for key, outputs in nests.items():
        shape = dims(outputs[0].shape)
        if not shape:
            body.extend(ctx.store_body(outputs, (), 1, 0))
            continue
        lanes, block_axes = plans[key]
        runs = _warp_runs(lanes, unroll) if warp else ((lanes, 1), (1, 1))
        start = 0
        for width, count in runs:
            stop = start + (math.prod(shape) - start) // (width * count) * width * count
            if stop > start:
                i = ctx.names.fresh("i")
                body.append(loop(i, start, stop, _unrolled_stores(
                    ctx, outputs, shape, var(i), width, count,
                    block_axes if width > 1 else 0), width * count, kind=LoopKind.PARALLEL))
            start = stop
    return GpuLowered(ctx.function(body), WARP if warp else 1)


def _warp_runs(lanes: int, unroll: int) -> tuple[tuple[int, int], ...]:
    """(vector width, runs per iteration) of the warp-form loops, widest first: ``unroll``
    runs of 16 bytes a thread, single such runs, an element a thread, then uniform scalars
    (every thread of the warp computes the same element)."""
    return ((WARP * lanes, unroll), (WARP * lanes, 1), (WARP, 1), (1, 1))


def _unrolled_stores(ctx: KernelContext, outputs: list[Value], shape: tuple[int, ...],
                     i: Expr, width: int, count: int, block_axes: int) -> list[Stmt]:
    if count == 1:
        return ctx.store_body(outputs, unflatten(i, shape), width, block_axes)
    j = ctx.names.fresh("j")
    at = unflatten(i + var(j) * width, shape)
    return [loop(j, 0, count, ctx.store_body(outputs, at, width, block_axes),
                 kind=LoopKind.UNROLLED)]


def _vector_plan(group: KernelGroup, outputs: list[Value], shape: tuple[int, ...]
                 ) -> tuple[int, int]:
    """(lanes, block axes) for the flat loop: 16 bytes of the widest output's elements when the
    vector accesses are provably lane-aligned, else scalars. Pure elementwise nodes whose inputs
    all have ``shape`` (or one element) run vectors over the flat index (block = every axis);
    inputs broadcast along leading axes only (a bias ``[n]`` of ``[m, n]``) allow vectors along
    the last axis when ``n`` is a multiple of the lanes (a run never crosses a row, and starts
    at a lane multiple of every operand)."""
    pure = all(n.op.kind is OpKind.ELEMENTWISE or n.op.name == "constant" for n in group.nodes)
    lanes = max(1, GPU_VECTOR_BYTES // max(v.dtype.itemsize for v in outputs))
    sizes = [dims(v.shape) for v in group.inputs]
    if not pure and lanes > 1 and _aligned_remap(group, shape, lanes):
        return lanes, 1
    if not pure or lanes == 1:
        return 1, 0
    if all(d == shape or math.prod(d) == 1 for d in sizes):
        return lanes, len(shape)
    if shape[-1] % lanes == 0 and all(d == shape or math.prod(d) == 1
                                      or _leading_broadcast(d, shape) for d in sizes):
        return lanes, 1
    return 1, 0


ALIGNED_REMAPS = frozenset({"reshape", "expand_dims", "squeeze", "window_patches", "pad"})
"""Movement ops that keep a lane-aligned run of the last axis a lane-aligned run of their
operand's last axis when that axis is a multiple of the lanes (``pad`` when it leaves the
last axis alone; ``transpose`` too when it keeps the last axis last: the head split of
attention): an im2col prologue's chain."""


def _aligned_remap(group: KernelGroup, shape: tuple[int, ...], lanes: int) -> bool:
    """Whether vectors of ``lanes`` along the output's last axis are lane-aligned at every
    load of a movement group made of :data:`ALIGNED_REMAPS` and elementwise ops (an im2col of
    NHWC activations with C a multiple of the lanes: 16-byte copies of channel runs instead
    of an element a thread, measured 0.25 ms for ResNet-50's first 3x3 im2col at b32 fp16 on
    an H200). The element builder still refuses runs it cannot prove (NotVectorizable), and
    the kernel is then built an element a thread."""
    if shape[-1] % lanes:
        return False
    for node in group.nodes:
        if node.op.kind is OpKind.ELEMENTWISE or node.op.name == "constant":
            if any(dims(v.shape) != dims(node.outputs[0].shape) and math.prod(dims(v.shape)) != 1
                   for v in node.inputs):
                return False
            continue
        if node.op.name == "transpose":   # one that keeps the last axis last (heads split)
            perm = node.attrs["perm"]
            if perm[-1] % len(perm) != len(perm) - 1:
                return False
            continue
        if node.op.name not in ALIGNED_REMAPS:
            return False
        if node.op.name == "pad" and (node.attrs["mode"] != "constant" or any(
                node.attrs["pads"][-2:])):
            return False
    return all(dims(v.shape) and dims(v.shape)[-1] % lanes == 0 for v in group.inputs)


def _leading_broadcast(operand: tuple[int, ...], shape: tuple[int, ...]) -> bool:
    """Whether ``operand`` is ``shape``'s trailing dims (after leading 1s): broadcast along
    leading axes only."""
    trimmed = operand
    while trimmed and trimmed[0] == 1:
        trimmed = trimmed[1:]
    return bool(trimmed) and len(trimmed) <= len(shape) \
        and shape[len(shape) - len(trimmed):] == trimmed


def lower_group_gpu(group: KernelGroup, row_unroll: int = 4, elementwise_unroll: int = 4,
                    register_row: int = REGISTER_ROW, long_row_block: int = LONG_ROW_BLOCK
                    ) -> GpuLowered:
    """The GPU loop IR of ``group``; CompileError for kinds without a GPU lowering.

    Groups holding a gather (``take``, ``take_along_axis``) and movement groups of several
    nodes (a reshape/transpose chain, an im2col) are lowered as elementwise kernels whose
    movement ops are index arithmetic (:mod:`tilefuse.kernel.lower_gpu_index`)."""
    if has_gather(group) or (group.kind is KernelKind.MOVEMENT and flat_movement(group)):
        return lower_elementwise_gpu(replace(group, kind=KernelKind.ELEMENTWISE),
                                     elementwise_unroll, GatherContext)
    if group.kind is KernelKind.ELEMENTWISE:
        return lower_elementwise_gpu(group, elementwise_unroll)
    if group.kind is KernelKind.REDUCTION:
        from tilefuse.kernel.lower_gpu_reduce import lower_reduction_gpu

        return GpuLowered(lower_reduction_gpu(group))
    if [n.op.name for n in group.nodes] in (["cumsum"], ["cumprod"]):
        from tilefuse.kernel.lower_gpu_scan import lower_scan_gpu

        return GpuLowered(lower_scan_gpu(group))
    if group.kind is KernelKind.OPAQUE and [n.op.name for n in group.nodes] in (
            ["max_pool2d"], ["avg_pool2d"]):
        from tilefuse.kernel.lower_gpu_pool import lower_pool_gpu

        return GpuLowered(lower_pool_gpu(group))
    if group.kind is KernelKind.OPAQUE and [n.op.name for n in group.nodes] == ["topk"]:
        from tilefuse.kernel.lower_gpu_reduce import lower_topk_gpu

        return GpuLowered(lower_topk_gpu(group))
    schedule = gpu_schedule(group, row_unroll)
    if group.kind is KernelKind.ROW_REDUCTION:
        from tilefuse.kernel.lower_rows import lower_rows

        simt = WARP if schedule.vector_width > 1 else 1
        fn = lower_rows(group, schedule, store_values=False)
        n = iteration_axes(group).get("n")
        if simt > 1 and isinstance(n, int) and n // WARP <= register_row and \
                _index_divisions(fn) * (n // WARP) <= REGISTER_ROW_DIVISIONS:
            fn = replace(fn, body=unroll_constant_loops(fn.body))
            # a long register row needs ~255 registers a thread: blocks of 128 threads let an
            # SM hold 2 of them instead of 1 of 256 (measured: layer_norm [32768,4096] f32
            # 0.327 -> 0.281 ms, bf16 0.159 -> 0.149 ms on an H200)
            return GpuLowered(fn, simt, long_row_block if n // WARP > 64 else None)
        return GpuLowered(fn, simt)
    from tilefuse.kernel.lower_movement import lower_movement

    return GpuLowered(lower_movement(group, schedule))


__all__ = ["GPU_KINDS", "WARP", "GpuLowered", "gpu_schedule", "lower_elementwise_gpu",
           "lower_group_gpu"]
