"""Dead-code elimination: drops nodes none of whose outputs reach a graph output."""

from __future__ import annotations

from tilefuse.graph.ir import Graph
from tilefuse.passes.rewrite import rebuild


def dce(graph: Graph) -> tuple[Graph, bool]:
    """``graph`` without its dead nodes; changed when any node was dropped. Graph inputs stay
    (they are the signature), used or not."""
    live = set(graph.outputs)
    kept = []
    for node in reversed(graph.nodes):
        if any(v in live for v in node.outputs):
            kept.append(node)
            live.update(node.inputs)
    if len(kept) == len(graph.nodes):
        return graph, False
    return rebuild(graph, kept[::-1], {}), True
