"""Graph preparation for the cuda target: convolutions of every float dtype as implicit GEMMs.

The graph pipeline lowers a ``conv2d`` with a constant f32 weight to im2col + one matmul
(:mod:`tilefuse.passes.conv_lowering`, the CPU's fast path). The GPU has no convolution kernel
of its own, so before kernel formation :func:`prepare_for_gpu` turns every remaining conv2d with a
constant f16/bf16 weight into the f32 one between casts (the input cast fuses into the im2col
prologue kernel, the output cast into the product's epilogue) and runs that lowering again:
the convolution is a cuBLAS product on the device instead of a host step. The product then runs
in f32 (TF32 tensor cores where cuBLAS picks them), not in half precision: correct, not yet
the fastest form.
"""

from __future__ import annotations

from tilefuse.dtypes import DType
from tilefuse.graph.builder import GraphBuilder
from tilefuse.graph.ir import Graph, Literal, Node, Value
from tilefuse.passes.conv_lowering import conv_to_matmul
from tilefuse.passes.dce import dce

HALF = frozenset({DType.f16, DType.bf16})


def _half_conv(node: Node, producers: dict[Value, Node]) -> bool:
    if node.op.name != "conv2d" or node.outputs[0].dtype not in HALF:
        return False
    weight = producers.get(node.inputs[1])
    return weight is not None and weight.op.name == "constant"


def prepare_for_gpu(graph: Graph) -> Graph:
    """``graph`` with half-precision convolutions as f32 implicit GEMMs (module docstring);
    the same graph when it has none."""
    producers = graph.producers()
    if not any(_half_conv(n, producers) for n in graph.nodes):
        return graph
    b = GraphBuilder(graph.name)
    renamed: dict[Value, Value] = {}
    for v in graph.inputs:
        renamed[v] = b.input(v.type, v.name)
    for node in graph.nodes:
        inputs = tuple(renamed.get(v, v) for v in node.inputs)
        if not _half_conv(node, producers):
            b.append(node if inputs == node.inputs else
                     Node(node.op, inputs, node.attrs, node.outputs, node.loc))
            continue
        x, _, *rest = inputs
        weight = producers[node.inputs[1]].attrs["value"].array
        wide = [b.add1("cast", [x], {"dtype": DType.f32}, node.loc),
                b.add1("constant", [], {"value": Literal(weight.astype("float32"))}, node.loc),
                *(b.add1("cast", [r], {"dtype": DType.f32}, node.loc) for r in rest)]
        y = b.add1("conv2d", wide, dict(node.attrs), node.loc)
        renamed[node.outputs[0]] = b.add1("cast", [y], {"dtype": node.outputs[0].dtype},
                                          node.loc)
    prepared = b.build([renamed.get(v, v) for v in graph.outputs])
    return dce(conv_to_matmul(prepared)[0])[0]


__all__ = ["prepare_for_gpu"]
