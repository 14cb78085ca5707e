"""Tuning the ``cuda`` target's kernels: every GPU kernel's knobs measured on the device with
CUDA events and stored under the GPU target in the tuning database.

A GPU kernel's schedule is the set of :class:`~tilefuse.codegen.llvm_nvptx.GpuTarget` knobs its
lowering reads (loads in flight, rows held in registers, threads a block), written as a
:class:`~tilefuse.kernel.schedule.Schedule` of the group's kind whose ``unroll`` pairs are
``(knob, value)``, so the database stores and returns it like a CPU schedule. Keys are the
group's fingerprint (:mod:`tilefuse.tune.fingerprint`) and :func:`gpu_target_string` (triple,
architecture, PTX ISA): a build looks them up without a GPU
(``tilefuse.driver.build_gpu_program(..., database=)``).

:func:`tune_gpu` builds the graph's program, then for each generated kernel: compiles every
candidate, runs it once on random inputs and checks its outputs against the NumPy references
(a wrong candidate is recorded as ``inf``), times it (CUDA events around ``repeats`` launches,
median of ``rounds``), records each time, and reports the fastest.
"""

from __future__ import annotations

import itertools
import math
import statistics
from dataclasses import dataclass

import numpy as np

from tilefuse.codegen.llvm_nvptx import SM90, GpuTarget
from tilefuse.errors import TilefuseError
from tilefuse.graph.ir import Graph
from tilefuse.kernel.fusion import KernelGroup, KernelKind
from tilefuse.kernel.schedule import Schedule
from tilefuse.log import get_logger
from tilefuse.schedules.database import TuningDatabase
from tilefuse.schedules.gpu import gpu_key, gpu_target_string, knob_target, tuned_target
from tilefuse.testing import assert_close, random_array

KNOBS: dict[KernelKind, dict[str, tuple[int, ...]]] = {
    KernelKind.ELEMENTWISE: {"elementwise_unroll": (1, 2, 4, 8),
                             "block_threads": (128, 256, 512)},
    KernelKind.ROW_REDUCTION: {"row_unroll": (2, 4), "register_row": (1, 128),
                               "block_threads": (128, 256), "long_row_block": (128, 256)},
    KernelKind.MOVEMENT: {"block_threads": (128, 256, 512)},
}
"""The knobs each kind's GPU lowering reads, with the values tried (``register_row`` 1 keeps
rows out of registers)."""

def gpu_candidates(group: KernelGroup) -> list[Schedule]:
    """Every combination of the kind's knobs (none for kinds without GPU knobs)."""
    knobs = KNOBS.get(group.kind, {})
    names = sorted(knobs)
    return [Schedule(group.kind, unroll=tuple(zip(names, values)))
            for values in itertools.product(*(knobs[n] for n in names))] if knobs else []


@dataclass(frozen=True)
class GpuTuned:
    kernel: str
    schedule: Schedule
    ms: float
    default_ms: float
    candidates: int


def tune_gpu(graph: Graph, database: TuningDatabase, target: GpuTarget = SM90,
             repeats: int = 10, rounds: int = 5, context: object | None = None
             ) -> list[GpuTuned]:
    """Measures every candidate of every generated kernel of ``graph`` (module docstring)."""
    from tilefuse.backend.cuda import compile_group
    from tilefuse.driver import build_gpu_program
    from tilefuse.runtime.cuda_driver import CudaContext
    from tilefuse.runtime.gpu import GpuKernel

    ctx = context if isinstance(context, CudaContext) else CudaContext()
    program = build_gpu_program(graph, target)
    results = []
    for step in program.steps:
        if not isinstance(step, GpuKernel):
            continue
        key = gpu_key(step.group, program.constants, target)
        bench = _KernelBench(ctx, step, program.constants, repeats, rounds, target)
        times: dict[Schedule, float] = {}
        for schedule in gpu_candidates(step.group):
            try:
                tuned = knob_target(target, schedule)
                ms = bench.measure(compile_group(step.group, tuned), tuned)
            except (TilefuseError, AssertionError) as err:
                get_logger("tune").info("GPU kernel %s: %s failed: %s", step.fn.name,
                                        schedule.unroll, str(err)[:200])
                ms = math.inf
            database.record(key, schedule, ms / 1e3)
            times[schedule] = ms
        if not times:
            continue
        best = min(times, key=times.__getitem__)
        results.append(GpuTuned(step.fn.name, best, times[best], bench.measure(step, target),
                                len(times)))
        get_logger("tune").info("GPU kernel %s: %s %.4f ms (default %.4f ms)", step.fn.name,
                                best.unroll, times[best], results[-1].default_ms)
    return results


class _KernelBench:
    """One kernel's random inputs on the device, its NumPy reference outputs, and timing."""

    def __init__(self, ctx, step, constants, repeats: int, rounds: int,  # type: ignore[no-untyped-def]
                 target: GpuTarget):
        from tilefuse.runtime.gpu import evaluate_group

        self.ctx, self.repeats, self.rounds = ctx, repeats, rounds
        rng = np.random.default_rng(0)
        env = {v: constants[v] if v in constants else random_array(rng, tuple(v.shape), v.dtype)
               for v in step.group.inputs}
        self.inputs = {v: ctx.upload(np.ascontiguousarray(a)) for v, a in env.items()}
        evaluate_group(step.group.nodes, env)
        self.reference = [env[v] for v in step.group.outputs]
        self.outputs = {v: ctx.alloc(a.nbytes) for v, a in zip(step.group.outputs,
                                                                 self.reference)}
        self.reduction = step.group.kind is not KernelKind.ELEMENTWISE

    def measure(self, kernel, target: GpuTarget) -> float:  # type: ignore[no-untyped-def]
        """Checks ``kernel``'s outputs, then its median milliseconds a launch (launched as an
        executable built for ``target`` launches it)."""
        from tilefuse.runtime.gpu import launch_grid

        function = self.ctx.load_ptx(kernel.ptx).function(kernel.fn.name)
        grid = launch_grid(self.ctx, kernel, function, target)
        args = [(self.inputs.get(v) or self.outputs[v]).ptr for v in kernel.bindings]

        def run() -> None:
            self.ctx.launch(function, grid, kernel.block, args)

        for v, want in zip(kernel.group.outputs, self.reference):
            self.outputs[v].copy_from(np.full(want.shape, np.nan, want.dtype))
        run()
        for v, want in zip(kernel.group.outputs, self.reference):
            got = self.outputs[v].copy_to(np.empty(want.shape, want.dtype))
            assert_close(got, want, reduction=self.reduction)
        return statistics.median(self.ctx.time_ms(run, self.repeats)
                                 for _ in range(self.rounds))


__all__ = ["KNOBS", "GpuTuned", "gpu_candidates", "gpu_key", "gpu_target_string",
           "knob_target", "tune_gpu", "tuned_target"]

