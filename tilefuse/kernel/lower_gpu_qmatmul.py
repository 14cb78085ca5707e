"""A ``matmul_wq`` group (a weight-only quantized product, :mod:`tilefuse.ops.quant_gpu`) as
one generated kernel of the cuda target (:mod:`tilefuse.codegen.nvptx_qgemm`).

The group is the one node; its bias and relu are fused in the op. :func:`quantized_step`
picks the kernel's launch knobs from M (:func:`default_config`) and adds a few other
configurations as alternatives, which the executable times once on the device and keeps the
fastest of (like the attention kernels). A shape the kernel does not take raises
CompileError with the reason; the executable then runs the group on the host (logged).
"""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np

from tilefuse.codegen.llvm_nvptx import SM90, GpuTarget
from tilefuse.codegen.nvptx_qgemm import QGemmConfig, QGemmKernel, qgemm, supports
from tilefuse.errors import CompileError
from tilefuse.graph.ir import Node, Value
from tilefuse.kernel.fusion import KernelGroup


def quantized_node(group: KernelGroup) -> Node | None:
    """The ``matmul_wq`` node of a one-node group, else None."""
    if len(group.nodes) == 1 and group.nodes[0].op.name == "matmul_wq":
        return group.nodes[0]
    return None


def config_of(node: Node, **knobs: int | bool) -> QGemmConfig:
    """The kernel configuration of ``node`` with :func:`default_config`'s knobs (or
    ``knobs``)."""
    x = node.inputs[0]
    k = int(x.shape[-1])
    m = math.prod(int(d) for d in x.shape[:-1])
    n = int(node.outputs[0].shape[-1])
    base = QGemmConfig(m, n, k, x.dtype, node.attrs["format"], node.attrs["group"],
                       node.attrs["zero_points"], node.attrs["act"])
    return replace(base, **(knobs or default_knobs(base)))


INT4_WIDE = ({"tiles": 2, "warps": 8, "loads": 2, "prefetch": 1, "stream": True},
             {"tiles": 1, "warps": 16, "loads": 2, "stream": True},
             {"tiles": 1, "warps": 8, "loads": 2})
"""int4 launch knobs for N >= 8192 and up to 8 tokens, best first where the shape allows: two
tiles a warp, the next K step's codes loaded ahead into registers past L1 (12.8 µs at M = 1,
13.2 µs at M = 4 for K = N = 8192, 10.1 µs for K = 4096, N = 11008, on an H200 timed from CUDA
graphs: benchmarks/gpu_quant-2026-12-03b.json and -03c.json)."""
INT4_TWO_WAVES = {"tiles": 2, "warps": 16, "loads": 2, "stream": True, "min_blocks": 2}
"""Up to 8 tokens where the grid (N / 32 blocks) fits two blocks on each of an H200's 132 SMs
(N <= 8448), 16-bit activations (f32's two bf16 parts spill under the cap): 16 warps a block
and registers capped at 64, so 32 warps an SM instead of 16
(12.1 µs at M = 1, 12.8 µs at M = 4 for K = N = 8192 against 12.8 and 13.3, -03c/d.json; the
profile of the 16-warp kernel had half its issue slots idle for want of eligible warps)."""
INT4_WIDE_16 = ({"tiles": 2, "warps": 8, "loads": 2, "stream": True},
                {"tiles": 1, "warps": 8, "loads": 2, "stream": True},
                {"tiles": 1, "warps": 8, "loads": 2})
"""The same for 9..16 tokens (two B tiles: 128 registers, so no prefetch): 15.6 µs at K = N =
8192."""
INT4_NARROW = ({"tiles": 1, "warps": 16, "loads": 2, "stream": True},
               {"tiles": 1, "warps": 8, "loads": 2, "stream": True},
               {"tiles": 1, "warps": 8, "loads": 2})
"""int4 launch knobs for narrower products (the decode step's 4096 columns): one tile and 16
warps a block, K split 16 ways, codes past L1 (4.9 µs for 4096², 9.7 µs for K = 11008)."""


def default_knobs(cfg: QGemmConfig) -> dict[str, int | bool]:
    """int4: :data:`INT4_WIDE` (``_16`` above 8 tokens; :data:`INT4_TWO_WAVES` first where
    it fits) or :data:`INT4_NARROW` by N, the first the shape takes (K steps for every warp);
    int8: two tiles a warp, two loads a K step and 8 warps a block where the shape allows;
    fp8 (timed alone) one tile and 4 loads up to 8 tokens, 4 tiles above; fewer warps where
    K is too short."""
    if cfg.fmt == "int4":
        wide = INT4_WIDE if cfg.m <= 8 else INT4_WIDE_16
        if cfg.m <= 8 and cfg.n // 32 <= 2 * 132 and cfg.dtype.itemsize == 2:   # f32 spills
            wide = (INT4_TWO_WAVES, *wide)
        for knobs in wide if cfg.n >= 8192 else INT4_NARROW:
            other = replace(cfg, **knobs)
            if supports(other) is None and cfg.k // other.k_step >= other.kwarps:
                return dict(knobs)
    tile_counts, load_counts = (2, 1), (2, 1, 4)
    if cfg.fmt == "fp8":   # no alternatives are timed for fp8: what was measured best
        tile_counts, load_counts = ((1,), (4, 2, 1)) if cfg.m <= 8 else ((4, 2, 1), (2, 1, 4))
    for tiles in tile_counts:
        for loads in load_counts:
            for warps in (8, 4, 2, 1):
                knobs = {"tiles": tiles, "warps": warps, "loads": loads}
                other = replace(cfg, **knobs)
                if supports(other) is None and cfg.k // other.k_step >= warps:
                    return knobs
    return {"tiles": 1, "warps": 1, "loads": 2}


ALTERNATIVE_KNOBS = ({"tiles": 1, "warps": 8, "loads": 4}, {"tiles": 1, "warps": 8, "loads": 2},
                     {"tiles": 4, "warps": 8, "loads": 2},
                     {"tiles": 2, "warps": 8, "loads": 2, "prefetch": True})
"""Configurations timed against the default one when the executable loads, for int8 only
(each won for some M on the H200). int4 takes its measured default alone: the load-time
timing (one launch, the weight in L2, Python's launch gap inside the events) chose a kernel
13 % slower than the best. None for fp8: the executable's random timing operands hold e4m3
NaN codes, so no output would agree."""


def quantized_step(group: KernelGroup, target: GpuTarget = SM90
                   ) -> tuple[QGemmKernel, tuple[Value, ...], tuple[QGemmKernel, ...]]:
    """The kernel of a ``matmul_wq`` group, the values its parameters bind (x, w, scales,
    zeros, bias, out) and alternative configurations to time (int8 only: int4 takes its
    measured default, fp8's random timing operands hold NaN codes)."""
    node = quantized_node(group)
    if node is None:
        raise CompileError(f"kernel {group.name}: not a quantized product group")
    cfg = config_of(node)
    kernel = qgemm(cfg, target)
    others: list[QGemmKernel] = []
    if cfg.fmt == "int8":
        for knobs in ALTERNATIVE_KNOBS:
            other = replace(cfg, **knobs)
            if other != cfg and supports(other) is None and cfg.k // other.k_step >= 1:
                others.append(qgemm(other, target))
    return kernel, (*node.inputs, node.outputs[0]), tuple(others)




# ---- the kernel's arithmetic on the host (the GPU simulator's model of it) ----------------

_LANE = np.arange(32)
_G, _Q = _LANE // 4, _LANE % 4
_R = np.arange(4).reshape(1, 4, 1)
_H = np.arange(2).reshape(1, 1, 2)
_A_ROW = np.broadcast_to(_G.reshape(32, 1, 1) + 8 * (_R % 2), (32, 4, 2))
"""Row (a column of W) of A-fragment element (lane, register, half): g, or g + 8 for a1/a3."""
_A_COL = np.broadcast_to(2 * _Q.reshape(32, 1, 1) + 8 * (_R // 2) + _H, (32, 4, 2))
"""Its k within the mma: 2q (+1), or 8 + 2q (+1) for a2/a3 (PTX's m16n8k16 layout)."""


def _bits_to_f32(bits: np.ndarray, half: str) -> np.ndarray:
    bits = np.asarray(bits, np.uint32) & 0xFFFF
    if half == "f16":
        return bits.astype(np.uint16).view(np.float16).astype(np.float32)
    return (bits << 16).view(np.float32)


def _round_half(v: np.ndarray, half: str) -> np.ndarray:
    """f32 -> the mma operand type (nearest even) -> f32."""
    from tilefuse.dtypes import DType

    dtype = DType.f16 if half == "f16" else DType.bf16
    return np.asarray(v, np.float32).astype(dtype.np).astype(np.float32)


def _fragments_of(cfg: QGemmConfig, words: np.ndarray, m: int, zeros: np.ndarray | None,
                  group: int) -> np.ndarray:
    """Mma ``m``'s A fragments of every tile, [T, 32, 4, 2] f32, decoded from the packed words
    as the kernel does (the bit tricks included)."""
    half = "f16" if cfg.dtype.value == "f16" else "bf16"
    if cfg.fmt == "int4":
        load, p = divmod(m, 4)
        word = words[:, load * 128 + _LANE * 4 + p]                    # [T, 32]
        magic = 0x6400 if half == "f16" else 0x4300
        out = np.empty((words.shape[0], 32, 4, 2), np.float32)
        for r in range(4):
            biased = ((word >> (4 * r)) & 0x000F000F) | (magic * 0x10001)
            n = np.arange(words.shape[0]).reshape(-1, 1) * 16 + _G + 8 * (r % 2)
            z = 8 if zeros is None else zeros[(m * 16) // group, n].astype(np.uint32)
            minus = _bits_to_f32(magic | z, half)
            out[:, :, r, 0] = _bits_to_f32(biased, half) - minus
            out[:, :, r, 1] = _bits_to_f32(biased >> 16, half) - minus
        return out
    load, p = divmod(m, 2)
    pair = np.stack([words[:, load * 128 + _LANE * 4 + 2 * p + e] for e in range(2)], -1)
    codes = pair.astype("<u4").view(np.uint8).reshape(words.shape[0], 32, 4, 2)
    if cfg.fmt == "fp8":
        from tilefuse.ops.quant_gpu import e4m3_values

        return e4m3_values(codes)
    flipped = (codes ^ 0x80).astype(np.uint32)
    if half == "f16":   # (1024 + u) as f16 minus 1152
        return _bits_to_f32(0x6400 | flipped, "f16") - np.float32(1152)
    return ((0x4B000000 | flipped).view(np.float32) - np.float32(8388736.0)).astype(np.float32)


def emulate(cfg: QGemmConfig, x: np.ndarray, w: np.ndarray, scales: np.ndarray,
            zeros: np.ndarray, bias: np.ndarray) -> np.ndarray:
    """The kernel's result computed on the host the way the kernel computes it: the packed
    words read at the kernel's offsets and decoded with its bit tricks, each mma as the
    product of the 16×16 A tile (rebuilt from the lanes' fragments by PTX's layout) and the
    B tile (x at the permuted k; f32 x as bf16 high + low parts), f32 sums per group scaled
    by ``s``, K steps dealt to warps round-robin and the warps' sums added in order, then
    the epilogue. Only the order of the f32 additions inside an mma differs from the GPU."""
    from tilefuse.ops.quant_gpu import chunk_lanes

    k, n = cfg.k, cfg.n
    tiles = n // 16
    half = "f16" if cfg.dtype.value == "f16" else "bf16"
    xs = np.asarray(x, np.float32).reshape(-1, k)
    parts = [_round_half(xs, half)]
    if cfg.dtype.value == "f32":
        parts.append(_round_half(xs - parts[0], half))
    words = np.ascontiguousarray(w).view("<u4").reshape(tiles, -1).astype(np.uint32)
    lanes = chunk_lanes(cfg.fmt, cfg.group)
    group = cfg.group if cfg.fmt == "int4" else k
    zp = zeros if cfg.fmt == "int4" and cfg.zero_points else None
    mmas_per_step = cfg.k_step // 16
    accs = np.zeros((cfg.kwarps, tiles, 16, xs.shape[0]), np.float32)
    t_index = np.arange(tiles).reshape(-1, 1, 1)
    for step in range(k // cfg.k_step):
        warp = step % cfg.kwarps   # every column group deals its K steps the same way
        part = np.zeros((tiles, 16, xs.shape[0]), np.float32)
        for mi in range(mmas_per_step):
            m = step * mmas_per_step + mi
            c, j = divmod(m, lanes // 4)
            frag = _fragments_of(cfg, words, m, zp, group)
            a = np.zeros((tiles, 16, 16), np.float32)
            a[t_index, _A_ROW.reshape(1, 32, 8), _A_COL.reshape(1, 32, 8)] = frag.reshape(
                tiles, 32, 8)
            # logical k of the mma -> the x column it reads (the lane-q permutation)
            logical = np.arange(16)
            q, reg, h = (logical % 8) // 2, logical // 8, logical % 2
            actual = c * 4 * lanes + q * lanes + 4 * j + 2 * reg + h
            for xp in parts:   # int4: into the group's sums; 8-bit: onto the accumulators
                product = np.einsum("tik,kj->tij", a, xp[:, actual].T).astype(np.float32)
                if cfg.fmt == "int4":
                    part = (part + product).astype(np.float32)
                else:
                    accs[warp] = (accs[warp] + product).astype(np.float32)
            if cfg.fmt == "int4" and ((m + 1) * 16) % group == 0:
                s = np.asarray(scales, np.float32)[(m * 16) // group].reshape(tiles, 16, 1)
                accs[warp] = (part * s + accs[warp]).astype(np.float32)
                part[:] = 0
    total = np.zeros_like(accs[0])
    for w_ in range(cfg.kwarps):
        total = (total + accs[w_]).astype(np.float32)
    out = total.reshape(n, -1).T                                        # [M, N]
    if cfg.fmt != "int4":
        out = out * np.asarray(scales, np.float32).reshape(1, n)
    from tilefuse.ops.quant import epilogue

    out = epilogue((out + np.asarray(bias, np.float32)).astype(np.float32), cfg.act)
    return out.astype(cfg.dtype.np).reshape(*x.shape[:-1], n)


__all__ = ["ALTERNATIVE_KNOBS", "config_of", "default_knobs", "emulate", "quantized_node",
           "quantized_step"]
