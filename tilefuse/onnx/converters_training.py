"""Converters of the ``ai.onnx.preview.training`` domain: ``Gradient``.

``Gradient(xs=[...], zs=[...], y=...)`` takes values for the tensors named in ``xs`` and ``zs``
and returns dy/dx for each name in ``xs`` (of ``sum(y)`` when ``y`` is not a scalar). The
forward graph from those names to ``y`` is converted again with the node's inputs bound to the
names (:meth:`NodeContext.reconvert`), so the gradient is taken at the values the node is given,
as the operator's definition asks, and then differentiated on graph IR by
:func:`tilefuse.graph.autodiff.gradients` with each op's reverse-mode rule. The result is
ordinary graph IR: constant folding, fusion and native code apply to it as to the forward graph.
"""

from __future__ import annotations

from tilefuse.errors import GradientError
from tilefuse.graph.autodiff import gradients
from tilefuse.onnx.context import NodeContext, Tensor

DOMAIN = "ai.onnx.preview.training"


def convert_gradient(ctx: NodeContext) -> list[Tensor]:
    xs = tuple(ctx.attr("xs") or ())
    zs = tuple(ctx.attr("zs") or ())
    y = ctx.attr("y")
    if not xs or not isinstance(y, str) or not y:
        raise ctx.error("needs the attributes xs (a non-empty list of names) and y (a name)")
    names = (*xs, *zs)
    if len(ctx.inputs) != len(names) or len(set(names)) != len(names):
        raise ctx.error(f"has {len(ctx.inputs)} inputs for the {len(names)} distinct names of "
                        "xs and zs; it needs one input per name")
    bindings = {name: ctx.input(i) for i, name in enumerate(names)}
    target, nodes = ctx.reconvert(y, bindings)
    em = ctx.em
    wrt = [em.value(bindings[name]) for name in xs]
    try:
        grads = gradients(em.builder, nodes, em.value(target), wrt, loc=em.loc)
    except GradientError as err:
        raise ctx.error(f"cannot differentiate {y!r}: {err}") from None
    return [Tensor(g.type, value=g) for g in grads]


CONVERTERS = (
    ("Gradient", 1, convert_gradient),
)
