"""A rank's graph cut at its collectives: compiled segments and collective steps, in order.

Every node gets the set of collectives it depends on (transitively); nodes with the same set
form a group, cut again after each node that makes a collective's input, and each piece is one
segment, which the compile driver builds like any graph (stages 2-6). Collectives start as
soon as the segment that makes their input has run and are waited for only by the first
segment that reads them, so work that does not depend on a collective in flight (the rest of
its group, an independent branch) runs while it moves: the overlap ``Program.text`` reports.
Constants and other source nodes are copied into every segment that reads them. The cut
depends only on the graph's structure, which the sharding pass makes the same on every rank:
all ranks issue the same collectives in the same order, as NCCL and gloo require.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from tilefuse.graph.builder import GraphBuilder
from tilefuse.graph.ir import Graph, Node, Value
from tilefuse.ops.registry import OpKind

COLLECTIVES = frozenset({"all_reduce", "all_gather"})


@dataclass
class Segment:
    """Nodes compiled together: ``graph`` reads ``inputs`` (values of the rank graph) and
    returns ``outputs``; ``waits`` are the collectives to finish before it runs."""

    index: int
    graph: Graph
    inputs: tuple[Value, ...]
    outputs: tuple[Value, ...]
    waits: tuple[int, ...]
    executable: object = None


@dataclass
class Collective:
    """One collective step: ``node`` of the rank graph, started after segment ``after``."""

    index: int
    node: Node
    after: int
    overlaps: list[int] = field(default_factory=list)   # segments run while it is in flight


@dataclass
class Program:
    """The steps of one rank: segments and collectives in issue order."""

    graph: Graph
    steps: list[Segment | Collective]

    @property
    def segments(self) -> list[Segment]:
        return [s for s in self.steps if isinstance(s, Segment)]

    @property
    def collectives(self) -> list[Collective]:
        return [s for s in self.steps if isinstance(s, Collective)]

    def text(self) -> str:
        lines = [f"program of @{self.graph.name}: {len(self.segments)} segments, "
                 f"{len(self.collectives)} collectives"]
        for step in self.steps:
            if isinstance(step, Segment):
                wait = f" after waiting for c{', c'.join(map(str, step.waits))}" \
                    if step.waits else ""
                lines.append(f"  s{step.index}: {len(step.graph.nodes)} nodes{wait}")
            else:
                node = step.node
                over = f", overlaps s{', s'.join(map(str, step.overlaps))}" \
                    if step.overlaps else ""
                lines.append(f"  c{step.index}: {node.op.name} {node.inputs[0].type} "
                             f"(started after s{step.after}{over})")
        return "\n".join(lines) + "\n"


def cut(graph: Graph) -> Program:
    """``graph`` (a rank graph) as segments between its collectives."""
    needs: dict[Value, frozenset[int]] = {v: frozenset() for v in graph.inputs}
    coll_index: dict[Node, int] = {}
    groups: dict[frozenset[int], list[Node]] = {}
    sources: dict[Value, Node] = {}
    for node in graph.nodes:
        if node.op.name in COLLECTIVES:
            c = coll_index.setdefault(node, len(coll_index))
            needs[node.outputs[0]] = needs[node.inputs[0]] | {c}
            continue
        if not node.inputs and node.op.kind == OpKind.SOURCE:
            for o in node.outputs:
                sources[o] = node
                needs[o] = frozenset()
            continue
        key = frozenset().union(*(needs[v] for v in node.inputs)) if node.inputs \
            else frozenset()
        groups.setdefault(key, []).append(node)
        for o in node.outputs:
            needs[o] = key
    # A group is cut again after each node that makes a collective's input, so that the
    # collective starts while the rest of the group runs.
    feeds = {node.inputs[0] for node in coll_index}
    pieces: list[tuple[frozenset[int], list[Node]]] = []
    for key in sorted(groups, key=lambda k: (len(k), sorted(k))):
        piece: list[Node] = []
        for node in groups[key]:
            piece.append(node)
            if any(o in feeds for o in node.outputs):
                pieces.append((key, piece))
                piece = []
        if piece:
            pieces.append((key, piece))
    produced_in = {o: i for i, (_, nodes) in enumerate(pieces) for n in nodes
                   for o in n.outputs}
    wanted: dict[int, list[Value]] = {i: [] for i in range(len(pieces))}

    def want(v: Value, reader: int | None) -> None:
        seg = produced_in.get(v)
        if seg is not None and seg != reader and v not in wanted[seg]:
            wanted[seg].append(v)

    for i, (_, nodes) in enumerate(pieces):
        for n in nodes:
            for v in n.inputs:
                want(v, i)
    for node in coll_index:
        want(node.inputs[0], None)
    for v in graph.outputs:
        want(v, None)
    segments = [_segment(i, nodes, sources, wanted[i], graph.name)
                for i, (_, nodes) in enumerate(pieces)]
    # Issue order: each collective right after the segment that makes its input (first, when
    # its input is a graph input); a segment waits for the collectives it reads, not yet waited.
    start_after = {c: produced_in.get(node.inputs[0], -1) for node, c in coll_index.items()}
    collectives = {c: Collective(c, node, start_after[c]) for node, c in coll_index.items()}
    steps: list[Segment | Collective] = []
    waited: set[int] = set()
    in_flight: list[int] = []

    def launch(after: int) -> None:
        for c in sorted(collectives):
            if start_after[c] == after:
                steps.append(collectives[c])
                in_flight.append(c)

    launch(-1)
    for i, (key, _) in enumerate(pieces):
        seg = segments[i]
        seg.waits = tuple(sorted(key - waited))
        waited |= key
        for c in in_flight:
            if c not in waited:
                collectives[c].overlaps.append(i)
        in_flight[:] = [c for c in in_flight if c not in waited]
        steps.append(seg)
        launch(i)
    return Program(graph, steps)


def _segment(index: int, nodes: list[Node], sources: dict[Value, Node],
             outputs: list[Value], name: str) -> Segment:
    b = GraphBuilder(f"{name}_s{index}")
    local: dict[Value, Value] = {}
    inputs: list[Value] = []
    copied: dict[Node, tuple[Value, ...]] = {}
    inside = {o for n in nodes for o in n.outputs}

    def get(v: Value) -> Value:
        if v in local:
            return local[v]
        if v in sources:
            src = sources[v]
            if src not in copied:
                copied[src] = b.add(src.op, [], dict(src.attrs), src.loc)
                for orig, new in zip(src.outputs, copied[src]):
                    local[orig] = new
            return local[v]
        assert v not in inside, "a segment reads a value before making it"
        local[v] = b.input(v.type, v.name)
        inputs.append(v)
        return local[v]

    for node in nodes:
        outs = b.add(node.op, [get(v) for v in node.inputs], dict(node.attrs), node.loc)
        local.update(zip(node.outputs, outs))
    graph = b.build([local[v] for v in outputs])
    return Segment(index, graph, tuple(inputs), tuple(outputs), ())


def compile_program(program: Program, build: Callable[[Graph, int], object]) -> Program:
    """Each segment's executable from ``build(segment_graph, index)`` (the driver's stages)."""
    for seg in program.segments:
        seg.executable = build(seg.graph, seg.index)
    return program
