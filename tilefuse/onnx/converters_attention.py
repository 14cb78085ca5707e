"""ONNX ``Attention`` (opsets 23-25) built from tilefuse ops.

The node becomes ``softmax(q·kᵀ·scale (softcapped) + bias)·v`` in plain ops, which the
``attention`` graph pass then recognises and fuses into one tiled kernel like any other
spelling of attention. What the operator adds around that core:

- 3-D inputs ``[B, S, heads·D]`` are split into heads (``q_num_heads``/``kv_num_heads``) and
  joined again at the end;
- ``past_key``/``past_value`` are concatenated in front of ``K``/``V`` (the present outputs);
- grouped-query attention repeats each KV head ``q_heads / kv_heads`` times (h0, h0, h1, h1 …);
- the additive bias composes the mask (a bool mask is 0 / -inf, a float mask is added; a
  shorter mask is padded with -inf), the causal frontier ``j <= i + offset``, the sliding window
  and the padding mask of ``nonpad_kv_seqlen``. Parts that depend only on shapes are constants;
  ``offset`` is the past length, ``nonpad_kv_seqlen - Sq`` per batch with an external cache, or 0;
- a query row whose bias is -inf everywhere gives zeros (not NaN), in ``Y`` and in mode 3 of
  ``qk_matmul_output`` (modes: 0 raw q·kᵀ·scale, 1 after softcap, 2 plus bias, 3 softmax).
"""

from __future__ import annotations

import math

import numpy as np

from tilefuse.dtypes import DType
from tilefuse.onnx.context import NodeContext, Tensor
from tilefuse.onnx.tensors import to_dtype


def _split_heads(ctx: NodeContext, t: Tensor, heads: int | None, what: str) -> Tensor:
    """[B, S, heads·D] -> [B, heads, S, D]."""
    if not heads or t.shape[2] % heads:
        raise ctx.error(f"a 3-D {what} {list(t.shape)} needs a head count that divides its last "
                        "dim (q_num_heads / kv_num_heads)")
    b, s, hidden = t.shape
    t = ctx.op("reshape", t, shape=(b, s, heads, hidden // heads))
    return ctx.op("transpose", t, perm=(0, 2, 1, 3))


def _repeat_heads(ctx: NodeContext, t: Tensor, reps: int) -> Tensor:
    """[B, H, S, D] -> [B, H·reps, S, D], each head repeated in place."""
    if reps == 1:
        return t
    b, h, s, d = t.shape
    wide = ctx.op("broadcast_to", ctx.op("reshape", t, shape=(b, h, 1, s, d)),
                  shape=(b, h, reps, s, d))
    return ctx.op("reshape", wide, shape=(b, h * reps, s, d))


def _neg_inf_where_not(ctx: NodeContext, allowed: Tensor, dtype: DType) -> Tensor:
    return ctx.op("where", allowed, ctx.scalar(0, dtype), ctx.scalar(-np.inf, dtype))


def _frontier_bias(ctx: NodeContext, sq: int, sk: int, offset: int | Tensor, causal: bool,
                   left: int, right: int, dtype: DType) -> Tensor | None:
    """The causal and window bias for query i and key j at distance ``d = i + offset - j``
    (allowed: ``d >= 0`` when causal, ``d <= left``, ``d >= -right``): [Sq, Sk] for a scalar
    offset, [B, 1, Sq, Sk] for a per-batch one."""
    bounds = [("ge", 0)] * causal + [("le", left)] * (left >= 0) + [("ge", -right)] * (right >= 0)
    if not bounds:
        return None
    rel = np.arange(sq)[:, None] - np.arange(sk)[None, :]            # i - j
    if isinstance(offset, int):
        compare = {"ge": np.greater_equal, "le": np.less_equal}
        allowed = np.ones(rel.shape, dtype=bool)
        for name, bound in bounds:
            allowed &= compare[name](rel + offset, bound)
        return ctx.const(np.where(allowed, 0, -np.inf).astype(dtype.np))
    per_batch = ctx.op("reshape", offset, shape=(offset.shape[0], 1, 1, 1))
    diff = ctx.op("add", ctx.const(rel.astype(np.int64)), per_batch)  # [B, 1, Sq, Sk]
    allowed = None
    for name, bound in bounds:
        test = ctx.op(name, diff, ctx.scalar(bound, DType.i64))
        allowed = test if allowed is None else ctx.op("logical_and", allowed, test)
    assert allowed is not None
    return _neg_inf_where_not(ctx, allowed, dtype)


def _mask_bias(ctx: NodeContext, mask: Tensor | None, sk: int, dtype: DType) -> Tensor | None:
    """The attn_mask as an additive bias over Sk keys (a shorter mask is padded with -inf)."""
    if mask is None:
        return None
    if mask.dtype is DType.bool:
        mask = _neg_inf_where_not(ctx, mask, dtype)
    pad = sk - mask.shape[-1]
    if pad < 0:
        raise ctx.error(f"attn_mask {list(mask.shape)} has more keys than the {sk} attended")
    if pad:
        filler = ctx.const(np.full((*mask.shape[:-1], pad), -np.inf, dtype=dtype.np))
        mask = ctx.op("concat", mask, filler, axis=-1)
    return mask


def _add_all(ctx: NodeContext, parts: list[Tensor | None]) -> Tensor | None:
    total = None
    for part in parts:
        if part is not None:
            total = part if total is None else ctx.op("add", total, part)
    return total


def _bias(ctx: NodeContext, q: Tensor, k: Tensor, past: int | None) -> Tensor | None:
    sq, sk, dtype = q.shape[2], k.shape[2], q.dtype
    nonpad = ctx.optional(6)
    if nonpad is not None and past is not None:
        raise ctx.error("nonpad_kv_seqlen cannot be combined with past_key/past_value")
    offset: int | Tensor = past or 0
    padding = None
    if nonpad is not None:
        nonpad = ctx.cast(nonpad, DType.i64)
        offset = ctx.op("sub", nonpad, ctx.scalar(sq, DType.i64))
        keys = ctx.const(np.arange(sk, dtype=np.int64))
        valid = ctx.op("lt", keys, ctx.op("reshape", nonpad, shape=(nonpad.shape[0], 1)))
        padding = ctx.op("reshape", _neg_inf_where_not(ctx, valid, dtype),
                         shape=(nonpad.shape[0], 1, 1, sk))
    frontier = _frontier_bias(ctx, sq, sk, offset, bool(ctx.attr("is_causal", 0)),
                              int(ctx.attr("left_window_size", -1)),
                              int(ctx.attr("right_window_size", -1)), dtype)
    return _add_all(ctx, [_mask_bias(ctx, ctx.optional(3), sk, dtype), frontier, padding])


def _fully_masked_rows(ctx: NodeContext, bias: Tensor | None) -> Tensor | None:
    """[..., Sq, 1] true where the bias leaves no key; None when no row can be."""
    if bias is None:
        return None
    if bias.const is not None and not np.isneginf(bias.const.max(axis=-1)).any():
        return None
    row_max = ctx.op("max", bias, axes=(-1,), keepdims=True)
    return ctx.op("eq", row_max, ctx.scalar(-np.inf, bias.dtype))


def convert_attention(ctx: NodeContext) -> list[Tensor]:
    q, k, v = ctx.input(0), ctx.input(1), ctx.input(2)
    if not q.rank == k.rank == v.rank or q.rank not in (3, 4):
        raise ctx.error("Q, K and V must all be 3-D or all 4-D")
    if q.rank == 3:
        q = _split_heads(ctx, q, ctx.attr("q_num_heads"), "Q")
        k = _split_heads(ctx, k, ctx.attr("kv_num_heads"), "K")
        v = _split_heads(ctx, v, ctx.attr("kv_num_heads"), "V")
    past_key, past_value = ctx.optional(4), ctx.optional(5)
    if (past_key is None) != (past_value is None):
        raise ctx.error("past_key and past_value must be given together")
    past = None
    if past_key is not None and past_value is not None:
        past = past_key.shape[2]
        k = ctx.op("concat", past_key, k, axis=2)
        v = ctx.op("concat", past_value, v, axis=2)
    present_k, present_v = k, v
    if q.shape[1] % k.shape[1] or k.shape[1] != v.shape[1]:
        raise ctx.error(f"{q.shape[1]} query heads cannot attend {k.shape[1]} key and "
                        f"{v.shape[1]} value heads")
    reps = q.shape[1] // k.shape[1]
    k, v = _repeat_heads(ctx, k, reps), _repeat_heads(ctx, v, reps)
    scale = ctx.attr("scale")
    scale = 1.0 / math.sqrt(q.shape[3]) if scale is None else float(scale)
    scores = ctx.op("mul", ctx.op("matmul", q, ctx.op("transpose", k, perm=(0, 1, 3, 2))),
                    ctx.scalar(scale, q.dtype))
    raw = scores
    softcap = float(ctx.attr("softcap", 0.0))
    if softcap > 0:
        cap = ctx.scalar(softcap, q.dtype)
        scores = ctx.op("mul", ctx.op("tanh", ctx.op("div", scores, cap)), cap)
    bias = _bias(ctx, q, k, past)
    logits = scores if bias is None else ctx.op("add", scores, bias)
    precision = ctx.attr("softmax_precision")
    if precision is not None:  # softmax in that type, then back
        wide = ctx.cast(logits, to_dtype(int(precision), "softmax_precision"))
    else:
        wide = logits
    probs = ctx.cast(ctx.op("softmax", wide, axis=-1), q.dtype)
    empty = _fully_masked_rows(ctx, bias)
    if empty is not None:
        probs = ctx.op("where", empty, ctx.scalar(0, q.dtype), probs)
    y = ctx.op("matmul", probs, v)
    if ctx.input(0).rank == 3:
        b, h, s, d = y.shape
        y = ctx.op("reshape", ctx.op("transpose", y, perm=(0, 2, 1, 3)), shape=(b, s, h * d))
    mode = int(ctx.attr("qk_matmul_output_mode", 0))
    qk = {0: raw, 1: scores, 2: logits, 3: probs}.get(mode)
    if qk is None:
        raise ctx.error(f"qk_matmul_output_mode {mode} is not one of 0, 1, 2, 3")
    return [y, present_k, present_v, qk]


CONVERTERS = (
    ("Attention", 23, convert_attention),
)
