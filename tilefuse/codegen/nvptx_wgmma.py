"""Hopper's warpgroup MMA (``wgmma.mma_async``, sm_90a) for kernels emitted as LLVM IR, and
the fused attention built on it (:class:`WgmmaFlash`, chosen by ``FlashConfig.wgmma``).

**Instructions** (inline PTX; LLVM 22's NVPTX back end has no wgmma intrinsics usable from
llvmlite): ``wgmma.fence``, ``wgmma.mma_async.sync.aligned.m64nNk16.f32.{bf16,f16}`` with A
from registers (the m16n8k16 A fragment of each warp's 16 rows, warp ``w % 4`` of the
warpgroup rows ``16·(w % 4)``) and B through a shared-memory matrix descriptor,
``wgmma.commit_group`` and ``wgmma.wait_group``. The accumulators are ``N/2`` f32 a thread
in the m16n8 C layout per n8 column tile (rows ``g``, ``g + 8``; columns ``2q``, ``2q + 1``),
so the FlashAttention-2 register reuse of :mod:`tilefuse.codegen.nvptx_attention` carries
over unchanged: the scores' packed pairs are the A fragments of P·V. The fence, the wait and
the products pass the registers they order through as tied operands, so LLVM cannot move an
access to an accumulator across them.

**Descriptors** (64 bits): start address ``>> 4`` in bits 0–13, leading byte offset ``>> 4``
in 16–29, stride byte offset ``>> 4`` in 32–45, base offset 0 (every tile is 1024-byte
aligned), swizzle mode in 62–63 (1: 128-byte). Tiles are rows of exactly 128 bytes (64
16-bit elements: D = Dv = 64), row ``r`` at ``128·r`` with its 16-byte chunk ``c`` stored at
chunk ``c ^ (r % 8)`` — the 128-byte swizzle, and the ``swizzle`` layout the ``cp.async``
copies of the mma.sync kernel already write. K (keys × D, D contiguous) is B "K-major"
(no transpose): 8-row groups ``SBO`` = 1024 bytes apart, a k16 step is +32 bytes on the
start address. V (keys × Dv, Dv contiguous) is B "MN-major" (``imm-trans-b`` 1): 8-key
groups ``SBO`` = 1024 bytes apart, a k16 step (16 keys) is +2048 bytes; the leading offset
(between 64-wide column blocks) is unused at Dv = 64.

**Ordering**: the tiles arrive by ``cp.async`` (generic proxy); wgmma reads them through the
async proxy, so every copying thread runs ``fence.proxy.async.shared::cta`` after its
``cp.async.wait_group`` and before the barrier that publishes the tile.
"""

from __future__ import annotations

from collections.abc import Sequence

from llvmlite import ir

from tilefuse.codegen.llvm_nvptx import GpuTarget
from tilefuse.codegen.llvm_types import F32, I64, VOID
from tilefuse.codegen.nvptx_prims import PtxBuilder

SM90A = GpuTarget(arch="sm_90a")
"""Hopper with its architecture-specific instructions (wgmma, setmaxnreg)."""
SWIZZLE_128B = 1 << 62
ROW_BYTES = 128
ATOM_BYTES = 1024
"""8 rows of 128 bytes: one 128-byte swizzle atom (the stride between 8-row groups)."""


def descriptor_bits(lead: int, stride: int) -> int:
    """The descriptor's fields other than the start address (byte offsets)."""
    return ((lead >> 4) << 16) | ((stride >> 4) << 32) | SWIZZLE_128B


class WgmmaOps:
    """wgmma primitives over a :class:`PtxBuilder` (module docstring)."""

    def __init__(self, p: PtxBuilder):
        self.p = p
        self.b = p.b

    def descriptor(self, element: ir.Value, lead: int = 16, stride: int = ATOM_BYTES
                   ) -> ir.Value:
        """The 128-byte-swizzled descriptor of the tile at shared element ``element`` (i32,
        16-bit elements; 1024-byte aligned except for the K-major k16 advance)."""
        b = self.b
        addr = b.ptrtoint(self.p.shared_at(element), I64)
        start = b.lshr(b.and_(addr, ir.Constant(I64, 0x3FFFF)), ir.Constant(I64, 4))
        return b.or_(start, ir.Constant(I64, descriptor_bits(lead, stride)))

    def _tied(self, text: str, values: Sequence[ir.Value]) -> list[ir.Value]:
        """``text`` (no operands) as side-effecting asm that passes ``values`` through as
        tied operands: an ordering point for those registers."""
        if not values:
            self.p.asm(VOID, [], text, "~{memory}", side_effect=True)
            return []
        kinds = ["f" if v.type == F32 else "r" for v in values]
        ret = ir.LiteralStructType([v.type for v in values])
        constraints = ",".join([f"={k}" for k in kinds] + [str(i) for i in range(len(values))]
                               + ["~{memory}"])
        got = self.p.asm(ret, values, text, constraints, side_effect=True)
        return [self.b.extract_value(got, i) for i in range(len(values))]

    def fence(self, values: Sequence[ir.Value]) -> list[ir.Value]:
        """``wgmma.fence``: register writes to ``values`` (accumulators, A fragments) are
        ordered before the products that follow."""
        return self._tied("wgmma.fence.sync.aligned;", values)

    def commit(self) -> None:
        self.p.asm(VOID, [], "wgmma.commit_group.sync.aligned;", "~{memory}",
                   side_effect=True)

    def wait(self, values: Sequence[ir.Value], pending: int = 0) -> list[ir.Value]:
        """``wgmma.wait_group pending``; the accumulators ``values`` are read only after."""
        return self._tied(f"wgmma.wait_group.sync.aligned {pending};", values)

    def mma(self, acc: Sequence[ir.Value] | int, a: Sequence[ir.Value], b_desc: ir.Value,
            trans_b: bool, f16: bool = False) -> list[ir.Value]:
        """``acc += A·B``: m64nNk16, N = 2·len(acc), A the 4 packed registers of this warp's
        m16k16 fragment, B through ``b_desc`` (``trans_b``: stored MN-major). ``acc`` an int
        ``n``: ``D = A·B`` into ``n`` fresh accumulators (``scale-d`` false: no zeroing)."""
        accumulate = not isinstance(acc, int)
        if isinstance(acc, int):
            acc = [ir.Constant(F32, ir.Undefined)] * acc
        n = len(acc)
        kind = "f16" if f16 else "bf16"
        outs = ", ".join(f"${i}" for i in range(n))
        a_ops = ", ".join(f"${2 * n + i}" for i in range(4))
        text = (f"{{\n.reg .pred p;\nsetp.ne.b32 p, ${2 * n + 5}, 0;\n"
                f"wgmma.mma_async.sync.aligned.m64n{2 * n}k16.f32.{kind}.{kind} "
                f"{{{outs}}}, {{{a_ops}}}, ${2 * n + 4}, p, 1, 1, {int(trans_b)};\n}}")
        constraints = ",".join(["=f"] * n + [str(i) for i in range(n)] + ["r"] * 4
                               + ["l", "r"])
        ret = ir.LiteralStructType([F32] * n)
        got = self.p.asm(ret, [*acc, *a, b_desc, self.p.i32(int(accumulate))], text, constraints,
                         side_effect=True)
        return [self.b.extract_value(got, i) for i in range(n)]

    def fence_proxy_async(self) -> None:
        """Generic-proxy writes to shared memory (``cp.async``, stores) made visible to the
        async proxy (wgmma's operand reads)."""
        self.p.asm(VOID, [], "fence.proxy.async.shared::cta;", "~{memory}", side_effect=True)


__all__ = ["ATOM_BYTES", "ROW_BYTES", "SM90A", "WgmmaOps", "descriptor_bits"]
