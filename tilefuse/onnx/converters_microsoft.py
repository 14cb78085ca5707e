"""Ops of onnxruntime's ``com.microsoft`` domain that tilefuse runs: ``MatMulNBits``.

``MatMulNBits`` (4 bits) is ``A @ dequant(B) + bias`` with B a constant [N, K/bs, bs/2] of
nibble pairs along K (low nibble first), one f32 scale per (column, block) and u8 zero points
packed two a byte (default 8). It becomes tilefuse's ``matmul_w4`` (the int4 weight-only
kernel; the nibbles are repacked into its [K/2, N] layout at import) when the block size is 32,
64 or 128 and K a whole number of blocks; otherwise (other block sizes, float zero points) the
weight is dequantized at import and the product is a plain f32 matmul. ``g_idx`` (act-order
groups) is refused.
"""

from __future__ import annotations

import numpy as np

from tilefuse.dtypes import DType
from tilefuse.onnx.context import NodeContext, Tensor

DOMAIN = "com.microsoft"


def _zero_points(ctx: NodeContext, n: int, blocks: int) -> np.ndarray:
    """[n, blocks]: u8 from the packed input (4 bits each, low nibble first), the default 8,
    or the float zero points as given."""
    packed = ctx.const_input(3, "zero_points")
    if packed is None:
        return np.full((n, blocks), 8, np.uint8)
    if packed.dtype != np.uint8:
        return np.asarray(packed, np.float32).reshape(n, blocks)
    per_col = (blocks + 1) // 2
    rows = packed.reshape(n, per_col)
    both = np.stack([rows & 0xF, rows >> 4], axis=-1).reshape(n, 2 * per_col)
    return both[:, :blocks].astype(np.uint8)


def _matmul_nbits(ctx: NodeContext) -> list[Tensor]:
    a = ctx.input(0)
    k, n = int(ctx.attr("K")), int(ctx.attr("N"))
    bits, block = int(ctx.attr("bits", 4)), int(ctx.attr("block_size"))
    if bits != 4:
        raise ctx.error(f"MatMulNBits with bits={bits}: only 4 is supported")
    if ctx.optional(4) is not None:
        raise ctx.error("MatMulNBits with g_idx (act-order groups) is not supported")
    if a.dtype is not DType.f32 or a.shape[-1] != k:
        raise ctx.error(f"MatMulNBits needs f32 A [..., {k}], got {a.type}")
    b = ctx.const_input(1, "B")
    scales = ctx.const_input(2, "scales")
    if b is None or scales is None:
        raise ctx.error("MatMulNBits needs constant B and scales")
    blocks = -(-k // block)
    nibbles = np.asarray(b, np.uint8).reshape(n, blocks * block // 2)
    scale = np.asarray(scales, np.float32).reshape(n, blocks)
    zeros = _zero_points(ctx, n, blocks)
    bias_t = ctx.optional(5)
    bias = np.zeros(n, np.float32) if bias_t is None else np.asarray(
        ctx.const_input(5, "bias"), np.float32).reshape(n)
    if block in (32, 64, 128) and k % block == 0 and zeros.dtype == np.uint8:
        wq = np.ascontiguousarray(nibbles.T)                # [K/2, N], low nibble = even k
        return [ctx.op("matmul_w4", a, ctx.const(wq), ctx.const(np.ascontiguousarray(scale.T)),
                       ctx.const(np.ascontiguousarray(zeros.T)), ctx.const(bias),
                       group=block, act="none")]
    codes = np.stack([nibbles & 0xF, nibbles >> 4], axis=-1).reshape(n, blocks * block)
    centred = codes.astype(np.float32) - np.repeat(zeros.astype(np.float32), block, axis=1)
    w = (centred * np.repeat(scale, block, axis=1))[:, :k].T.astype(np.float32)
    product = ctx.op("matmul", a, ctx.const(np.ascontiguousarray(w)))
    return [product if bias_t is None else ctx.op("add", product, ctx.const(bias))]


CONVERTERS = (("MatMulNBits", 1, _matmul_nbits),)
