"""The graph IR: SSA values, immutable nodes, and graphs.

Every value is defined once, either as a graph input or as an output of exactly one node. Nodes
and graphs are immutable; a pass builds a new graph (see :mod:`tilefuse.graph.builder`). Values
compare by identity: the printer names them ``%0, %1, ...`` in definition order, so two graphs are
structurally equal exactly when they print the same (:func:`structurally_equal`).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from tilefuse.dtypes import DType, from_numpy
from tilefuse.errors import SourceLoc, VerifyError
from tilefuse.graph.types import TensorType

if TYPE_CHECKING:
    from tilefuse.ops.registry import OpDef


class Literal:
    """An immutable array used as an attribute (the payload of ``constant``).

    Hashes and compares by dtype, shape and bytes, so graphs holding equal constants are equal
    and CSE can merge them.
    """

    __slots__ = ("array", "_digest")

    def __init__(self, array: np.ndarray | Any, dtype: DType | None = None):
        arr = np.asarray(array, dtype=dtype.np if dtype is not None else None)
        from_numpy(arr.dtype)  # rejects unsupported dtypes with a DTypeError
        arr = np.array(arr, order="C", copy=True)
        arr.setflags(write=False)
        self.array = arr
        digest = hashlib.sha1(arr.dtype.str.encode() + repr(arr.shape).encode())
        digest.update(memoryview(arr.reshape(-1).view(np.uint8)))  # no copy (tobytes was one)
        self._digest = digest.hexdigest()

    @property
    def dtype(self) -> DType:
        return from_numpy(self.array.dtype)

    @property
    def type(self) -> TensorType:
        return TensorType(tuple(int(d) for d in self.array.shape), self.dtype)

    @property
    def digest(self) -> str:
        return self._digest

    def __hash__(self) -> int:
        return hash(self._digest)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Literal) and other._digest == self._digest

    def __repr__(self) -> str:
        return f"Literal({self.type}, sha1={self._digest[:12]})"


AttrValue = Any  # int | float | str | bool | None | DType | Literal | tuple[AttrValue, ...]


def freeze_attr(value: Any) -> AttrValue:
    """Converts an attribute value to its immutable, hashable form (lists become tuples)."""
    if isinstance(value, (list, tuple)):
        return tuple(freeze_attr(v) for v in value)
    if isinstance(value, np.ndarray):
        return Literal(value)
    if isinstance(value, np.generic):
        return value.item()
    return value


class Attrs(Mapping[str, AttrValue]):
    """An immutable, hashable, ordered (by name) attribute mapping."""

    __slots__ = ("_items", "_hash")

    def __init__(self, items: Mapping[str, Any] | None = None):
        pairs = sorted((k, freeze_attr(v)) for k, v in (items or {}).items())
        self._items: tuple[tuple[str, AttrValue], ...] = tuple(pairs)
        self._hash = hash(self._items)

    def __getitem__(self, key: str) -> AttrValue:
        for k, v in self._items:
            if k == key:
                return v
        raise KeyError(key)

    def __iter__(self) -> Iterator[str]:
        return (k for k, _ in self._items)

    def __len__(self) -> int:
        return len(self._items)

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Attrs):
            return self._items == other._items
        return isinstance(other, Mapping) and dict(self._items) == dict(other)

    def __repr__(self) -> str:
        return f"Attrs({dict(self._items)!r})"


@dataclass(frozen=True, eq=False)
class Value:
    """An SSA value. Identity is the object itself; ``name`` is a hint for printing inputs."""

    type: TensorType
    name: str | None = None

    @property
    def shape(self) -> tuple:
        return self.type.shape

    @property
    def dtype(self) -> DType:
        return self.type.dtype

    def __repr__(self) -> str:
        label = f"%{self.name}" if self.name else f"%<{id(self) & 0xFFFF:04x}>"
        return f"Value({label}: {self.type})"


@dataclass(frozen=True, eq=False)
class Node:
    """One op application: ``outputs = op(inputs) {attrs}``. ``loc`` is the user's source line."""

    op: OpDef
    inputs: tuple[Value, ...]
    attrs: Attrs
    outputs: tuple[Value, ...]
    loc: SourceLoc | None = field(default=None, compare=False)

    @property
    def output(self) -> Value:
        """The only output of a single-output node."""
        if len(self.outputs) != 1:
            raise VerifyError(f"has {len(self.outputs)} outputs, expected one", op=self.op.name)
        return self.outputs[0]

    def __repr__(self) -> str:
        return f"Node({self.op.name}, {len(self.inputs)} inputs, {dict(self.attrs)})"


@dataclass(frozen=True, eq=False)
class Graph:
    """A function: inputs, nodes in a topological order, outputs."""

    name: str
    inputs: tuple[Value, ...]
    nodes: tuple[Node, ...]
    outputs: tuple[Value, ...]

    def __str__(self) -> str:
        from tilefuse.graph.printer import print_graph
        return print_graph(self)

    def producers(self) -> dict[Value, Node]:
        """Maps each node-defined value to the node that defines it."""
        return {v: n for n in self.nodes for v in n.outputs}


def structurally_equal(a: Graph, b: Graph) -> bool:
    """True when the two graphs compute the same thing in the same order (same printed form)."""
    from tilefuse.graph.printer import print_graph
    return print_graph(a) == print_graph(b)
