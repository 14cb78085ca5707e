"""Shrinking a failing graph to a small one that fails the same way.

Greedy reduction to a fixpoint over three moves, each rebuilt through :class:`GraphBuilder` (so
every candidate verifies) and pruned to what its outputs need: keep one output; *cut* a value
(it becomes a fresh graph input, dropping everything above it); *bypass* a node (its users read
one of its inputs of the same type instead). A candidate is kept when it is smaller and the
caller's predicate still sees the failure. Shapes are not shrunk.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence

from tilefuse.errors import TilefuseError
from tilefuse.graph.builder import GraphBuilder
from tilefuse.graph.ir import Graph, Value

MAX_TRIALS = 400


def rebuild(graph: Graph, outputs: Sequence[Value], *, cut: frozenset[Value] = frozenset(),
            alias: Mapping[Value, Value] | None = None) -> Graph:
    """``graph`` pruned to what ``outputs`` need, with each ``cut`` value a new input and each
    ``alias`` key replaced by its value."""
    alias = alias or {}

    def resolve(v: Value) -> Value:
        while v in alias:
            v = alias[v]
        return v

    producer = {out: node for node in graph.nodes for out in node.outputs}
    live_nodes: set[int] = set()
    leaves: set[Value] = set()
    stack = [resolve(v) for v in outputs]
    while stack:
        v = stack.pop()
        node = producer.get(v)
        if v in cut or node is None:
            leaves.add(v)
        elif id(node) not in live_nodes:
            live_nodes.add(id(node))
            stack.extend(resolve(i) for i in node.inputs)
    builder = GraphBuilder(graph.name)
    made: dict[Value, Value] = {}
    for v in graph.inputs:
        if v in leaves:
            made[v] = builder.input(v.type, v.name)
    for i, v in enumerate(sorted(leaves - set(graph.inputs), key=_position(graph))):
        made[v] = builder.input(v.type, f"cut{i}")
    for node in graph.nodes:
        if id(node) in live_nodes:
            outs = builder.add(node.op, [made[resolve(v)] for v in node.inputs],
                               dict(node.attrs), node.loc)
            made.update(zip(node.outputs, outs))
    return builder.build([made[resolve(v)] for v in outputs])


def _position(graph: Graph) -> Callable[[Value], int]:
    order = {out: i for i, node in enumerate(graph.nodes) for out in node.outputs}
    return lambda v: order.get(v, -1)


def size(graph: Graph) -> tuple[int, int]:
    """What shrinking minimises: nodes, then inputs."""
    return len(graph.nodes), len(graph.inputs)


def candidates(graph: Graph) -> Iterator[Graph]:
    """Every one-move reduction of ``graph`` that builds (smallest moves last)."""
    outputs = list(graph.outputs)
    moves: list[Callable[[], Graph]] = []
    if len(outputs) > 1:
        moves += [lambda o=o: rebuild(graph, [o]) for o in outputs]
    for node in reversed(graph.nodes):
        for out in node.outputs:
            moves.append(lambda out=out: rebuild(graph, outputs, cut=frozenset([out])))
            for v in node.inputs:
                if v.type == out.type:
                    moves.append(lambda out=out, v=v: rebuild(graph, outputs, alias={out: v}))
    for move in moves:
        try:
            yield move()
        except TilefuseError:
            continue


def shrink(graph: Graph, still_fails: Callable[[Graph], bool],
           max_trials: int = MAX_TRIALS) -> Graph:
    """The smallest graph reachable from ``graph`` by single moves that ``still_fails``."""
    current, trials = graph, 0
    pruned = rebuild(graph, list(graph.outputs))
    if size(pruned) < size(current) and still_fails(pruned):
        current = pruned
    progress = True
    while progress and trials < max_trials:
        progress = False
        for candidate in candidates(current):
            if size(candidate) >= size(current):
                continue
            trials += 1
            if still_fails(candidate):
                current, progress = candidate, True
                break
            if trials >= max_trials:
                break
    return current
