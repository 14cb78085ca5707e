"""Decomposition of composite ops (softmax, log_softmax, layer_norm, rms_norm) into the simpler
ops their OpDef's ``decompose`` emits.

After this pass kernel formation sees one vocabulary: a softmax written as one op and a softmax
written by hand in NumPy (max, sub, exp, sum, div) reach fusion as the same nodes, so one rule
fuses both. Each emitted node keeps the composite node's source location. A decomposition that
itself emits composite ops is expanded again, up to :data:`MAX_DEPTH` levels.
"""

from __future__ import annotations

from tilefuse.errors import TilefuseError, VerifyError
from tilefuse.graph.builder import GraphBuilder
from tilefuse.graph.ir import Graph, Node, Value
from tilefuse.ops.registry import Trait
from tilefuse.passes.rewrite import rewrite_nodes

MAX_DEPTH = 8
"""How many times a decomposition may produce composite ops again before the pass gives up."""


def decompose_composites(graph: Graph) -> tuple[Graph, bool]:
    """``graph`` with every node of a COMPOSITE op replaced by its decomposition; changed when
    there was at least one such node."""
    changed = False
    for _ in range(MAX_DEPTH):
        if not any(_is_composite(n) for n in graph.nodes):
            return graph, changed
        graph, _ = rewrite_nodes(graph, _expand)
        changed = True
    names = sorted({n.op.name for n in graph.nodes if _is_composite(n)})
    raise VerifyError(f"decompositions of {', '.join(names)} still produce composite ops after "
                      f"{MAX_DEPTH} rounds")


def _is_composite(node: Node) -> bool:
    return node.op.has(Trait.COMPOSITE)


def _expand(builder: GraphBuilder, node: Node, inputs: tuple[Value, ...]
            ) -> tuple[Value, ...] | None:
    """A composite node replaced by what its decomposition emits; other nodes kept."""
    return _decompose(node, builder, inputs) if _is_composite(node) else None


def _decompose(node: Node, builder: GraphBuilder, inputs: tuple[Value, ...]) -> tuple[Value, ...]:
    """The values that replace ``node``'s outputs; VerifyError if the decomposition is missing or
    disagrees with the node's output types."""
    shown = tuple(str(v.type) for v in inputs)
    if node.op.decompose is None:
        raise VerifyError("is marked composite but has no decomposition", op=node.op.name,
                          inputs=shown, loc=node.loc)
    try:
        outs = tuple(node.op.decompose(builder, inputs, node.attrs, node.loc))
    except TilefuseError as err:
        raise err.with_context(op=node.op.name, inputs=shown, loc=node.loc) from None
    got = tuple(v.type for v in outs)
    want = tuple(v.type for v in node.outputs)
    if got != want:
        raise VerifyError(f"decomposition produced {', '.join(map(str, got)) or 'nothing'}, the "
                          f"node has {', '.join(map(str, want))}", op=node.op.name,
                          inputs=shown, loc=node.loc)
    return outs
