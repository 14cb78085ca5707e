"""Reverse-mode differentiation of graph IR.

:func:`gradients` walks the nodes between some values ``wrt`` and a value ``y`` backwards and
builds, with the same :class:`GraphBuilder`, the nodes that compute ``d sum(y·seed) / d x`` for
each ``x`` in ``wrt``. The rule for each op is the ``vjp`` slot of its :class:`OpDef`, written
next to the op's shape rule and reference; rules build nodes through a :class:`GradEmitter`, so
gradient graphs are ordinary graph IR that every later pass (constant folding, fusion, native
code) treats like any other. An op on the path without a rule is a :class:`GradientError` that
names it. Used by ONNX's ``Gradient`` operator (:mod:`tilefuse.onnx.converters_training`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from tilefuse.errors import GradientError, SourceLoc
from tilefuse.graph.builder import GraphBuilder
from tilefuse.graph.ir import Literal, Node, Value
from tilefuse.graph.types import Shape


class GradEmitter:
    """What a ``vjp`` rule builds with: ops, scalars of a value's dtype, un-broadcasting."""

    def __init__(self, builder: GraphBuilder, loc: SourceLoc | None = None):
        self.builder = builder
        self.loc = loc

    def op(self, name: str, *inputs: Value, **attrs: Any) -> Value:
        return self.builder.add1(name, inputs, attrs, self.loc)

    def scalar(self, value: float, like: Value) -> Value:
        """A rank-0 constant ``value`` in ``like``'s dtype."""
        array = np.asarray(value).astype(like.type.dtype.np)
        return self.builder.add1("constant", [], {"value": Literal(array)}, self.loc)

    def zeros_like(self, like: Value) -> Value:
        return self.op("broadcast_to", self.scalar(0, like), shape=like.type.shape)

    def select(self, cond: Value, value: Value) -> Value:
        """``value`` where ``cond`` holds, zero elsewhere."""
        return self.op("where", cond, value, self.scalar(0, value))

    def sum_to(self, grad: Value, like: Value) -> Value:
        """``grad`` summed over the axes that broadcasting added to ``like``'s shape, in its
        dtype: the gradient of an operand that was broadcast."""
        target: Shape = like.type.shape
        have: Shape = grad.type.shape
        lead = len(have) - len(target)
        axes = [*range(lead), *(lead + i for i, d in enumerate(target)
                                 if d == 1 and have[lead + i] != 1)]
        if axes:
            grad = self.op("sum", grad, axes=tuple(axes), keepdims=True)
        if tuple(grad.type.shape) != tuple(target):
            grad = self.op("reshape", grad, shape=tuple(target))
        return self.cast_like(grad, like)

    def cast_like(self, grad: Value, like: Value) -> Value:
        if grad.type.dtype is like.type.dtype:
            return grad
        return self.op("cast", grad, dtype=like.type.dtype)


def gradients(builder: GraphBuilder, nodes: Sequence[Node], y: Value, wrt: Sequence[Value],
              seed: Value | None = None, loc: SourceLoc | None = None) -> list[Value]:
    """The gradient of ``y`` with respect to each value of ``wrt``, through ``nodes`` (in
    topological order; other values are constants of the differentiation). ``seed`` is the
    gradient flowing into ``y`` (ones when None, so a non-scalar ``y`` is differentiated as
    ``sum(y)``). A value of ``wrt`` that ``y`` does not depend on gets zeros."""
    for x in (y, *wrt):
        if not x.type.dtype.is_float:
            raise GradientError(f"cannot differentiate a {x.type} value; gradients are of "
                                "floating-point values", loc=loc)
    d = GradEmitter(builder, loc)
    start = seed if seed is not None else d.op("broadcast_to", d.scalar(1, y), shape=y.type.shape)
    grads = backprop(d, nodes, {y: start}, wrt)
    return [d.cast_like(grads[x], x) if x in grads else d.zeros_like(x) for x in wrt]


def backprop(d: GradEmitter, nodes: Sequence[Node], seeds: dict[Value, Value],
             wrt: Sequence[Value]) -> dict[Value, Value]:
    """The gradients reaching the values of ``wrt`` (those on a path to a seeded value) from the
    gradients ``seeds`` of some values, through ``nodes``. A composite op without a rule of its
    own (layer_norm, group_norm, attention...) is differentiated through its decomposition,
    emitted next to it; CSE later merges that copy with the forward's own decomposition."""
    relevant = _path(nodes, list(seeds), wrt)
    grads = dict(seeds)
    depends = set(wrt) | {out for node in relevant for out in node.outputs}
    for node in reversed(relevant):
        if not any(out in grads for out in node.outputs):
            continue
        for value, g in zip(node.inputs, _node_vjp(d, node, grads)):
            if g is None or value not in depends:
                continue
            grads[value] = g if value not in grads else d.op("add", grads[value], g)
    return grads


def _path(nodes: Sequence[Node], ys: Sequence[Value], wrt: Sequence[Value]) -> list[Node]:
    """The nodes on some path from a value of ``wrt`` to a value of ``ys``, in their order."""
    reached = set(wrt)
    forward = []
    for node in nodes:
        if any(v in reached for v in node.inputs):
            reached.update(node.outputs)
            forward.append(node)
    needed = set(ys)
    relevant = []
    for node in reversed(forward):
        if any(out in needed for out in node.outputs):
            needed.update(node.inputs)
            relevant.append(node)
    relevant.reverse()
    return relevant


def _node_vjp(d: GradEmitter, node: Node, grads: dict[Value, Value]
              ) -> tuple[Value | None, ...]:
    shown = tuple(str(v.type) for v in node.inputs)
    d.loc = node.loc or d.loc
    if node.op.vjp is None:
        if node.op.decompose is not None:
            return _through_decomposition(d, node, grads)
        raise GradientError("has no gradient rule; tilefuse cannot differentiate through it",
                            op=node.op.name, inputs=shown, loc=node.loc)
    if len(node.outputs) == 1:
        out, grad = node.outputs[0], grads[node.outputs[0]]
    else:  # multi-output rules get every output and every gradient (zeros where none came)
        out = node.outputs
        grad = tuple(grads[o] if o in grads else d.zeros_like(o) for o in node.outputs)
    try:
        result = node.op.vjp(d, node.inputs, out, grad, **dict(node.attrs))
    except GradientError as err:
        raise err.with_context(op=node.op.name, inputs=shown, loc=node.loc) from None
    if len(result) != len(node.inputs):
        raise GradientError(f"gradient rule gave {len(result)} gradients for "
                            f"{len(node.inputs)} inputs", op=node.op.name, inputs=shown)
    return tuple(None if g is None or not v.type.dtype.is_float else d.cast_like(g, v)
                 for v, g in zip(node.inputs, result))


def _through_decomposition(d: GradEmitter, node: Node, grads: dict[Value, Value]
                           ) -> tuple[Value | None, ...]:
    """A composite's input gradients: its decomposition is emitted on the node's inputs and
    differentiated, seeded with the gradients of the node's outputs."""
    builder = d.builder
    before = len(builder.nodes)
    outs = tuple(node.op.decompose(builder, node.inputs, node.attrs, node.loc))
    emitted = builder.nodes[before:]
    seeds = {new: grads[old] for old, new in zip(node.outputs, outs) if old in grads}
    floats = [v for v in node.inputs if v.type.dtype.is_float]
    inner = backprop(GradEmitter(builder, node.loc), emitted, seeds, floats)
    return tuple(inner.get(v) for v in node.inputs)
