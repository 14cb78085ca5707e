"""Constant folding through the ops' NumPy references, with a size cap.

A node whose inputs are all constants (and that has at least one input, or is a ``full`` /
``arange`` source) is computed once at compile time and replaced by ``constant`` nodes holding
its results, when **every** result passes the cap:

- at most :data:`FOLD_MAX_BYTES` (64 MiB) per result, so folding never allocates a huge array;
- and it does not grow the constant data: a result may be larger than the constants it reads
  only up to :data:`FOLD_FREE_BYTES` (64 KiB). ``broadcast_to(c, [4096, 4096])`` of a small
  ``c`` therefore stays a computation (a kernel reads ``c`` and broadcasts for free), while
  ``transpose(W)``, ``W * 0.125`` or ``concat(Wq, Wk, Wv)`` fold: their results are the size of
  their inputs, and the inputs usually die.

A result beyond the cap stays a computation: the node is kept as it is. Symbolic shapes never
fold (there is no size to check), nor do nodes with symbols in their attributes.
"""

from __future__ import annotations

import numpy as np

from tilefuse.graph.builder import GraphBuilder
from tilefuse.graph.interpreter import run_node
from tilefuse.graph.ir import Graph, Literal, Node, Value
from tilefuse.passes.rewrite import rewrite_nodes

FOLD_MAX_BYTES = 64 << 20
"""No folded result is larger than this."""

FOLD_FREE_BYTES = 64 << 10
"""A folded result may exceed the bytes of the constants it reads by at most this much."""

_FOLDABLE_SOURCES = frozenset({"full", "arange"})


def _static_bytes(value: Value) -> int | None:
    if not all(isinstance(d, int) for d in value.shape):
        return None
    return int(np.prod(value.shape, dtype=np.int64)) * value.dtype.itemsize


def _within_cap(node: Node, input_bytes: int) -> bool:
    total = 0
    for out in node.outputs:
        size = _static_bytes(out)
        if size is None or size > FOLD_MAX_BYTES:
            return False
        total += size
    return total <= max(input_bytes, 0) + FOLD_FREE_BYTES


def _literal(node: Node) -> np.ndarray | None:
    if node.op.name != "constant":
        return None
    literal = node.attrs["value"]
    return literal.array if isinstance(literal, Literal) else None


def constant_fold(graph: Graph) -> tuple[Graph, bool]:
    """``graph`` with every foldable all-constant node replaced by its computed constants."""
    arrays: dict[Value, np.ndarray] = {}   # values known at compile time (rewritten graph's)

    def fold(builder: GraphBuilder, node: Node, inputs: tuple[Value, ...]) -> list[Value] | None:
        array = _literal(node)
        if array is not None:
            arrays[node.outputs[0]] = array
            return None
        if node.op.name == "constant" or not all(v in arrays for v in inputs):
            return None
        if not inputs and node.op.name not in _FOLDABLE_SOURCES:
            return None
        input_bytes = sum(arrays[v].nbytes for v in inputs)
        if not _within_cap(node, input_bytes):
            return None
        results = run_node(node, [arrays[v] for v in inputs])
        outs = []
        for result, out in zip(results, node.outputs, strict=True):
            value = builder.add1("constant", [], {"value": Literal(result, out.dtype)}, node.loc)
            arrays[value] = np.asarray(result)
            outs.append(value)
        return outs

    return rewrite_nodes(graph, fold)


__all__ = ["FOLD_FREE_BYTES", "FOLD_MAX_BYTES", "constant_fold"]
