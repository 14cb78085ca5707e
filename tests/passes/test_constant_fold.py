"""Constant folding: all-constant nodes become constants through the references, within the cap."""

from __future__ import annotations

import textwrap

import numpy as np

from tilefuse.graph.interpreter import interpret
from tilefuse.graph.parser import parse_graph
from tilefuse.graph.printer import print_graph
from tilefuse.passes import constant_fold as constant_fold_module
from tilefuse.passes.constant_fold import FOLD_FREE_BYTES, constant_fold
from tilefuse.passes.dce import dce
from tilefuse.testing import assert_close, random_array


def _graph(text: str):
    return parse_graph(textwrap.dedent(text).strip("\n") + "\n")


def _fold(graph):
    folded, changed = constant_fold(graph)
    return dce(folded)[0], changed


def _same_results(a, b, seed=0):
    rng = np.random.default_rng(seed)
    args = [random_array(rng, tuple(v.shape), v.dtype) for v in a.inputs]
    for got, want in zip(interpret(b, *args), interpret(a, *args), strict=True):
        assert_close(got, want)


WEIGHT = """
    graph @g(%x: f32[7,3]) -> f32[7,2] {
      %0 = constant() {value=array<f32[2,3]>[[1.0,2.0,3.0],[-1.0,0.5,0.25]]} : f32[2,3]
      %1 = transpose(%0) {perm=[1,0]} : f32[3,2]
      %2 = constant() {value=array<f32[]>2.0} : f32[]
      %3 = mul(%1, %2) : f32[3,2]
      %4 = matmul(%x, %3) : f32[7,2]
      return %4
    }
    """


def test_a_chain_of_constant_ops_folds_into_one_constant():
    graph = _graph(WEIGHT)
    folded, changed = _fold(graph)
    assert changed
    assert print_graph(folded) == textwrap.dedent("""\
        graph @g(%x: f32[7,3]) -> f32[7,2] {
          %0 = constant() {value=array<f32[3,2]>[[2.0,-2.0],[4.0,1.0],[6.0,0.5]]} : f32[3,2]
          %1 = matmul(%x, %0) : f32[7,2]
          return %1
        }
        """)
    _same_results(graph, folded)


def test_nothing_to_fold_returns_the_graph_itself():
    graph = _graph("""
        graph @g(%x: f32[2,3]) -> f32[2,3] {
          %0 = constant() {value=array<f32[]>2.0} : f32[]
          %1 = mul(%x, %0) : f32[2,3]
          return %1
        }
        """)
    assert constant_fold(graph) == (graph, False)


def test_a_result_growing_the_constants_beyond_the_free_allowance_stays_a_computation():
    side = 129   # 129*129*4 bytes > 4 + 64 KiB
    assert side * side * 4 > 4 + FOLD_FREE_BYTES
    graph = _graph(f"""
        graph @g(%x: f32[{side},{side}]) -> f32[{side},{side}] {{
          %0 = constant() {{value=array<f32[1]>[3.0]}} : f32[1]
          %1 = broadcast_to(%0) {{shape=[{side},{side}]}} : f32[{side},{side}]
          %2 = add(%x, %1) : f32[{side},{side}]
          return %2
        }}
        """)
    assert constant_fold(graph) == (graph, False)
    small = _graph("""
        graph @g(%x: f32[7,5]) -> f32[7,5] {
          %0 = constant() {value=array<f32[1]>[3.0]} : f32[1]
          %1 = broadcast_to(%0) {shape=[7,5]} : f32[7,5]
          %2 = add(%x, %1) : f32[7,5]
          return %2
        }
        """)
    folded, changed = _fold(small)
    assert changed and [n.op.name for n in folded.nodes] == ["constant", "add"]
    _same_results(small, folded)


def test_the_size_cap_keeps_a_large_result_a_computation(monkeypatch):
    monkeypatch.setattr(constant_fold_module, "FOLD_MAX_BYTES", 16)   # the [3,2] f32 is 24
    graph = _graph(WEIGHT)
    folded, changed = _fold(graph)
    assert [n.op.name for n in folded.nodes] == ["constant", "transpose", "constant", "mul",
                                                 "matmul"]
    assert not changed


def test_sources_and_multi_output_nodes_fold():
    graph = _graph("""
        graph @g(%x: f32[3,4]) -> (f32[3,4], f32[3,4]) {
          %0 = full() {dtype=f32, shape=[3,2], value=1.5} : f32[3,2]
          %1 = arange() {dtype=f32, start=0.0, step=1.0, stop=6.0} : f32[6]
          %2 = reshape(%1) {shape=[3,2]} : f32[3,2]
          %3 = concat(%0, %2) {axis=1} : f32[3,4]
          %4, %5 = split(%3) {axis=0, sizes=[1,2]} : f32[1,4], f32[2,4]
          %6 = add(%x, %4) : f32[3,4]
          %7 = sum(%5) {axes=[0], keepdims=true} : f32[1,4]
          %8 = mul(%x, %7) : f32[3,4]
          return %6, %8
        }
        """)
    folded, changed = _fold(graph)
    assert changed
    assert [n.op.name for n in folded.nodes] == ["constant", "add", "constant", "mul"]
    _same_results(graph, folded)


def test_values_computed_from_inputs_never_fold():
    graph = _graph("""
        graph @g(%x: f32[1,7]) -> f32[7,1] {
          %0 = transpose(%x) {perm=[1,0]} : f32[7,1]
          %1 = exp(%0) : f32[7,1]
          return %1
        }
        """)
    assert constant_fold(graph) == (graph, False)
