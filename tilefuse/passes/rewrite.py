"""The two ways passes copy a graph: with some nodes dropped and some values replaced
(:func:`rebuild`), and with some nodes rewritten into others (:func:`rewrite_nodes`)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

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


Rule = Callable[[GraphBuilder, Node, tuple[Value, ...]], Sequence[Value] | None]
"""``rule(builder, node, inputs)``: emits a replacement of ``node`` (reading ``inputs``, the
rewritten graph's values for its inputs) into ``builder`` and returns the values that stand for
its outputs, or returns None to keep the node as it is."""


def rewrite_nodes(graph: Graph, rule: Rule) -> tuple[Graph, bool]:
    """``graph`` with each node passed through ``rule``, in order; changed when the rule
    replaced any node (an unchanged graph is returned as it is)."""
    builder = GraphBuilder(graph.name)
    mapping: dict[Value, Value] = {v: builder.input(v.type, v.name) for v in graph.inputs}
    changed = False
    for node in graph.nodes:
        inputs = tuple(mapping.get(v, v) for v in node.inputs)
        outs = rule(builder, node, inputs)
        if outs is None:
            kept = node if inputs == node.inputs else Node(node.op, inputs, node.attrs,
                                                           node.outputs, node.loc)
            builder.append(kept)
            outs = node.outputs
        else:
            changed = True
        mapping.update(zip(node.outputs, outs, strict=True))
    if not changed:
        return graph, False
    return builder.build([mapping.get(v, v) for v in graph.outputs]), True
