"""Each pass on golden text (parse the before, run the pass, compare the printed after exactly),
numerically (the interpreter agrees before and after on random inputs), and its changed flag."""

from __future__ import annotations

import textwrap

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tilefuse.dtypes import DType
from tilefuse.errors import DTypeError, ShapeError
from tilefuse.graph.interpreter import interpret
from tilefuse.graph.ir import Graph, Node, Value, structurally_equal
from tilefuse.graph.parser import parse_graph
from tilefuse.graph.printer import print_graph
from tilefuse.graph.types import Sym, TensorType
from tilefuse.passes import cse, dce, shape_infer, specialize
from tilefuse.testing import assert_close, random_array


def text(s: str) -> str:
    return textwrap.dedent(s).lstrip("\n")


def run_golden(pass_fn, before: str, after: str) -> Graph:
    graph = parse_graph(text(before))
    result, changed = pass_fn(graph)
    assert print_graph(result) == text(after)
    assert changed == (text(before) != text(after))
    assert_same_results(graph, result)
    return result


def assert_same_results(a: Graph, b: Graph, seed: int = 0) -> None:
    rng = np.random.default_rng(seed)
    args = [random_array(rng, tuple(int(d) for d in v.type.shape), v.type.dtype)
            for v in a.inputs]
    for got, want in zip(interpret(b, *args), interpret(a, *args), strict=True):
        assert_close(got, want)


# ---- dce -------------------------------------------------------------------------------------

def test_dce_golden():
    run_golden(dce, """
        graph @g(%x: f32[2,3], %unused: f32[3]) -> f32[2,3] {
          %0 = exp(%x) : f32[2,3]
          %1 = neg(%0) : f32[2,3]  # m.py:3
          %2, %3 = split(%x) {axis=1, sizes=[1,2]} : f32[2,1], f32[2,2]
          %4 = tanh(%2) : f32[2,1]
          %5 = mul(%0, %4) : f32[2,3]
          %6 = gelu(%5) {approximate="none"} : f32[2,3]
          return %5
        }
        """, """
        graph @g(%x: f32[2,3], %unused: f32[3]) -> f32[2,3] {
          %0 = exp(%x) : f32[2,3]
          %1, %2 = split(%x) {axis=1, sizes=[1,2]} : f32[2,1], f32[2,2]
          %3 = tanh(%1) : f32[2,1]
          %4 = mul(%0, %3) : f32[2,3]
          return %4
        }
        """)


def test_dce_keeps_a_live_graph_unchanged():
    before = """
        graph @g(%x: f32[2]) -> (f32[2], f32[2]) {
          %0 = neg(%x) : f32[2]
          return %0, %x
        }
        """
    graph = run_golden(dce, before, before)
    assert graph is not None


# ---- cse -------------------------------------------------------------------------------------

def test_cse_golden():
    run_golden(cse, """
        graph @g(%x: f32[2,3], %b: f32[3]) -> (f32[2,3], f32[2,3], f32[2,3], f32[2,3], f32[2,1]) {
          %0 = add(%x, %b) : f32[2,3]
          %1 = add(%b, %x) : f32[2,3]
          %2 = div(%x, %b) : f32[2,3]
          %3 = div(%b, %x) : f32[2,3]
          %4 = gelu(%0) {approximate="none"} : f32[2,3]
          %5 = gelu(%1) {approximate="none"} : f32[2,3]
          %6 = gelu(%1) {approximate="tanh"} : f32[2,3]
          %7 = mul(%4, %5) : f32[2,3]
          %8 = mul(%5, %4) : f32[2,3]
          %9, %10 = split(%x) {axis=1, sizes=[1,2]} : f32[2,1], f32[2,2]
          %11, %12 = split(%x) {axis=1, sizes=[1,2]} : f32[2,1], f32[2,2]
          %13 = add(%7, %8) : f32[2,3]
          %14 = add(%2, %3) : f32[2,3]
          %15 = add(%6, %14) : f32[2,3]
          return %13, %15, %1, %8, %11
        }
        """, """
        graph @g(%x: f32[2,3], %b: f32[3]) -> (f32[2,3], f32[2,3], f32[2,3], f32[2,3], f32[2,1]) {
          %0 = add(%x, %b) : f32[2,3]
          %1 = div(%x, %b) : f32[2,3]
          %2 = div(%b, %x) : f32[2,3]
          %3 = gelu(%0) {approximate="none"} : f32[2,3]
          %4 = gelu(%0) {approximate="tanh"} : f32[2,3]
          %5 = mul(%3, %3) : f32[2,3]
          %6, %7 = split(%x) {axis=1, sizes=[1,2]} : f32[2,1], f32[2,2]
          %8 = add(%5, %5) : f32[2,3]
          %9 = add(%1, %2) : f32[2,3]
          %10 = add(%4, %9) : f32[2,3]
          return %8, %10, %0, %5, %6
        }
        """)


def test_cse_merges_equal_constants_but_not_signed_zeros_or_other_dtypes():
    run_golden(cse, """
        graph @g() -> (f32[2], f32[2], f32[2], f32[2], f64[2]) {
          %0 = constant() {value=array<f32[2]>[1.5,-0.0]} : f32[2]
          %1 = constant() {value=array<f32[2]>[1.5,-0.0]} : f32[2]
          %2 = constant() {value=array<f32[2]>[1.5,0.0]} : f32[2]
          %3 = full() {dtype=f32, shape=[2], value=-0.0} : f32[2]
          %4 = full() {dtype=f32, shape=[2], value=0.0} : f32[2]
          %5 = full() {dtype=f32, shape=[2], value=0.0} : f32[2]
          %6 = full() {dtype=f64, shape=[2], value=0.0} : f64[2]
          %7 = add(%0, %1) : f32[2]
          %8 = add(%4, %5) : f32[2]
          return %7, %2, %3, %8, %6
        }
        """, """
        graph @g() -> (f32[2], f32[2], f32[2], f32[2], f64[2]) {
          %0 = constant() {value=array<f32[2]>[1.5,-0.0]} : f32[2]
          %1 = constant() {value=array<f32[2]>[1.5,0.0]} : f32[2]
          %2 = full() {dtype=f32, shape=[2], value=-0.0} : f32[2]
          %3 = full() {dtype=f32, shape=[2], value=0.0} : f32[2]
          %4 = full() {dtype=f64, shape=[2], value=0.0} : f64[2]
          %5 = add(%0, %0) : f32[2]
          %6 = add(%3, %3) : f32[2]
          return %5, %1, %2, %6, %4
        }
        """)


# ---- shape_infer and specialize ----------------------------------------------------------------

SYMBOLIC = """
    graph @g(%x: f32[batch,6], %b: f32[6]) -> (f32[batch,2,3], f32[batch,6]) {
      %0 = add(%x, %b) : f32[batch,6]
      %1 = reshape(%0) {shape=[batch,2,-1]} : f32[batch,2,3]
      %2 = sum(%1) {axes=[2], keepdims=false} : f32[batch,2]
      %3, %4 = split(%0) {axis=1, sizes=[2,4]} : f32[batch,2], f32[batch,4]
      %5 = mul(%2, %3) : f32[batch,2]
      %6 = lt(%5, %3) : bool[batch,2]
      return %1, %0
    }
    """

SPECIALIZED = """
    graph @g(%x: f32[4,6], %b: f32[6]) -> (f32[4,2,3], f32[4,6]) {
      %0 = add(%x, %b) : f32[4,6]
      %1 = reshape(%0) {shape=[4,2,-1]} : f32[4,2,3]
      %2 = sum(%1) {axes=[2], keepdims=false} : f32[4,2]
      %3, %4 = split(%0) {axis=1, sizes=[2,4]} : f32[4,2], f32[4,4]
      %5 = mul(%2, %3) : f32[4,2]
      %6 = lt(%5, %3) : bool[4,2]
      return %1, %0
    }
    """


def test_shape_infer_on_consistent_types_changes_nothing():
    graph = parse_graph(text(SYMBOLIC))
    result, changed = shape_infer(graph)
    assert not changed and result is graph


def test_shape_infer_golden_repairs_stale_types():
    """An input retyped by hand leaves every type below it stale (such a graph has no parseable
    text, so the before is built from parsed text and its printed form is checked too)."""
    graph = parse_graph(text("""
        graph @g(%x: f32[batch,6], %b: f32[6]) -> (f32[batch,6], bf16[batch,2]) {
          %0 = add(%x, %b) : f32[batch,6]
          %1, %2 = split(%0) {axis=1, sizes=[2,4]} : f32[batch,2], f32[batch,4]
          %3 = sum(%2) {axes=[1], keepdims=true} : f32[batch,1]
          %4 = mul(%1, %3) : f32[batch,2]
          %5 = cast(%4) {dtype=bf16} : bf16[batch,2]
          return %0, %5
        }
        """))
    x = Value(TensorType((4, 6), DType.f32), "x")
    first = graph.nodes[0]
    nodes = (Node(first.op, (x, first.inputs[1]), first.attrs, first.outputs, first.loc),
             *graph.nodes[1:])
    stale = Graph(graph.name, (x, graph.inputs[1]), nodes, graph.outputs)
    assert print_graph(stale).startswith("graph @g(%x: f32[4,6], %b: f32[6]) -> "
                                         "(f32[batch,6], bf16[batch,2]) {\n"
                                         "  %0 = add(%x, %b) : f32[batch,6]\n")
    result, changed = shape_infer(stale)
    assert changed
    assert print_graph(result) == text("""
        graph @g(%x: f32[4,6], %b: f32[6]) -> (f32[4,6], bf16[4,2]) {
          %0 = add(%x, %b) : f32[4,6]
          %1, %2 = split(%0) {axis=1, sizes=[2,4]} : f32[4,2], f32[4,4]
          %3 = sum(%2) {axes=[1], keepdims=true} : f32[4,1]
          %4 = mul(%1, %3) : f32[4,2]
          %5 = cast(%4) {dtype=bf16} : bf16[4,2]
          return %0, %5
        }
        """)
    assert shape_infer(result) == (result, False)
    assert_same_results(result, specialize(graph, [x.type, graph.inputs[1].type]))


def test_specialize_golden():
    graph = parse_graph(text(SYMBOLIC))
    result = specialize(graph, [TensorType((4, 6), DType.f32), graph.inputs[1].type])
    assert print_graph(result) == text(SPECIALIZED)
    assert_same_results(result, parse_graph(text(SPECIALIZED)))


def test_specialize_checks_the_new_types():
    graph = parse_graph(text("""
        graph @g(%x: f32[n,6], %y: f32[n,6]) -> f32[n,6] {
          %0 = add(%x, %y) : f32[n,6]
          return %0
        }
        """))
    f32 = DType.f32
    with pytest.raises(ShapeError, match="symbol n is bound to both 4 and 5"):
        specialize(graph, [TensorType((4, 6), f32), TensorType((5, 6), f32)])
    with pytest.raises(ShapeError, match="cannot specialize"):
        specialize(graph, [TensorType((4, 7), f32), TensorType((4, 7), f32)])
    with pytest.raises(DTypeError, match="cannot specialize"):
        specialize(graph, [TensorType((4, 6), DType.f16), TensorType((4, 6), DType.f16)])
    with pytest.raises(ShapeError, match="2 inputs"):
        specialize(graph, [TensorType((4, 6), f32)])
    renamed = specialize(graph, [TensorType((Sym("m"), 6), f32)] * 2)
    assert renamed.outputs[0].type == TensorType((Sym("m"), 6), f32)


# ---- every pass on random graphs ---------------------------------------------------------------

PASSES = {"dce": dce, "cse": cse, "shape_infer": shape_infer}


@settings(max_examples=30, deadline=None)
@given(st.integers(0, 2**32 - 1), st.sampled_from(sorted(PASSES)))
def test_passes_preserve_results_and_report_changes_honestly(graph_factory, seed, name):
    graph = graph_factory(np.random.default_rng(seed), 14)
    result, changed = PASSES[name](graph)
    assert changed == (not structurally_equal(result, graph))
    assert_same_results(graph, result, seed)
    again, changed_again = PASSES[name](result)
    assert not changed_again and structurally_equal(again, result)


def test_random_graphs_give_the_passes_work(graph_factory):
    """Guards the property test above against testing only no-op cases."""
    graphs = [graph_factory(np.random.default_rng(seed), 14) for seed in range(30)]
    assert sum(dce(g)[1] for g in graphs) >= 10
    assert sum(cse(g)[1] for g in graphs) >= 5
