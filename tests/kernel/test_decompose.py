"""The decompose pass: golden before/after text, numeric agreement with the composite ops'
references, the changed flag, and its errors."""

from __future__ import annotations

import textwrap

import numpy as np
import pytest

from tilefuse.dtypes import DType
from tilefuse.errors import VerifyError
from tilefuse.graph.builder import GraphBuilder
from tilefuse.graph.interpreter import interpret
from tilefuse.graph.ir import Graph, Node
from tilefuse.graph.parser import parse_graph
from tilefuse.graph.printer import print_graph
from tilefuse.ops import get_op
from tilefuse.ops.registry import Trait
from tilefuse.passes.decompose import decompose_composites
from tilefuse.testing import assert_close, random_array


def text(s: str) -> str:
    return textwrap.dedent(s).lstrip("\n")


def assert_same_results(a: Graph, b: Graph, seed: int) -> None:
    rng = np.random.default_rng(seed)
    args = [random_array(rng, tuple(int(d) for d in v.type.shape), v.type.dtype)
            for v in a.inputs]
    for got, want in zip(interpret(b, *args), interpret(a, *args), strict=True):
        assert_close(got, want, reduction=True)


BEFORE = """
    graph @g(%x: f32[2,8], %w: f32[8], %b: f32[8]) -> (f32[2,8], f32[2,8]) {
      %0 = layer_norm(%x, %w, %b) {eps=1e-05} : f32[2,8]  # m.py:3 in f
      %1 = softmax(%0) {axis=-1} : f32[2,8]  # m.py:4 in f
      %2 = neg(%1) : f32[2,8]
      %3 = rms_norm(%2, %w) {eps=1e-06} : f32[2,8]
      %4 = log_softmax(%3) {axis=0} : f32[2,8]  # m.py:6
      return %4, %0
    }
    """

AFTER = """
    graph @g(%x: f32[2,8], %w: f32[8], %b: f32[8]) -> (f32[2,8], f32[2,8]) {
      %0 = mean(%x) {axes=[1], keepdims=true} : f32[2,1]  # m.py:3 in f
      %1 = sub(%x, %0) : f32[2,8]  # m.py:3 in f
      %2 = mul(%1, %1) : f32[2,8]  # m.py:3 in f
      %3 = mean(%2) {axes=[1], keepdims=true} : f32[2,1]  # m.py:3 in f
      %4 = full() {dtype=f32, shape=[], value=1e-05} : f32[]  # m.py:3 in f
      %5 = add(%3, %4) : f32[2,1]  # m.py:3 in f
      %6 = rsqrt(%5) : f32[2,1]  # m.py:3 in f
      %7 = mul(%1, %6) : f32[2,8]  # m.py:3 in f
      %8 = mul(%7, %w) : f32[2,8]  # m.py:3 in f
      %9 = add(%8, %b) : f32[2,8]  # m.py:3 in f
      %10 = max(%9) {axes=[-1], keepdims=true} : f32[2,1]  # m.py:4 in f
      %11 = sub(%9, %10) : f32[2,8]  # m.py:4 in f
      %12 = exp(%11) : f32[2,8]  # m.py:4 in f
      %13 = sum(%12) {axes=[-1], keepdims=true} : f32[2,1]  # m.py:4 in f
      %14 = div(%12, %13) : f32[2,8]  # m.py:4 in f
      %15 = neg(%14) : f32[2,8]
      %16 = mul(%15, %15) : f32[2,8]
      %17 = mean(%16) {axes=[1], keepdims=true} : f32[2,1]
      %18 = full() {dtype=f32, shape=[], value=1e-06} : f32[]
      %19 = add(%17, %18) : f32[2,1]
      %20 = rsqrt(%19) : f32[2,1]
      %21 = mul(%15, %20) : f32[2,8]
      %22 = mul(%21, %w) : f32[2,8]
      %23 = max(%22) {axes=[0], keepdims=true} : f32[1,8]  # m.py:6
      %24 = sub(%22, %23) : f32[2,8]  # m.py:6
      %25 = exp(%24) : f32[2,8]  # m.py:6
      %26 = sum(%25) {axes=[0], keepdims=true} : f32[1,8]  # m.py:6
      %27 = log(%26) : f32[1,8]  # m.py:6
      %28 = sub(%24, %27) : f32[2,8]  # m.py:6
      return %28, %9
    }
    """


def test_decompose_golden_keeps_locations():
    before = parse_graph(text(BEFORE))
    after, changed = decompose_composites(before)
    assert changed
    assert print_graph(after) == text(AFTER)
    assert not any(n.op.has(Trait.COMPOSITE) for n in after.nodes)


@pytest.mark.parametrize("seed", range(3))
def test_decompose_preserves_results(seed):
    before = parse_graph(text(BEFORE))
    after, _ = decompose_composites(before)
    assert_same_results(before, after, seed)


@pytest.mark.parametrize("dtype", [DType.f16, DType.bf16, DType.f64])
def test_decompose_low_precision_casts_up_and_back(dtype):
    builder = GraphBuilder("g")
    x = builder.input(((3, 5), dtype), "x")
    w = builder.input(((5,), dtype), "w")
    y = builder.add1("rms_norm", [x, w])
    graph = builder.build([builder.add1("softmax", [y], {"axis": 0})])
    after, changed = decompose_composites(graph)
    assert changed
    casts = [n for n in after.nodes if n.op.name == "cast"]
    assert (len(casts) > 0) == (dtype is not DType.f64)
    assert after.outputs[0].type == graph.outputs[0].type
    assert_same_results(graph, after, seed=7)


def test_graph_without_composites_is_returned_unchanged():
    graph = parse_graph(text("""
        graph @g(%x: f32[2,3]) -> f32[2,3] {
          %0 = exp(%x) : f32[2,3]
          return %0
        }
        """))
    after, changed = decompose_composites(graph)
    assert after is graph and not changed


def test_a_decomposition_of_the_wrong_type_is_a_verify_error():
    softmax = get_op("softmax")
    broken = type(softmax)(**{**{f: getattr(softmax, f) for f in (
        "name", "kind", "arity", "shape_rule", "dtype_rule", "reference", "attrs", "traits",
        "accepts", "doc")}, "decompose": lambda b, ins, attrs, loc=None: (
            b.add1("sum", [ins[0]], {"axes": (0,)}),)})
    builder = GraphBuilder("g")
    x = builder.input(((2, 3), DType.f32), "x")
    (y,) = builder.add("softmax", [x])
    graph = builder.build([y])
    node = graph.nodes[0]
    patched = Graph(graph.name, graph.inputs,
                    (Node(broken, node.inputs, node.attrs, node.outputs, node.loc),),
                    graph.outputs)
    with pytest.raises(VerifyError, match="softmax: decomposition produced f32\\[3\\]"):
        decompose_composites(patched)
