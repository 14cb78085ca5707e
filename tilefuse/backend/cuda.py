"""The CUDA back end: a kernel plan lowered and compiled to PTX, as a
:class:`~tilefuse.runtime.gpu.GpuProgram` that :class:`~tilefuse.runtime.gpu.CudaExecutable`
runs. Nothing here needs a GPU but :func:`build_cuda`, which asks the device its compute
capability and loads the program.

:func:`build_gpu_program` takes the driver's kernel plan (:func:`tilefuse.driver.plan_kernels`:
composites decomposed, kernel groups), folds constant groups, lowers each group with the GPU
lowerings (:mod:`tilefuse.kernel.lower_gpu`) and compiles it to PTX
(:mod:`tilefuse.codegen.llvm_nvptx`). A matmul group becomes a cuBLAS product
(:mod:`tilefuse.runtime.cublas`) followed by its epilogue as a generated elementwise kernel. An
attention group is one fused kernel (:mod:`tilefuse.codegen.nvptx_attention`); an attention
that kernel does not take is decomposed first and runs unfused (logged on the ``fallback``
topic, :mod:`tilefuse.kernel.lower_gpu_attention`). A group with no GPU lowering becomes a host
step run with the NumPy references; the step's reason is logged on the ``fallback`` topic.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tilefuse.codegen.llvm_nvptx import SM90, GpuTarget, compile_ptx, launch_extent
from tilefuse.codegen.nvptx_attention import flash_attention
from tilefuse.codegen.nvptx_mma import mma_gemm, supports
from tilefuse.errors import CompileError
from tilefuse.graph.ir import Graph
from tilefuse.graph.types import is_static
from tilefuse.kernel.access import kernel_buffers
from tilefuse.kernel.fusion import KernelGroup, KernelKind, KernelPlan
from tilefuse.kernel.lower_gpu import GPU_KINDS, lower_group_gpu
from tilefuse.kernel.lower_gpu_attention import (
    attention_alternatives,
    causal_mask,
    group_attention,
)
from tilefuse.kernel.lower_gpu_contraction import split_contraction
from tilefuse.kernel.lower_gpu_product import lower_product_gpu
from tilefuse.kernel.lower_gpu_qmatmul import quantized_node, quantized_step
from tilefuse.kernel.lower_gpu_scatter import (
    lower_scatter_elements_gpu,
    lower_scatter_nd_gpu,
    scatter_node,
)
from tilefuse.kernel.lower_matmul import matmul_shape
from tilefuse.log import get_logger
from tilefuse.loop.ir import LoopFunction
from tilefuse.runtime.cublas import CUBLAS_DTYPES, GemmShape
from tilefuse.runtime.cuda_driver import CudaContext
from tilefuse.runtime.gpu import (
    CudaExecutable,
    FusedStep,
    GemmStep,
    GpuKernel,
    GpuProgram,
    GpuStep,
    HostGroup,
    evaluate_group,
)
from tilefuse.schedules.database import TuningDatabase
from tilefuse.schedules.gpu import tuned_target


def build_gpu_program(graph: Graph, target: GpuTarget = SM90,
                      dump_dir: Path | str | None = None,
                      database: TuningDatabase | None = None,
                      plan: KernelPlan | None = None) -> GpuProgram:
    """Plans, lowers and compiles ``graph`` to PTX (see the module docstring); a kernel with
    a schedule measured in ``database`` (looked up by :mod:`tilefuse.schedules.gpu`) is built
    with it."""
    for v in [*graph.inputs, *(o for n in graph.nodes for o in n.outputs)]:
        if not is_static(v.shape):
            raise CompileError(f"the cuda target needs static shapes, got {v.type}")
    if plan is None:  # the driver's kernel formation (it passes the plan it made)
        from tilefuse.driver import plan_kernels

        plan = plan_kernels(graph, "cuda")
    graph = plan.graph
    constants = {n.output: n.attrs["value"].array for n in graph.nodes
                 if n.op.name == "constant"}
    program = GpuProgram(graph, target, constants)
    log = get_logger("fallback")
    for group in plan.groups:
        if all(v in constants for v in group.inputs):
            evaluate_group(group.nodes, constants)
            continue
        try:
            if group.kind is KernelKind.CONTRACTION:
                program.steps.extend(_contraction_steps(group, target))
                log.debug("kernel %s: product through cuBLAS, epilogue generated", group.name)
            elif group.kind is KernelKind.ATTENTION:
                shape, bindings = group_attention(group)
                causal = shape.mask is not None and causal_mask(
                    constants.get(bindings[3]), shape.sq, shape.sk)
                program.steps.append(FusedStep(group, flash_attention(shape, target=target),
                                               bindings, attention_alternatives(shape, causal)))
            elif quantized_node(group) is not None:   # matmul_wq: lower_gpu_qmatmul
                program.steps.append(FusedStep(group, *quantized_step(group, target)))
            elif scatter_node(group) is not None:     # lower_gpu_scatter
                program.steps.extend(_scatter_steps(group, target))
            else:
                program.steps.append(compile_group(
                    group, tuned_target(group, constants, target, database)))
        except CompileError as err:
            reason = str(err) if group.kind in GPU_KINDS | {KernelKind.CONTRACTION,
                                                            KernelKind.ATTENTION} \
                or quantized_node(group) is not None or scatter_node(group) is not None else \
                f"no GPU lowering for {group.kind.value} kernels yet"
            ops = ", ".join(dict.fromkeys(n.op.name for n in group.nodes))
            log.warning("kernel %s (%s) runs on the host under the cuda target: %s",
                        group.name, ops, reason)
            program.steps.append(HostGroup(group, reason))
    if dump_dir is not None:
        program.dump(dump_dir)
    return program


STRIDE_BLOCKS = 132 * 16
"""Blocks a launch whose iteration count is not a constant gets (its loops stride over the
rest)."""


def compile_group(group: KernelGroup, target: GpuTarget) -> GpuKernel:
    """One generated kernel of ``group`` with ``target``'s knobs (CompileError if none)."""
    lowered = lower_group_gpu(group, target.row_unroll, target.elementwise_unroll,
                              target.register_row, target.long_row_block)
    return kernel_step(group, lowered.fn, target, simt_width=lowered.simt_width,
                       block=lowered.block)


def _contraction_steps(group: KernelGroup, target: GpuTarget) -> list[GpuStep]:
    """A matmul group as its prologue kernels (operands computed in the group; views of an
    input are read in place), a cuBLAS product and (when it has one) its epilogue as a
    generated elementwise kernel reading the product
    (:mod:`tilefuse.kernel.lower_gpu_contraction`). CompileError for dtypes cuBLAS lacks."""
    split = split_contraction(group)
    node, a, b = split.node, split.a, split.b
    steps: list[GpuStep] = [compile_group(p, target) for p in split.prologues]
    if a.dtype not in CUBLAS_DTYPES:   # integers: a generated product (lower_gpu_product)
        product = KernelGroup(f"{group.name}_product", KernelKind.CONTRACTION, (node,),
                              tuple(dict.fromkeys((a, b))), (node.output,), node,
                              node.output.shape)
        steps.append(kernel_step(product, lower_product_gpu(product.name, node, a, b), target))
        if split.epilogue is not None:
            steps.append(compile_group(split.epilogue, target))
        return steps
    ms = matmul_shape(node)
    if ms.b_batched:
        shape = GemmShape(ms.batch_size, ms.m, ms.n, ms.k,
                          ms.m * ms.k if ms.a_batched else 0, ms.k * ms.n, a.dtype)
    else:  # a shared B: A's batch folds into M
        rows = ms.m * (ms.batch_size if ms.a_batched else 1)
        shape = GemmShape(1, rows, ms.n, ms.k, 0, 0, a.dtype)
    mma = mma_gemm(shape.m, shape.n, shape.k, node.output.dtype, target) \
        if shape.batch == 1 and supports(shape.m, shape.n, shape.k, a.dtype,
                                         node.output.dtype) else None
    steps.append(GemmStep(group, a, b, node.output, shape, mma))
    if split.epilogue is not None:
        steps.append(compile_group(split.epilogue, target))
    return steps


def kernel_step(group: KernelGroup, fn: LoopFunction, target: GpuTarget,
                named_by: KernelGroup | None = None, simt_width: int = 1,
                block: int | None = None) -> GpuKernel:
    """``fn`` (``simt_width`` threads an iteration of its parallel loops; blocks of ``block``
    threads, default the target's) as a launch of ``group``'s step; its buffers are bound by
    name to the values ``kernel_buffers`` gives the inputs and outputs of ``named_by`` (default
    ``group``): the group ``fn`` was lowered from."""
    source = group if named_by is None else named_by
    buffers = kernel_buffers(source.inputs, source.outputs)
    by_name = {p.name: v for v, p in [*buffers.inputs.items(), *buffers.outputs.items()]}
    missing = [b.name for b in fn.buffers if b.name not in by_name]
    if missing:
        raise CompileError(f"kernel {fn.name}: unbound buffers {missing}")
    extent = launch_extent(fn)
    block = block or target.block_threads
    grid = STRIDE_BLOCKS if extent is None else \
        max(1, min(target.max_blocks, -(-extent * simt_width // block)))
    return GpuKernel(group, fn, compile_ptx(fn, target, simt_width),
                     tuple(by_name[b.name] for b in fn.buffers), grid, block, simt_width)

def _scatter_steps(group: KernelGroup, target: GpuTarget) -> list[GpuStep]:
    """A scatter group's kernels (:mod:`tilefuse.kernel.lower_gpu_scatter`): one for
    scatter_elements; for scatter_nd the copy of data (the step producing the output) then the
    rows' writes (a step reading and writing the output, producing nothing new)."""
    node = scatter_node(group)
    assert node is not None
    if node.op.name == "scatter_elements":
        return [kernel_step(group, lower_scatter_elements_gpu(group), target)]
    copy, rows = lower_scatter_nd_gpu(group)
    data = node.inputs[0]
    first = KernelGroup(f"{group.name}_copy", group.kind, group.nodes, (data,), group.outputs,
                        group.anchor, group.domain)
    second = KernelGroup(group.name, group.kind, group.nodes, group.inputs, (), group.anchor,
                         group.domain)
    return [kernel_step(first, copy, target, group), kernel_step(second, rows, target, group)]


def build_cuda(graph: Graph, dump_dir: Path | str | None = None, *,
               target: Any = "cuda") -> CudaExecutable:
    """The ``cuda`` target's executable of ``graph`` (CudaError without a usable GPU);
    ``target`` ("cuda", "cuda:sm_80", a :class:`~tilefuse.target.Target`) names the compute
    capability, else the device's is used."""
    from tilefuse.target import Target

    context = CudaContext()
    gpu = Target.parse(target).gpu("sm_90" if context.info.compute_capability >= (9, 0)
                                   else context.info.arch)
    return CudaExecutable(build_gpu_program(graph, gpu, dump_dir), context)


__all__ = ["STRIDE_BLOCKS", "build_cuda", "build_gpu_program", "compile_group", "kernel_step"]
