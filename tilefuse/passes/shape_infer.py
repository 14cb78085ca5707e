"""Shape and dtype inference: every node's output types re-inferred from its inputs' types.

:func:`shape_infer` repairs stale types (a graph assembled by hand, or after a rewrite);
:func:`specialize` gives the inputs new, more specific types (``batch`` → 8) and propagates them,
substituting the bound symbols inside attributes too (``reshape shape=[batch,768]``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from tilefuse.errors import DTypeError, ShapeError, VerifyError
from tilefuse.graph.builder import GraphBuilder, infer_types
from tilefuse.graph.ir import Graph, Value
from tilefuse.graph.types import Dim, Sym, TensorType


def shape_infer(graph: Graph) -> tuple[Graph, bool]:
    """``graph`` with every node's output types inferred again by its op's rules; changed (and
    rebuilt) only when some type differs."""
    types: dict[Value, TensorType] = {v: v.type for v in graph.inputs}
    stale = False
    for i, node in enumerate(graph.nodes):
        missing = [v for v in node.inputs if v not in types]
        if missing:
            raise VerifyError(f"node #{i} uses a value defined after it or never",
                              op=node.op.name, loc=node.loc)
        inferred = infer_types(node.op, [types[v] for v in node.inputs], node.attrs, node.loc)
        stale = stale or inferred != tuple(v.type for v in node.outputs)
        types.update(zip(node.outputs, inferred))
    if not stale:
        return graph, False
    return _reinfer(graph, [v.type for v in graph.inputs], {}), True


def specialize(graph: Graph, input_types: Sequence[TensorType]) -> Graph:
    """``graph`` with its inputs retyped to ``input_types`` and every type re-inferred.

    Each new type must keep the input's rank and dtype and its static dims; each symbol binds
    to one dim (an int or another symbol) across all inputs, and that binding is applied to
    symbols inside node attributes as well. ShapeError / DTypeError otherwise.
    """
    if len(input_types) != len(graph.inputs):
        raise ShapeError(f"@{graph.name} has {len(graph.inputs)} inputs, got "
                         f"{len(input_types)} types to specialize them to")
    binding: dict[Sym, Dim] = {}
    for value, new in zip(graph.inputs, input_types):
        _bind(value, new, binding)
    return _reinfer(graph, list(input_types), binding)


def _bind(value: Value, new: TensorType, binding: dict[Sym, Dim]) -> None:
    label = f"input {value.name or '?'}"
    if new.dtype is not value.type.dtype:
        raise DTypeError(f"{label} is {value.type}; cannot specialize it to {new}")
    if new.rank != value.type.rank:
        raise ShapeError(f"{label} is {value.type}; cannot specialize it to {new} (rank)")
    for old_dim, new_dim in zip(value.type.shape, new.shape):
        if isinstance(old_dim, int):
            if old_dim != new_dim:
                raise ShapeError(f"{label} is {value.type}; cannot specialize it to {new}")
        elif binding.setdefault(old_dim, new_dim) != new_dim:
            raise ShapeError(f"symbol {old_dim} is bound to both {binding[old_dim]} and "
                             f"{new_dim} (at {label}: {new})")


def _substitute(value: Any, binding: Mapping[Sym, Dim]) -> Any:
    if isinstance(value, Sym):
        return binding.get(value, value)
    if isinstance(value, tuple):
        return tuple(_substitute(v, binding) for v in value)
    return value


def _reinfer(graph: Graph, input_types: Sequence[TensorType],
             binding: Mapping[Sym, Dim]) -> Graph:
    builder = GraphBuilder(graph.name)
    mapping: dict[Value, Value] = {
        v: builder.input(t, v.name) for v, t in zip(graph.inputs, input_types)}
    for node in graph.nodes:
        attrs = {k: _substitute(v, binding) for k, v in node.attrs.items()} if binding \
            else node.attrs
        outs = builder.add(node.op, [mapping[v] for v in node.inputs], attrs, node.loc)
        mapping.update(zip(node.outputs, outs))
    return builder.build([mapping[v] for v in graph.outputs])
