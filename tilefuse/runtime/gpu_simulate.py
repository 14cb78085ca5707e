"""A :class:`~tilefuse.runtime.gpu.GpuProgram` run on the host, without a GPU.

Generated kernels run through the loop-IR interpreter (:mod:`tilefuse.loop.interp`; parallel
loops serially, which the grid-stride mapping makes equivalent), products through NumPy with
the step's :class:`~tilefuse.runtime.cublas.GemmShape` (so an operand read in place through a
view is read as cuBLAS reads it), quantized products through a model of their kernel's
arithmetic (:func:`tilefuse.kernel.lower_gpu_qmatmul.emulate`), and fused attention and host
steps through the references.
This checks every GPU lowering and the program's bindings on machines without a GPU (CI); the
PTX itself is checked by ``ptxas`` and on the device. Kernels run with the GPU's alignment rule
checked too: a thread's vector access (``lanes / simt_width`` elements in a warp-spread kernel)
must start at a multiple of its width (of 16 bytes, for wider ones), as ``ld.global.v4``
needs (the device faults with CUDA_ERROR_MISALIGNED_ADDRESS and the context is lost); a
misaligned one raises
:class:`MisalignedAccess` naming the kernel, buffer and index.
"""

from __future__ import annotations

from collections import ChainMap
from collections.abc import Sequence

import numpy as np

from tilefuse.codegen.nvptx_qgemm import QGemmKernel
from tilefuse.errors import VerifyError
from tilefuse.graph.interpreter import run_node
from tilefuse.kernel.lower_gpu_qmatmul import emulate
from tilefuse.loop import interp as loop_interp
from tilefuse.loop.ir import LoopFunction
from tilefuse.runtime.gpu import FusedStep, GemmStep, GpuKernel, GpuProgram


class MisalignedAccess(VerifyError):
    """A vector access a GPU thread would make at an address not a multiple of its width."""


class _AlignedMachine(loop_interp._Machine):
    """The loop-IR interpreter with the GPU's vector alignment rule (module docstring)."""

    simt_width = 1

    def buffer_slice(self, name: str, start: int, lanes: int) -> np.ndarray:
        per_thread = lanes // self.simt_width if lanes >= self.simt_width > 1 else lanes
        itemsize = self.buffers[name].itemsize
        need = min(per_thread * itemsize, 16)   # the widest PTX access is 16 bytes
        if per_thread > 1 and (start * itemsize) % need:
            raise MisalignedAccess(f"{self.fn_name}: a vector of {per_thread} elements at "
                                   f"{name}[{start}] is not aligned to its {need} bytes")
        return super().buffer_slice(name, start, lanes)


def run_kernel(fn: LoopFunction, buffers: Sequence[np.ndarray], simt_width: int = 1) -> None:
    """One kernel through the loop-IR interpreter with the alignment rule checked."""
    loop_interp.verify(fn)
    arrays, values = loop_interp.check_arguments(fn.name, fn.buffers, fn.scalars, buffers)
    machine = _AlignedMachine(fn, arrays, values)
    machine.simt_width, machine.fn_name = simt_width, fn.name
    with np.errstate(all="ignore"):
        machine.run(fn.body)


def _product(step: GemmStep, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    sh = step.shape
    wide = np.float64 if step.a.dtype.np == np.float64 else np.float32
    a2 = a.reshape(-1).astype(wide)
    b2 = b.reshape(-1).astype(wide)
    out = np.empty((sh.batch, sh.m, sh.n), wide)
    for i in range(sh.batch):
        am = a2[i * sh.stride_a:i * sh.stride_a + sh.m * sh.k].reshape(sh.m, sh.k)
        bm = b2[i * sh.stride_b:i * sh.stride_b + sh.k * sh.n].reshape(sh.k, sh.n)
        out[i] = am @ bm
    return out.astype(step.out.dtype.np).reshape(step.out.shape)


def simulate(program: GpuProgram, arrays: Sequence[np.ndarray]) -> list[np.ndarray]:
    """``program``'s outputs for ``arrays``, computed on the host (module docstring)."""
    env: ChainMap = ChainMap({}, program.constants)
    env.update(zip(program.graph.inputs, (np.require(a, requirements="C") for a in arrays)))
    for step in program.steps:
        if isinstance(step, GpuKernel):
            for v in step.group.outputs:
                env[v] = np.empty(v.shape, v.dtype.np)
            run_kernel(step.fn, [env[v].reshape(-1) for v in step.bindings], step.simt_width)
        elif isinstance(step, GemmStep):
            env[step.out] = _product(step, env[step.a], env[step.b])
        elif isinstance(step, FusedStep) and isinstance(step.kernel, QGemmKernel):
            env[step.bindings[-1]] = emulate(step.kernel.config,
                                             *(env[v] for v in step.bindings[:-1]))
        else:
            for node in step.group.nodes:
                env.update(zip(node.outputs, run_node(node, [env[v] for v in node.inputs])))
    return [np.asarray(env[v]) for v in program.graph.outputs]


__all__ = ["MisalignedAccess", "run_kernel", "simulate"]
