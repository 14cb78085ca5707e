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
  is not a multiple of 32 fall back to a thread per row.
* **movement**: the CPU lowering with the flat domain as the parallel loop, scalar code.

:func:`gpu_schedule` is the schedule data those lowerings take; :func:`lower_group_gpu`
dispatches, raising CompileError for kinds with no GPU lowering (contractions today), which the
executable then runs on the host.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from tilefuse.errors import CompileError
from tilefuse.graph.ir import Value
from tilefuse.kernel.access import dims, squeezed, unflatten
from tilefuse.kernel.fusion import KernelGroup, KernelKind
from tilefuse.kernel.lower_elementwise import KernelContext
from tilefuse.kernel.schedule import Schedule, iteration_axes
from tilefuse.loop.ir import LoopFunction, LoopKind, Stmt, loop, var
from tilefuse.ops.registry import OpKind

GPU_KINDS = frozenset({KernelKind.ELEMENTWISE, KernelKind.ROW_REDUCTION, KernelKind.MOVEMENT})


WARP = 32


@dataclass(frozen=True)
class GpuLowered:
    """A kernel's GPU loop IR and how its vectors map to threads: ``simt_width`` 1 means
    per-thread vectors; 32 means every vector spans a warp (:mod:`tilefuse.codegen.simt`)."""

    fn: LoopFunction
    simt_width: int = 1


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
    if group.kind in (KernelKind.ELEMENTWISE, KernelKind.MOVEMENT):
        return Schedule(group.kind, order=("i",), parallel_axes=("i",))
    raise CompileError(f"kernel {group.name}: no GPU lowering for {group.kind.value} kernels "
                       f"yet")


def _row_vector_width(group: KernelGroup) -> int:
    n = iteration_axes(group).get("n")
    if not isinstance(n, int) or n % WARP:
        return 1
    itemsize = min(v.dtype.itemsize for v in group.inputs)
    per_thread = max(1, GPU_VECTOR_BYTES // itemsize)
    while n % (WARP * per_thread):
        per_thread //= 2
    return WARP * per_thread


GPU_VECTOR_BYTES = 16
"""One 128-bit access per thread and iteration when the operands allow it."""


def lower_elementwise_gpu(group: KernelGroup) -> LoopFunction:
    """One parallel loop per output shape over the flat index (module docstring); vectors of
    16 bytes when every operand has the output's layout (or is one element)."""
    ctx = KernelContext.of(group)
    nests: dict[tuple[int, ...], list[Value]] = {}
    for v in ctx.buffers.outputs:
        nests.setdefault(squeezed(dims(v.shape)), []).append(v)
    body: list[Stmt] = []
    for outputs in nests.values():
        shape = dims(outputs[0].shape)
        if not shape:
            body.extend(ctx.store_body(outputs, (), 1, 0))
            continue
        count = math.prod(shape)
        lanes, block_axes = _vector_plan(group, outputs, shape)
        whole = count - count % lanes
        for start, stop, width in ((0, whole, lanes), (whole, count, 1)):
            if stop <= start:
                continue
            i = ctx.names.fresh("i")
            stores = ctx.store_body(outputs, unflatten(var(i), shape), width,
                                    block_axes if width > 1 else 0)
            body.append(loop(i, start, stop, stores, width, kind=LoopKind.PARALLEL))
    return ctx.function(body)


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
    if not pure or lanes == 1:
        return 1, 0
    if all(d == shape or math.prod(d) == 1 for d in sizes):
        return lanes, len(shape)
    if shape[-1] % lanes == 0 and all(d == shape or math.prod(d) == 1
                                      or _leading_broadcast(d, shape) for d in sizes):
        return lanes, 1
    return 1, 0


def _leading_broadcast(operand: tuple[int, ...], shape: tuple[int, ...]) -> bool:
    """Whether ``operand`` is ``shape``'s trailing dims (after leading 1s): broadcast along
    leading axes only."""
    trimmed = operand
    while trimmed and trimmed[0] == 1:
        trimmed = trimmed[1:]
    return bool(trimmed) and len(trimmed) <= len(shape) \
        and shape[len(shape) - len(trimmed):] == trimmed


def lower_group_gpu(group: KernelGroup, row_unroll: int = 4) -> GpuLowered:
    """The GPU loop IR of ``group``; CompileError for kinds without a GPU lowering."""
    if group.kind is KernelKind.ELEMENTWISE:
        return GpuLowered(lower_elementwise_gpu(group))
    schedule = gpu_schedule(group, row_unroll)
    if group.kind is KernelKind.ROW_REDUCTION:
        from tilefuse.kernel.lower_rows import lower_rows

        simt = WARP if schedule.vector_width > 1 else 1
        return GpuLowered(lower_rows(group, schedule, store_values=False), simt)
    from tilefuse.kernel.lower_movement import lower_movement

    return GpuLowered(lower_movement(group, schedule))


__all__ = ["GPU_KINDS", "WARP", "GpuLowered", "gpu_schedule", "lower_elementwise_gpu",
           "lower_group_gpu"]
