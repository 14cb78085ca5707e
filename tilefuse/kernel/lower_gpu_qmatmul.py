"""A ``matmul_wq`` group (a weight-only quantized product, :mod:`tilefuse.ops.quant_gpu`) as
one generated kernel of the cuda target (:mod:`tilefuse.codegen.nvptx_qgemm`).

The group is the one node; its bias and relu are fused in the op. :func:`quantized_step`
picks the kernel's launch knobs from M (:func:`default_config`) and adds a few other
configurations as alternatives, which the executable times once on the device and keeps the
fastest of (like the attention kernels). A shape the kernel does not take raises
CompileError with the reason; the executable then runs the group on the host (logged).
"""

from __future__ import annotations

import math
from dataclasses import replace

from tilefuse.codegen.llvm_nvptx import SM90, GpuTarget
from tilefuse.codegen.nvptx_qgemm import QGemmConfig, QGemmKernel, qgemm, supports
from tilefuse.errors import CompileError
from tilefuse.graph.ir import Node, Value
from tilefuse.kernel.fusion import KernelGroup


def quantized_node(group: KernelGroup) -> Node | None:
    """The ``matmul_wq`` node of a one-node group, else None."""
    if len(group.nodes) == 1 and group.nodes[0].op.name == "matmul_wq":
        return group.nodes[0]
    return None


def config_of(node: Node, **knobs: int | bool) -> QGemmConfig:
    """The kernel configuration of ``node`` with :func:`default_config`'s knobs (or
    ``knobs``)."""
    x = node.inputs[0]
    k = int(x.shape[-1])
    m = math.prod(int(d) for d in x.shape[:-1])
    n = int(node.outputs[0].shape[-1])
    base = QGemmConfig(m, n, k, x.dtype, node.attrs["format"], node.attrs["group"],
                       node.attrs["zero_points"], node.attrs["act"])
    return replace(base, **(knobs or default_knobs(base)))


def default_knobs(cfg: QGemmConfig) -> dict[str, int | bool]:
    """Two tiles a warp, two loads a K step and 8 warps a block where the shape allows (the
    fastest of the configurations timed on an H200 for int4 at M = 1, 4 and 16, K = N =
    8192: benchmarks/gpu_quant-2026-12-03.json), fewer where K or N is too small; fp8 (timed
    alone) keeps one tile and 4 loads up to 8 tokens, 4 tiles above."""
    tile_counts, load_counts = (2, 1), (2, 1, 4)
    if cfg.fmt == "fp8":   # no alternatives are timed for fp8: what was measured best
        tile_counts, load_counts = ((1,), (4, 2, 1)) if cfg.m <= 8 else ((4, 2, 1), (2, 1, 4))
    for tiles in tile_counts:
        for loads in load_counts:
            for warps in (8, 4, 2, 1):
                knobs = {"tiles": tiles, "warps": warps, "loads": loads}
                other = replace(cfg, **knobs)
                if supports(other) is None and cfg.k // other.k_step >= warps:
                    return knobs
    return {"tiles": 1, "warps": 1, "loads": 2}


ALTERNATIVE_KNOBS = ({"tiles": 1, "warps": 8, "loads": 4}, {"tiles": 1, "warps": 8, "loads": 2},
                     {"tiles": 4, "warps": 8, "loads": 2},
                     {"tiles": 2, "warps": 8, "loads": 2, "prefetch": True})
"""Configurations timed against the default one when the executable loads (each won for some
format and M on the H200; the prefetching one is not measured yet). None for fp8: the
executable's random timing operands hold e4m3 NaN codes, so no output would agree."""


def quantized_step(group: KernelGroup, target: GpuTarget = SM90
                   ) -> tuple[QGemmKernel, tuple[Value, ...], tuple[QGemmKernel, ...]]:
    """The kernel of a ``matmul_wq`` group, the values its parameters bind (x, w, scales,
    zeros, bias, out) and alternative configurations to time (none for fp8, whose random
    timing operands hold NaN codes)."""
    node = quantized_node(group)
    if node is None:
        raise CompileError(f"kernel {group.name}: not a quantized product group")
    cfg = config_of(node)
    kernel = qgemm(cfg, target)
    others: list[QGemmKernel] = []
    if cfg.fmt != "fp8":
        for knobs in ALTERNATIVE_KNOBS:
            other = replace(cfg, **knobs)
            if other != cfg and supports(other) is None and cfg.k // other.k_step >= 1:
                others.append(qgemm(other, target))
    return kernel, (*node.inputs, node.outputs[0]), tuple(others)


__all__ = ["ALTERNATIVE_KNOBS", "config_of", "default_knobs", "quantized_node",
           "quantized_step"]
