"""Converters for the fused scaled-dot-product-attention ATen ops (what
``F.scaled_dot_product_attention`` becomes when CUDA tensors are traced: the flash, efficient,
cuDNN and overrideable kernels' ops) into one tilefuse ``attention`` node.

Only the output is converted: a node whose log-sum-exp (or any other result) is read, with
dropout, or causal with ``Sq != Sk`` (torch's top-left alignment against the kernels'
bottom-right one) raises :class:`Unsupported` and runs in torch. ``is_causal`` becomes an
additive ``[Sq, Sk]`` constant mask (0 on and below the diagonal, -inf above), added to an
``attn_bias`` when there is one. (On CPU tensors SDPA decomposes into plain ops before these
converters see it.)

When the graph is compiled for the cuda target the trace does not leave the choice of SDPA
kernel to torch: :class:`FusedAttention` (a ``TorchFunctionMode`` around the trace) routes every
``F.scaled_dot_product_attention`` call to ``_scaled_dot_product_efficient_attention`` (key and
value heads repeated for grouped-query attention, a bool mask made additive), so it becomes
one ``attention`` node whatever torch would have picked. Left to torch, a trace picked the
math path for ViT-base on an H200 (f16, 197 tokens): an f32 upcast, two batched f32 products
and a masked softmax a thread per row, 8 ms of its 11 ms; on CPU tensors it always does.
Calls with dropout, causal with ``Sq != Sk`` or other than 4-D stay torch's.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch
from torch import fx
from torch.overrides import TorchFunctionMode

from tilefuse.frontend.torch.convert import (
    Converter,
    Lowering,
    Result,
    Unsupported,
    arg,
    used_outputs,
)
from tilefuse.graph.ir import Value


def _sdpa(mask_at: int | None, dropout_at: int, causal_at: int) -> Converter:
    """The converter of one fused SDPA op, given where its ``attn_bias``, ``dropout_p`` and
    ``is_causal`` arguments sit."""
    def convert(lw: Lowering, node: fx.Node) -> Result:
        if used_outputs(node) - {0}:
            raise Unsupported("reads results other than the attention output", op=lw.op)
        if float(arg(node, dropout_at, "dropout_p", 0.0)) != 0.0:
            raise Unsupported("dropout", op=lw.op)
        out = lw.out_type.dtype
        q, k, v = (lw.cast(lw.tensor(a), out) for a in node.args[:3])
        operands = [q, k, v]
        bias = arg(node, mask_at, "attn_bias", None) if mask_at is not None else None
        mask = lw.cast(lw.tensor(bias), out) if bias is not None else None
        if bool(arg(node, causal_at, "is_causal", False)):
            causal = _causal_mask(lw, q, k)
            mask = causal if mask is None else lw.add("add", [mask, causal])
        if mask is not None:
            operands.append(mask)
        scale = node.kwargs.get("scale")
        scale = 1.0 / math.sqrt(int(q.shape[-1])) if scale is None else float(scale)
        value = lw.add("attention", operands, scale=scale)
        val = node.meta.get("val")
        count = len(val) if isinstance(val, (tuple, list)) else 1
        return (value, *([None] * (count - 1)))
    return convert


def _causal_mask(lw: Lowering, q: Value, k: Value) -> Value:
    sq, sk = int(q.shape[-2]), int(k.shape[-2])
    if sq != sk:
        raise Unsupported(f"causal attention with {sq} queries and {sk} keys (alignment)",
                          op=lw.op)
    keep = np.tril(np.ones((sq, sk), dtype=bool))
    return lw.constant(np.where(keep, 0.0, -np.inf).astype(q.dtype.np))


def sdpa_converters() -> Mapping[Any, Converter]:
    """ATen overload → converter for every fused SDPA op this torch has."""
    aten = torch.ops.aten
    spec = {"_scaled_dot_product_flash_attention": (None, 3, 4),
            "_scaled_dot_product_efficient_attention": (3, 5, 6),
            "_scaled_dot_product_cudnn_attention": (3, 5, 6),
            "_scaled_dot_product_fused_attention_overrideable": (3, 4, 5)}
    table: dict[Any, Converter] = {}
    for name, (mask_at, dropout_at, causal_at) in spec.items():
        op = getattr(aten, name, None)
        if op is not None:
            table[op.default] = _sdpa(mask_at, dropout_at, causal_at)
    return table


def _fused_sdpa(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                attn_mask: torch.Tensor | None = None, dropout_p: float = 0.0,
                is_causal: bool = False, scale: float | None = None,
                enable_gqa: bool = False) -> torch.Tensor | None:
    """``F.scaled_dot_product_attention`` as the efficient-attention op (module docstring), or
    None where it must stay torch's own call."""
    if dropout_p or query.dim() != 4 or key.dim() != 4 or \
            (is_causal and query.shape[-2] != key.shape[-2]):
        return None
    heads, kv_heads = query.shape[-3], key.shape[-3]
    if kv_heads != heads:
        if not enable_gqa or heads % kv_heads:
            return None
        key = key.repeat_interleave(heads // kv_heads, dim=-3)
        value = value.repeat_interleave(heads // kv_heads, dim=-3)
    if attn_mask is not None and attn_mask.dtype == torch.bool:
        attn_mask = torch.zeros(attn_mask.shape, dtype=query.dtype,
                                device=query.device).masked_fill(~attn_mask, float("-inf"))
    elif attn_mask is not None and attn_mask.dtype != query.dtype:
        attn_mask = attn_mask.to(query.dtype)
    return torch.ops.aten._scaled_dot_product_efficient_attention.default(
        query, key, value, attn_mask, False, 0.0, is_causal, scale=scale)[0]


class FusedAttention(TorchFunctionMode):
    """Routes ``F.scaled_dot_product_attention`` to one fused op while tracing (module
    docstring)."""

    def __torch_function__(self, func: Any, types: Any, args: tuple = (),
                           kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        if func is torch.nn.functional.scaled_dot_product_attention:
            fused = _fused_sdpa(*args, **kwargs)
            if fused is not None:
                return fused
        return func(*args, **kwargs)


__all__ = ["FusedAttention", "sdpa_converters"]
