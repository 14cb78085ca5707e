"""Algebraic peepholes that need no search: rewrites that are exact in IEEE arithmetic.

- ``pow(x, 2) -> mul(x, x)``: NumPy computes a float square as ``x*x`` too, so results are
  bit-identical, and a kernel does one multiply instead of a general power (log, multiply, exp).
- ``pow(x, 1) -> x``.

Each applies only when the exponent is a one-element constant and the result has exactly ``x``'s
type (no broadcasting or promotion hidden in the pow). Equality saturation (egglog) will take over
the general rule set; these stay because they are free and exact.
"""

from __future__ import annotations

from tilefuse.graph.builder import GraphBuilder
from tilefuse.graph.ir import Graph, Literal, Node, Value
from tilefuse.passes.rewrite import rewrite_nodes


def _scalar_constant(value: Value, producers: dict[Value, Node]) -> float | None:
    node = producers.get(value)
    if node is None or node.op.name != "constant":
        return None
    literal = node.attrs["value"]
    if not isinstance(literal, Literal) or literal.array.size != 1:
        return None
    number = literal.array.reshape(()).item()
    return float(number) if isinstance(number, (int, float)) else None


def simplify_algebra(graph: Graph) -> tuple[Graph, bool]:
    """``graph`` with the peepholes above applied; changed when any fired."""
    producers = graph.producers()

    def peephole(builder: GraphBuilder, node: Node, inputs: tuple[Value, ...]
                 ) -> list[Value] | None:
        if node.op.name != "pow" or node.outputs[0].type != node.inputs[0].type:
            return None
        exponent = _scalar_constant(node.inputs[1], producers)
        if exponent == 2.0 and node.inputs[0].dtype.is_float:
            return [builder.add1("mul", [inputs[0], inputs[0]], {}, node.loc)]
        if exponent == 1.0:
            return [inputs[0]]
        return None

    return rewrite_nodes(graph, peephole)


__all__ = ["simplify_algebra"]
