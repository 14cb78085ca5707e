"""Building graphs: every node is created here, with its attributes validated and its output
types inferred from the op's rules. A shape or dtype error gets the op name, the input types and
the source location added before it reaches the user."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from tilefuse.dtypes import DType
from tilefuse.errors import DTypeError, ShapeError, SourceLoc, TilefuseError
from tilefuse.graph.ir import Attrs, Graph, Node, Value
from tilefuse.graph.types import Shape, TensorType
from tilefuse.ops.registry import OpDef


def resolve_op(op: OpDef | str) -> OpDef:
    if isinstance(op, OpDef):
        return op
    from tilefuse.ops import get_op
    return get_op(op)


def infer_types(op: OpDef, input_types: Sequence[TensorType], attrs: Attrs,
                loc: SourceLoc | None = None) -> tuple[TensorType, ...]:
    """Output types of ``op`` applied to values of ``input_types``; errors carry full context."""
    shown = tuple(str(t) for t in input_types)
    try:
        if op.arity is not None and len(input_types) != op.arity:
            raise ShapeError(f"expects {op.arity} inputs, got {len(input_types)}")
        dtypes = tuple(t.dtype for t in input_types)
        op.check_dtypes(dtypes)
        shapes: tuple[Shape, ...] = tuple(t.shape for t in input_types)
        out_shapes = op.shape_rule(shapes, attrs)
        out_dtypes = op.dtype_rule(dtypes, attrs)
        if len(out_shapes) != len(out_dtypes):
            raise ShapeError(f"rules disagree on the output count ({len(out_shapes)} shapes, "
                             f"{len(out_dtypes)} dtypes)")
        return tuple(TensorType(tuple(s), d) for s, d in zip(out_shapes, out_dtypes))
    except TilefuseError as err:
        raise err.with_context(op=op.name, inputs=shown, loc=loc) from None
    except (TypeError, ValueError, IndexError, KeyError, ZeroDivisionError) as err:
        # A rule tripped over input it did not expect: report it as a shape error, not a crash.
        raise ShapeError(f"invalid inputs or attributes ({type(err).__name__}: {err})",
                         op=op.name, inputs=shown, loc=loc) from None


class GraphBuilder:
    """Accumulates inputs and nodes, then freezes them into a :class:`Graph`."""

    def __init__(self, name: str = "main"):
        self.name = name
        self._inputs: list[Value] = []
        self._nodes: list[Node] = []

    def input(self, type_: TensorType | tuple[Shape, DType], name: str | None = None) -> Value:
        if not isinstance(type_, TensorType):
            type_ = TensorType(tuple(type_[0]), type_[1])
        value = Value(type_, name)
        self._inputs.append(value)
        return value

    def add(self, op: OpDef | str, inputs: Sequence[Value], attrs: Mapping[str, Any] | None = None,
            loc: SourceLoc | None = None) -> tuple[Value, ...]:
        """Appends ``op(inputs) {attrs}`` and returns its output values."""
        opdef = resolve_op(op)
        try:
            checked = opdef.validate_attrs(attrs or {})
        except TilefuseError as err:
            raise err.with_context(op=opdef.name, inputs=tuple(str(v.type) for v in inputs),
                                   loc=loc) from None
        types = infer_types(opdef, [v.type for v in inputs], checked, loc)
        node = Node(opdef, tuple(inputs), checked, tuple(Value(t) for t in types), loc)
        self._nodes.append(node)
        return node.outputs

    def add1(self, op: OpDef | str, inputs: Sequence[Value],
             attrs: Mapping[str, Any] | None = None, loc: SourceLoc | None = None) -> Value:
        """``add`` for single-output ops."""
        outs = self.add(op, inputs, attrs, loc)
        if len(outs) != 1:
            raise DTypeError(f"has {len(outs)} outputs; use add()", op=resolve_op(op).name)
        return outs[0]

    def append(self, node: Node) -> None:
        """Appends an existing node unchanged (used by passes that copy most of a graph)."""
        self._nodes.append(node)

    @property
    def nodes(self) -> tuple[Node, ...]:
        return tuple(self._nodes)

    def build(self, outputs: Sequence[Value]) -> Graph:
        return Graph(self.name, tuple(self._inputs), tuple(self._nodes), tuple(outputs))
