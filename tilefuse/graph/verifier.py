"""The IR invariants, checked: :func:`verify` raises a VerifyError naming the first broken one.

- inputs are distinct values with distinct identifier names (when named);
- SSA: every value is defined once, by a graph input or one node output;
- every use (node input, graph output) is defined before it in node order;
- each node's attributes are what its OpDef's validation gives, and its output types are exactly
  what the op's rules infer from its input types.
"""

from __future__ import annotations

from tilefuse.errors import TilefuseError, VerifyError
from tilefuse.graph.builder import infer_types
from tilefuse.graph.ir import Graph, Node, Value
from tilefuse.graph.printer import format_attrs, format_type, input_names, is_identifier
from tilefuse.ops.registry import OpDef


def verify(graph: Graph) -> None:
    """Raises VerifyError if ``graph`` breaks an IR invariant; returns None otherwise."""
    if not isinstance(graph, Graph):
        raise VerifyError(f"expected a Graph, got {type(graph).__name__}")
    labels = _verify_inputs(graph)
    later = _later_definitions(graph)
    counter = 0
    for index, node in enumerate(graph.nodes):
        _verify_node(node, index, labels, later)
        for v in node.outputs:
            labels[v] = f"%{counter}"
            counter += 1
    for i, v in enumerate(graph.outputs):
        if not isinstance(v, Value):
            raise VerifyError(f"graph output {i} is a {type(v).__name__}, not a Value")
        if v not in labels:
            raise VerifyError(f"graph output {i} ({v.type}) is never defined in "
                              f"@{graph.name} (a dangling use)")


def _verify_inputs(graph: Graph) -> dict[Value, str]:
    for i, v in enumerate(graph.inputs):
        if not isinstance(v, Value):
            raise VerifyError(f"graph input {i} is a {type(v).__name__}, not a Value")
    labels: dict[Value, str] = {}
    names: set[str] = set()
    for i, (v, printed) in enumerate(zip(graph.inputs, input_names(graph.inputs))):
        if v in labels:
            first = graph.inputs.index(v)
            raise VerifyError(f"graph input {i} repeats input {first} (%{v.name or '?'})")
        if v.name is not None:
            if not is_identifier(v.name):
                raise VerifyError(f"graph input {i} has name {v.name!r}, which is not an "
                                  "identifier (letters, digits, '_' and '.')")
            if v.name in names:
                raise VerifyError(f"two graph inputs are named {v.name!r}")
            names.add(v.name)
        labels[v] = f"%{printed}"
    return labels


def _later_definitions(graph: Graph) -> dict[Value, int]:
    """Each node-defined value → the index of the first node that defines it."""
    found: dict[Value, int] = {}
    for index, node in enumerate(graph.nodes):
        if isinstance(node, Node):
            for v in node.outputs:
                found.setdefault(v, index)
    return found


def _verify_node(node: Node, index: int, labels: dict[Value, str],
                 later: dict[Value, int]) -> None:
    if not isinstance(node, Node) or not isinstance(node.op, OpDef):
        raise VerifyError(f"node #{index} is not a Node with an OpDef: {node!r}")
    for k, v in enumerate(node.inputs):
        if not isinstance(v, Value):
            raise _node_error(node, index, f"input {k} is a {type(v).__name__}, not a Value")
        if v in labels:
            continue
        if v in later:
            raise _node_error(node, index, f"input {k} is used before its definition by "
                                           f"node #{later[v]}")
        raise _node_error(node, index, f"input {k} ({v.type}) is never defined in the graph")
    for k, v in enumerate(node.outputs):
        if not isinstance(v, Value):
            raise _node_error(node, index, f"output {k} is a {type(v).__name__}, not a Value")
        if v in labels:
            raise _node_error(node, index, f"output {k} redefines {labels[v]} (SSA: every "
                                           "value is defined once)")
        if node.outputs.index(v) != k:
            raise _node_error(node, index, f"output {k} repeats an earlier output")
    _verify_types(node, index)


def _verify_types(node: Node, index: int) -> None:
    try:
        checked = node.op.validate_attrs(dict(node.attrs))
        inferred = infer_types(node.op, [v.type for v in node.inputs], checked, node.loc)
    except TilefuseError as err:
        raise _node_error(node, index, f"fails its op's checks: {err.message}") from None
    if format_attrs(checked, elide_constants_over=0) != format_attrs(node.attrs,
                                                                     elide_constants_over=0):
        raise _node_error(node, index, f"attributes{format_attrs(node.attrs)} are not in the "
                                       f"validated form{format_attrs(checked)}")
    actual = tuple(v.type for v in node.outputs)
    if actual != inferred:
        shown = ", ".join(format_type(t) for t in actual) or "()"
        want = ", ".join(format_type(t) for t in inferred) or "()"
        raise _node_error(node, index, f"output types {shown} differ from the inferred {want}")


def _node_error(node: Node, index: int, message: str) -> VerifyError:
    inputs = tuple(str(v.type) if isinstance(v, Value) else repr(v) for v in node.inputs)
    return VerifyError(f"node #{index}: {message}", op=node.op.name, inputs=inputs, loc=node.loc)
