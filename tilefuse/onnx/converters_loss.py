"""ONNX's loss ops, built from tilefuse ops: NegativeLogLikelihoodLoss and
SoftmaxCrossEntropyLoss (log_softmax over the class axis, then the same NLL).

``loss[n, d...] = -x[n, target[n, d...], d...] · weight[target]``; a target equal to
``ignore_index`` contributes 0 and, for ``mean``, no weight: the mean divides by the sum of the
weights of the entries that count (their number when there is no weight).
"""

from __future__ import annotations

from tilefuse.dtypes import DType
from tilefuse.onnx.context import NodeContext, Tensor

_REDUCTIONS = ("none", "sum", "mean")


def _nll(ctx: NodeContext, x: Tensor, target: Tensor, weight: Tensor | None) -> Tensor:
    if x.rank < 2 or target.shape != (x.shape[0], *x.shape[2:]):
        raise ctx.error(f"needs input [N, C, d...] and target [N, d...], got {list(x.shape)} "
                        f"and {list(target.shape)}")
    reduction = ctx.attr("reduction", "mean")
    if reduction not in _REDUCTIONS:
        raise ctx.error(f"reduction {reduction!r} is not one of {', '.join(_REDUCTIONS)}")
    t = ctx.cast(target, DType.i64)
    ignore = ctx.attr("ignore_index")
    keep = None
    if ignore is not None:  # ignored targets may be out of range: gather class 0 instead
        keep = ctx.op("ne", t, ctx.scalar(int(ignore), DType.i64))
        t = ctx.op("where", keep, t, ctx.scalar(0, DType.i64))
    picked = ctx.op("take_along_axis", x, ctx.op("expand_dims", t, axes=(1,)), axis=1)
    loss = ctx.op("neg", ctx.op("squeeze", picked, axes=(1,)))
    w = None if weight is None else ctx.op("take", weight, t, axis=0)
    if keep is not None:
        counted = ctx.cast(keep, x.dtype)
        w = counted if w is None else ctx.op("mul", w, counted)
    if w is not None:
        loss = ctx.op("mul", loss, w)
    if reduction == "none":
        return loss
    total = ctx.op("sum", loss)
    if reduction == "sum":
        return total
    if w is None:
        return ctx.op("mean", loss)
    return ctx.op("div", total, ctx.op("sum", w))


def _negative_log_likelihood(ctx: NodeContext) -> list[Tensor]:
    return [_nll(ctx, ctx.input(0), ctx.input(1), ctx.optional(2))]


def _softmax_cross_entropy(ctx: NodeContext) -> list[Tensor]:
    scores = ctx.input(0)
    if scores.rank < 2:
        raise ctx.error(f"needs scores [N, C, d...], got {list(scores.shape)}")
    log_prob = ctx.op("log_softmax", scores, axis=1)
    return [_nll(ctx, log_prob, ctx.input(1), ctx.optional(2)), log_prob]


CONVERTERS = (
    ("NegativeLogLikelihoodLoss", 12, _negative_log_likelihood),
    ("SoftmaxCrossEntropyLoss", 12, _softmax_cross_entropy),
)
