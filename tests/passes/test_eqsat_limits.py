"""Equality saturation stops at its node, time and iteration limits, and what it extracts at any
stopping point is still a correct graph."""

from __future__ import annotations

import textwrap

import numpy as np
import pytest

from tilefuse.graph.interpreter import interpret
from tilefuse.graph.parser import parse_graph
from tilefuse.passes.eqsat import Limits, saturate
from tilefuse.testing import assert_close, random_array

# transposes around a chain of elementwise ops: each iteration pushes them one op further
CHAIN = textwrap.dedent("""
    graph @g(%x: f32[3,5,7], %y: f32[3,5,7]) -> f32[3,5,7] {
      %0 = transpose(%x) {perm=[2,0,1]} : f32[7,3,5]
      %1 = transpose(%y) {perm=[2,0,1]} : f32[7,3,5]
      %2 = add(%0, %1) : f32[7,3,5]
      %3 = exp(%2) : f32[7,3,5]
      %4 = tanh(%3) : f32[7,3,5]
      %5 = neg(%4) : f32[7,3,5]
      %6 = neg(%5) : f32[7,3,5]
      %7 = transpose(%6) {perm=[1,2,0]} : f32[3,5,7]
      return %7
    }
    """).lstrip()


def _check_results(before, after):
    rng = np.random.default_rng(3)
    args = [random_array(rng, tuple(v.shape), v.dtype) for v in before.inputs]
    assert_close(interpret(after, *args)[0], interpret(before, *args)[0])


def test_unlimited_run_saturates_and_cancels_the_transposes():
    graph = parse_graph(CHAIN)
    result = saturate(graph)
    assert result.stopped == "saturated" and result.iterations > 2
    assert [n.op.name for n in result.graph.nodes] == ["add", "exp", "tanh"]
    _check_results(graph, result.graph)


@pytest.mark.parametrize(("limits", "reason"), [
    (Limits(max_nodes=1), "node limit"),
    (Limits(max_seconds=0.0), "time limit"),
    (Limits(max_iterations=1), "iteration limit"),
])
def test_each_limit_stops_after_one_iteration_with_a_correct_graph(limits, reason):
    graph = parse_graph(CHAIN)
    result = saturate(graph, limits)
    assert result.stopped == reason
    assert result.iterations == 1
    assert result.notes()["stopped"] == reason
    _check_results(graph, result.graph)


def test_the_node_limit_bounds_growth():
    graph = parse_graph(CHAIN)
    full = saturate(graph)
    limited = saturate(graph, Limits(max_nodes=full.enodes // 2))
    assert limited.stopped == "node limit"
    assert limited.enodes < full.enodes
    _check_results(graph, limited.graph)


def test_a_graph_of_unmodelled_ops_skips_the_egraph():
    graph = parse_graph(textwrap.dedent("""
        graph @g(%x: f32[3,5]) -> f32[3] {
          %0 = sum(%x) {axes=[1]} : f32[3]
          return %0
        }
        """).lstrip())
    result = saturate(graph)
    assert result.stopped == "nothing to rewrite" and result.graph is graph and not result.changed
