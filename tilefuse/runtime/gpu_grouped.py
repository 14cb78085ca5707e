"""Grouped-query products without the broadcast: a batched ``matmul`` whose right operand is a
key/value tensor repeated over the heads that share it (grouped-query attention, as Llama's
``repeat_kv`` writes it: ``k[:, :, None].expand(b, kv, g, n, d).reshape(b, kv·g, n, d)``)
becomes one product per shared tensor with the ``g`` heads' rows stacked into M.

For ``a [.., kv·g, M, K]`` and ``b = view(broadcast(x [.., kv, 1, K', N']))`` with the repeat
axis the innermost batch axis, head ``h = i·g + j`` multiplies ``x[i]``, and ``a``'s rows of
heads ``i·g .. i·g + g-1`` are contiguous, so::

    matmul(a, b) == reshape(matmul(reshape(a, [kv, g·M, K]), x'), a·b's shape)

with ``x'`` the ``[kv, K, N]`` view of ``x`` (transposed when ``b`` is the broadcast's
transpose, as the scores' ``q · kᵀ`` is). The same arithmetic per element; the broadcast's
copy (``g`` times the cache: 8 MB a layer for a decode step over 2048 keys, 16 heads of 4 KV
heads) is never written, and cuBLAS sees M = ``g·M`` instead of ``g`` times as many M = 1
products. Only the scores ``q · kᵀ`` are folded (see :func:`_fold`: the weighted values
``p · v`` folded were slower in cuBLAS). The chain recognised, from ``b`` back: an optional
batch-regrouping reshape, an optional swap of the last two axes, a reshape merging the
repeat axis into the one before it, the ``broadcast_to`` of one size-1 batch axis.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from tilefuse.graph.builder import GraphBuilder
from tilefuse.graph.ir import Graph, Node, Value


@dataclass(frozen=True)
class _Repeat:
    """``b`` is ``x`` (batch ``groups``, then ``[rows, cols]``) repeated ``g`` times per
    group over the innermost batch axis, transposed in its last two axes when ``swapped``."""

    x: Value
    groups: int
    g: int
    swapped: bool


def _static(shape: tuple[object, ...]) -> bool:
    return all(isinstance(d, int) for d in shape)


def _op(producer: dict[Value, Node], value: Value) -> str | None:
    node = producer.get(value)
    return None if node is None else node.op.name


def _repeat_of(producer: dict[Value, Node], b: Value) -> _Repeat | None:
    node = producer.get(b)
    if node is not None and node.op.name == "reshape" and \
            node.inputs[0].shape[-2:] == b.shape[-2:] and len(node.inputs[0].shape) >= 3 \
            and _op(producer, node.inputs[0]) != "broadcast_to":
        node = producer.get(node.inputs[0])   # a batch regrouping
    swapped = False
    if node is not None and node.op.name == "transpose":
        rank = len(node.outputs[0].shape)
        if tuple(node.attrs["perm"]) != (*range(rank - 2), rank - 1, rank - 2):
            return None
        swapped = True
        node = producer.get(node.inputs[0])
    if node is None or node.op.name != "reshape":
        return None
    merged, out = node.inputs[0].shape, node.outputs[0].shape
    if len(merged) < 3 or merged[-2:] != out[-2:]:
        return None
    bcast = producer.get(node.inputs[0])
    if bcast is None or bcast.op.name != "broadcast_to":
        return None
    x = bcast.inputs[0]
    before, after = x.shape, bcast.outputs[0].shape
    if len(before) != len(after) or not _static(after):
        return None
    differs = [i for i, (p, q) in enumerate(zip(before, after)) if p != q]
    if differs != [len(after) - 3] or before[-3] != 1 or after[-3] < 2:
        return None
    g = int(after[-3])
    groups = math.prod(int(d) for d in after[:-3])
    return _Repeat(x, groups, g, swapped)


def _fold(producer: dict[Value, Node], node: Node) -> _Repeat | None:
    if node.op.name != "matmul" or node.attrs:
        return None
    a, b = node.inputs[:2]
    if len(a.shape) < 3 or len(b.shape) != len(a.shape) or a.shape[:-2] != b.shape[:-2] \
            or not _static(a.shape):
        return None
    found = _repeat_of(producer, b)
    if found is None or found.groups * found.g != math.prod(int(d) for d in a.shape[:-2]):
        return None
    # only the scores (b the keys' transpose): the weighted values folded to M = g·M ran as
    # cuBLAS's batched small-N kernel, 37 µs a layer where the unfolded M = 1 products and
    # the broadcast copy took ~17 (H200, decode step, 2026-12-03)
    return found if found.swapped else None


def fold_grouped_products(graph: Graph) -> Graph:
    """``graph`` with each grouped-query product (module docstring) as one product per shared
    operand; the same graph when there is none (the broadcasts left unread go at DCE)."""
    producer = graph.producers()
    folds = {n: r for n in graph.nodes if n.op.name == "matmul"
             and (r := _fold(producer, n)) is not None}
    if not folds:
        return graph
    b = GraphBuilder(graph.name)
    renamed: dict[Value, Value] = {v: b.input(v.type, v.name) for v in graph.inputs}
    for node in graph.nodes:
        inputs = tuple(renamed.get(v, v) for v in node.inputs)
        repeat = folds.get(node)
        if repeat is None:
            b.append(node if inputs == node.inputs else
                     Node(node.op, inputs, node.attrs, node.outputs, node.loc))
            continue
        a = inputs[0]
        m, k = int(a.shape[-2]), int(a.shape[-1])
        rows, cols = (int(d) for d in repeat.x.shape[-2:])
        x = b.add1("reshape", [renamed.get(repeat.x, repeat.x)],
                   {"shape": (repeat.groups, rows, cols)}, node.loc)
        if repeat.swapped:
            x = b.add1("transpose", [x], {"perm": (0, 2, 1)}, node.loc)
        stacked = b.add1("reshape", [a], {"shape": (repeat.groups, repeat.g * m, k)},
                         node.loc)
        product = b.add1("matmul", [stacked, x], {}, node.loc)
        renamed[node.outputs[0]] = b.add1("reshape", [product],
                                          {"shape": tuple(node.outputs[0].shape)}, node.loc)
    from tilefuse.passes.dce import dce

    return dce(b.build([renamed.get(v, v) for v in graph.outputs]))[0]


__all__ = ["fold_grouped_products"]
