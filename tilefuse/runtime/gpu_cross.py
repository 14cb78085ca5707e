"""Cross-compilation for the ``cuda`` target on a machine without a GPU.

:func:`cross_compile` runs the graph pipeline and :func:`~tilefuse.driver.build_gpu_program`
(which needs no GPU) and, given a directory, writes every stage there: the pipeline's graphs,
``partition.txt`` (each step's device, the copies host steps cost, the device arena) and
``kernels/*.loop`` / ``*.ptx``. :func:`cross_compile_torch` does the same for a ``torch.nn.Module``
on example inputs (every ATen op must convert; SDPA traced as one fused op, as the torch
backend traces for cuda). :func:`assemble` runs ``ptxas`` on PTX text, the
check CI makes of every kernel (PTX targets ``sm_90`` or, for the wgmma kernels, ``sm_90a``).

``tilefuse dump MODEL --target cuda -o DIR`` is the command-line form.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from tilefuse.codegen.llvm_nvptx import SM90, GpuTarget
from tilefuse.errors import CompileError
from tilefuse.graph.ir import Graph
from tilefuse.runtime.gpu import (
    FusedStep,
    GemmStep,
    GpuKernel,
    GpuProgram,
    HostGroup,
)


@dataclass(frozen=True)
class CrossCompiled:
    """One graph built for the cuda target: the program and where its steps run."""

    graph: Graph
    program: GpuProgram

    @property
    def host_steps(self) -> list[HostGroup]:
        return [s for s in self.program.steps if isinstance(s, HostGroup)]

    def ptx(self) -> dict[str, str]:
        """Kernel name -> PTX of every kernel the program may launch."""
        found: dict[str, str] = {}
        for step in self.program.steps:
            if isinstance(step, GpuKernel):
                found[step.fn.name] = step.ptx
            elif isinstance(step, GemmStep) and step.mma is not None:
                found[step.mma.name] = step.mma.ptx
            elif isinstance(step, FusedStep):
                for kernel in (step.kernel, *step.alternatives):
                    found[kernel.name] = kernel.ptx
        return found


def cross_compile(graph: Graph, out: Path | str | None = None, target: GpuTarget = SM90,
                  optimize: bool = True, pipeline: tuple[Any, ...] | None = None
                  ) -> CrossCompiled:
    """``graph`` (after the graph pipeline, or ``pipeline``: a quantizing one, say, unless
    ``optimize`` is False) built for ``target``; every stage written under ``out`` when given
    (module docstring)."""
    if optimize:
        from tilefuse.passes.manager import run_pipeline
        from tilefuse.passes.pipeline import GRAPH_PIPELINE
        from tilefuse.passes.quantize import for_target

        graph = run_pipeline(graph, for_target(pipeline, "cuda") or GRAPH_PIPELINE,
                             dump_dir=out)[0]
    from tilefuse.driver import CompileOptions, build_gpu_program

    return CrossCompiled(graph, build_gpu_program(graph, target, CompileOptions(dump_dir=out)))


def cross_compile_torch(module: Any, inputs: Sequence[np.ndarray],
                        out: Path | str | None = None, target: GpuTarget = SM90,
                        name: str = "model") -> CrossCompiled:
    """``module`` on ``inputs`` (NumPy arrays) as one tilefuse graph, cross-compiled."""
    from tilefuse.zoo import torch_graph

    return cross_compile(torch_graph(module, list(inputs), name, fused_attention=True), out,
                         target)


def ptx_arch(ptx: str) -> str:
    """The ``.target`` a PTX module names (``sm_90``, ``sm_90a``)."""
    found = re.search(r"^\s*\.target\s+(sm_\w+)", ptx, re.MULTILINE)
    if found is None:
        raise CompileError("the PTX names no .target")
    return found.group(1)


def assemble(ptx: str, ptxas: str | None = None) -> None:
    """Runs ``ptxas`` for the PTX's own target; CompileError with its messages if it refuses
    (and if ptxas is not installed)."""
    tool = ptxas or shutil.which("ptxas")
    if tool is None:
        raise CompileError("ptxas is not installed")
    with tempfile.TemporaryDirectory() as tmp:
        source = Path(tmp) / "k.ptx"
        source.write_text(ptx)
        done = subprocess.run([tool, f"-arch={ptx_arch(ptx)}", str(source), "-o",
                               str(Path(tmp) / "k.cubin")], capture_output=True, text=True)
    if done.returncode != 0:
        raise CompileError(f"ptxas refused the PTX: {done.stderr.strip()[:2000]}")


__all__ = ["CrossCompiled", "assemble", "cross_compile", "cross_compile_torch", "ptx_arch"]
