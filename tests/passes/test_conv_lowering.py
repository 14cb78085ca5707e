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
from tilefuse.ops.registry import OpKind
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
    """The patches are gathered while A is packed, through the padding and the input's layout
    change: no slices, no stack, no im2col, pad or transpose kernel of their own."""
    graph = conv_graph(1, 16, (9, 7), 3, 1, (1, 1, 1, 1), 1, True, seed=3, after="relu")
    lowered, _ = run_pipeline(graph, GRAPH_PIPELINE)
    exe = build_native(lowered)
    assert exe.fallbacks == []
    plan = form_kernels(decompose_composites(lowered)[0])
    (conv,) = [g for g in plan.groups if g.kind is KernelKind.CONTRACTION]
    assert [n.op.name for n in conv.nodes][:4] == ["transpose", "pad", "window_patches",
                                                   "reshape"]
    assert [g.kind for g in plan.groups] == [KernelKind.CONTRACTION, KernelKind.MOVEMENT]
    assert not any(n.op.name in ("slice", "stack") for n in lowered.nodes)
    rng = np.random.default_rng(4)
    args = [random_array(rng, tuple(int(d) for d in v.shape), v.dtype) for v in graph.inputs]
    for got, want in zip(exe(*args), interpret(graph, *args), strict=True):
        assert_close(got, want, reduction=True)


def test_following_elementwise_op_runs_on_the_matrix():
    """relu after the conv reads the [N·OH·OW, O] matrix (the matmul's epilogue); the
    conversion back to NCHW comes last."""
    graph = conv_graph(1, 3, (7, 9), 3, 1, (1, 1, 1, 1), 1, True, seed=2, after="relu")
    result, _ = conv_to_matmul(graph)
    names = [node.op.name for node in result.nodes]
    assert names[-5:] == ["matmul", "add", "relu", "reshape", "transpose"]
    assert_same(graph, result, seed=3)


def test_leaves_other_convolutions_alone():
    """A grouped weight known only at run time; more groups than MAX_GROUPS, not depthwise."""
    rng = np.random.default_rng(0)
    b = GraphBuilder("g")
    x = b.input(((1, 34, 7, 7), DType.f32), "x")
    w_in = b.input(((2, 17, 3, 3), DType.f32), "w")
    grouped_w = b.add1("constant", [], {"value": Literal(random_array(rng, (34, 2, 3, 3),
                                                                      DType.f32))})
    y1 = b.add1("conv2d", [x, w_in], {"groups": 2})
    y2 = b.add1("conv2d", [x, grouped_w], {"groups": 17})
    graph = b.build([y1, y2])
    result, changed = conv_to_matmul(graph)
    assert not changed and result is graph


def test_runtime_weight_is_lowered():
    """A weight that is a graph input (training: parameters are inputs) is rearranged at run
    time and the conv is the same matmul."""
    b = GraphBuilder("g")
    x = b.input(((2, 5, 9, 8), DType.f32), "x")
    w = b.input(((7, 5, 3, 2), DType.f32), "w")
    graph = b.build([b.add1("conv2d", [x, w], {"stride": (2, 1), "padding": (1, 0, 1, 1)})])
    result, changed = conv_to_matmul(graph)
    assert changed and not any(n.op.name == "conv2d" for n in result.nodes)
    assert_same(graph, result, seed=5)


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


def _const(b: GraphBuilder, rng: np.random.Generator, shape: tuple[int, ...]):
    return b.add1("constant", [], {"value": Literal(random_array(rng, shape, DType.f32))})


def residual_block(c: int = 8, hw: int = 9, seed: int = 0) -> Graph:
    """conv -> batch norm (per-channel mul/add, two constant shapes) -> relu -> 3x3 conv ->
    residual add -> relu -> max pool -> global average pool, as an ONNX CNN arrives."""
    rng = np.random.default_rng(seed)
    b = GraphBuilder("block")
    x = b.input(((1, c, hw, hw), DType.f32), "x")
    h = b.add1("conv2d", [x, _const(b, rng, (c, c, 1, 1))])
    h = b.add1("mul", [h, _const(b, rng, (c, 1, 1))])
    h = b.add1("add", [h, _const(b, rng, (1, c, 1, 1))])
    h = b.add1("relu", [h])
    y = b.add1("conv2d", [h, _const(b, rng, (c, c, 3, 3))], {"padding": (1, 1, 1, 1)})
    y = b.add1("relu", [b.add1("add", [y, h])])
    y = b.add1("max_pool2d", [y], {"kernel": (3, 3), "stride": (2, 2), "padding": (1, 1, 1, 1)})
    pooled = b.add1("avg_pool2d", [y], {"kernel": tuple(y.shape[2:]), "stride": (1, 1)})
    return b.build([pooled, y])


def _perms(graph: Graph) -> list[tuple[int, ...]]:
    """The permutations of the transposes of activations (not of constant weights)."""
    producers = graph.producers()
    return [tuple(n.attrs["perm"]) for n in graph.nodes if n.op.name == "transpose" and
            (n.inputs[0] not in producers or producers[n.inputs[0]].op.name != "constant")]


def test_activations_stay_channels_last_between_convs():
    """The only layout changes are the input's to NHWC and the outputs' back to NCHW; batch
    norm, relu, the residual add and both pools read activation matrices."""
    graph = residual_block()
    result, changed = conv_to_matmul(graph)
    assert changed
    assert sorted(_perms(result)) == [(0, 2, 3, 1), (0, 3, 1, 2), (0, 3, 1, 2)]
    names = [n.op.name for n in result.nodes]
    assert "max_pool2d" not in names and "avg_pool2d" not in names
    assert_same(graph, result, seed=7)


def test_batch_norm_relu_and_residual_are_matmul_epilogues():
    optimized, _ = run_pipeline(residual_block(), GRAPH_PIPELINE)
    plan = form_kernels(decompose_composites(optimized)[0])
    convs = [g for g in plan.groups if g.kind is KernelKind.CONTRACTION]
    first, second = ([n.op.name for n in g.nodes] for g in convs)
    assert first[-4:] == ["matmul", "mul", "add", "relu"]
    assert second[-3:] == ["matmul", "add", "relu"]


@pytest.mark.parametrize("c,hw,seed", [(8, 9, 0), (7, 13, 1), (17, 6, 2), (1, 7, 3), (32, 5, 4)])
def test_channels_last_network_runs_natively(c, hw, seed):
    graph = residual_block(c, hw, seed)
    optimized, _ = run_pipeline(graph, GRAPH_PIPELINE)
    exe = build_native(optimized)
    assert exe.fallbacks == []
    args = [random_array(np.random.default_rng(seed + 10), (1, c, hw, hw), DType.f32)]
    for got, want in zip(exe(*args), interpret(graph, *args), strict=True):
        assert_close(got, want, reduction=True)


@pytest.mark.parametrize("op,attrs,lowered", [
    ("max_pool2d", {"kernel": (2, 3), "stride": (2, 1), "padding": (1, 0, 0, 1)}, True),
    ("avg_pool2d", {"kernel": (3, 3), "stride": (2, 2), "padding": (1, 1, 1, 1),
                    "count_include_pad": True}, True),
    ("avg_pool2d", {"kernel": (2, 2), "stride": (1, 2)}, True),
    # the divisor counts the input taps of each window (a constant per window):
    ("avg_pool2d", {"kernel": (3, 3), "stride": (1, 1), "padding": (1, 1, 1, 1),
                    "count_include_pad": False}, True),
    ("avg_pool2d", {"kernel": (3, 2), "stride": (2, 1), "padding": (0, 0, 1, 1),
                    "count_include_pad": False}, True),
    # ceil mode has overhanging windows:
    ("max_pool2d", {"kernel": (3, 3), "stride": (2, 2), "ceil_mode": True}, False),
])
def test_pools_after_a_conv(op, attrs, lowered):
    rng = np.random.default_rng(5)
    b = GraphBuilder("pool")
    x = b.input(((2, 3, 8, 7), DType.f32), "x")
    h = b.add1("conv2d", [x, _const(b, rng, (5, 3, 3, 3))])
    graph = b.build([b.add1(op, [h], attrs)])
    result, _ = conv_to_matmul(graph)
    assert (op not in [n.op.name for n in result.nodes]) is lowered
    assert_same(graph, result, seed=6)
    exe = build_native(run_pipeline(graph, GRAPH_PIPELINE)[0])
    assert exe.fallbacks == []
    args = [random_array(np.random.default_rng(8), (2, 3, 8, 7), DType.f32)]
    for got, want in zip(exe(*args), interpret(graph, *args), strict=True):
        assert_close(got, want, reduction=True)


def test_channel_concat_and_nchw_readers():
    """A concat along channels joins the matrices; an operand broadcast over channels (not
    per channel) and a graph output get NCHW conversions, made once."""
    rng = np.random.default_rng(3)
    b = GraphBuilder("mix")
    x = b.input(((1, 3, 6, 5), DType.f32), "x")
    spatial = b.input(((1, 1, 6, 5), DType.f32), "s")
    h1 = b.add1("conv2d", [x, _const(b, rng, (4, 3, 1, 1))])
    h2 = b.add1("conv2d", [x, _const(b, rng, (2, 3, 3, 3))], {"padding": (1, 1, 1, 1)})
    cat = b.add1("concat", [h1, h2], {"axis": 1})
    scaled = b.add1("mul", [cat, spatial])
    graph = b.build([b.add1("sigmoid", [scaled]), h1])
    result, _ = conv_to_matmul(graph)
    concat = next(n for n in result.nodes if n.op.name == "concat")
    assert concat.attrs["axis"] == 1 and len(concat.outputs[0].shape) == 2
    assert len([p for p in _perms(result) if p == (0, 3, 1, 2)]) == 2  # cat and h1, once each
    assert_same(graph, result, seed=4)
    exe = build_native(run_pipeline(graph, GRAPH_PIPELINE)[0])
    assert exe.fallbacks == []
    args = [random_array(np.random.default_rng(9), tuple(v.shape), DType.f32)
            for v in graph.inputs]
    for got, want in zip(exe(*args), interpret(graph, *args), strict=True):
        assert_close(got, want, reduction=True)


@pytest.mark.parametrize("c,o,groups,k,stride,padding,hw", [
    (4, 6, 2, 3, 1, (1, 1, 1, 1), (7, 9)),     # AlexNet's two groups
    (12, 8, 4, 1, 1, (0, 0, 0, 0), (5, 5)),    # ShuffleNet's grouped 1x1
    (32, 64, 2, 3, 2, (1, 0, 0, 1), (9, 7)),   # groups of 16 channels: vectorised gathers
    (7, 7, 7, 3, 1, (1, 1, 1, 1), (7, 9)),     # depthwise
    (32, 32, 32, 3, 2, (1, 1, 1, 1), (9, 9)),  # depthwise, vectors along C, stride 2
    (17, 17, 17, 5, 1, (2, 2, 2, 2), (6, 5)),  # depthwise, a scalar channel tail
])
def test_grouped_and_depthwise_convs(c, o, groups, k, stride, padding, hw):
    rng = np.random.default_rng(c + groups)
    b = GraphBuilder("grouped")
    x = b.input(((2, c, *hw), DType.f32), "x")
    y = b.add1("conv2d", [x, _const(b, rng, (o, c // groups, k, k)), _const(b, rng, (o,))],
               {"groups": groups, "stride": (stride, stride), "padding": padding})
    graph = b.build([b.add1("relu", [y])])
    result, changed = conv_to_matmul(graph)
    names = [n.op.name for n in result.nodes]
    assert changed and "conv2d" not in names
    depthwise = groups == c == o
    assert names.count("matmul") == (0 if depthwise else groups)
    assert_same(graph, result, seed=groups)
    exe = build_native(run_pipeline(graph, GRAPH_PIPELINE)[0])
    assert exe.fallbacks == []
    args = [random_array(np.random.default_rng(1), (2, c, *hw), DType.f32)]
    for got, want in zip(exe(*args), interpret(graph, *args), strict=True):
        assert_close(got, want, reduction=True)


def test_pool_taps_do_not_recompute_arithmetic():
    """An elementwise value read by a pool's taps is written once, not recomputed per window
    reading it (ZFNet's LRN before its max pool)."""
    rng = np.random.default_rng(12)
    b = GraphBuilder("lrn_pool")
    x = b.input(((1, 3, 9, 9), DType.f32), "x")
    spatial = b.input(((1, 1, 9, 9), DType.f32), "s")
    h = b.add1("conv2d", [x, _const(b, rng, (16, 3, 3, 3))], {"padding": (1, 1, 1, 1)})
    scale = b.add1("exp", [b.add1("mul", [h, spatial])])  # NCHW: not a per-channel operand
    y = b.add1("max_pool2d", [b.add1("div", [h, scale])],
               {"kernel": (3, 3), "stride": (2, 2), "padding": (1, 1, 1, 1)})
    graph = b.build([y])
    optimized, _ = run_pipeline(graph, GRAPH_PIPELINE)
    plan = form_kernels(decompose_composites(optimized)[0])
    (taps,) = [g for g in plan.groups if g.kind is KernelKind.REDUCTION]
    assert {n.op.kind for n in taps.nodes if n is not taps.anchor} <= {OpKind.MOVEMENT}
    exe = build_native(optimized)
    assert exe.fallbacks == []
    args = [random_array(np.random.default_rng(2), tuple(v.shape), DType.f32)
            for v in graph.inputs]
    for got, want in zip(exe(*args), interpret(graph, *args), strict=True):
        assert_close(got, want, reduction=True)


@pytest.mark.parametrize("attrs,clamped", [
    ({"kernel": (3, 3), "stride": (2, 2), "padding": (1, 1, 1, 1)}, True),   # ResNet's stem
    ({"kernel": (2, 3), "stride": (2, 1), "padding": (1, 0, 0, 1)}, True),
    ({"kernel": (5, 5), "stride": (1, 1), "padding": (2, 2, 2, 2)}, True),
    ({"kernel": (3, 2), "stride": (1, 2), "padding": (0, 1, 1, 1), "dilation": (1, 2)}, False),
])
def test_max_pool_reads_its_padding_as_clamped_loads(attrs, clamped):
    """A channels-last max pool over a -inf padded input with unit dilation reads the padding
    as loads clamped to the edge (no bounds test, no select): every window holds a real
    element and max is idempotent. All-negative activations make a 0 fill or a tap clamped
    outside its window visible; NaN must still propagate."""
    rng = np.random.default_rng(21)
    b = GraphBuilder("pool_pad")
    x = b.input(((2, 3, 9, 8), DType.f32), "x")
    h = b.add1("conv2d", [x, _const(b, rng, (16, 3, 3, 3))])
    h = b.add1("sub", [h, b.add1("constant", [], {"value": Literal(np.float32(50.0))})])
    graph = b.build([b.add1("max_pool2d", [h], attrs)])
    optimized, _ = run_pipeline(graph, GRAPH_PIPELINE)
    plan = form_kernels(decompose_composites(optimized)[0])
    (taps,) = [g for g in plan.groups if g.kind is KernelKind.REDUCTION]
    from tilefuse.kernel.lower_pool import lower_taps
    assert ("select(" not in str(lower_taps(taps))) is clamped
    exe = build_native(optimized)
    assert exe.fallbacks == []
    for seed in (3, 4):
        args = [random_array(np.random.default_rng(seed), (2, 3, 9, 8), DType.f32)]
        (want,) = interpret(graph, *args)
        assert want.max() < 0
        for got, w in zip(exe(*args), (want,), strict=True):
            assert_close(got, w, reduction=True)
    args[0][1, :, 4, 4] = np.nan
    (got,) = exe(*args)
    (want,) = interpret(graph, *args)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))


@pytest.mark.parametrize("op,keepdims,hw,rewritten", [
    ("mean", True, (7, 9), True), ("mean", False, (5, 5), True), ("max", True, (6, 4), True),
    ("sum", False, (3, 11), True), ("mean", True, (17, 16), False),   # over 256 taps
])
def test_global_pool_of_a_matrix_is_a_tap_reduction(op, keepdims, hw, rewritten):
    """A max / mean / sum over H and W of a conv's output reduces the taps of the activation
    matrix seen as [N, H·W, C] (no transpose back to NCHW), and matches the reference."""
    rng = np.random.default_rng(31)
    b = GraphBuilder("gap")
    x = b.input(((2, 3, *hw), DType.f32), "x")
    h = b.add1("conv2d", [x, _const(b, rng, (19, 3, 1, 1))])
    y = b.add1(op, [b.add1("relu", [h])], {"axes": (2, -1), "keepdims": keepdims})
    graph = b.build([b.add1("mul", [y, y])])
    result, _ = conv_to_matmul(graph)
    reductions = [n for n in result.nodes if n.op.name == op]
    assert len(reductions) == 1
    assert (tuple(reductions[0].attrs["axes"]) == (1,)) is rewritten
    back = [n for n in result.nodes if n.op.name == "transpose" and
            tuple(n.attrs["perm"]) == (0, 3, 1, 2) and tuple(n.inputs[0].shape[1:3]) == hw]
    assert (not back) is rewritten   # no full-size NHWC -> NCHW transpose
    assert_same(graph, result, seed=7)
    exe = build_native(run_pipeline(graph, GRAPH_PIPELINE)[0])
    assert exe.fallbacks == []
    args = [random_array(np.random.default_rng(9), (2, 3, *hw), DType.f32)]
    for got, want in zip(exe(*args), interpret(graph, *args), strict=True):
        assert_close(got, want, reduction=True)
