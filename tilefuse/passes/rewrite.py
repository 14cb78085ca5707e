"""The one way passes copy a graph with some nodes dropped and some values replaced."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from tilefuse.graph.builder import GraphBuilder
from tilefuse.graph.ir import Graph, Node, Value


def rebuild(graph: Graph, nodes: Sequence[Node], replace: Mapping[Value, Value]) -> Graph:
    """A graph with ``graph``'s inputs (same names and types), the given ``nodes`` in order and
    ``graph``'s outputs, every use of a key of ``replace`` reading its value instead. Nodes whose
    inputs change are re-created with the same outputs; the others are reused as they are."""
    builder = GraphBuilder(graph.name)
    mapping: dict[Value, Value] = dict(replace)
    for v in graph.inputs:
        mapping[v] = builder.input(v.type, v.name)
    for node in nodes:
        inputs = tuple(_resolve(v, mapping) for v in node.inputs)
        if inputs != node.inputs:
            node = Node(node.op, inputs, node.attrs, node.outputs, node.loc)
        builder.append(node)
    return builder.build([_resolve(v, mapping) for v in graph.outputs])


def _resolve(v: Value, mapping: Mapping[Value, Value]) -> Value:
    """Follows replacement chains (a → b → c) to their end."""
    seen = 0
    while v in mapping and seen <= len(mapping):
        nxt = mapping[v]
        if nxt is v:
            break
        v = nxt
        seen += 1
    return v
