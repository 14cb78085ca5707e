"""``matmul_wq``: a weight-only quantized product whose weight is packed in the tile layout of
the cuda target's tensor-core kernel (:mod:`tilefuse.codegen.nvptx_qgemm`).

The ``quantize`` pass makes it for the cuda target (:mod:`tilefuse.passes.quantize`): the
weight is quantized *and* packed at build time, so the kernel reads each thread's share of a
16-column tile with one 16-byte load and dequantizes it in registers straight into ``mma``
fragments. Three weight formats:

- ``int4``: codes 0..15 per group of ``group`` rows of K with an f32 scale and a u8 zero point
  per group and column, ``w = (q - z) * s`` (:func:`tilefuse.passes.quantize.quantize_int4`;
  with ``zero_points`` False every z is 8 and the kernel does not read them);
- ``int8``: symmetric codes -127..127 with an f32 scale per output column, ``w = q * s``;
- ``fp8``: e4m3 (``float8_e4m3fn``) codes with an f32 scale per output column, ``w = f8(q) * s``.

``matmul_wq(x [..., K], w u8 [N/16, B·K], scales f32 [K/G or 1, N], zeros u8 [same], bias f32
[N])`` returns ``act(x @ w + bias)`` in x's dtype (f32, bf16 or f16), computed in f32 and
rounded once: that is the reference. The kernel agrees to f32 rounding for bf16/f16 x (the
weights are exact in the mma operand type, the scales are applied to f32 partial sums per
group); f32 x is split into two bf16 parts, which costs it ~2^-16 relative.

**Tile layout.** For the 16 columns ``n0..n0+15`` of tile ``t`` the weight bytes are the
m16n8k16 A fragments of ``W^T`` (rows = columns of W) in the order the kernel loads them:
per 16-byte load, per lane, the fragments of P consecutive mmas (P = 4 for int4, 2 for the
8-bit formats). The k order inside a chunk of ``4L`` rows is permuted so that lane ``q`` of
a quad owns the L consecutive k ``q·L..q·L+L-1`` (a 16-byte load of x for its B
fragments); :func:`fragment_coords` is that map, used both to pack and to unpack.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

from tilefuse.dtypes import DType
from tilefuse.errors import DTypeError, ShapeError
from tilefuse.graph.ir import Attrs
from tilefuse.graph.types import Shape, format_shape
from tilefuse.ops.quant import ACTIVATIONS, epilogue
from tilefuse.ops.registry import AttrType, OpDef, OpKind, attr

FORMATS = ("int4", "int8", "fp8")
TILE_N = 16
"""Columns of W per tile: the m16 side of the mma (W^T is the A operand)."""
BYTES_PER_K = {"int4": 8, "int8": 16, "fp8": 16}
"""Bytes of a 16-column tile per row of K."""
ACTIVATION_DTYPES = frozenset({DType.f32, DType.bf16, DType.f16})
_F32 = np.float32


def chunk_lanes(fmt: str, group: int) -> int:
    """L, the consecutive k a lane owns per chunk of 4L (16, or 8 for int4 groups of 32, so
    that one mma never mixes two groups)."""
    return 8 if fmt == "int4" and group == 32 else 16


def group_of(fmt: str, group: int, k: int) -> int:
    """Rows of K per scale: ``group`` for int4, all of K for the per-channel formats."""
    return group if fmt == "int4" else k


@functools.lru_cache(maxsize=32)
def fragment_coords(k: int, n: int, lanes: int) -> tuple[np.ndarray, np.ndarray]:
    """(k index, n index) of every A-fragment element, shape [N/16, K/16, 32, 4, 2]: tile,
    mma along K, lane, fragment register a0..a3, half (low: even k of the pair). The map
    written out from PTX's m16n8k16 fragment layout (what the kernel assumes); the packer
    computes the same by reshapes (tests hold the two equal)."""
    tiles, mmas = n // TILE_N, k // 16
    per_chunk = lanes // 4              # mmas per chunk of 4L rows of K
    t = np.arange(tiles).reshape(-1, 1, 1, 1, 1)
    m = np.arange(mmas).reshape(1, -1, 1, 1, 1)
    lane = np.arange(32).reshape(1, 1, -1, 1, 1)
    r = np.arange(4).reshape(1, 1, 1, -1, 1)
    h = np.arange(2).reshape(1, 1, 1, 1, -1)
    g, q = lane // 4, lane % 4
    chunk, j = m // per_chunk, m % per_chunk
    kk = chunk * 4 * lanes + q * lanes + 4 * j + 2 * (r // 2) + h
    nn = t * TILE_N + g + 8 * (r % 2)
    shape = (tiles, mmas, 32, 4, 2)
    return np.broadcast_to(kk, shape), np.broadcast_to(nn, shape)


def _fragments(codes: np.ndarray, lanes: int) -> np.ndarray:
    """Codes [K, N] as A-fragment elements [N/16, K/16, 32, 4, 2] (tile, mma, lane, register,
    half): :func:`fragment_coords` by reshapes and one transpose, no index arrays."""
    k, n = codes.shape
    per_chunk = lanes // 4
    # k = ((chunk·4 + q)·J + j)·4 + r2·2 + h; n = (t·2 + r1)·8 + g; register r = 2·r2 + r1
    v = codes.reshape(k // (4 * lanes), 4, per_chunk, 2, 2, n // TILE_N, 2, 8)
    v = v.transpose(5, 0, 2, 7, 1, 3, 6, 4)      # t, chunk, j, g, q, r2, r1, h
    return v.reshape(n // TILE_N, k // 16, 32, 4, 2)


def _from_fragments(vals: np.ndarray, k: int, n: int, lanes: int) -> np.ndarray:
    per_chunk = lanes // 4
    v = vals.reshape(n // TILE_N, k // (4 * lanes), per_chunk, 8, 4, 2, 2, 2)
    return np.ascontiguousarray(v.transpose(1, 4, 2, 5, 7, 0, 6, 3)).reshape(k, n)


_SHIFTS = (4 * (np.arange(4).reshape(4, 1) + 4 * np.arange(2).reshape(1, 2))).astype(np.uint32)
"""Nibble position of fragment element (register r, half h) in its int4 word: r + 4h."""


def pack_tiles(codes: np.ndarray, fmt: str, lanes: int) -> np.ndarray:
    """Codes [K, N] (u8: int4 nibbles 0..15, int8 two's complement bytes, e4m3 bits) in the
    tile layout: u8 [N/16, BYTES_PER_K·K]."""
    k, n = codes.shape
    tiles = n // TILE_N
    vals = _fragments(np.asarray(codes, np.uint8), lanes)    # [T, K/16, 32, 4, 2]
    if fmt == "int4":
        words = np.zeros((tiles, k // 16, 32), np.uint32)
        for r in range(4):
            for h in range(2):
                words |= vals[..., r, h].astype(np.uint32) << _SHIFTS[r, h]
        # mma m = 4·load + p: [T, load, p, lane] -> [T, load, lane, p]
        words = words.reshape(tiles, k // 64, 4, 32).transpose(0, 1, 3, 2)
        return np.ascontiguousarray(words.astype("<u4")).view(np.uint8).reshape(tiles, -1)
    data = vals.reshape(tiles, k // 32, 2, 32, 8).transpose(0, 1, 3, 2, 4)
    return np.ascontiguousarray(data).reshape(tiles, -1)


def unpack_tiles(packed: np.ndarray, fmt: str, k: int, n: int, lanes: int) -> np.ndarray:
    """The codes [K, N] (u8) :func:`pack_tiles` packed."""
    tiles = n // TILE_N
    if fmt == "int4":
        words = np.ascontiguousarray(packed).view("<u4").reshape(tiles, k // 64, 32, 4)
        words = words.transpose(0, 1, 3, 2).reshape(tiles, k // 16, 32, 1, 1)
        vals = ((words >> _SHIFTS) & 0xF).astype(np.uint8)
    else:
        vals = np.ascontiguousarray(packed).reshape(tiles, k // 32, 32, 2, 8)
        vals = vals.transpose(0, 1, 3, 2, 4).reshape(tiles, k // 16, 32, 4, 2)
    return _from_fragments(vals, k, n, lanes)


def e4m3_values(bits: np.ndarray) -> np.ndarray:
    """f32 values of e4m3 (``float8_e4m3fn``) bit patterns."""
    import ml_dtypes

    return np.asarray(bits, np.uint8).view(ml_dtypes.float8_e4m3fn).astype(_F32)


def to_e4m3(values: np.ndarray) -> np.ndarray:
    """Bits of ``values`` rounded to e4m3 (nearest even; |v| <= 448 expected)."""
    import ml_dtypes

    return np.asarray(values, _F32).astype(ml_dtypes.float8_e4m3fn).view(np.uint8)


def dequantize(w: np.ndarray, scales: np.ndarray, zeros: np.ndarray, *, fmt: str, group: int,
               k: int) -> np.ndarray:
    """The f32 weight [K, N] a ``matmul_wq`` stands for."""
    n = w.shape[0] * TILE_N
    codes = unpack_tiles(w, fmt, k, n, chunk_lanes(fmt, group))
    rows = group_of(fmt, group, k)
    s = np.repeat(np.asarray(scales, _F32), rows, axis=0)
    if fmt == "int4":
        z = np.repeat(np.asarray(zeros, _F32), rows, axis=0)
        return ((codes.astype(_F32) - z) * s).astype(_F32)
    q = codes.view(np.int8).astype(_F32) if fmt == "int8" else e4m3_values(codes)
    return (q * s).astype(_F32)


def _rule(shapes: tuple[Shape, ...], attrs: Attrs) -> tuple[Shape, ...]:
    x, w, scales, zeros, bias = shapes
    fmt = attrs["format"]
    if len(x) < 1 or len(w) != 2:
        raise ShapeError(f"matmul_wq needs x [..., K] and w [N/16, bytes], got "
                         f"{format_shape(x)} and {format_shape(w)}")
    k, n = x[-1], w[0] * TILE_N if isinstance(w[0], int) else w[0]
    if not isinstance(k, int) or k % 64 or w[1] != BYTES_PER_K[fmt] * k:
        raise ShapeError(f"matmul_wq ({fmt}): K = {k} must be a multiple of 64 with w "
                         f"[N/16, {BYTES_PER_K[fmt]}·K], got w {format_shape(w)}")
    rows = group_of(fmt, attrs["group"], k)
    if k % rows:
        raise ShapeError(f"matmul_wq: K = {k} is no multiple of the group {rows}")
    for shape, what in ((scales, "scales"), (zeros, "zero_points")):
        if tuple(shape) != (k // rows, n):
            raise ShapeError(f"{what} must be [{k // rows}, {n}], got {format_shape(shape)}")
    if tuple(bias) != (n,):
        raise ShapeError(f"bias must be [{n}], got {format_shape(bias)}")
    return ((*x[:-1], n),)


def _dtypes(dtypes: tuple[DType, ...], attrs: Attrs) -> tuple[DType, ...]:
    x, *rest = dtypes
    if x not in ACTIVATION_DTYPES or tuple(rest) != (DType.u8, DType.f32, DType.u8,
                                                     DType.f32):
        raise DTypeError("matmul_wq takes (f32|bf16|f16, u8, f32, u8, f32), got "
                         f"({', '.join(d.value for d in dtypes)})")
    return (x,)


def _reference(x: np.ndarray, w: np.ndarray, scales: np.ndarray, zeros: np.ndarray,
               bias: np.ndarray, *, format: str, group: int, act: str, **_: Any) -> np.ndarray:
    k = x.shape[-1]
    dense = dequantize(w, scales, zeros, fmt=format, group=group, k=k)
    n = dense.shape[1]
    out = (x.reshape(-1, k).astype(_F32) @ dense + np.asarray(bias, _F32)).astype(_F32)
    return epilogue(out, act).reshape(*x.shape[:-1], n).astype(x.dtype)


MATMUL_WQ = OpDef(
    "matmul_wq", OpKind.OPAQUE, 5, _rule, _dtypes, _reference,
    attrs=(attr("format", AttrType.STR, "int4", FORMATS),
           attr("group", AttrType.INT, 128, (32, 64, 128)),
           attr("zero_points", AttrType.BOOL, False),
           attr("act", AttrType.STR, "none", ACTIVATIONS)),
    accepts=frozenset({DType.f32, DType.bf16, DType.f16, DType.u8}),
    doc="x @ dequant(w) with w int4/int8/fp8 packed in the cuda tile layout, bias, act")

DEFINITIONS: tuple[OpDef, ...] = (MATMUL_WQ,)

__all__ = ["BYTES_PER_K", "DEFINITIONS", "FORMATS", "MATMUL_WQ", "TILE_N", "chunk_lanes",
           "dequantize", "e4m3_values", "fragment_coords", "group_of", "pack_tiles",
           "to_e4m3", "unpack_tiles"]
