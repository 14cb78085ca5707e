# ruff: noqa: E501  (golden graph text has long lines)
"""conv_to_matmul: conv2d with a constant weight becomes im2col movement ops + one 2-D matmul.

Golden text for one small conv, numeric agreement with the reference interpreter over odd conv
shapes (and through the native executable), what is left alone, and the native build of
conv -> relu -> conv running no convolution on the host."""

from __future__ import annotations

import itertools
import textwrap

import numpy as np
import pytest

from tilefuse.dtypes import DType
from tilefuse.graph.builder import GraphBuilder
from tilefuse.graph.interpreter import interpret
from tilefuse.graph.ir import Graph, Literal
from tilefuse.graph.parser import parse_graph
from tilefuse.graph.printer import print_graph
from tilefuse.kernel.fusion import KernelKind, form_kernels
from tilefuse.passes.conv_lowering import conv_to_matmul
from tilefuse.passes.decompose import decompose_composites
from tilefuse.passes.manager import run_pipeline
from tilefuse.passes.pipeline import GRAPH_PIPELINE
from tilefuse.runtime.native import build_native
from tilefuse.testing import assert_close, random_array


def text(s: str) -> str:
    return textwrap.dedent(s).lstrip("\n")


BEFORE = text("""
    graph @g(%x: f32[1,2,4,5], %b: f32[3]) -> f32[1,3,2,4] {
      %0 = constant() {value=array<f32[3,2,2,1]>[[[[1.0],[2.0]],[[3.0],[4.0]]],[[[5.0],[6.0]],[[7.0],[8.0]]],[[[9.0],[10.0]],[[11.0],[12.0]]]]} : f32[3,2,2,1]
      %1 = conv2d(%x, %0, %b) {dilation=[1,1], groups=1, padding=[1,0,0,0], stride=[2,1]} : f32[1,3,2,5]  # m.py:7
      %2 = slice(%1) {starts=[0,0,0,0], steps=[1,1,1,1], stops=[1,3,2,4]} : f32[1,3,2,4]
      return %2
    }
    """)

AFTER = text("""
    graph @g(%x: f32[1,2,4,5], %b: f32[3]) -> f32[1,3,2,4] {
      %0 = constant() {value=array<f32[3,2,2,1]>[[[[1.0],[2.0]],[[3.0],[4.0]]],[[[5.0],[6.0]],[[7.0],[8.0]]],[[[9.0],[10.0]],[[11.0],[12.0]]]]} : f32[3,2,2,1]
      %1 = transpose(%x) {perm=[0,2,3,1]} : f32[1,4,5,2]  # m.py:7
      %2 = pad(%1) {mode="constant", pads=[0,0,1,0,0,0,0,0], value=0.0} : f32[1,5,5,2]  # m.py:7
      %3 = window_patches(%2) {dilations=[1,1], kernel=[2,1], strides=[2,1]} : f32[1,2,5,2,1,2]  # m.py:7
      %4 = reshape(%3) {shape=[10,4]} : f32[10,4]  # m.py:7
      %5 = transpose(%0) {perm=[2,3,1,0]} : f32[2,1,2,3]  # m.py:7
      %6 = reshape(%5) {shape=[4,3]} : f32[4,3]  # m.py:7
      %7 = matmul(%4, %6) : f32[10,3]  # m.py:7
      %8 = add(%7, %b) : f32[10,3]  # m.py:7
      %9 = reshape(%8) {shape=[1,2,5,3]} : f32[1,2,5,3]  # m.py:7
      %10 = transpose(%9) {perm=[0,3,1,2]} : f32[1,3,2,5]  # m.py:7
      %11 = slice(%10) {starts=[0,0,0,0], steps=[1,1,1,1], stops=[1,3,2,4]} : f32[1,3,2,4]
      return %11
    }
    """)


def assert_same(a: Graph, b: Graph, seed: int) -> None:
    rng = np.random.default_rng(seed)
    args = [random_array(rng, tuple(int(d) for d in v.shape), v.dtype) for v in a.inputs]
    for got, want in zip(interpret(b, *args), interpret(a, *args), strict=True):
        assert_close(got, want, reduction=True)


def test_golden_small_conv():
    graph = parse_graph(BEFORE)
    result, changed = conv_to_matmul(graph)
    assert changed
    assert print_graph(result) == AFTER
    assert_same(graph, result, seed=1)
    again, changed_again = conv_to_matmul(result)
    assert not changed_again and again is result


def conv_graph(n: int, c: int, hw: tuple[int, int], k: int, stride: int,
               padding: tuple[int, int, int, int], dilation: int, bias: bool, seed: int,
               after: str | None = None, o: int = 4) -> Graph:
    rng = np.random.default_rng(seed)
    b = GraphBuilder("conv")
    x = b.input(((n, c, *hw), DType.f32), "x")
    w = b.add1("constant", [], {"value": Literal(random_array(rng, (o, c, k, k), DType.f32))})
    inputs = [x, w]
    if bias:
        inputs.append(b.input(((o,), DType.f32), "b"))
    y = b.add1("conv2d", inputs, {"stride": (stride, stride), "padding": padding,
                                  "dilation": (dilation, dilation)})
    if after is not None:
        y = b.add1(after, [y])
    return b.build([y])


SHAPES = list(itertools.product((1, 2), (1, 3), ((7, 9), (9, 7)), (1, 3), (1, 2),
                                ((0, 0, 0, 0), (1, 0, 0, 1), (0, 1, 1, 0)), (1, 2), (False, True)))


@pytest.mark.parametrize("n,c,hw,k,stride,padding,dilation,bias", SHAPES)
def test_matches_the_reference(n, c, hw, k, stride, padding, dilation, bias):
    seed = abs(hash((n, c, hw, k, stride, padding, dilation, bias))) % 2**32
    graph = conv_graph(n, c, hw, k, stride, padding, dilation, bias, seed)
    result, changed = conv_to_matmul(graph)
    assert changed
    names = [node.op.name for node in result.nodes]
    assert "conv2d" not in names and names.count("matmul") == 1
    matmul = next(node for node in result.nodes if node.op.name == "matmul")
    assert all(len(v.shape) == 2 for v in matmul.inputs)
    assert_same(graph, result, seed=seed + 1)


@pytest.mark.parametrize("n,c,hw,k,stride,padding,dilation,bias", [
    (1, 3, (7, 9), 3, 1, (1, 1, 1, 1), 1, True),
    (2, 1, (9, 7), 3, 2, (1, 0, 0, 1), 2, False),
    (2, 3, (9, 7), 1, 2, (0, 0, 0, 0), 1, True),
    (1, 3, (7, 9), 3, 2, (0, 1, 1, 0), 1, True),
])
def test_native_matches_the_reference(n, c, hw, k, stride, padding, dilation, bias):
    graph = conv_graph(n, c, hw, k, stride, padding, dilation, bias, seed=5, after="relu")
    lowered, _ = run_pipeline(graph, GRAPH_PIPELINE)
    exe = build_native(lowered)
    assert exe.fallbacks == []
    rng = np.random.default_rng(11)
    args = [random_array(rng, tuple(int(d) for d in v.shape), v.dtype) for v in graph.inputs]
    for got, want in zip(exe(*args), interpret(graph, *args), strict=True):
        assert_close(got, want, reduction=True)


def test_im2col_is_the_matmul_prologue():
    """The patches are gathered while A is packed: no slices, no stack, no im2col kernel of
    their own."""
    graph = conv_graph(1, 16, (9, 7), 3, 1, (1, 1, 1, 1), 1, True, seed=3, after="relu")
    lowered, _ = run_pipeline(graph, GRAPH_PIPELINE)
    exe = build_native(lowered)
    assert exe.fallbacks == []
    plan = form_kernels(decompose_composites(lowered)[0])
    (conv,) = [g for g in plan.groups if g.kind is KernelKind.CONTRACTION]
    assert [n.op.name for n in conv.nodes][:2] == ["window_patches", "reshape"]
    assert not any(n.op.name in ("slice", "stack") for n in lowered.nodes)
    rng = np.random.default_rng(4)
    args = [random_array(rng, tuple(int(d) for d in v.shape), v.dtype) for v in graph.inputs]
    for got, want in zip(exe(*args), interpret(graph, *args), strict=True):
        assert_close(got, want, reduction=True)


def test_following_elementwise_op_stays_with_the_layout_change():
    graph = conv_graph(1, 3, (7, 9), 3, 1, (1, 1, 1, 1), 1, True, seed=2, after="relu")
    result, _ = conv_to_matmul(graph)
    names = [node.op.name for node in result.nodes]
    assert names[-5:] == ["matmul", "add", "reshape", "transpose", "relu"]
    assert_same(graph, result, seed=3)


def test_leaves_other_convolutions_alone():
    rng = np.random.default_rng(0)
    b = GraphBuilder("g")
    x = b.input(((1, 4, 7, 7), DType.f32), "x")
    w_in = b.input(((2, 4, 3, 3), DType.f32), "w")
    grouped_w = b.add1("constant", [], {"value": Literal(random_array(rng, (4, 2, 3, 3),
                                                                      DType.f32))})
    y1 = b.add1("conv2d", [x, w_in])
    y2 = b.add1("conv2d", [x, grouped_w], {"groups": 2})
    graph = b.build([y1, y2])
    result, changed = conv_to_matmul(graph)
    assert not changed and result is graph


def test_conv_relu_conv_has_no_host_fallback():
    rng = np.random.default_rng(4)
    b = GraphBuilder("net")
    x = b.input(((2, 3, 9, 9), DType.f32), "x")
    w1 = b.add1("constant", [], {"value": Literal(random_array(rng, (8, 3, 3, 3), DType.f32))})
    b1 = b.add1("constant", [], {"value": Literal(random_array(rng, (8,), DType.f32))})
    w2 = b.add1("constant", [], {"value": Literal(random_array(rng, (5, 8, 3, 3), DType.f32))})
    h = b.add1("relu", [b.add1("conv2d", [x, w1, b1], {"padding": (1, 1, 1, 1)})])
    y = b.add1("conv2d", [h, w2], {"stride": (2, 2), "padding": (0, 1, 1, 0)})
    graph = b.build([y])
    optimized, report = run_pipeline(graph, GRAPH_PIPELINE)
    assert "conv_lowering" in report.changed
    exe = build_native(optimized)
    assert "conv2d" not in [node.op.name for node in optimized.nodes]
    # Everything runs natively, the last conv's reshape + transpose back to NCHW included (a
    # chain of index remaps is lowered as one copy loop), through one native entry.
    assert exe.fallbacks == [] and exe.single_entry
    args = [random_array(np.random.default_rng(9), (2, 3, 9, 9), DType.f32)]
    for got, want in zip(exe(*args), interpret(graph, *args), strict=True):
        assert_close(got, want, reduction=True)
