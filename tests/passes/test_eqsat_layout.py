"""Layout through equality saturation: convolutions lowered to NHWC matmuls keep NHWC between
them (the NCHW round trip between two convs cancels), and the result still computes the same."""

from __future__ import annotations

import numpy as np

from tilefuse.dtypes import DType
from tilefuse.graph.builder import GraphBuilder
from tilefuse.graph.interpreter import interpret
from tilefuse.graph.ir import Graph, Literal
from tilefuse.passes.manager import run_pipeline
from tilefuse.passes.pipeline import GRAPH_PIPELINE
from tilefuse.testing import assert_close, random_array


def _conv_bn_relu_conv() -> Graph:
    rng = np.random.default_rng(11)
    b = GraphBuilder("net")

    def const(shape):
        return b.add1("constant", [], {"value": Literal(random_array(rng, shape, DType.f32))})

    x = b.input(((1, 3, 7, 7), DType.f32), "x")
    h = b.add1("conv2d", [x, const((8, 3, 3, 3)), const((8,))], {"padding": (1, 1, 1, 1)})
    h = b.add1("add", [b.add1("mul", [h, const((8, 1, 1))]), const((8, 1, 1))])  # batch norm
    h = b.add1("relu", [h])
    y = b.add1("conv2d", [h, const((5, 8, 1, 1))])
    return b.build([b.add1("relu", [y])])


def _transposes(graph: Graph) -> list[tuple[int, ...]]:
    return [tuple(n.attrs["perm"]) for n in graph.nodes if n.op.name == "transpose"]


def test_consecutive_convs_stay_nhwc():
    """conv_lowering keeps the activations NHWC itself; equality saturation keeps it so."""
    graph = _conv_bn_relu_conv()
    without = run_pipeline(graph, [s for s in GRAPH_PIPELINE if s.name != "eqsat"])[0]
    optimized = run_pipeline(graph, GRAPH_PIPELINE)[0]
    # into NHWC once at the input, out once at the output, with or without eqsat
    assert _transposes(without) == [(0, 2, 3, 1), (0, 3, 1, 2)]
    assert _transposes(optimized) == [(0, 2, 3, 1), (0, 3, 1, 2)]
    rng = np.random.default_rng(2)
    x = random_array(rng, (1, 3, 7, 7), DType.f32)
    assert_close(interpret(optimized, x)[0], interpret(graph, x)[0])


def test_round_trip_through_per_channel_ops_cancels():
    """NHWC -> NCHW, batch norm and relu, -> NHWC (what a layout-unaware lowering leaves
    between two convs): the transposes move through the per-channel ops and cancel."""
    rng = np.random.default_rng(5)
    b = GraphBuilder("trip")
    x = b.input(((1, 7, 7, 8), DType.f32), "x")
    h = b.add1("transpose", [x], {"perm": (0, 3, 1, 2)})
    scale, shift = (b.add1("constant", [], {"value": Literal(random_array(rng, (8, 1, 1),
                                                                           DType.f32))})
                    for _ in range(2))
    h = b.add1("relu", [b.add1("add", [b.add1("mul", [h, scale]), shift])])
    graph = b.build([b.add1("transpose", [h], {"perm": (0, 2, 3, 1)})])
    optimized, report = run_pipeline(graph, GRAPH_PIPELINE)
    assert _transposes(optimized) == []
    eqsat = next(r for r in report.records if r.name == "eqsat")
    assert eqsat.notes["rules_fired"]["transpose_into_binary_constant_right"] > 0
    x = random_array(rng, (1, 7, 7, 8), DType.f32)
    assert_close(interpret(optimized, x)[0], interpret(graph, x)[0])
