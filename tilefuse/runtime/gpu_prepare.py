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

A ``matmul`` with a 1-D operand (a vector times a matrix, NumPy's rule) becomes the 2-D product
of the vector as a row (``[1, K]``) or a column (``[K, 1]``) reshaped back to the result's
shape, so it is a cuBLAS product too instead of a host step (found by the GPU fuzzer).

Grouped-query products (a key/value cache repeated over the heads sharing it) multiply the
shared tensor once with the heads' rows stacked (:mod:`tilefuse.runtime.gpu_grouped`);
transposes of size-1 axes are reshapes and RoPE's ``rotate_half`` one gather
(:mod:`tilefuse.runtime.gpu_views`).
"""

from __future__ import annotations

from tilefuse.dtypes import DType
from tilefuse.graph.builder import GraphBuilder
from tilefuse.graph.ir import Graph, Node, Value
from tilefuse.passes.conv_lowering import conv_to_matmul
from tilefuse.passes.dce import dce
from tilefuse.passes.split_reduce import split_long_sums

HALF = frozenset({DType.f16, DType.bf16})
GPU_CONV_DTYPES = HALF | {DType.f32}


def prepare_for_gpu(graph: Graph) -> Graph:
    """``graph`` with its remaining convolutions (half precision: the pipeline lowered the f32
    ones) as GEMMs in their dtype (module docstring); the same graph when none is left."""
    lowered, changed = conv_to_matmul(graph, GPU_CONV_DTYPES)
    graph = dce(lowered)[0] if changed else graph
    if any(n.op.name == "conv2d" for n in graph.nodes):   # grouped, weight computed at run time
        from tilefuse.kernel.legalize import legalize_convs

        graph = legalize_convs(graph)[0]
    if any(n.op.name in ("qconv_i8", "matmul_u8s8", "dynamic_quantize_u8", "matmul_w4")
           for n in graph.nodes):   # ONNX's integer ops: no VNNI kernels here
        from tilefuse.kernel.legalize_int8 import legalize_int8

        graph = dce(legalize_int8(graph)[0])[0]
    from tilefuse.runtime.gpu_grouped import fold_grouped_products
    from tilefuse.runtime.gpu_views import gpu_views

    # column sums: two kernels, more threads (split_long_sums)
    return split_long_sums(fold_grouped_products(gpu_views(_matrix_products(graph))))


def _vector_product(node: Node) -> bool:
    return node.op.name == "matmul" and any(len(v.shape) == 1 for v in node.inputs[:2])


def _matrix_products(graph: Graph) -> Graph:
    """``graph`` with every matmul of a 1-D operand as a 2-D product between reshapes."""
    if not any(_vector_product(n) for n in graph.nodes):
        return graph
    b = GraphBuilder(graph.name)
    renamed: dict[Value, Value] = {v: b.input(v.type, v.name) for v in graph.inputs}
    for node in graph.nodes:
        inputs = tuple(renamed.get(v, v) for v in node.inputs)
        if not _vector_product(node):
            b.append(node if inputs == node.inputs else
                     Node(node.op, inputs, node.attrs, node.outputs, node.loc))
            continue
        x, y = inputs
        if len(x.shape) == 1:
            x = b.add1("reshape", [x], {"shape": (1, x.shape[0])}, node.loc)
        if len(y.shape) == 1:
            y = b.add1("reshape", [y], {"shape": (y.shape[0], 1)}, node.loc)
        product = b.add1("matmul", [x, y], dict(node.attrs), node.loc)
        renamed[node.outputs[0]] = b.add1("reshape", [product],
                                          {"shape": tuple(node.outputs[0].shape)}, node.loc)
    return b.build([renamed.get(v, v) for v in graph.outputs])


__all__ = ["GPU_CONV_DTYPES", "HALF", "prepare_for_gpu"]
