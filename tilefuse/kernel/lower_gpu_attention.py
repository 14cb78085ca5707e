"""ATTENTION kernel groups on the ``cuda`` target: the fused attention kernel
(:mod:`tilefuse.codegen.nvptx_attention`) or, for what it does not take, the unfused graph.

:func:`attention_shape` reads the group's ``attention(q, k, v[, mask]) {scale}`` node into the
kernel's static description (the batch dims flattened, the mask's element strides with 0
where it broadcasts); :func:`gpu_attention_reason` says why an attention node cannot run fused
on the GPU (f32 operands, head dims that are not multiples of 16 or over 128, broadcast batch
dims, runtime sizes); :func:`unfuse_attention` replaces such nodes by their decomposition
(matmuls, softmax), each logged on the ``fallback`` topic with its reason, so the rest of the
GPU path runs them unfused. :func:`attention_alternatives` gives the kernels the executable
times against the default (mma.sync) kernel when it loads: the wgmma kernel where it takes the
shape (``TILEFUSE_NO_WGMMA=1`` leaves it out).
"""

from __future__ import annotations

import os
from dataclasses import replace

import numpy as np

from tilefuse.codegen.nvptx_attention import (
    FlashKernel,
    FlashShape,
    MaskLayout,
    default_config,
    flash_attention,
    unsupported,
)
from tilefuse.errors import CompileError, TilefuseError
from tilefuse.graph.builder import GraphBuilder
from tilefuse.graph.ir import Graph, Node, Value
from tilefuse.graph.types import is_static
from tilefuse.kernel.access import c_strides
from tilefuse.kernel.fusion import KernelGroup
from tilefuse.kernel.lower_attention import AttentionShape
from tilefuse.kernel.schedule import attention_node
from tilefuse.log import get_logger
from tilefuse.passes.rewrite import rewrite_nodes


def attention_shape(node: Node) -> FlashShape:
    """The fused kernel's description of ``node`` (CompileError for runtime sizes, broadcast
    batch dims or mixed dtypes)."""
    values = [*node.inputs, *node.outputs]
    if not all(is_static(v.shape) for v in values):
        raise CompileError("the fused GPU attention needs static shapes")
    dtype = node.outputs[0].dtype
    if any(v.dtype is not dtype for v in node.inputs):
        raise CompileError(f"attention in {', '.join(str(v.dtype) for v in node.inputs)}: the "
                           f"fused GPU attention takes one dtype throughout")
    shape = AttentionShape.of(node)
    mask = None
    if shape.mask is not None:
        mask = _mask_layout(tuple(int(d) for d in node.inputs[3].shape), shape)
    return FlashShape(shape.bh, int(shape.sq), int(shape.sk), shape.d, shape.dv,
                      float(node.attrs["scale"]), dtype, mask)


def _mask_layout(actual: tuple[int, ...], shape: AttentionShape) -> MaskLayout:
    """Element strides of a C-order mask of shape ``actual`` against the scores
    ``[batch..., Sq, Sk]`` it broadcasts to (0 along its axes of size 1)."""
    rank = len(shape.batch) + 2
    padded = (1,) * (rank - len(actual)) + actual
    strides = (0,) * (rank - len(actual)) + c_strides(actual)
    strides = tuple(0 if size == 1 else st for size, st in zip(padded, strides))
    return MaskLayout(tuple(int(d) for d in shape.batch), strides[:-2], strides[-2],
                      strides[-1])


def gpu_attention_reason(node: Node) -> str | None:
    """Why ``node`` (an attention) cannot run as the fused GPU kernel, or None."""
    try:
        return unsupported(attention_shape(node))
    except CompileError as err:
        return str(err)


def group_attention(group: KernelGroup) -> tuple[FlashShape, tuple[Value, ...]]:
    """The kernel description of an ATTENTION group and the values its parameters bind
    (q, k, v[, mask], out)."""
    node = attention_node(group)
    return attention_shape(node), (*node.inputs, node.outputs[0])


def causal_mask(mask: np.ndarray | None, sq: int, sk: int) -> bool:
    """Whether a constant additive ``mask`` (broadcast to ``[..., sq, sk]``) masks out every
    key after its query in every batch and head: each entry above the diagonal at most -65504
    (f16's lowest; exp of it underflows to 0 in f32), so the tiles there may be skipped."""
    if mask is None or sq != sk or mask.ndim < 2 or mask.shape[-2:] != (sq, sk):
        return False
    above = np.triu(np.ones((sq, sk), dtype=bool), 1)
    masked = np.asarray(mask, np.float32) <= -65504.0
    return bool(np.all(masked[..., above]))


def attention_alternatives(shape: FlashShape, causal: bool = False
                           ) -> tuple[FlashKernel, ...]:
    """Kernels of ``shape`` besides the default one, to be chosen between by measurement:
    with ``causal`` (the mask is a causal constant: :func:`causal_mask`) the default blocking
    that skips the masked key tiles; the wgmma kernels (sm_90a) when they take the shape (why
    not: logged on ``fallback``)."""
    from tilefuse.codegen.nvptx_wgmma_attention import WGMMA_CONFIG, WGMMA_CONFIGS

    found: tuple[FlashKernel, ...] = ()
    skip = replace(default_config(shape), causal=1, pipeline=0)
    if causal and unsupported(shape, skip) is None:
        found = (flash_attention(shape, skip),)
    if os.environ.get("TILEFUSE_NO_WGMMA"):
        return found
    reason = unsupported(shape, WGMMA_CONFIG)
    if reason is not None:
        get_logger("fallback").debug("attention %dx%dx%d: mma.sync only: %s", shape.bh,
                                     shape.sq, shape.sk, reason)
        return found
    return found + tuple(flash_attention(shape, c) for c in WGMMA_CONFIGS
                         if unsupported(shape, c) is None)


def unfuse_attention(graph: Graph) -> Graph:
    """``graph`` with every attention node the fused GPU kernel cannot take replaced by its
    decomposition (logged on the ``fallback`` topic with the reason)."""
    log = get_logger("fallback")

    def rule(builder: GraphBuilder, node: Node, inputs: tuple[Value, ...]
             ) -> tuple[Value, ...] | None:
        if node.op.name != "attention":
            return None
        reason = gpu_attention_reason(node)
        if reason is None:
            return None
        log.info("attention %s runs unfused on the GPU: %s",
                 "x".join(map(str, node.outputs[0].shape)), reason)
        assert node.op.decompose is not None
        try:
            return tuple(node.op.decompose(builder, inputs, node.attrs, node.loc))
        except TilefuseError as err:
            raise CompileError(f"unfusing an attention for the GPU failed: {err}") from err

    if not any(n.op.name == "attention" for n in graph.nodes):
        return graph
    from tilefuse.runtime.gpu_grouped import fold_grouped_products

    # an unfused grouped-query attention multiplies each shared K/V once (no broadcast copy)
    return fold_grouped_products(rewrite_nodes(graph, rule)[0])


__all__ = [
    "attention_alternatives",
    "attention_shape",
    "causal_mask",
    "gpu_attention_reason",
    "group_attention",
    "unfuse_attention",
]
