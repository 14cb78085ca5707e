"""The ``cuda`` target: a graph's kernels as PTX, run on an NVIDIA GPU through the driver API.

Building has two halves so that everything but the launch runs (and is tested) on machines
without a GPU:

1. :func:`build_gpu_program` (no GPU needed): take the driver's kernel plan
   (:func:`tilefuse.driver.plan_kernels`: composites decomposed, kernel groups), fold
   constant groups, lower each group with the GPU lowerings (:mod:`tilefuse.kernel.lower_gpu`)
   and compile it to PTX (:mod:`tilefuse.codegen.llvm_nvptx`). A matmul group becomes a cuBLAS
   product (:mod:`tilefuse.runtime.cublas`) followed by its epilogue as a generated elementwise
   kernel. An attention group is one fused kernel (:mod:`tilefuse.codegen.nvptx_attention`);
   an attention that kernel does not take is decomposed first and runs unfused (logged on the
   ``fallback`` topic, :mod:`tilefuse.kernel.lower_gpu_attention`). A group with no GPU
   lowering becomes a *host step* run with the NumPy references;
   the step's reason is logged on the ``fallback`` topic and the dump's ``partition.txt``
   shows every step's device and each copy between device and host.
2. :class:`CudaExecutable` loads the PTX into the device's primary context, uploads the
   constants once, and per call uploads the inputs, launches the kernels in order (one
   stream, so they run in sequence), runs host steps between downloads and uploads, and
   downloads the outputs into fresh NumPy arrays.

Values the steps write share one device arena, placed by liveness (:mod:`tilefuse.runtime.memory`,
the CPU's planner); graph inputs and constants have buffers of their own.
"""

from __future__ import annotations

import math
import threading
from collections import ChainMap
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from tilefuse.codegen.llvm_nvptx import SM90, GpuTarget, compile_ptx, launch_extent
from tilefuse.codegen.nvptx_attention import FlashKernel, flash_attention
from tilefuse.codegen.nvptx_mma import MmaGemm, mma_gemm, supports
from tilefuse.codegen.nvptx_qgemm import QGemmKernel
from tilefuse.dump import DumpWriter
from tilefuse.errors import CompileError, GuardError, TilefuseError
from tilefuse.graph.interpreter import run_node
from tilefuse.graph.ir import Graph, Node, Value
from tilefuse.graph.types import is_static
from tilefuse.kernel.access import kernel_buffers
from tilefuse.kernel.fusion import KernelGroup, KernelKind, KernelPlan
from tilefuse.kernel.lower_gpu import GPU_KINDS, lower_group_gpu
from tilefuse.kernel.lower_gpu_attention import attention_alternatives, group_attention
from tilefuse.kernel.lower_gpu_contraction import split_contraction
from tilefuse.kernel.lower_gpu_qmatmul import quantized_node, quantized_step
from tilefuse.kernel.lower_matmul import matmul_shape
from tilefuse.log import get_logger
from tilefuse.loop.ir import LoopFunction
from tilefuse.loop.printer import format_function
from tilefuse.runtime.cublas import CUBLAS_DTYPES, Cublas, GemmShape
from tilefuse.runtime.cuda_driver import CudaContext, CudaError, DeviceBuffer
from tilefuse.runtime.cuda_graph import CudaGraph, GraphReplay, graphs_enabled
from tilefuse.runtime.device_arrays import device_kind
from tilefuse.runtime.dynamic import SymbolBinder
from tilefuse.runtime.memory import MemoryPlan, plan_from_liveness, value_names
from tilefuse.schedules.database import TuningDatabase
from tilefuse.schedules.gpu import tuned_target


@dataclass(frozen=True)
class GpuKernel:
    """One kernel launch: its loop IR, PTX, buffer bindings (kernel buffer name -> graph
    value, in the kernel's parameter order) and the 1-D launch shape."""

    group: KernelGroup
    fn: LoopFunction
    ptx: str
    bindings: tuple[Value, ...]
    grid: int
    block: int
    simt_width: int = 1


    @property
    def outputs(self) -> tuple[Value, ...]:
        return self.group.outputs


@dataclass(frozen=True)
class GemmStep:
    """A contraction's product through cuBLAS (:mod:`tilefuse.runtime.cublas`): ``out = a @ b``
    (its epilogue, if any, is the next step: a generated elementwise kernel)."""

    group: KernelGroup
    a: Value
    b: Value
    out: Value
    shape: GemmShape
    mma: MmaGemm | None = None
    """The generated tensor-core product for this shape, if there is one: the executable
    times it against cuBLAS once and keeps the faster (logged on the ``fallback`` topic)."""

    @property
    def outputs(self) -> tuple[Value, ...]:
        return (self.out,)


@dataclass(frozen=True)
class HostGroup:
    """A group run on the host with the references (no GPU lowering, or it failed)."""

    group: KernelGroup
    reason: str

    @property
    def outputs(self) -> tuple[Value, ...]:
        return self.group.outputs


@dataclass(frozen=True)
class FusedStep:
    """A kernel generated directly as LLVM IR (the fused attention, a quantized product):
    ``bindings`` are the graph values of its pointer parameters, in order; ``alternatives``
    are other kernels of the same function (the wgmma attention, other launch
    configurations), timed against ``kernel`` when the executable loads
    (:meth:`CudaExecutable._choose_fused`)."""

    group: KernelGroup
    kernel: FlashKernel | QGemmKernel
    bindings: tuple[Value, ...]
    alternatives: tuple[FlashKernel | QGemmKernel, ...] = ()

    @property
    def outputs(self) -> tuple[Value, ...]:
        return self.group.outputs


GpuStep = GpuKernel | GemmStep | FusedStep | HostGroup


@dataclass
class GpuProgram:
    """Everything about a graph's GPU build that needs no GPU."""

    graph: Graph
    target: GpuTarget
    constants: dict[Value, np.ndarray]
    steps: list[GpuStep] = field(default_factory=list)

    def copies(self) -> list[str]:
        """The device<->host copies the host steps cost per call, as text lines."""
        lines = []
        for step in self.steps:
            if isinstance(step, HostGroup):
                ins = [v for v in step.group.inputs if v not in self.constants]
                nbytes = sum(_nbytes(v) for v in [*ins, *step.group.outputs])
                lines.append(f"{step.group.name}: {len(ins)} download(s), "
                             f"{len(step.group.outputs)} upload(s), {nbytes} bytes")
        return lines

    def memory_plan(self) -> MemoryPlan:
        """The device arena: every value a step writes, placed by its liveness over the steps
        (graph outputs live to the end); graph inputs and constants have buffers of their own."""
        produced = {v: i for i, step in enumerate(self.steps) for v in step.outputs}
        last = dict(produced)
        for i, step in enumerate(self.steps):
            for v in _reads(step):
                if v in produced:
                    last[v] = max(last[v], i)
        for v in self.graph.outputs:
            if v in produced:
                last[v] = len(self.steps)
        values = list(plan_values(self))
        liveness = {v: (produced[v], last[v]) for v in values}
        return plan_from_liveness(values, liveness, _nbytes)

    def partition_text(self) -> str:
        hosted = sum(isinstance(s, HostGroup) for s in self.steps)
        lines = [f"# {self.graph.name} on {self.target}: {len(self.steps)} steps, "
                 f"{hosted} on the host"]
        for step in self.steps:
            ops = ", ".join(dict.fromkeys(n.op.name for n in step.group.nodes))
            if isinstance(step, GpuKernel):
                lines.append(f"device {step.group.name} [{step.group.kind.value}] ({ops}) "
                             f"grid={step.grid} block={step.block} simt={step.simt_width}")
            elif isinstance(step, FusedStep):
                k = step.kernel
                lines.append(f"device {step.group.name} [{step.group.kind.value}] "
                             f"({k.name}) grid={k.grid} block={k.block} "
                             f"shared={k.shared_bytes}"
                             + "".join(f" (or {a.name}, by measurement)"
                                       for a in step.alternatives))
            elif isinstance(step, GemmStep):
                sh = step.shape
                lines.append(f"cublas {step.group.name} [matmul] batch={sh.batch} m={sh.m} "
                             f"n={sh.n} k={sh.k} {sh.dtype}"
                             + (f" (or {step.mma.name}, by measurement)" if step.mma else ""))
            else:
                lines.append(f"host   {step.group.name} [{step.group.kind.value}] ({ops}): "
                             f"{step.reason}")
        lines += ["# copies per call", *(self.copies() or ["none"])]
        lines += ["# device memory", self.memory_plan().summary()]
        return "\n".join(lines) + "\n"

    def dump(self, directory: Path | str) -> None:
        writer = DumpWriter(directory)
        writer.write("partition.txt", self.partition_text())
        for step in self.steps:
            if isinstance(step, GpuKernel):
                writer.write(f"kernels/{step.fn.name}.loop", format_function(step.fn) + "\n")
                writer.write(f"kernels/{step.fn.name}.ptx", step.ptx)
            elif isinstance(step, GemmStep) and step.mma is not None:
                writer.write(f"kernels/{step.mma.name}.ptx", step.mma.ptx)
            elif isinstance(step, FusedStep):
                for kernel in (step.kernel, *step.alternatives):
                    writer.write(f"kernels/{kernel.name}.ptx", kernel.ptx)


def _reads(step: GpuStep) -> tuple[Value, ...]:
    if isinstance(step, (GpuKernel, FusedStep)):
        return step.bindings
    if isinstance(step, GemmStep):
        return (step.a, step.b)
    return step.group.inputs


def _nbytes(value: Value) -> int:
    return math.prod(value.shape) * value.dtype.itemsize


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
                program.steps.append(FusedStep(group, flash_attention(shape, target=target),
                                               bindings, attention_alternatives(shape)))
            elif quantized_node(group) is not None:   # matmul_wq: lower_gpu_qmatmul
                program.steps.append(FusedStep(group, *quantized_step(group, target)))
            else:
                program.steps.append(compile_group(
                    group, tuned_target(group, constants, target, database)))
        except CompileError as err:
            reason = str(err) if group.kind in GPU_KINDS | {KernelKind.CONTRACTION,
                                                            KernelKind.ATTENTION} \
                or quantized_node(group) is not None else \
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
    fn = lowered.fn
    buffers = kernel_buffers(group.inputs, group.outputs)
    by_name = {p.name: v for v, p in [*buffers.inputs.items(), *buffers.outputs.items()]}
    missing = [b.name for b in fn.buffers if b.name not in by_name]
    if missing:
        raise CompileError(f"kernel {fn.name}: unbound buffers {missing}")
    extent = launch_extent(fn)
    block = lowered.block or target.block_threads
    grid = STRIDE_BLOCKS if extent is None else \
        max(1, min(target.max_blocks, -(-extent * lowered.simt_width // block)))
    return GpuKernel(group, fn, compile_ptx(fn, target, lowered.simt_width),
                     tuple(by_name[b.name] for b in fn.buffers), grid, block,
                     lowered.simt_width)


def launch_grid(context: CudaContext, step: GpuKernel, function: Any,
                target: GpuTarget) -> int:
    """The blocks ``step`` launches with: with ``resident_grid`` at most one wave of what the
    device holds at once (the loops are grid-stride, so any grid is correct)."""
    if not target.resident_grid:
        return step.grid
    return min(step.grid, context.resident_blocks(function, step.block))


def plan_values(program: GpuProgram) -> dict[Value, None]:
    """The values :meth:`GpuProgram.memory_plan` places, in its order."""
    return dict.fromkeys(v for step in program.steps for v in step.outputs)


def _contraction_steps(group: KernelGroup, target: GpuTarget) -> list[GpuStep]:
    """A matmul group as its prologue kernels (operands computed in the group; views of an
    input are read in place), a cuBLAS product and (when it has one) its epilogue as a
    generated elementwise kernel reading the product
    (:mod:`tilefuse.kernel.lower_gpu_contraction`). CompileError for dtypes cuBLAS lacks."""
    split = split_contraction(group)
    node, a, b = split.node, split.a, split.b
    if a.dtype not in CUBLAS_DTYPES:
        raise CompileError(f"kernel {group.name}: cuBLAS has no {a.dtype} products")
    steps: list[GpuStep] = [compile_group(p, target) for p in split.prologues]
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


def evaluate_group(nodes: Sequence[Node], env: dict[Value, np.ndarray]) -> None:
    for node in nodes:
        outs = run_node(node, [env[v] for v in node.inputs])
        env.update(zip(node.outputs, (np.require(o, requirements="C") for o in outs)))


class CudaExecutable:
    """A :class:`GpuProgram` loaded on a device: ``executable(*arrays)`` -> NumPy outputs."""

    def __init__(self, program: GpuProgram, context: CudaContext | None = None):
        self.program = program
        self.graph = program.graph
        self.context = context or CudaContext()
        self._lock = threading.Lock()
        self._guard = SymbolBinder.of(self.graph)
        self._bound: dict[Value, int] = {}   # inputs given as device pointers (run_device)
        self._functions = {}
        self._grids: dict[str, int] = {}
        self._fused: dict[int, tuple[FlashKernel, Any]] = {}
        for step in program.steps:
            if isinstance(step, FusedStep):
                module = self.context.load_ptx(step.kernel.ptx)
                self._functions[step.kernel.name] = (module, module.function(step.kernel.name))
                self._fused[id(step)] = self._choose_fused(step)
            elif isinstance(step, GpuKernel):
                module = self.context.load_ptx(step.ptx)
                function = module.function(step.fn.name)
                self._functions[step.fn.name] = (module, function)
                self._grids[step.fn.name] = launch_grid(self.context, step, function,
                                                        program.target)
        self._constants = {v: self.context.upload(np.ascontiguousarray(a))
                           for v, a in program.constants.items()}
        plan = program.memory_plan()
        self.arena = self.context.alloc(plan.arena_bytes)
        names = value_names(list(plan_values(program)))
        self._buffers: dict[Value, DeviceBuffer] = {
            v: self.arena.view(plan.offsets[names[v]], _nbytes(v)) for v in names}
        self._cublas = Cublas(self.context) if any(isinstance(s, GemmStep)
                                                   for s in program.steps) else None
        self._mma = {id(s): self._choose_product(s) for s in program.steps
                     if isinstance(s, GemmStep) and s.mma is not None}
        for v in self.graph.inputs:
            self._buffers.setdefault(v, self.context.alloc(_nbytes(v)))
        self._replay: GraphReplay | None = None
        self._capture = graphs_enabled()
        if self._capture and any(isinstance(s, HostGroup) for s in program.steps):
            self._capture = False
            get_logger("fallback").warning(
                "%s: not replayed as a CUDA graph (it has host steps): each call launches its "
                "%d steps one by one", self.graph.name, len(program.steps))

    @property
    def graph_nodes(self) -> int | None:
        """Nodes of the CUDA graph a call replays (None: not captured, or not yet)."""
        return None if self._replay is None else self._replay.graph.nodes

    def _after_first_call(self) -> None:
        """Captures the steps as one CUDA graph (:mod:`tilefuse.runtime.cuda_graph`) once a
        call has run them step by step; a capture the driver refuses is logged and not
        tried again (calls keep launching step by step)."""
        self._capture = False
        try:
            graph = CudaGraph(self.context, self._record)
        except (CudaError, AttributeError, TypeError) as err:  # an older/newer cuda-python
            get_logger("fallback").warning(
                "%s: CUDA graph capture failed (%s): each call launches its %d steps one by "
                "one", self.graph.name, err, len(self.program.steps))
            return
        self._replay = GraphReplay(self.context, graph,
                                   [self._buffers[v] for v in self.graph.inputs],
                                   [self._buffer(v) for v in self.graph.outputs])
        get_logger("fallback").info("%s: %d steps captured as a CUDA graph of %d nodes",
                                    self.graph.name, len(self.program.steps), graph.nodes)

    def _record(self, stream: Any) -> None:
        if self._cublas is None:
            self.launch_all(stream)
            return
        self._cublas.set_stream(stream)
        try:
            self.launch_all(stream)
        finally:
            self._cublas.set_stream(0)

    def __repr__(self) -> str:
        return f"CudaExecutable(@{self.graph.name} on {self.context.info.name})"

    def _choose_product(self, step: GemmStep) -> Any:
        """The generated kernel's function when it beats cuBLAS on this product (CUDA events,
        random operands, the best of 3 after a warm-up), else None; logged either way."""
        assert step.mma is not None and self._cublas is not None
        kernel, sh = step.mma, step.shape
        function = self.context.load_ptx(kernel.ptx).function(kernel.name)
        rng = np.random.default_rng(0)
        a, b = (self.context.upload(rng.standard_normal(n, np.float32).astype(v.dtype.np))
                for n, v in ((sh.m * sh.k, step.a), (sh.k * sh.n, step.b)))
        c = self.context.alloc(_nbytes(step.out))
        runs = {"generated": lambda: self.context.launch(function, kernel.grid, kernel.block,
                                                          [a.ptr, b.ptr, c.ptr]),
                "cublas": lambda: self._cublas.gemm(sh, a.ptr, b.ptr, c.ptr)}
        ms = {}
        for name, run in runs.items():
            run()
            ms[name] = min(self.context.time_ms(run) for _ in range(3))
        chosen = "generated" if ms["generated"] < ms["cublas"] else "cublas"
        get_logger("fallback").info(
            "kernel %s: %s %.3f ms, cuBLAS %.3f ms: %s chosen", step.group.name, kernel.name,
            ms["generated"], ms["cublas"], chosen)
        return function if chosen == "generated" else None

    def _choose_fused(self, step: FusedStep) -> tuple[FlashKernel, Any]:
        """The fastest of ``step``'s kernel and its alternatives on random operands (CUDA
        events, the best of 3 after a warm-up), logged on the ``fallback`` topic; an
        alternative that does not load here (sm_90a code on another GPU) or whose output
        differs from the kernel's by over 1e-2 relative is not taken (logged)."""
        first = step.kernel
        chosen = (first, self._functions[first.name][1])
        log = get_logger("fallback")
        if not step.alternatives:
            return chosen
        if self.context.info.arch != "sm_90":
            log.info("kernel %s: %s (the wgmma kernels need sm_90, this is %s)",
                     step.group.name, first.name, self.context.info.arch)
            return chosen
        rng = np.random.default_rng(0)
        ins = [self.context.upload(rng.standard_normal(v.shape, np.float32).astype(v.dtype.np))
               for v in step.bindings[:-1]]
        out_value = step.bindings[-1]
        outs = [self.context.alloc(_nbytes(out_value)) for _ in range(2)]
        candidates = [chosen]
        for kernel in step.alternatives:
            try:
                module = self.context.load_ptx(kernel.ptx)
            except TilefuseError as err:
                log.info("kernel %s: %s does not load here (%s)", step.group.name,
                         kernel.name, err)
                continue
            self._functions[kernel.name] = (module, module.function(kernel.name))
            candidates.append((kernel, self._functions[kernel.name][1]))
        ms: dict[str, float] = {}
        want = None
        for kernel, function in candidates:
            def run(kernel: FlashKernel = kernel, function: Any = function) -> None:
                self.context.launch(function, kernel.grid, kernel.block,
                                    [b.ptr for b in ins] + [outs[kernel is not first].ptr])
            run()
            got = outs[kernel is not first].copy_to(
                np.empty(out_value.shape, out_value.dtype.np)).astype(np.float32)
            if want is None:
                want = got
            elif not _agrees(got, want):
                log.warning("kernel %s: %s disagrees with %s, not taken", step.group.name,
                            kernel.name, first.name)
                continue
            ms[kernel.name] = min(self.context.time_ms(run) for _ in range(3))
            if ms[kernel.name] < ms.get(chosen[0].name, float("inf")):
                chosen = (kernel, function)
        log.info("kernel %s: %s: %s chosen", step.group.name,
                 ", ".join(f"{k} {v:.3f} ms" for k, v in ms.items()), chosen[0].name)
        return chosen

    def _check(self, arrays: Sequence[np.ndarray]) -> None:
        """GuardError unless count, dtypes and shapes are the graph's (the guard every
        executable of a graph shares)."""
        self._guard.check(arrays)

    def _buffer(self, value: Value) -> DeviceBuffer:
        found = self._buffers.get(value)
        return found if found is not None else self._constants[value]

    def run_trusted(self, arrays: Sequence[np.ndarray]) -> list[np.ndarray]:
        with self._lock:
            if self._replay is not None:
                outs = [np.empty(v.shape, v.dtype.np) for v in self.graph.outputs]
                self._replay.run_host(arrays, outs)
                return outs
            for value, a in zip(self.graph.inputs, arrays):
                self._buffers[value].copy_from(a)
            self.launch_all()
            outs = []
            for value in self.graph.outputs:
                if value in self.program.constants:
                    outs.append(np.array(self.program.constants[value]))
                else:
                    host = np.empty(value.shape, value.dtype.np)
                    outs.append(self._buffer(value).copy_to(host))
            if self._capture:
                self._after_first_call()
            return outs

    device = "cuda"
    """Where the executable's memory lives: callers with device tensors use
    :meth:`run_device`."""

    def run_device(self, inputs: Sequence[int], outputs: Sequence[int],
                   stream: Any = 0) -> None:
        """One call on device memory the caller owns (torch CUDA tensors, say): ``inputs`` and
        ``outputs`` are device pointers to C-contiguous buffers of the graph's input and
        output types; no host copy is made. Replayed as a CUDA graph (inputs copied device to
        device into its buffers), it is queued on ``stream`` without waiting; step by step
        (the first call, or a program with host steps) inputs are read in place and launches
        go to the legacy default stream, which orders them after the caller's earlier work
        there."""
        if len(inputs) != len(self.graph.inputs) or len(outputs) != len(self.graph.outputs):
            raise GuardError(f"{self.graph.name}: run_device takes {len(self.graph.inputs)} "
                             f"input and {len(self.graph.outputs)} output pointers")
        with self._lock:
            if self._replay is not None:
                self._replay.run_device(inputs, outputs, stream)
                return
            self._bound = dict(zip(self.graph.inputs, inputs))
            try:
                self.launch_all()
                for value, ptr in zip(self.graph.outputs, outputs):
                    self.context.copy_device(ptr, self._bound_ptr(value), _nbytes(value))
            finally:
                self._bound = {}
            if self._capture:
                self._after_first_call()

    def run_arrays(self, arrays: Sequence[Any]) -> list[Any]:
        """One call on device arrays (torch CUDA tensors, CuPy arrays: anything
        :mod:`tilefuse.runtime.device_arrays` reads); results are fresh arrays of the same
        library on the same device, queued on its current stream (nothing waits)."""
        kind = device_kind(arrays, self.graph)
        outs = [kind.empty(v) for v in self.graph.outputs]
        self.run_device([kind.pointer(a) for a in arrays], [kind.pointer(o) for o in outs],
                        kind.stream())
        return outs

    def _bound_ptr(self, value: Value) -> int:
        found = self._bound.get(value)
        return found if found is not None else self._buffer(value).ptr

    def __call__(self, *arrays: np.ndarray) -> list[np.ndarray]:
        self._check(arrays)
        return self.run_trusted([np.ascontiguousarray(a) for a in arrays])

    def launch_all(self, stream: Any = 0) -> None:
        """Every step once, on ``stream`` (0: the device's default stream; host steps
        synchronise). cuBLAS launches on its handle's stream (:meth:`Cublas.set_stream`)."""
        for step in self.program.steps:
            if isinstance(step, GpuKernel):
                _, function = self._functions[step.fn.name]
                self.context.launch(function, self._grids[step.fn.name], step.block,
                                    [self._bound_ptr(v) for v in step.bindings], stream=stream)
            elif isinstance(step, FusedStep):
                kernel, function = self._fused[id(step)]
                self.context.launch(function, kernel.grid, kernel.block,
                                    [self._bound_ptr(v) for v in step.bindings], stream=stream)
            elif isinstance(step, GemmStep):
                assert self._cublas is not None
                args = [self._bound_ptr(step.a), self._bound_ptr(step.b),
                        self._buffer(step.out).ptr]
                generated = self._mma.get(id(step))
                if generated is not None and step.mma is not None:
                    self.context.launch(generated, step.mma.grid, step.mma.block, args,
                                        stream=stream)
                else:
                    self._cublas.gemm(step.shape, *args)
            else:
                self._run_on_host(step)

    def _run_on_host(self, step: HostGroup) -> None:
        self.context.synchronize()
        made: dict[Value, np.ndarray] = {}
        env = ChainMap(made, self.program.constants)
        for v in step.group.inputs:
            if v not in env:
                host = np.empty(v.shape, v.dtype.np)
                self.context.copy_to_host(host, self._bound_ptr(v))
                made[v] = host
        evaluate_group(step.group.nodes, env)  # type: ignore[arg-type]
        for v in step.group.outputs:
            self._buffers[v].copy_from(np.ascontiguousarray(made[v], v.dtype.np))


def _agrees(got: np.ndarray, want: np.ndarray) -> bool:
    """Whether two attention outputs agree to bf16 accuracy (NaN never does)."""
    scale = float(np.linalg.norm(want))
    return bool(np.isfinite(got).all()) and float(np.linalg.norm(got - want)) <= 1e-2 * scale


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


__all__ = ["CudaExecutable", "FusedStep", "GpuKernel", "GpuProgram", "HostGroup", "build_cuda",
           "build_gpu_program", "compile_group", "evaluate_group", "launch_grid"]
