"""The fused attention on Hopper's warpgroup MMA (``FlashConfig.wgmma``; sm_90a), and a probe
kernel that checks the two products' operand layouts alone.

:class:`WgmmaFlash` is :mod:`tilefuse.codegen.nvptx_attention`'s kernel with its two
products replaced: each warpgroup (4 consecutive warps) owns 64 query rows, so with
``block_m = 16·warps`` every warp holds 16 rows exactly as the mma.sync kernel's warps do
with one m16 tile (``row_tiles = 1``), and the softmax, the masks, the tails and the finish
are that kernel's code. Per key tile and warpgroup:

* S = Q·Kᵀ: ``D/16`` ``wgmma.m64n{block_n}k16``, A = Q's fragments (read once from shared
  memory by ``ldmatrix``, kept in registers), B = K's swizzled tile by descriptor;
* O += P·V: ``block_n/16`` ``wgmma.m64n{Dv}k16``, A = P's packed pairs in registers, B = V's
  swizzled tile by descriptor with ``imm-trans-b`` (V is stored Dv-contiguous).

Both batches are fenced, committed and waited for before their results are read (no overlap
inside a warpgroup yet: the overlap of one warpgroup's exponentials with another's products
comes from the 4 warpgroups an SM holds). K and V arrive by ``cp.async`` into the 128-byte
swizzled layout (``FlashConfig.swizzle``), two stages, fenced for the async proxy before the
barrier that publishes them (:mod:`tilefuse.codegen.nvptx_wgmma`).

Shapes: D = Dv = 64 (one 128-byte row a key), bf16 or f16, any Sq/Sk and masks as the
mma.sync kernel; everything else stays on that kernel (:func:`wgmma_unsupported`).
"""

from __future__ import annotations

from functools import cache

from llvmlite import ir

from tilefuse.codegen.llvm_nvptx import PTX_TRIPLE, emit_ptx, gpu_target_machine
from tilefuse.codegen.llvm_types import I32, I64
from tilefuse.codegen.nvptx_attention import FlashConfig, FlashShape, Frag, _Flash
from tilefuse.codegen.nvptx_prims import PtxBuilder, kernel_function, shared_array
from tilefuse.codegen.nvptx_wgmma import ATOM_BYTES, SM90A, WgmmaOps

WGMMA_CONFIG = FlashConfig(64, 64, 4, 4, swizzle=1, wgmma=1)
"""One warpgroup a block (64 query rows), 64-key tiles, four blocks an SM: G8 0.324–0.332 ms
on an H200 against 0.336–0.348 for two warpgroups a block, 0.359 pipelined and 0.431–0.447
for the mma.sync kernel (2026-12-01, two runs, interleaved, ``gpu_bench.py --g8-configs``)."""
WGMMA_CONFIGS = (
    WGMMA_CONFIG,
    FlashConfig(128, 64, 8, 2, swizzle=1, wgmma=1),
    FlashConfig(64, 64, 4, 3, pipeline=1, swizzle=1, wgmma=1),
)
"""What the executable times against the mma.sync kernel when it loads: the default, two
warpgroups a block sharing the K/V tiles, and the next tile's S = Q·Kᵀ in flight under this
tile's softmax (``pipeline``: 164 registers, three blocks an SM; slower at G8, kept for other
shapes since the executable measures)."""


def wgmma_unsupported(shape: FlashShape, config: FlashConfig) -> str | None:
    """Why :class:`WgmmaFlash` cannot build this attention under ``config``, or None."""
    if shape.d != 64 or shape.dv != 64:
        return f"the wgmma attention takes D = Dv = 64, not {shape.d}, {shape.dv}"
    if not config.swizzle or config.sum_mma or config.exp_pairs or config.q_shared:
        return f"the wgmma attention needs swizzle=1 and no knob but pipeline: {config}"
    if config.warps % 4 or config.block_m != 16 * config.warps:
        return f"the wgmma attention needs whole warpgroups of 64 rows: {config}"
    if config.block_n % 16 or config.block_n > 256:
        return f"the wgmma attention takes 16..256 keys a tile in k16 steps: {config}"
    return None


class WgmmaFlash(_Flash):
    """The kernel (module docstring)."""

    def __init__(self, module: ir.Module, name: str, shape: FlashShape, config: FlashConfig):
        super().__init__(module, name, shape, config)
        self.p.smem.align = ATOM_BYTES
        self.w = WgmmaOps(self.p)
        self.pending: list[ir.Value] = []
        """The scores of the next tile while their products are in flight."""

    def publish(self) -> None:
        """The base kernel's wait and barrier with the copies fenced for the async proxy
        between them, so the products' descriptors see them (also in the prologue)."""
        self.p.cp_async_wait(0)
        self.w.fence_proxy_async()
        self.p.barrier()

    def issue_scores(self, q_frags: list[list[Frag]] | None, stage: ir.Value
                     ) -> list[list[Frag]]:
        """S = Q·Kᵀ of the tile in ``stage``, committed but not waited for: the registers
        stay in flight (passed through the next wait, in :meth:`pv`) while this tile's
        softmax runs."""
        assert q_frags is not None
        b, w = self.b, self.w
        w.fence([])
        acc: list[ir.Value] | int = self.c.block_n // 2   # the first product: S = Q·Kᵀ
        for kt in range(self.s.d // 16):
            desc = w.descriptor(b.add(stage, self.i32(16 * kt)))
            acc = w.mma(acc, q_frags[0][kt], desc, trans_b=False, f16=self.f16)
        assert isinstance(acc, list)
        w.commit()
        self.pending = acc
        return [[acc[4 * nt:4 * nt + 4] for nt in range(self.c.block_n // 8)]]

    def scores_ready(self, scores: list[list[Frag]]) -> list[list[Frag]]:
        acc, self.pending = self.pending, []
        return [[acc[4 * nt:4 * nt + 4] for nt in range(self.c.block_n // 8)]]

    def scores(self, q_frags: list[list[Frag]] | None, stage: ir.Value) -> list[list[Frag]]:
        self.issue_scores(q_frags, stage)
        self.pending = self.w.wait(self.pending)
        return self.scores_ready([])

    def pv(self, probs: list[list[Frag]], stage: ir.Value, o: list[list[Frag]], l_sum: list
           ) -> tuple[list[list[Frag]], list]:
        b, w = self.b, self.w
        flat = [x for frag in o[0] for x in frag]
        a = [x for kk in range(self.c.block_n // 16)
             for x in (*probs[0][2 * kk], *probs[0][2 * kk + 1])]
        fenced = w.fence(flat + a)
        acc, a = fenced[:len(flat)], fenced[len(flat):]
        base = b.add(stage, self.i32(self.lay.k_tile))
        for kk in range(self.c.block_n // 16):
            desc = w.descriptor(b.add(base, self.i32(16 * self.lay.ldv * kk)),
                                lead=self.c.block_n * ATOM_BYTES // 8)
            acc = w.mma(acc, a[4 * kk:4 * kk + 4], desc, trans_b=True, f16=self.f16)
        w.commit()
        done = w.wait(acc + self.pending)   # and the next tile's scores, in flight
        acc, self.pending = done[:len(acc)], done[len(acc):]
        return [[acc[4 * nt:4 * nt + 4] for nt in range(self.s.dv // 8)]], l_sum


# ---- the probe: both products of one 64×64 tile, alone --------------------------------------
@cache
def wgmma_probe_ptx(f16: bool = False) -> str:
    """PTX of ``wgmma_probe(q, k, v, s, o)``, one warpgroup: ``s = q·kᵀ`` (f32) and ``o =
    round(s)·v`` (f32, ``s`` rounded to the operand dtype) for 64×64 operands, C order, K and
    V through the swizzled shared tiles and descriptors the attention uses."""
    module = ir.Module(name="wgmma_probe")
    module.triple = PTX_TRIPLE
    module.data_layout = str(gpu_target_machine(SM90A).target_data)
    fn = kernel_function(module, "wgmma_probe", 5, 128, 1)
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    smem = shared_array(module, "smem", 2 * 64 * 64)
    smem.align = ATOM_BYTES
    p = PtxBuilder(b, smem)
    w = WgmmaOps(p)
    q, k, v, s_out, o_out = (p.global_ptr(a) for a in fn.args)
    tid = p.sreg("tid.x")
    for first in range(0, 2 * 512, 128):   # 512 16-byte chunks of K, then of V
        idx = b.add(tid, p.i32(first))
        tile = b.lshr(idx, p.i32(9))
        chunk = b.and_(idx, p.i32(511))
        row, col = b.lshr(chunk, p.i32(3)), b.and_(chunk, p.i32(7))
        slot = b.xor(col, b.and_(row, p.i32(7)))
        dst = b.add(b.mul(tile, p.i32(4096)), b.add(b.mul(row, p.i32(64)), b.shl(slot, p.i32(3))))
        src_el = b.zext(b.add(b.mul(row, p.i32(64)), b.shl(col, p.i32(3))), I64)
        src_k, src_v = p.global_at(k, src_el), p.global_at(v, src_el)
        src = b.select(b.icmp_unsigned("==", tile, p.i32(0)), src_k, src_v)
        p.cp_async16(p.shared_at(dst), src)
    p.cp_async_commit()
    p.cp_async_wait(0)
    w.fence_proxy_async()
    p.barrier()
    lane = b.and_(tid, p.i32(31))
    g, q2 = b.lshr(lane, p.i32(2)), b.shl(b.and_(lane, p.i32(3)), p.i32(1))
    row0 = b.add(b.mul(b.lshr(tid, p.i32(5)), p.i32(16)), g)

    def at(row: ir.Value, col: ir.Value) -> ir.Value:
        return b.zext(b.add(b.mul(row, p.i32(64)), col), I64)

    def q_pair(r: int, c: int) -> ir.Value:
        ptr = p.global_at(q, at(b.add(row0, p.i32(r)), b.add(q2, p.i32(c))))
        return b.load(ptr, typ=I32, align=4)

    acc = w.fence([p.f32(0.0)] * 32)
    for kt in range(4):
        frag = [q_pair(0, 16 * kt), q_pair(8, 16 * kt), q_pair(0, 16 * kt + 8),
                q_pair(8, 16 * kt + 8)]
        acc = w.mma(acc, frag, w.descriptor(p.i32(16 * kt)), trans_b=False, f16=f16)
    w.commit()
    s = w.wait(acc)
    packed = [p.pack2(s[i], s[i + 1], f16) for i in range(0, 32, 2)]
    fenced = w.fence([p.f32(0.0)] * 32 + packed)
    acc, packed = fenced[:32], fenced[32:]
    for kk in range(4):
        # A for k16 step kk: n8 tiles 2kk (rows g, g+8) then 2kk+1 (rows g, g+8)
        frag = [packed[4 * kk], packed[4 * kk + 1], packed[4 * kk + 2], packed[4 * kk + 3]]
        acc = w.mma(acc, frag, w.descriptor(p.i32(4096 + 1024 * kk), lead=8192),
                    trans_b=True, f16=f16)
    w.commit()
    o = w.wait(acc)
    for values, out in ((s, s_out), (o, o_out)):
        for i, x in enumerate(values):
            nt, e = divmod(i, 4)
            row = b.add(row0, p.i32(8 * (e // 2)))
            col = b.add(q2, p.i32(8 * nt + e % 2))
            b.store(x, b.gep(out, [at(row, col)], inbounds=True, source_etype=ir.FloatType()),
                    align=4)
    b.ret_void()
    return _emit(module, "wgmma_probe")


def _emit(module: ir.Module, name: str) -> str:
    return emit_ptx(module, SM90A, f"the wgmma kernel {name}")


__all__ = ["WGMMA_CONFIG", "WGMMA_CONFIGS", "WgmmaFlash", "wgmma_probe_ptx", "wgmma_unsupported"]
