"""Common-subexpression elimination: one node per (op, inputs, attributes).

Two nodes merge when they apply the same op to the same values with equal attributes (compared
by their printed form, so ``0.0`` and ``-0.0`` differ and equal arrays compare by digest) and
infer the same output types. Commutative ops compare their inputs as a multiset, so ``add(a, b)``
and ``add(b, a)`` merge.
"""

from __future__ import annotations

from collections.abc import Hashable

from tilefuse.graph.ir import Graph, Node, Value
from tilefuse.graph.printer import format_attrs
from tilefuse.ops.registry import Trait
from tilefuse.passes.rewrite import rebuild


def cse(graph: Graph) -> tuple[Graph, bool]:
    """``graph`` with repeated computations merged into their first occurrence."""
    order: dict[Value, int] = {v: i for i, v in enumerate(graph.inputs)}
    seen: dict[Hashable, Node] = {}
    replace: dict[Value, Value] = {}
    kept: list[Node] = []
    for node in graph.nodes:
        inputs = [replace.get(v, v) for v in node.inputs]
        key = _key(node, inputs, order)
        first = seen.get(key) if node.outputs else None
        if first is not None:
            replace.update(zip(node.outputs, first.outputs))
            continue
        seen.setdefault(key, node)
        kept.append(node)
        for v in node.outputs:
            order.setdefault(v, len(order))
    if not replace:
        return graph, False
    return rebuild(graph, kept, replace), True


def _key(node: Node, inputs: list[Value], order: dict[Value, int]) -> Hashable:
    positions = [order.setdefault(v, len(order)) for v in inputs]
    if node.op.has(Trait.COMMUTATIVE):
        positions.sort()
    types = tuple(v.type for v in node.outputs)
    return (node.op, tuple(positions), format_attrs(node.attrs, elide_constants_over=0), types)
