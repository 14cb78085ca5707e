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
    builder = GraphBuilder(graph.name)
    mapping: dict[Value, Value] = {v: builder.input(v.type, v.name) for v in graph.inputs}
    changed = False
    for node in graph.nodes:
        inputs = [mapping[v] for v in node.inputs]
        exponent = (_scalar_constant(node.inputs[1], producers)
                    if node.op.name == "pow" else None)
        same_type = node.op.name == "pow" and node.outputs[0].type == node.inputs[0].type
        if same_type and exponent == 2.0 and node.inputs[0].dtype.is_float:
            mapping[node.outputs[0]] = builder.add1("mul", [inputs[0], inputs[0]], {}, node.loc)
            changed = True
        elif same_type and exponent == 1.0:
            mapping[node.outputs[0]] = inputs[0]
            changed = True
        else:
            outs = builder.add(node.op, inputs, dict(node.attrs), node.loc)
            mapping.update(zip(node.outputs, outs))
    if not changed:
        return graph, False
    return builder.build([mapping[v] for v in graph.outputs]), True


__all__ = ["simplify_algebra"]
