"""Movement the GPU need not launch: transposes that only move axes of size 1, and RoPE's
``rotate_half`` as one gather, so that a decode step's small tensors are not copied by a row of
one-microsecond kernels.

* ``transpose(x)`` whose permutation keeps the axes longer than 1 in order is a reshape (the
  bytes do not move): a decode step's ``[1, 1, H, D] -> [1, H, 1, D]`` head split and its
  inverse, four copy kernels a layer.
* ``concat(neg(x[..., h:]), x[..., :h])`` over the last axis of length ``2h`` (Llama's
  ``rotate_half``: two slices, a negation and a concatenation, four kernels) is
  ``reshape(take(reshape(x, [..., 2, h]), [1, 0], axis=-2) · [[-1], [1]], x.shape)``: a
  gather, which the GPU lowers as index arithmetic inside the elementwise kernel reading it,
  so the whole RoPE (``x · cos + rotate_half(x) · sin``) is one kernel.

Both are exact (the same values, no arithmetic but the negation). :func:`gpu_views` applies
them before kernel formation on the cuda target.
"""

from __future__ import annotations

import numpy as np

from tilefuse.graph.builder import GraphBuilder
from tilefuse.graph.ir import Graph, Literal, Node, Value


def _size_one_transpose(node: Node) -> bool:
    if node.op.name != "transpose":
        return False
    shape = node.inputs[0].shape
    kept = [a for a in node.attrs["perm"] if shape[a] != 1]
    return kept == sorted(kept)


def _slice_of(producer: dict[Value, Node], value: Value, start: int, stop: int
              ) -> Value | None:
    """``x`` when ``value`` is ``x[..., start:stop]`` (a unit-step slice of the last axis
    only)."""
    node = producer.get(value)
    if node is None or node.op.name != "slice":
        return None
    x = node.inputs[0]
    rank = len(x.shape)
    starts, stops = list(node.attrs["starts"]), list(node.attrs["stops"])
    steps = list(node.attrs.get("steps") or [1] * rank)
    if len(starts) != rank or any(s != 1 for s in steps):
        return None
    whole = all(starts[i] == 0 and stops[i] >= x.shape[i] for i in range(rank - 1))
    return x if whole and starts[-1] == start and stops[-1] == stop else None


def _rotate_half(producer: dict[Value, Node], node: Node) -> Value | None:
    """``x`` when ``node`` is ``concat(neg(x[..., h:]), x[..., :h])`` on the last axis."""
    if node.op.name != "concat" or len(node.inputs) != 2:
        return None
    out = node.outputs[0]
    rank = len(out.shape)
    if node.attrs["axis"] not in (-1, rank - 1) or not isinstance(out.shape[-1], int) \
            or out.shape[-1] % 2 or not out.dtype.is_float:
        return None
    h = out.shape[-1] // 2
    neg = producer.get(node.inputs[0])
    if neg is None or neg.op.name != "neg":
        return None
    x = _slice_of(producer, neg.inputs[0], h, 2 * h)
    if x is None or x.shape != out.shape or _slice_of(producer, node.inputs[1], 0, h) is not x:
        return None
    return x


def gpu_views(graph: Graph) -> Graph:
    """``graph`` with the rewrites of the module docstring; the same graph when none applies
    (the nodes they leave unread go at DCE)."""
    producer = graph.producers()
    rotations = {n: x for n in graph.nodes if (x := _rotate_half(producer, n)) is not None}
    views = {n for n in graph.nodes if _size_one_transpose(n)}
    if not rotations and not views:
        return graph
    b = GraphBuilder(graph.name)
    renamed: dict[Value, Value] = {v: b.input(v.type, v.name) for v in graph.inputs}
    for node in graph.nodes:
        inputs = tuple(renamed.get(v, v) for v in node.inputs)
        out = node.outputs[0] if node.outputs else None
        if node in views:
            renamed[out] = b.add1("reshape", [inputs[0]], {"shape": tuple(out.shape)},
                                  node.loc)
        elif node in rotations:
            x = renamed.get(rotations[node], rotations[node])
            shape = tuple(out.shape)
            h = shape[-1] // 2
            halves = b.add1("reshape", [x], {"shape": (*shape[:-1], 2, h)}, node.loc)
            order = b.add1("constant", [], {"value": Literal(np.array([1, 0], np.int64))},
                           node.loc)
            swapped = b.add1("take", [halves, order], {"axis": -2}, node.loc)
            sign = b.add1("constant", [], {"value": Literal(
                np.array([[-1.0], [1.0]], out.dtype.np))}, node.loc)
            renamed[out] = b.add1("reshape", [b.add1("mul", [swapped, sign], {}, node.loc)],
                                  {"shape": shape}, node.loc)
        else:
            b.append(node if inputs == node.inputs else
                     Node(node.op, inputs, node.attrs, node.outputs, node.loc))
    from tilefuse.passes.dce import dce

    return dce(b.build([renamed.get(v, v) for v in graph.outputs]))[0]


__all__ = ["gpu_views"]
