"""The weight-only quantized product of the ``cuda`` target (``matmul_wq``): int4 / int8 / fp8
weights dequantized in registers into ``mma.m16n8k16`` fragments, emitted as LLVM IR.

Decode (M = 1..16 tokens) is a memory-bound product: its time is the weight bytes over DRAM
bandwidth, so the point is to read 4× (int4) or 2× (int8, fp8) fewer bytes than bf16 and to
keep the dequantization off the critical path. The schedule:

* ``W^T`` is the A operand (16 output columns = the mma's m16), the activations the B operand
  (8 tokens = its n8; 16 tokens take two B tiles, f32 activations a bf16 high and low part
  each, so an f32 input costs ~2^-16 relative, not a bf16 rounding);
* a warp owns ``tiles`` 16-column tiles; the block's ``warps`` split K: warp w takes the K
  steps w, w+warps, ... (each step ``loads`` 16-byte loads of a tile's packed weight, the
  fragments of 4 (int4) or 2 (8-bit) mmas a load), then the warps' partial sums meet in
  shared memory and the block adds the bias, applies relu or GELU and writes its
  [tokens, columns];
* the packed layout (:mod:`tilefuse.ops.quant_gpu`) permutes k inside a chunk so that a
  lane's B fragments are L consecutive elements of its token's row: 16- or 32-byte loads of x;
* int4: ``(q | 0x4300) as bf16 = 128 + q``, minus ``128 + z`` (one ``lop3`` and one
  ``sub.bf16x2`` for two weights, ``fma.rn.bf16x2(a, 1, -c)`` before sm_90; f16: ``0x6400``
  /1024), exact; the group's partial sums are
  scaled in f32 (``acc += s · Σ``), so no weight is ever rounded; int8: the same trick with
  ``prmt`` (f16) or through f32 (bf16); fp8: ``cvt.rn.f16x2.e4m3x2`` (sm_89+), exact; the
  per-channel scale of the 8-bit formats multiplies the final sums.

* how the bytes get there (:class:`QGemmConfig`): ``prefetch`` loads the next 1..4 K steps'
  codes and scales into registers carried round the loop; ``stages`` copies them into a
  per-thread ``cp.async`` ring in shared memory instead (each lane reads back only what it
  copied: no barrier); ``stream`` loads the codes past L1 (``ld.global.nc.L1::no_allocate``),
  which keeps the activations there; ``nsplit`` makes column groups of a block's warps (they
  read the same activations); ``min_blocks`` caps the registers for more warps an SM.

Measured on an H200 (docs/PERFORMANCE.md, CUDA graph replays): int4 at K = N = 8192 takes
12.1 µs at M = 1 (2.98 TB/s of weights, 2.78x cuBLAS bf16) and 15.7 µs at M = 16 (2.09x); all
the ways of loading ahead land within a few per cent of each other, what helped was more warps
an SM (the profile: half the issue slots idle for want of eligible warps) and keeping the
activations in L1.

Shapes: N a multiple of 16·tiles, K of the K step (:func:`supports`); any M (blocks of 16
tokens, each reading the weights again: the prefill case is correct, not fast). sm_80 and
later; fp8 sm_89 and later.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import cache

from llvmlite import ir

from tilefuse.codegen.llvm_nvptx import PTX_TRIPLE, SM90, GpuTarget, emit_ptx, gpu_target_machine
from tilefuse.codegen.llvm_types import F32, I32, I64, declare, intrinsic
from tilefuse.codegen.nvptx_prims import I16, PtxBuilder, kernel_function, shared_array
from tilefuse.dtypes import DType
from tilefuse.errors import CompileError
from tilefuse.ops.quant_gpu import BYTES_PER_K, TILE_N, chunk_lanes

V4 = ir.VectorType(I32, 4)
V2F = ir.VectorType(F32, 2)
SHARED = 3
MAGIC = {"bf16": 0x4300, "f16": 0x6400}
"""16-bit patterns whose mantissa holds a small integer exactly: 128 + q (bf16), 1024 + q."""


@dataclass(frozen=True)
class QGemmConfig:
    """One kernel: the product ``[m, k] · [k, n]`` of x dtype ``dtype`` with ``fmt`` weights
    (int4 with ``group`` rows a scale, ``zero_points`` or the fixed 8) and the launch knobs."""

    m: int
    n: int
    k: int
    dtype: DType
    fmt: str
    group: int = 128
    zero_points: bool = False
    act: str = "none"
    tiles: int = 1
    """16-column tiles a warp owns (x fragments reused across them)."""
    warps: int = 8
    """Warps a block, splitting K."""
    loads: int = 2
    """16-byte weight loads per tile and K step (bytes in flight per thread)."""
    prefetch: int = 0
    """K steps whose weights and scales are loaded ahead into registers, carried round the
    loop (0: none; ``True`` counts as 1): ``prefetch + 1`` steps' bytes in flight a warp."""
    stages: int = 0
    """Depth of a per-thread ``cp.async`` ring in shared memory (0: off, else 2..8, a power
    of two): codes and scales copied ``stages - 1`` K steps ahead without holding registers.
    Each lane reads back only the bytes it copied itself, so the ring needs no barrier."""
    min_blocks: int = 1
    """Blocks an SM should hold (``.minnctapersm``): ptxas caps the registers to fit them."""
    nsplit: int = 1
    """Warp groups a block splits its columns into (each ``tiles`` tiles); the warps of a group
    split K. Groups at the same K read the same activations, mostly from L1."""
    stream: bool = False
    """Load the codes with ``ld.global.nc.L1::no_allocate`` (read once: they would evict the
    activations from L1, which every warp of the SM reads again)."""

    @property
    def k_per_load(self) -> int:
        return 64 if self.fmt == "int4" else 32

    @property
    def k_step(self) -> int:
        return self.loads * self.k_per_load

    @property
    def tokens(self) -> int:
        """Tokens a block: 8 or 16 (one or two B tiles)."""
        return 8 if self.m <= 8 else 16

    @property
    def kwarps(self) -> int:
        """Warps that split K for one group of columns."""
        return self.warps // self.nsplit

    @property
    def block_n(self) -> int:
        """Columns a block computes."""
        return TILE_N * self.tiles * self.nsplit

    @property
    def grid(self) -> int:
        return (self.n // self.block_n) * -(-self.m // self.tokens)

    @property
    def block(self) -> int:
        return 32 * self.warps

    @property
    def partial_bytes(self) -> int:
        """Shared memory of the warps' partial sums ([warp][register][lane] f32)."""
        if self.kwarps == 1:   # each warp stores its own sums
            return 0
        return 4 * self.warps * 32 * self.tiles * (self.tokens // 8) * 4

    @property
    def ring_codes(self) -> int:
        """16-byte code units a thread copies per K step into its ring slot."""
        return self.tiles * self.loads

    @property
    def ring_scales(self) -> int:
        """(group, tile) scale pairs (s_lo, s_hi: 8 bytes) a thread copies per K step."""
        return self.tiles * (self.k_step // self.group) if self.fmt == "int4" else 0

    @property
    def ring_bytes(self) -> int:
        """Shared memory of the cp.async ring (0 without ``stages``)."""
        per_thread = 16 * self.ring_codes + 8 * self.ring_scales
        return self.stages * per_thread * self.block

    @property
    def shared_bytes(self) -> int:
        """The partial sums reuse the ring's memory once every warp has left its loop."""
        return max(self.partial_bytes, self.ring_bytes)

    @property
    def name(self) -> str:
        zp = "zp" if self.zero_points else ""
        g = f"g{self.group}{zp}_" if self.fmt == "int4" else ""
        return (f"qgemm_{self.fmt}_{g}{self.dtype.value}_{self.m}x{self.n}x{self.k}_"
                f"t{self.tiles}w{self.warps}l{self.loads}{self.pipeline_tag}"
                + (f"_{self.act}" if self.act != "none" else ""))

    @property
    def pipeline_tag(self) -> str:
        """``p`` (one step ahead), ``p<n>``, ``s<n>`` (a ring of n), ``b<n>`` (min blocks)."""
        tag = "" if not self.prefetch else "p" if self.prefetch == 1 else f"p{self.prefetch}"
        tag += f"s{self.stages}" if self.stages else ""
        tag += "n" if self.stream else ""
        tag += f"c{self.nsplit}" if self.nsplit != 1 else ""
        return tag + (f"b{self.min_blocks}" if self.min_blocks != 1 else "")


def supports(cfg: QGemmConfig) -> str | None:
    """Why this kernel cannot be built (None when it can)."""
    if cfg.dtype not in (DType.bf16, DType.f16, DType.f32):
        return f"activations of {cfg.dtype} (bf16, f16 or f32 only)"
    if cfg.act not in ("none", "relu", "gelu"):
        return f"the {cfg.act} epilogue"
    if cfg.nsplit < 1 or cfg.warps % cfg.nsplit:
        return f"{cfg.warps} warps in {cfg.nsplit} column groups"
    if cfg.n % cfg.block_n:
        return f"N = {cfg.n} is no multiple of {cfg.block_n}"
    if cfg.k % cfg.k_step:
        return f"K = {cfg.k} is no multiple of the K step {cfg.k_step}"
    lanes = chunk_lanes(cfg.fmt, cfg.group)
    if cfg.k_step % (4 * lanes) or (cfg.fmt == "int4" and cfg.k_step % cfg.group):
        return f"the K step {cfg.k_step} holds no whole chunks/groups (group {cfg.group})"
    if cfg.warps > 16 or cfg.warps < 1:
        return f"{cfg.warps} warps a block (1..16)"
    if cfg.stream and cfg.stages:
        return "streaming loads and a cp.async ring (its copies bypass L1 already)"
    if cfg.prefetch and cfg.stages:
        return "both a register prefetch and a cp.async ring"
    if not 0 <= cfg.prefetch <= 4:
        return f"prefetch {cfg.prefetch} (0..4 steps ahead)"
    if cfg.stages and (cfg.stages < 2 or cfg.stages > 8 or cfg.stages & (cfg.stages - 1)):
        return f"a ring of {cfg.stages} stages (2, 4 or 8)"
    if cfg.shared_bytes > 48 * 1024:
        return f"{cfg.shared_bytes} bytes of shared memory"
    return None


@dataclass(frozen=True)
class QGemmKernel:
    """A built kernel: entry ``name`` taking ``(x, w, scales, zeros, bias, out)``."""

    config: QGemmConfig
    ptx: str

    @property
    def name(self) -> str:
        return self.config.name

    @property
    def grid(self) -> int:
        return self.config.grid

    @property
    def block(self) -> int:
        return self.config.block

    @property
    def shared_bytes(self) -> int:
        return self.config.shared_bytes


@cache
def qgemm(cfg: QGemmConfig, target: GpuTarget = SM90) -> QGemmKernel:
    """The kernel for ``cfg`` (CompileError when :func:`supports` refuses it)."""
    why = supports(cfg)
    if why is not None:
        raise CompileError(f"no quantized GPU product for {cfg.m}x{cfg.k} · {cfg.k}x{cfg.n} "
                           f"{cfg.fmt}: {why}")
    arch = int(target.arch.removeprefix("sm_").rstrip("a"))
    if arch < 80 or (cfg.fmt == "fp8" and arch < 89):
        raise CompileError(f"the quantized GPU product ({cfg.fmt}) needs sm_80 (bf16/f16 mma), "
                           f"sm_89 for fp8 (cvt from e4m3); the target is {target.arch}")
    module = ir.Module(name=cfg.name)
    module.triple = PTX_TRIPLE
    module.data_layout = str(gpu_target_machine(target).target_data)
    _Kernel(module, cfg, arch).build()
    return QGemmKernel(cfg, emit_ptx(module, target, f"the quantized product {cfg.name}"))


class _Kernel:
    def __init__(self, module: ir.Module, cfg: QGemmConfig, arch: int = 90):
        self.cfg = cfg
        self.arch = arch
        self.module = module
        self.fn = kernel_function(module, cfg.name, 6, cfg.block, cfg.min_blocks)
        self.b = ir.IRBuilder(self.fn.append_basic_block("entry"))
        smem = shared_array(module, "partials", max(1, cfg.shared_bytes // 2))
        self.smem = smem
        self.p = PtxBuilder(self.b, smem)
        self.half = "f16" if cfg.dtype is DType.f16 else "bf16"
        self.lanes = chunk_lanes(cfg.fmt, cfg.group)
        self.ring = smem   # the cp.async ring, then the partial sums

    # ---- helpers ---------------------------------------------------------------------------
    def i32(self, v: int) -> ir.Constant:
        return ir.Constant(I32, v)

    def i64(self, v: int) -> ir.Constant:
        return ir.Constant(I64, v)

    def wide(self, v: ir.Value) -> ir.Value:
        return self.b.zext(v, I64)

    def load(self, base: ir.Value, byte_offset: ir.Value, ty: ir.Type, align: int) -> ir.Value:
        ptr = self.b.gep(base, [byte_offset], inbounds=True, source_etype=ir.IntType(8))
        return self.b.load(ptr, typ=ty, align=align)

    def words(self, vec: ir.Value) -> list[ir.Value]:
        return [self.b.extract_element(vec, self.i32(e)) for e in range(4)]

    def asm(self, ret: ir.Type, args: list[ir.Value], text: str, cons: str) -> ir.Value:
        return self.p.asm(ret, args, text, cons)

    def mma(self, a: list[ir.Value], b2: list[ir.Value], c: list[ir.Value]) -> list[ir.Value]:
        return self.p.mma_16816(a, b2, c, f16=self.half == "f16")

    # ---- the kernel ------------------------------------------------------------------------
    def build(self) -> None:
        cfg, b = self.cfg, self.b
        x, w, scales, zeros, bias, out = (self.p.global_ptr(a) for a in self.fn.args)
        self.x, self.w, self.scales, self.zeros = x, w, scales, zeros
        tid, bid = self.p.sreg("tid.x"), self.p.sreg("ctaid.x")
        warp, lane = b.lshr(tid, self.i32(5)), b.and_(tid, self.i32(31))
        self.lane = lane
        self.g, self.q = b.lshr(lane, self.i32(2)), b.and_(lane, self.i32(3))
        n_blocks = cfg.n // cfg.block_n
        self.block_tile0 = b.mul(b.urem(bid, self.i32(n_blocks)), self.i32(cfg.tiles * cfg.nsplit))
        kw = cfg.kwarps
        group, warp = b.udiv(warp, self.i32(kw)), b.urem(warp, self.i32(kw))
        self.tile0 = b.add(self.block_tile0, b.mul(group, self.i32(cfg.tiles)))
        self.warp_index = b.add(b.mul(group, self.i32(kw)), warp)
        self.m0 = b.mul(b.udiv(bid, self.i32(n_blocks)), self.i32(cfg.tokens))
        self.btiles = cfg.tokens // 8
        self.rows = []   # per B tile: (valid, clamped row)
        for tt in range(self.btiles):
            t = b.add(self.m0, b.add(self.g, self.i32(8 * tt)))
            valid = b.icmp_unsigned("<", t, self.i32(cfg.m))
            self.rows.append((valid, b.select(valid, t, self.i32(cfg.m - 1))))
        regs = cfg.tiles * self.btiles * 4
        steps = cfg.k // cfg.k_step
        self.tid = tid
        before = b.block
        head = self.fn.append_basic_block("k.head")
        body = self.fn.append_basic_block("k.body")
        done = self.fn.append_basic_block("k.done")
        b.branch(head)
        b.position_at_end(head)
        step = b.phi(I32, name="step")
        step.add_incoming(warp, before)
        accs = [b.phi(F32) for _ in range(regs)]
        for acc in accs:
            acc.add_incoming(ir.Constant(F32, 0.0), before)

        def clamped(s: ir.Value, fallback: ir.Value) -> ir.Value:
            """Step ``s``, or ``fallback`` past K (a load whose bytes go unused)."""
            return b.select(b.icmp_unsigned("<", s, self.i32(steps)), s, fallback)

        sets: list[list[ir.Value]] = []
        if cfg.prefetch:   # steps warp, warp + W, ... loaded before the loop
            b.position_before(before.terminator)
            last = self.i32(steps - 1)
            ahead = [self.fetch(clamped(b.add(warp, self.i32(j * kw)), last))
                     for j in range(cfg.prefetch)]
            b.position_at_end(head)
            for values in ahead:
                phis = [b.phi(v.type) for v in values]
                for phi, v in zip(phis, values):
                    phi.add_incoming(v, before)
                sets.append(phis)
        it = None
        if cfg.stages:   # the ring's first stages - 1 steps copied before the loop
            b.position_before(before.terminator)
            last = self.i32(steps - 1)
            for j in range(cfg.stages - 1):
                self.issue(clamped(b.add(warp, self.i32(j * kw)), last), self.i32(j))
                self.p.cp_async_commit()
            b.position_at_end(head)
            it = b.phi(I32, name="it")
            it.add_incoming(self.i32(0), before)
        b.cbranch(b.icmp_unsigned("<", step, self.i32(steps)), body, done)
        b.position_at_end(body)
        nxt = b.add(step, self.i32(kw))
        if cfg.prefetch:   # later steps' loads in flight during this step's products
            following = self.fetch(clamped(b.add(step, self.i32(cfg.prefetch * kw)),
                                           step))
            new = self.compute(step, list(sets[0]), list(accs))
            for phis, values in zip(sets, [*sets[1:], following]):
                for phi, v in zip(phis, values):
                    phi.add_incoming(v, b.block)
        elif cfg.stages:   # copy step + (S-1)·W into the slot read last time, then read ours
            mask = self.i32(cfg.stages - 1)
            ahead = b.add(step, self.i32((cfg.stages - 1) * kw))
            self.issue(clamped(ahead, step), b.and_(b.add(it, mask), mask))
            self.p.cp_async_commit()
            self.p.cp_async_wait(cfg.stages - 1)
            new = self.compute(step, self.read_slot(b.and_(it, mask), step), list(accs))
            it.add_incoming(b.add(it, self.i32(1)), b.block)
        else:
            new = self.compute(step, self.fetch(step), list(accs))
        step.add_incoming(nxt, b.block)
        for phi, v in zip(accs, new):
            phi.add_incoming(v, b.block)
        b.branch(head)
        b.position_at_end(done)
        if cfg.stages:   # no copy may land after the block has gone
            self.p.cp_async_wait(0)
        self.reduce_and_store(self.warp_index, tid, list(accs), bias, out)
        b.ret_void()

    # ---- the cp.async ring: [stage][unit][thread] 16-byte code units, then
    # [stage][pair][thread] 8-byte scale pairs (s_lo, s_hi); a thread reads its own bytes only
    def ring_at(self, offset: ir.Value) -> ir.Value:
        """The ring's byte ``offset`` (i32)."""
        return self.b.gep(self.ring, [offset], inbounds=True, source_etype=ir.IntType(8))

    def code_slot(self, slot: ir.Value, unit: int) -> ir.Value:
        cfg, b = self.cfg, self.b
        row = b.add(b.mul(slot, self.i32(cfg.ring_codes)), self.i32(unit))
        return self.ring_at(b.mul(b.add(b.mul(row, self.i32(cfg.block)), self.tid),
                                  self.i32(16)))

    def scale_slot(self, slot: ir.Value, pair: int) -> ir.Value:
        cfg, b = self.cfg, self.b
        codes = cfg.stages * cfg.ring_codes * cfg.block * 16
        row = b.add(b.mul(slot, self.i32(cfg.ring_scales)), self.i32(pair))
        at = b.add(b.mul(b.add(b.mul(row, self.i32(cfg.block)), self.tid), self.i32(8)),
                   self.i32(codes))
        return self.ring_at(at)

    def issue(self, step: ir.Value, slot: ir.Value) -> None:
        """Copies K step ``step``'s code units and scales into ring slot ``slot``."""
        cfg, b = self.cfg, self.b
        for i in range(cfg.tiles):
            for li in range(cfg.loads):
                src = b.gep(self.w, [self.code_offset(step, i, li)], inbounds=True,
                            source_etype=ir.IntType(8))
                self.p.cp_async16(self.code_slot(slot, i * cfg.loads + li), src)
        per = cfg.k_step // cfg.group if cfg.fmt == "int4" else 0
        for gi in range(per):
            grp = b.add(b.mul(step, self.i32(per)), self.i32(gi))
            for i in range(cfg.tiles):
                dst = self.scale_slot(slot, gi * cfg.tiles + i)
                for upper in (False, True):
                    src = b.gep(self.scales, [b.mul(self.scale_index(grp, i, upper),
                                                    self.i64(4))],
                                inbounds=True, source_etype=ir.IntType(8))
                    at = b.gep(dst, [self.i32(4 * upper)], inbounds=True,
                               source_etype=ir.IntType(8))
                    self.p.asm(ir.VoidType(), [at, src],
                               "cp.async.ca.shared.global [$0], [$1], 4;", "l,l,~{memory}",
                               side_effect=True)

    def read_slot(self, slot: ir.Value, step: ir.Value) -> list[ir.Value]:
        """What :meth:`fetch` returns for ``step``, read from ring slot ``slot``."""
        cfg, b = self.cfg, self.b
        found: list[ir.Value] = []
        for u in range(cfg.ring_codes):
            found += self.words(b.load(self.code_slot(slot, u), typ=V4, align=16))
        per = cfg.k_step // cfg.group if cfg.fmt == "int4" else 0
        for gi in range(per):
            grp = b.add(b.mul(step, self.i32(per)), self.i32(gi))
            for i in range(cfg.tiles):
                pair = b.load(self.scale_slot(slot, gi * cfg.tiles + i), typ=V2F, align=8)
                found += [b.extract_element(pair, self.i32(0)),
                          b.extract_element(pair, self.i32(1)),
                          *self.zero_pairs(grp, i)]
        return found

    def code_offset(self, step: ir.Value, tile: int, li: int) -> ir.Value:
        """Byte offset of this lane's 16 bytes of load ``li`` of tile ``tile`` in K step
        ``step``."""
        cfg, b = self.cfg, self.b
        base = b.mul(self.wide(b.add(self.tile0, self.i32(tile))),
                     self.i64(BYTES_PER_K[cfg.fmt] * cfg.k))
        index = b.add(b.mul(step, self.i32(cfg.loads)), self.i32(li))
        return b.add(base, self.wide(b.add(b.mul(index, self.i32(512)),
                                           b.mul(self.lane, self.i32(16)))))

    def fetch(self, step: ir.Value) -> list[ir.Value]:
        """The global loads of K step ``step``: the packed weight words of every tile and load
        ([tile][load][word], flat), then (int4) each group's scales and zero-point pairs
        ([group][tile][s_lo, s_hi, z_lo, z_hi])."""
        cfg, b = self.cfg, self.b
        found: list[ir.Value] = []
        for i in range(cfg.tiles):
            for li in range(cfg.loads):
                at = self.code_offset(step, i, li)
                if cfg.stream:
                    ptr = b.gep(self.w, [at], inbounds=True, source_etype=ir.IntType(8))
                    got = self.asm(ir.LiteralStructType([I32] * 4), [ptr],
                                   "ld.global.nc.L1::no_allocate.v4.u32 {$0, $1, $2, $3}, [$4];",
                                   "=r,=r,=r,=r,l")
                    found += [b.extract_value(got, e) for e in range(4)]
                else:
                    found += self.words(self.load(self.w, at, V4, 16))
        if cfg.fmt == "int4":
            for gi in range(cfg.k_step // cfg.group):
                grp = b.add(b.mul(step, self.i32(cfg.k_step // cfg.group)), self.i32(gi))
                for i in range(cfg.tiles):
                    found += self.group_params(grp, i)
        return found

    def compute(self, step: ir.Value, fetched: list[ir.Value], accs: list[ir.Value]
                ) -> list[ir.Value]:
        """The products of K step ``step`` from the operands :meth:`fetch` loaded (and x,
        loaded here: it is small and stays in L1)."""
        cfg, b = self.cfg, self.b
        words = cfg.tiles * cfg.loads * 4
        loads = [[fetched[(i * cfg.loads + li) * 4:(i * cfg.loads + li + 1) * 4]
                  for li in range(cfg.loads)] for i in range(cfg.tiles)]
        k0 = b.mul(step, self.i32(cfg.k_step))
        chunk = 4 * self.lanes
        xs = [[self.x_fragments(b.add(k0, self.i32(c * chunk)), tt)
               for tt in range(self.btiles)] for c in range(cfg.k_step // chunk)]
        mmas = cfg.k_step // 16
        per_load = cfg.k_per_load // 16
        if cfg.fmt != "int4":
            out = list(accs)
            for mi in range(mmas):
                c, j = divmod(mi, self.lanes // 4)
                li, p = divmod(mi, per_load)
                for i in range(cfg.tiles):
                    a = self.dequant8(loads[i][li][2 * p], loads[i][li][2 * p + 1])
                    for tt in range(self.btiles):
                        at = (i * self.btiles + tt) * 4
                        for b2 in xs[c][tt][j]:
                            out[at:at + 4] = self.mma(a, b2, out[at:at + 4])
            return out
        out = list(accs)
        per_group = cfg.group // 16
        zero = ir.Constant(F32, 0.0)
        for gi in range(mmas // per_group):
            for i in range(cfg.tiles):
                at_params = words + (gi * cfg.tiles + i) * 4
                s_lo, s_hi, z_lo, z_hi = fetched[at_params:at_params + 4]
                part = [[zero] * 4 for _ in range(self.btiles)]
                for mi in range(gi * per_group, (gi + 1) * per_group):
                    c, j = divmod(mi, self.lanes // 4)
                    li, p = divmod(mi, per_load)
                    a = self.dequant4(loads[i][li][p], z_lo, z_hi)
                    for tt in range(self.btiles):
                        for b2 in xs[c][tt][j]:
                            part[tt] = self.mma(a, b2, part[tt])
                for tt in range(self.btiles):
                    at = (i * self.btiles + tt) * 4
                    for e in range(4):
                        out[at + e] = self.p.fma(part[tt][e], s_lo if e < 2 else s_hi,
                                                 out[at + e])
        return out

    def column(self, tile: int, upper: bool) -> ir.Value:
        """The output column of this lane's fragment rows g (or g + 8) in tile ``tile``."""
        b = self.b
        n = b.add(b.mul(b.add(self.tile0, self.i32(tile)), self.i32(TILE_N)), self.g)
        return b.add(n, self.i32(8)) if upper else n

    def scale_index(self, grp: ir.Value, tile: int, upper: bool) -> ir.Value:
        """Element index (i64) of group ``grp``'s scale (or zero point) of row g (g + 8)."""
        b = self.b
        return b.add(b.mul(self.wide(grp), self.i64(self.cfg.n)),
                     self.wide(self.column(tile, upper)))

    def group_params(self, grp: ir.Value, tile: int) -> tuple[ir.Value, ...]:
        """Scales (f32) and zero-point pairs (the magic pattern of 128 + z twice) of rows g
        and g + 8 for group ``grp``."""
        found = [self.load(self.scales, self.b.mul(self.scale_index(grp, tile, upper),
                                                   self.i64(4)), F32, 4)
                 for upper in (False, True)]
        return (*found, *self.zero_pairs(grp, tile))

    def zero_pairs(self, grp: ir.Value, tile: int) -> tuple[ir.Value, ir.Value]:
        """The magic pattern of 128 + z twice for rows g and g + 8 (z loaded, or the fixed
        8)."""
        b, cfg = self.b, self.cfg
        magic = MAGIC[self.half]
        if not cfg.zero_points:
            return (self.i32((magic | 8) * 0x10001),) * 2
        found = []
        for upper in (False, True):
            z = b.zext(self.load(self.zeros, self.scale_index(grp, tile, upper),
                                 ir.IntType(8), 1), I32)
            one = b.or_(z, self.i32(magic))
            found.append(b.or_(one, b.shl(one, self.i32(16))))
        return found[0], found[1]

    def dequant4(self, word: ir.Value, z_lo: ir.Value, z_hi: ir.Value) -> list[ir.Value]:
        """A fragment (a0..a3) of 8 nibbles: ``(nibble | magic) - (magic + z)``, exact."""
        b = self.b
        magic = MAGIC[self.half] * 0x10001
        frags = []
        for r in range(4):
            shifted = b.lshr(word, self.i32(4 * r)) if r else word
            biased = b.or_(b.and_(shifted, self.i32(0x000F000F)), self.i32(magic))
            frags.append(self.sub_pairs(biased, z_hi if r % 2 else z_lo))
        return frags

    def sub_pairs(self, a: ir.Value, c: ir.Value) -> ir.Value:
        """``a - c`` on both 16-bit halves (exact here: small integers): ``sub.rn.bf16x2`` on
        sm_90, ``fma.rn.bf16x2(a, 1, -c)`` before it (bf16 sub is sm_90's), ``sub.f16x2``."""
        if self.half == "f16":
            return self.asm(I32, [a, c], "sub.f16x2 $0, $1, $2;", "=r,r,r")
        if self.arch >= 90:
            return self.asm(I32, [a, c], "sub.rn.bf16x2 $0, $1, $2;", "=r,r,r")
        negated = self.b.xor(c, self.i32(-0x7FFF8000))   # 0x80008000: both signs flipped
        return self.asm(I32, [a, self.i32(0x3F803F80), negated],
                        "fma.rn.bf16x2 $0, $1, $2, $3;", "=r,r,r,r")

    def dequant8(self, first: ir.Value, second: ir.Value) -> list[ir.Value]:
        """A fragment from two words of 8-bit codes: (a0, a1) from ``first``, (a2, a3) from
        ``second``, each register two consecutive bytes."""
        out = []
        for word in (first, second):
            for sel in (0x10, 0x32):
                out.append(self.pair8(word, sel))
        return out

    def pair8(self, word: ir.Value, sel: int) -> ir.Value:
        """Bytes ``sel & 0xF`` (low half) and ``sel >> 4`` of ``word`` as a 16-bit pair."""
        b, lo, hi = self.b, sel & 0xF, sel >> 4
        if self.cfg.fmt == "fp8":
            bits = b.trunc(b.lshr(word, self.i32(8 * lo)), I16) if lo else b.trunc(word, I16)
            pair = self.asm(I32, [bits], "cvt.rn.f16x2.e4m3x2 $0, $1;", "=r,h")
            if self.half == "f16":
                return pair
            f0 = self.p.half_to_f32(b.trunc(pair, I16), f16=True)
            f1 = self.p.half_to_f32(b.trunc(b.lshr(pair, self.i32(16)), I16), f16=True)
            return self.p.pack2(f0, f1)
        flipped = b.xor(word, self.i32(0x80808080))   # b + 128, 0..255
        prmt = "prmt.b32 $0, $1, $2, $3;"
        if self.half == "f16":  # (1024 + u) as f16, minus 1152
            sel16 = lo | (4 << 4) | (hi << 8) | (5 << 12)
            pair = self.asm(I32, [flipped, self.i32(0x64646464), self.i32(sel16)], prmt,
                            "=r,r,r,r")
            return self.asm(I32, [pair, self.i32(0x64806480)], "sub.f16x2 $0, $1, $2;",
                            "=r,r,r")
        vals = []
        for byte in (lo, hi):   # 2^23 + u as f32, minus 2^23 + 128
            bits = self.asm(I32, [flipped, self.i32(0x4B000000), self.i32(0x7650 | byte)],
                            prmt, "=r,r,r,r")
            vals.append(b.fsub(b.bitcast(bits, F32), ir.Constant(F32, 8388736.0)))
        return self.p.pack2(vals[0], vals[1])

    def x_fragments(self, k0: ir.Value, tt: int) -> list[list[list[ir.Value]]]:
        """For each mma j of the chunk at ``k0``: the B fragments (b0, b1) of B tile ``tt``
        (one; two for f32 x: high and low bf16 parts), zero for tokens past M."""
        cfg, b = self.cfg, self.b
        valid, row = self.rows[tt]
        at = b.add(b.mul(self.wide(row), self.i64(cfg.k)),
                   self.wide(b.add(k0, b.mul(self.q, self.i32(self.lanes)))))
        size = cfg.dtype.itemsize
        vecs = [self.load(self.x, b.mul(b.add(at, self.i64(e * 16 // size)), self.i64(size)),
                          V4, 16) for e in range(self.lanes * size // 16)]
        raw = [b.select(valid, word, self.i32(0)) for v in vecs for word in self.words(v)]
        if cfg.dtype is not DType.f32:
            pairs = [[raw[2 * j], raw[2 * j + 1]] for j in range(self.lanes // 4)]
            return [[p] for p in pairs]
        words_hi, words_lo = [], []
        for e in range(0, len(raw), 2):   # elements e, e+1 -> one bf16 pair, hi and lo
            f0, f1 = (b.bitcast(raw[e], F32), b.bitcast(raw[e + 1], F32))
            hi = self.p.pack2(f0, f1)
            h0 = b.bitcast(b.shl(hi, self.i32(16)), F32)
            h1 = b.bitcast(b.and_(hi, self.i32(-65536)), F32)
            words_hi.append(hi)
            words_lo.append(self.p.pack2(b.fsub(f0, h0), b.fsub(f1, h1)))
        return [[[words_hi[2 * j], words_hi[2 * j + 1]], [words_lo[2 * j], words_lo[2 * j + 1]]]
                for j in range(self.lanes // 4)]

    def reduce_and_store(self, warp: ir.Value, tid: ir.Value, accs: list[ir.Value],
                         bias: ir.Value, out: ir.Value) -> None:
        """The warps' partial sums added through shared memory ([warp][reg][lane] f32), then
        per (column, token) of the block: scale (8-bit formats), bias, relu, store."""
        cfg, b = self.cfg, self.b
        regs = len(accs)
        if cfg.kwarps > 1:
            if cfg.stages:   # the partial sums overwrite the ring: every warp out of its loop
                self.p.barrier()
            for r, acc in enumerate(accs):
                at = b.add(b.mul(b.add(b.mul(warp, self.i32(regs)), self.i32(r)),
                                 self.i32(32)), self.lane)
                b.store(acc, self.f32_shared(at), align=4)
            self.p.barrier()
        if cfg.kwarps == 1:   # each lane stores its own registers
            for r, acc in enumerate(accs):
                self.store_one(self.i32(r), self.lane, acc, bias, out, self.tile0)
            return
        per, kw, size = cfg.block, cfg.kwarps, 32 * regs
        for it in range(-(-size * cfg.nsplit // per)):
            e = b.add(tid, self.i32(it * per))
            then = self.fn.append_basic_block(f"red{it}")
            after = self.fn.append_basic_block(f"red{it}.done")
            b.cbranch(b.icmp_unsigned("<", e, self.i32(size * cfg.nsplit)), then, after)
            b.position_at_end(then)
            group, rest = b.udiv(e, self.i32(size)), b.urem(e, self.i32(size))
            first = b.add(b.mul(group, self.i32(kw * size)), rest)
            total = ir.Constant(F32, 0.0)
            for w in range(kw):
                total = b.fadd(total, b.load(self.f32_shared(b.add(first, self.i32(w * size))),
                                             typ=F32, align=4))
            r, ln = b.lshr(rest, self.i32(5)), b.and_(rest, self.i32(31))
            tile0 = b.add(self.block_tile0, b.mul(group, self.i32(cfg.tiles)))
            self.store_one(r, ln, total, bias, out, tile0)
            b.branch(after)
            b.position_at_end(after)

    def f32_shared(self, index: ir.Value) -> ir.Value:
        """Element ``index`` of the partial sums (f32) in the kernel's i16 shared array."""
        return self.b.gep(self.smem, [self.i32(0), self.b.mul(index, self.i32(2))],
                          inbounds=True, source_etype=self.smem.value_type)

    def store_one(self, r: ir.Value, ln: ir.Value, value: ir.Value, bias: ir.Value,
                  out: ir.Value, tile0: ir.Value) -> None:
        """Accumulator register ``r`` of lane ``ln``: C[n][t] with n = g (+8 for c >= 2) of
        its tile and t = 2q + (c & 1) of its B tile."""
        cfg, b = self.cfg, self.b
        btiles = self.btiles
        c = b.and_(r, self.i32(3))
        tt = b.urem(b.lshr(r, self.i32(2)), self.i32(btiles))
        tile = b.udiv(r, self.i32(4 * btiles))
        g, q = b.lshr(ln, self.i32(2)), b.and_(ln, self.i32(3))
        n = b.add(b.add(b.mul(b.add(tile0, tile), self.i32(TILE_N)), g),
                  b.mul(b.lshr(c, self.i32(1)), self.i32(8)))
        t = b.add(b.add(self.m0, b.mul(tt, self.i32(8))),
                  b.add(b.mul(q, self.i32(2)), b.and_(c, self.i32(1))))
        then = self.fn.append_basic_block("store")
        after = self.fn.append_basic_block("store.done")
        b.cbranch(b.icmp_unsigned("<", t, self.i32(cfg.m)), then, after)
        b.position_at_end(then)
        nn = self.wide(n)
        if cfg.fmt != "int4":
            value = b.fmul(value, self.load(self.scales, b.mul(nn, self.i64(4)), F32, 4))
        value = b.fadd(value, self.load(bias, b.mul(nn, self.i64(4)), F32, 4))
        if cfg.act == "relu":
            value = self.p.fmax(value, ir.Constant(F32, 0.0))
        elif cfg.act == "gelu":   # 0.5·v·(1 + erf(v/√2)), the reference's exact GELU
            half_v = b.fmul(ir.Constant(F32, 0.5), value)
            e = erf_f32(b, b.fmul(value, ir.Constant(F32, 0.7071067811865476)), nvvm_exp2)
            value = b.fmul(half_v, b.fadd(ir.Constant(F32, 1.0), e))
        index = b.add(b.mul(self.wide(t), self.i64(cfg.n)), nn)
        size = cfg.dtype.itemsize
        if cfg.dtype is DType.f32:
            stored = value
        elif cfg.dtype is DType.f16:
            stored = b.bitcast(b.fptrunc(value, ir.HalfType()), I16)
        else:
            stored = self.asm(I16, [value], "cvt.rn.bf16.f32 $0, $1;", "=h,f")
        b.store(stored, b.gep(out, [b.mul(index, self.i64(size))], inbounds=True,
                              source_etype=ir.IntType(8)), align=size)
        b.branch(after)
        b.position_at_end(after)


def nvvm_exp2(b: ir.IRBuilder, x: ir.Value) -> ir.Value:
    """2**x on the special-function unit (``ex2.approx.f32``)."""
    return b.call(declare(b.module, "llvm.nvvm.ex2.approx.f", F32, [F32]), [x])


def erf_f32(b: ir.IRBuilder, x: ir.Value, exp2: Callable[[ir.IRBuilder, ir.Value], ir.Value]
            ) -> ir.Value:
    """f32 erf, branch-free, the polynomials of the NVPTX lowering's ``erf``
    (:meth:`tilefuse.codegen.llvm_nvptx.NvptxLowering.erf`: N. Juffa's ``erff``), with
    ``exp2`` given (the GPU's ``ex2.approx``; the CPU's ``llvm.exp2`` in its test)."""
    def c(v: float) -> ir.Constant:
        return ir.Constant(F32, v)

    def fma(a: ir.Value, m: ir.Value, add: ir.Value) -> ir.Value:
        return intrinsic(b, "fma", [a, m, add])

    def horner(v: ir.Value, first: ir.Value, coeffs: tuple[float, ...]) -> ir.Value:
        for k in coeffs:
            first = fma(first, v, c(k))
        return first

    a = intrinsic(b, "fabs", [x])
    s = b.fmul(x, x)
    r = fma(c(-1.72853470e-5), a, c(3.83197126e-4))
    u = fma(c(-3.88396438e-3), a, c(2.42546219e-2))
    r = horner(a, fma(r, s, u), (-1.06777877e-1, -6.34846687e-1, -1.28717512e-1))
    r = fma(r, a, b.fneg(a))
    big = intrinsic(b, "copysign", [b.fsub(c(1.0), exp2(b, b.fmul(r, c(LOG2_E)))), x])
    small = horner(s, c(-5.96761703e-4), (4.99119423e-3, -2.67681349e-2, 1.12819925e-1,
                                          -3.76125336e-1, 1.28379166e-1))
    small = fma(small, x, x)
    return b.select(b.fcmp_ordered(">", a, c(0.927734375)), big, small)


LOG2_E = 1.4426950408889634

__all__ = ["QGemmConfig", "QGemmKernel", "erf_f32", "nvvm_exp2", "qgemm", "supports"]
