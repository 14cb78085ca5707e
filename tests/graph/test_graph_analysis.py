"""Analyses: use counts, users, topological order, liveness."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tilefuse.dtypes import DType
from tilefuse.errors import VerifyError
from tilefuse.graph.analysis import liveness, topo_order, use_counts, users
from tilefuse.graph.builder import GraphBuilder
from tilefuse.graph.ir import Attrs, Node, Value
from tilefuse.graph.types import TensorType
from tilefuse.ops import get_op


def _diamond():
    b = GraphBuilder("diamond")
    x = b.input(((4,), DType.f32), "x")
    y = b.input(((4,), DType.f32), "y")      # unused
    a = b.add1("neg", [x])
    c = b.add1("exp", [a])
    d = b.add1("mul", [a, a])
    e = b.add1("add", [c, d])
    dead = b.add1("tanh", [x])
    return b.build([e, a]), (x, y, a, c, d, e, dead)


def test_use_counts_count_operand_slots_and_graph_outputs():
    graph, (x, y, a, c, d, e, dead) = _diamond()
    assert use_counts(graph) == {x: 2, y: 0, a: 4, c: 1, d: 1, e: 1, dead: 0}


def test_users_lists_each_reader_once_in_order():
    graph, (x, y, a, c, d, e, dead) = _diamond()
    n = graph.nodes
    assert users(graph) == {x: [n[0], n[4]], y: [], a: [n[1], n[2]], c: [n[3]], d: [n[3]],
                            e: [], dead: []}


def test_liveness_intervals():
    graph, (x, y, a, c, d, e, dead) = _diamond()
    assert liveness(graph) == {x: (-1, 4), y: (-1, -1), a: (0, 5), c: (1, 3), d: (2, 3),
                               e: (3, 5), dead: (4, 4)}


def test_topo_order_keeps_a_valid_order_and_sorts_a_shuffled_one():
    graph, _ = _diamond()
    assert topo_order(graph.nodes, graph.inputs) == list(graph.nodes)
    shuffled = [graph.nodes[i] for i in (3, 4, 2, 1, 0)]
    # stable: among ready nodes the earliest in the given list goes first
    assert topo_order(shuffled, graph.inputs) == [graph.nodes[i] for i in (4, 0, 2, 1, 3)]


def test_topo_order_rejects_cycles_and_undefined_values():
    t = TensorType((2,), DType.f32)
    x, a, c = Value(t, "x"), Value(t), Value(t)
    neg, exp = get_op("neg"), get_op("exp")
    cycle = [Node(neg, (c,), Attrs(), (a,)), Node(exp, (a,), Attrs(), (c,))]
    with pytest.raises(VerifyError, match="cycle"):
        topo_order(cycle, [x])
    with pytest.raises(VerifyError, match="cycle"):
        topo_order([Node(neg, (a,), Attrs(), (a,))], [x])
    with pytest.raises(VerifyError, match="no input or node defines"):
        topo_order([Node(neg, (Value(t),), Attrs(), (a,))], [x])
    with pytest.raises(VerifyError, match="defined by two nodes"):
        topo_order([Node(neg, (x,), Attrs(), (a,)), Node(exp, (x,), Attrs(), (a,))], [x])


def test_liveness_rejects_use_before_definition():
    t = TensorType((2,), DType.f32)
    x, a, c = Value(t, "x"), Value(t), Value(t)
    from tilefuse.graph.ir import Graph
    graph = Graph("g", (x,), (Node(get_op("neg"), (a,), Attrs(), (c,)),), (c,))
    with pytest.raises(VerifyError):
        liveness(graph)


@settings(max_examples=30, deadline=None)
@given(st.integers(0, 2**32 - 1), st.randoms(use_true_random=False))
def test_topo_order_of_any_permutation_is_a_valid_order(graph_factory, seed, rnd):
    graph = graph_factory(np.random.default_rng(seed), 14)
    nodes = list(graph.nodes)
    rnd.shuffle(nodes)
    order = topo_order(nodes, graph.inputs)
    assert sorted(map(id, order)) == sorted(map(id, graph.nodes))
    defined = set(graph.inputs)
    for n in order:
        assert all(v in defined for v in n.inputs)
        defined.update(n.outputs)
    live = liveness(graph)
    for i, n in enumerate(graph.nodes):
        for v in n.inputs:
            assert live[v][0] < i <= live[v][1]
