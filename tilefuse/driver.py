"""The compile driver: the one path from a graph to something callable.

Every frontend (``tilefuse.jit``, the torch backend, ONNX models), the CLI, the tuner and the
fuzzer call :func:`compile` (or :func:`compile_graph`, which also returns the optimised graph and
the pass report). It runs these stages, in this order (:data:`STAGES` lists them with a line
each, as ``passes/pipeline.py`` lists the graph passes):

1. **graph**: the graph pipeline (:data:`tilefuse.passes.pipeline.GRAPH_PIPELINE`), unless the
   caller hands over a graph it optimised itself (``CompileOptions(optimize=False)``);
   **shard** (``CompileOptions(devices=...)`` only): the optimised graph split over N ranks
   (:mod:`tilefuse.distributed`), this rank's part cut at its collectives, and stages 2-6 run
   per segment;
2. **kernels**: kernel formation (:func:`plan_kernels`: :func:`prepare` decomposes composites
   and legalises what the kernels do not take, then
   :func:`~tilefuse.kernel.fusion.form_kernels`; no other module calls either);
3. **schedules**: each kernel's schedule, from the tuning database or the default rule
   (:class:`~tilefuse.runtime.schedules.ScheduleSource`; the tuner and the fuzzer force theirs);
4. **lowering**, 5. **codegen**, 6. **assembly**: the back end of the target, handed the kernel
   plan and the schedule source (:mod:`tilefuse.backend.cpu` for CPU targets,
   :mod:`tilefuse.backend.cuda` for cuda): loop IR per kernel, LLVM to machine code or PTX, then
   the launch sequence, host steps and the memory plan. What they make, ``runtime/`` executes
   (:class:`~tilefuse.runtime.native.NativeExecutable`,
   :class:`~tilefuse.runtime.gpu.CudaExecutable`).

A graph whose input dims are symbolic becomes a
:class:`~tilefuse.runtime.dynamic.DynamicExecutable` whose per-size builds come back here.

This module imports nothing heavy at import time: the stages import their modules when they run.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tilefuse.target import Target

if TYPE_CHECKING:
    from tilefuse.codegen.llvm_nvptx import GpuTarget
    from tilefuse.graph.ir import Graph
    from tilefuse.kernel.fusion import KernelPlan
    from tilefuse.passes.manager import PipelineReport
    from tilefuse.runtime.executable import Executable
    from tilefuse.runtime.gpu import GpuProgram
    from tilefuse.schedules.database import TuningDatabase


@dataclass(frozen=True)
class Stage:
    """One stage of :func:`compile`: its name (as in logs and docs) and what it does."""

    name: str
    doc: str


STAGES: tuple[Stage, ...] = (
    Stage("graph", "the graph pipeline: shape_infer, decompose, algebra, conv_lowering, dce, "
                   "cse, constant_fold, eqsat, constant_fold, dce, attention, dce"),
    Stage("shard", "with devices=N only: this rank's graph (column/row-parallel products, "
                   "heads, vocabulary), collectives as ops, cut into segments between them"),
    Stage("kernels", "decompose composites, legalise matmuls (cuda: GPU preparation, unfuse "
                     "attention), form kernel groups"),
    Stage("schedules", "per kernel: the tuning database's fastest schedule, else the default "
                       "rule"),
    Stage("lowering", "each kernel group to loop IR (or a host step, logged, with its reason)"),
    Stage("codegen", "loop IR -> LLVM -> machine code (through the disk kernel cache) or PTX"),
    Stage("assembly", "launch sequence, constants, memory plan: the executable"),
)


@dataclass(frozen=True)
class CompileOptions:
    """How :func:`compile` builds.

    ``dump_dir``: every stage written there as text; ``debug``: the pass manager verifies the
    graph after each pass; ``optimize``: False when the graph is already optimised (the
    fuzzer, which checks the pipeline on its own, and the tuner, which builds single kernels);
    ``schedules``: a ``ScheduleSource`` that replaces the database/default rule (CPU);
    ``cache``: the ``KernelCache`` that compiles the kernels (CPU; default: the disk cache the
    environment asks for)."""

    dump_dir: Path | str | None = None
    debug: bool = False
    optimize: bool = True
    schedules: Any = None
    cache: Any = None
    pipeline: tuple[Any, ...] | None = None
    """The graph pipeline to run (None: ``GRAPH_PIPELINE``; quantisation and reassociation
    make their own, ``passes/quantize.py``, ``passes/pipeline.py``)."""
    devices: Any = None
    """A :class:`tilefuse.distributed.build.Devices`: split the optimised graph over that many
    ranks (tensor parallel) and build this rank's part (stage 1b, ``shard``)."""


@dataclass(frozen=True)
class Compiled:
    """What :func:`compile_graph` made: the graph given, the optimised graph, the pass
    manager's report (None when ``optimize`` was off) and the executable."""

    graph: Graph
    optimized: Graph
    report: PipelineReport | None
    executable: Executable


def compile(graph: Graph, target: Target | str = "cpu",
            options: CompileOptions | None = None) -> Executable:
    """``graph`` compiled for ``target`` (see the module docstring for the stages)."""
    return compile_graph(graph, target, options).executable


def compile_graph(graph: Graph, target: Target | str = "cpu",
                  options: CompileOptions | None = None) -> Compiled:
    """:func:`compile`, also returning the optimised graph and the pass report."""
    target = Target.parse(target)
    options = options or CompileOptions()
    if target.is_cuda and options.pipeline is not None:  # cuda quantizes to its own ops
        from tilefuse.passes.quantize import for_target

        options = dataclasses.replace(options, pipeline=for_target(options.pipeline, target))
    # 1. graph
    if options.optimize:
        optimized, report = optimize(graph, options)
    else:
        optimized, report = graph, None
    from tilefuse.runtime.dynamic import DynamicExecutable, is_symbolic

    if options.devices is not None:
        # 1b. shard: this rank's graph, cut at its collectives; stages 2-6 per segment.
        from tilefuse.distributed.build import build_sharded

        return Compiled(graph, optimized, report, build_sharded(optimized, target, options))
    if is_symbolic(optimized):
        # Stages 2-6 per size binding (or once with runtime extents: the native CPU build);
        # a specialisation runs the graph pipeline again on its static graph.
        def build_for(g: Graph, where: Path | None) -> Executable:
            return build(g, target, dataclasses.replace(options, dump_dir=where))

        def optimize_for(g: Graph) -> Graph:
            return optimize(g, dataclasses.replace(options, dump_dir=None))[0]

        executable: Any = DynamicExecutable(
            optimized, build_for, optimize=optimize_for if options.optimize else _same,
            dump_dir=_path(options.dump_dir))
    else:
        executable = build(optimized, target, options)
    return Compiled(graph, optimized, report, executable)


def optimize(graph: Graph, options: CompileOptions | None = None
             ) -> tuple[Graph, PipelineReport]:
    """Stage 1, the graph pipeline: the optimised graph and the pass manager's report."""
    from tilefuse.passes.manager import run_pipeline
    from tilefuse.passes.pipeline import GRAPH_PIPELINE

    options = options or CompileOptions()
    return run_pipeline(graph, options.pipeline or GRAPH_PIPELINE, dump_dir=options.dump_dir,
                        debug=options.debug)


def prepare(graph: Graph, target: Target | str = "cpu") -> Graph:
    """The graph kernel formation sees: composites decomposed; on CPU targets the matmuls the
    contraction kernel does not take legalised (:mod:`tilefuse.kernel.legalize`); for cuda,
    first the GPU's own preparation (:mod:`tilefuse.runtime.gpu_prepare`) and the attentions
    the fused GPU kernel does not take unfused."""
    from tilefuse.passes.decompose import decompose_composites

    if Target.parse(target).is_cuda:
        from tilefuse.kernel.lower_gpu_attention import unfuse_attention
        from tilefuse.runtime.gpu_prepare import prepare_for_gpu

        return decompose_composites(unfuse_attention(prepare_for_gpu(graph)))[0]
    from tilefuse.kernel.legalize import legalize_matmuls

    decomposed, _ = decompose_composites(graph)
    return legalize_matmuls(decomposed)[0]


def plan_kernels(graph: Graph, target: Target | str = "cpu") -> KernelPlan:
    """Stage 2, kernel formation: the graph :func:`prepare` d for ``target``, then kernel
    groups. ``plan.graph`` is the prepared graph the groups' nodes belong to."""
    from tilefuse.kernel.fusion import form_kernels

    return form_kernels(prepare(graph, target))


def build(graph: Graph, target: Target | str = "cpu",
          options: CompileOptions | None = None) -> Executable:
    """Stages 2-6 on an optimised graph: the target's back end (:mod:`tilefuse.backend`),
    handed the kernel plan and the schedule source."""
    target = Target.parse(target)
    options = options or CompileOptions()
    if target.kind == "reference":
        from tilefuse.runtime.executable import InterpreterExecutable

        return InterpreterExecutable(graph)
    if target.is_cuda:
        from tilefuse.backend.cuda import build_cuda

        return build_cuda(graph, options.dump_dir, target=target)
    from tilefuse.runtime.dynamic import is_symbolic
    from tilefuse.runtime.schedules import ScheduleSource

    llvm_cpu = target.llvm_cpu()
    plan = plan_kernels(graph, target)                               # 2. kernels
    schedules = options.schedules or ScheduleSource(llvm_cpu)        # 3. schedules
    if is_symbolic(graph):                                           # 4-6. the back end
        from tilefuse.backend.cpu_symbolic import SymbolicNativeExecutable

        return SymbolicNativeExecutable(graph, options.dump_dir, target=llvm_cpu,
                                        cache=options.cache, schedules=schedules, plan=plan)
    from tilefuse.backend.cpu import build_cpu

    return build_cpu(graph, options.dump_dir, target=llvm_cpu, cache=options.cache,
                     schedules=schedules, plan=plan)


def build_gpu_program(graph: Graph, target: Target | str | GpuTarget = "cuda:sm_90",
                      options: CompileOptions | None = None, *,
                      database: TuningDatabase | None = None) -> GpuProgram:
    """Stages 2-5 for a cuda target, with no GPU: the program (PTX inside) that
    :class:`~tilefuse.runtime.gpu.CudaExecutable` loads. The tuner, cross-compilation and
    cuda artifacts start here. ``target``: a cuda target, or the PTX back end's own
    ``GpuTarget`` (the tuner's knobs); ``database``: the measured GPU schedules to build with
    (default: none, every kernel takes the default knobs)."""
    from tilefuse.backend.cuda import build_gpu_program as build_program
    from tilefuse.codegen.llvm_nvptx import GpuTarget

    gpu = target if isinstance(target, GpuTarget) else Target.parse(target).gpu()
    options = options or CompileOptions()
    return build_program(graph, gpu, options.dump_dir, database,
                         plan=plan_kernels(graph, "cuda"))                # 2. kernels


def _same(graph: Graph) -> Graph:
    return graph


def _path(where: Path | str | None) -> Path | None:
    return None if where is None else Path(where)


__all__ = ["STAGES", "CompileOptions", "Compiled", "Stage", "build", "build_gpu_program",
           "compile", "compile_graph", "optimize", "plan_kernels", "prepare"]
