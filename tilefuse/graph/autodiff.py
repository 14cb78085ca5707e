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
    relevant = _path(nodes, y, wrt)
    grads: dict[Value, Value] = {y: seed if seed is not None else
                                 d.op("broadcast_to", d.scalar(1, y), shape=y.type.shape)}
    depends = set(wrt) | {out for node in relevant for out in node.outputs}
    for node in reversed(relevant):
        grad = grads.get(node.outputs[0])
        if grad is None:
            continue
        for value, g in zip(node.inputs, _node_vjp(d, node, grad)):
            if g is None or value not in depends:
                continue
            grads[value] = g if value not in grads else d.op("add", grads[value], g)
    return [d.cast_like(grads[x], x) if x in grads else d.zeros_like(x) for x in wrt]


def _path(nodes: Sequence[Node], y: Value, wrt: Sequence[Value]) -> list[Node]:
    """The nodes on some path from a value of ``wrt`` to ``y``, in their order."""
    reached = set(wrt)
    forward = []
    for node in nodes:
        if any(v in reached for v in node.inputs):
            reached.update(node.outputs)
            forward.append(node)
    needed = {y}
    relevant = []
    for node in reversed(forward):
        if any(out in needed for out in node.outputs):
            needed.update(node.inputs)
            relevant.append(node)
    relevant.reverse()
    return relevant


def _node_vjp(d: GradEmitter, node: Node, grad: Value) -> tuple[Value | None, ...]:
    shown = tuple(str(v.type) for v in node.inputs)
    if node.op.vjp is None or len(node.outputs) != 1:
        raise GradientError("has no gradient rule; tilefuse cannot differentiate through it",
                            op=node.op.name, inputs=shown, loc=node.loc)
    d.loc = node.loc or d.loc
    result = node.op.vjp(d, node.inputs, node.outputs[0], grad, **dict(node.attrs))
    if len(result) != len(node.inputs):
        raise GradientError(f"gradient rule gave {len(result)} gradients for "
                            f"{len(node.inputs)} inputs", op=node.op.name, inputs=shown)
    return tuple(None if g is None or not v.type.dtype.is_float else d.cast_like(g, v)
                 for v, g in zip(node.inputs, result))
