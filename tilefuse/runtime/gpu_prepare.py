"""Graph preparation for the cuda target: convolutions of every float dtype as GEMMs in their
own dtype.

The graph pipeline lowers a ``conv2d`` with a constant f32 weight to im2col + one matmul with
activations kept as NHWC matrices (:mod:`tilefuse.passes.conv_lowering`, the CPU's fast path;
the CPU's contraction kernel is f32, so the pipeline leaves other dtypes alone). The GPU has no
convolution kernel of its own, so before kernel formation :func:`prepare_for_gpu` runs the same
lowering for f16 and bf16 convolutions too: the product is a cuBLAS (or generated tensor-core)
GEMM in the input's dtype with f32 accumulation, its A operand the im2col prologue kernel
writing half-precision patches (a 1x1 stride-1 convolution reads the activation matrix in
place), and batch norm, bias, ReLU and the residual add of a ResNet block the product's
epilogue kernel. Earlier sessions ran half convolutions as f32 products between casts (twice
the bytes, no half tensor cores).
"""

from __future__ import annotations

from tilefuse.dtypes import DType
from tilefuse.graph.ir import Graph
from tilefuse.passes.conv_lowering import conv_to_matmul
from tilefuse.passes.dce import dce

HALF = frozenset({DType.f16, DType.bf16})
GPU_CONV_DTYPES = HALF | {DType.f32}


def prepare_for_gpu(graph: Graph) -> Graph:
    """``graph`` with its remaining convolutions (half precision: the pipeline lowered the f32
    ones) as GEMMs in their dtype (module docstring); the same graph when none is left."""
    lowered, changed = conv_to_matmul(graph, GPU_CONV_DTYPES)
    return dce(lowered)[0] if changed else graph


__all__ = ["GPU_CONV_DTYPES", "HALF", "prepare_for_gpu"]
