"""Converters of the ``ai.onnx.preview.training`` domain: ``Gradient`` and the optimizer
updates ``Adagrad``, ``Adam`` and ``Momentum``.

The optimizers are elementwise formulas over ``(R, T, X..., G..., states...)``, one update per
tensor group; the iteration count ``T`` is a run-time value, so "no bias correction on the first
step" is a ``where`` on ``T > 0``.

``Gradient(xs=[...], zs=[...], y=...)`` takes values for the tensors named in ``xs`` and ``zs``
and returns dy/dx for each name in ``xs`` (of ``sum(y)`` when ``y`` is not a scalar). The
forward graph from those names to ``y`` is converted again with the node's inputs bound to the
names (:meth:`NodeContext.reconvert`), so the gradient is taken at the values the node is given,
as the operator's definition asks, and then differentiated on graph IR by
:func:`tilefuse.graph.autodiff.gradients` with each op's reverse-mode rule. The result is
ordinary graph IR: constant folding, fusion and native code apply to it as to the forward graph.
"""

from __future__ import annotations

from collections.abc import Callable

from tilefuse.dtypes import DType
from tilefuse.errors import GradientError
from tilefuse.graph.autodiff import gradients
from tilefuse.onnx.context import NodeContext, Tensor
from tilefuse.onnx.model import TRAINING_DOMAIN

DOMAIN = TRAINING_DOMAIN


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


Update = Callable[..., tuple[Tensor, ...]]


def _groups(ctx: NodeContext, per: int, update: Update) -> list[Tensor]:
    """Applies ``update(r, t, x, g, *states)`` to each of the node's tensor groups; the
    outputs are every group's new X, then every group's new first state, and so on."""
    count, extra = divmod(len(ctx.inputs) - 2, per)
    if extra or count < 1:
        raise ctx.error(f"needs R, T and {per} inputs a tensor group, got {len(ctx.inputs)}")
    r, t = ctx.input(0), ctx.input(1)
    results = [update(r, t, *(ctx.input(2 + k * count + i) for k in range(per)))
               for i in range(count)]
    return [group[j] for j in range(per - 1) for group in results]


def _k(ctx: NodeContext, name: str, default: float, like: Tensor) -> Tensor:
    return ctx.scalar(float(ctx.attr(name, default)), like.dtype)


def _first_step(ctx: NodeContext, t: Tensor) -> Tensor:
    return ctx.op("le", ctx.cast(t, DType.i64), ctx.scalar(0, DType.i64))


def _regularized(ctx: NodeContext, x: Tensor, g: Tensor) -> Tensor:
    return ctx.op("add", ctx.op("mul", _k(ctx, "norm_coefficient", 0.0, x), x), g)


def _adagrad(ctx: NodeContext) -> list[Tensor]:
    def update(r: Tensor, t: Tensor, x: Tensor, g: Tensor, h: Tensor) -> tuple[Tensor, ...]:
        decay = ctx.op("mul", ctx.cast(t, x.dtype), _k(ctx, "decay_factor", 0.0, x))
        rate = ctx.op("div", ctx.cast(r, x.dtype), ctx.op("add", ctx.scalar(1, x.dtype), decay))
        gr = _regularized(ctx, x, g)
        h_new = ctx.op("add", h, ctx.op("mul", gr, gr))
        root = ctx.op("add", ctx.op("sqrt", h_new), _k(ctx, "epsilon", 0.0, x))
        return ctx.op("sub", x, ctx.op("div", ctx.op("mul", rate, gr), root)), h_new
    return _groups(ctx, 3, update)


def _adam(ctx: NodeContext) -> list[Tensor]:
    def update(r: Tensor, t: Tensor, x: Tensor, g: Tensor, v: Tensor,
               h: Tensor) -> tuple[Tensor, ...]:
        one = ctx.scalar(1, x.dtype)
        alpha, beta = _k(ctx, "alpha", 0.9, x), _k(ctx, "beta", 0.999, x)
        gr = _regularized(ctx, x, g)
        v_new = ctx.op("add", ctx.op("mul", alpha, v), ctx.op("mul", ctx.op("sub", one, alpha),
                                                              gr))
        h_new = ctx.op("add", ctx.op("mul", beta, h),
                       ctx.op("mul", ctx.op("sub", one, beta), ctx.op("mul", gr, gr)))
        root = ctx.op("add", ctx.op("sqrt", h_new), _k(ctx, "epsilon", 0.0, x))
        tf, rate = ctx.cast(t, x.dtype), ctx.cast(r, x.dtype)
        corrected = ctx.op("div", ctx.op("mul", rate, ctx.op("sqrt", ctx.op(
            "sub", one, ctx.op("pow", beta, tf)))), ctx.op("sub", one, ctx.op("pow", alpha, tf)))
        rate = ctx.op("where", _first_step(ctx, t), rate, corrected)
        x_new = ctx.op("sub", x, ctx.op("mul", rate, ctx.op("div", v_new, root)))
        post = ctx.op("sub", one, _k(ctx, "norm_coefficient_post", 0.0, x))
        return ctx.op("mul", post, x_new), v_new, h_new
    return _groups(ctx, 4, update)


def _momentum(ctx: NodeContext) -> list[Tensor]:
    mode = ctx.attr("mode", "standard")
    if mode not in ("standard", "nesterov"):
        raise ctx.error(f"mode {mode!r} is not standard or nesterov")

    def update(r: Tensor, t: Tensor, x: Tensor, g: Tensor, v: Tensor) -> tuple[Tensor, ...]:
        alpha = _k(ctx, "alpha", 0.0, x)
        beta = ctx.op("where", _first_step(ctx, t), ctx.scalar(1, x.dtype),
                      _k(ctx, "beta", 0.0, x))
        gr = _regularized(ctx, x, g)
        v_new = ctx.op("add", ctx.op("mul", alpha, v), ctx.op("mul", beta, gr))
        step = v_new if mode == "standard" else ctx.op("add", gr, ctx.op("mul", alpha, v_new))
        return ctx.op("sub", x, ctx.op("mul", ctx.cast(r, x.dtype), step)), v_new
    return _groups(ctx, 3, update)


CONVERTERS = (
    ("Gradient", 1, convert_gradient), ("Adagrad", 1, _adagrad), ("Adam", 1, _adam),
    ("Momentum", 1, _momentum),
)
