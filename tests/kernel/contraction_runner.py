"""Runs a graph's one contraction kernel (:func:`tilefuse.kernel.lower_matmul.lower_matmul`) on
given arrays, compiled or in the loop interpreter: what the matmul and implicit-GEMM convolution
tests share."""

from __future__ import annotations

import numpy as np

from tilefuse.codegen import compile_kernel, host_target
from tilefuse.codegen.jit import aligned_empty
from tilefuse.graph.ir import Graph
from tilefuse.kernel.fusion import form_kernels
from tilefuse.kernel.lower_matmul import lower_matmul
from tilefuse.kernel.schedule import Schedule, default_schedule
from tilefuse.loop import interpret


def run_contraction(graph: Graph, arrays: list[np.ndarray], *, schedule: Schedule | None = None,
                    interpreted: bool = False) -> tuple[np.ndarray, list[str]]:
    """Lowers the graph's one contraction kernel (under ``schedule``, else the default one),
    runs its functions on ``arrays`` and returns the output (NaN-poisoned first) and the
    names of the functions."""
    [group] = form_kernels(graph).groups
    lowered = lower_matmul(group, schedule or default_schedule(group, host_target()))
    values = dict(zip(graph.inputs, arrays))
    [out_value] = graph.outputs
    out = np.full(tuple(out_value.shape), np.nan, np.float32)
    values[out_value] = out
    scratch = {name: aligned_empty(nbytes // 4, np.float32)
               for name, nbytes in lowered.scratch.items()}
    for fn in lowered.functions:
        args = [scratch[b.name] if b.name in scratch else values[lowered.bindings[b.name]]
                for b in fn.buffers]
        if interpreted:
            interpret(fn, *args)
        else:
            compile_kernel(fn)(*args)
    return out, [fn.name for fn in lowered.functions]
