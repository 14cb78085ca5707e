"""Analyses over graphs: use counts, users, topological order, liveness intervals."""

from __future__ import annotations

import heapq
from collections.abc import Sequence

from tilefuse.errors import VerifyError
from tilefuse.graph.ir import Graph, Node, Value


def use_counts(graph: Graph) -> dict[Value, int]:
    """Every value of ``graph`` → how often it is used: once per node operand slot and once per
    appearance among the graph outputs. Unused values map to 0."""
    counts: dict[Value, int] = dict.fromkeys(graph.inputs, 0)
    for node in graph.nodes:
        for v in node.outputs:
            counts.setdefault(v, 0)
    for node in graph.nodes:
        for v in node.inputs:
            counts[v] = counts.get(v, 0) + 1
    for v in graph.outputs:
        counts[v] = counts.get(v, 0) + 1
    return counts


def users(graph: Graph) -> dict[Value, list[Node]]:
    """Every value of ``graph`` → the nodes that read it, each once, in node order."""
    result: dict[Value, list[Node]] = {v: [] for v in graph.inputs}
    for node in graph.nodes:
        for v in node.outputs:
            result.setdefault(v, [])
    for node in graph.nodes:
        for v in dict.fromkeys(node.inputs):
            result.setdefault(v, []).append(node)
    return result


def topo_order(nodes: Sequence[Node], inputs: Sequence[Value]) -> list[Node]:
    """``nodes`` in a dependency order; among ready nodes the earliest given comes first, so an
    order that is already topological is kept. VerifyError on a cycle or an undefined value."""
    producer: dict[Value, int] = {}
    for i, node in enumerate(nodes):
        for v in node.outputs:
            if v in producer:
                raise VerifyError(f"{v.type} value is defined by two nodes (#{producer[v]} and "
                                  f"#{i})", op=node.op.name)
            producer[v] = i
    given = set(inputs)
    dependents: list[list[int]] = [[] for _ in nodes]
    waiting = [0] * len(nodes)
    for i, node in enumerate(nodes):
        for d in _dependencies(node, i, given, producer):
            dependents[d].append(i)
            waiting[i] += 1
    ready = [i for i, n in enumerate(waiting) if n == 0]
    heapq.heapify(ready)
    order: list[Node] = []
    while ready:
        i = heapq.heappop(ready)
        order.append(nodes[i])
        for j in dependents[i]:
            waiting[j] -= 1
            if waiting[j] == 0:
                heapq.heappush(ready, j)
    if len(order) != len(nodes):
        stuck = ", ".join(f"#{i} {nodes[i].op.name}" for i, n in enumerate(waiting) if n)
        raise VerifyError(f"the nodes form a cycle (nodes that never become ready: {stuck})")
    return order


def _dependencies(node: Node, index: int, given: set[Value],
                  producer: dict[Value, int]) -> list[int]:
    """The indices of the nodes whose outputs ``node`` reads, each once."""
    deps: dict[int, None] = {}
    for v in node.inputs:
        if v in given:
            continue
        if v not in producer:
            raise VerifyError(f"node #{index} uses a {v.type} value that no input or node "
                              "defines", op=node.op.name,
                              inputs=tuple(str(x.type) for x in node.inputs), loc=node.loc)
        deps[producer[v]] = None
    return list(deps)


def liveness(graph: Graph) -> dict[Value, tuple[int, int]]:
    """Every value → (index of the node defining it, index of its last use). Graph inputs are
    defined at -1, graph outputs live until ``len(graph.nodes)``, and an unused value's last use
    is its definition."""
    live: dict[Value, tuple[int, int]] = {v: (-1, -1) for v in graph.inputs}
    for i, node in enumerate(graph.nodes):
        for v in node.inputs:
            if v not in live:
                raise VerifyError(f"node #{i} uses a {v.type} value before it is defined",
                                  op=node.op.name, loc=node.loc)
            live[v] = (live[v][0], i)
        for v in node.outputs:
            live[v] = (i, i)
    end = len(graph.nodes)
    for v in graph.outputs:
        if v not in live:
            raise VerifyError(f"graph output {v.type} is never defined")
        live[v] = (live[v][0], end)
    return live
