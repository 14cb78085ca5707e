"""Fused attention for the ``cuda`` target: ``out = softmax(q·kᵀ·scale + mask)·v`` in one
kernel with an online softmax (FlashAttention-2's schedule), bf16 or f16 operands, f32
accumulation, emitted as LLVM IR through llvmlite and compiled by LLVM's NVPTX back end.

Operands are ``q [BH, Sq, D]``, ``k [BH, Sk, D]``, ``v [BH, Sk, Dv]``, ``out [BH, Sq, Dv]``
(C order, ``BH`` the flattened batch dims) and optionally an additive mask of the same dtype
broadcast to ``[batch..., Sq, Sk]`` (:class:`MaskLayout`: its element strides, 0 where it
broadcasts). One block of ``warps`` warps owns ``block_m`` query rows of one batch·head (warp
``w`` rows ``w·R .. +R``, ``R = block_m / warps``) and walks the keys in tiles of ``block_n``:

* **loads**: ``cp.async.cg.shared.global`` 16-byte copies (L2 only) into shared memory padded
  to ``D + 8`` elements a row (the 8 rows an ``ldmatrix`` phase reads hit 32 banks), two
  stages deep: at the top of tile ``j`` a thread waits for its copies of tile ``j``, one
  barrier publishes them (and retires every warp's reads of the other stage), then tile
  ``j+1`` is issued into the other stage and computed under. Rows past ``Sq`` or ``Sk`` are
  zero-filled (the copy's source size 0), never read. The Q block goes through the second
  stage once, before the first tile, and then lives in registers as ``ldmatrix`` A fragments.
* **S = Q·Kᵀ**: ``mma.sync.m16n8k16`` with K's fragments from ``ldmatrix.x4`` (K's rows are
  keys with D contiguous: already the ``.col`` B layout); ``R/16 × block_n/8`` accumulators of
  4 f32 a thread.
* **online softmax** in registers, in the log2 domain (``ex2.approx``): per row, the tile's
  max over the thread's columns then over its quad (two ``shfl.xor``), ``m' = max(m, ...)``,
  ``alpha = 2^(m - m')`` (``m' = -inf``, a row masked so far, taken as 0), ``p = 2^(s·c - m')``
  with ``c = scale·log2 e`` folded into one ``fma`` when there is no mask; ``l = l·alpha +
  Σp`` kept per thread (the quad's partial sums are added once, at the end); ``O *= alpha``.
  Keys past ``Sk`` (the last tile only, peeled) are ``-inf``.
* **O += P·V**: P's accumulators are rounded to bf16 pairs in registers and are, as they
  stand, the A fragments of the next product (the m16n8 C layout of two adjacent key tiles is
  the m16k16 A layout: FlashAttention-2's register reuse, no shared-memory round trip); V's
  fragments from ``ldmatrix.x4.trans``.
* **finish**: ``out = O / l`` rounded to the operand dtype, 4-byte stores of column pairs;
  rows past ``Sq`` are not stored.

A fully masked row gives NaN (0/0), as the plain graph does. Shapes: D and Dv multiples of 16
up to 128 (else :class:`CompileError`: the attention then runs unfused).

:class:`FlashConfig` holds the blocking and the schedule variants measured on an H200
(``benchmarks/gpu_bench.py --g8-configs``; figures in docs/PERFORMANCE.md): row sums by an
mma, packed exponentials, the next tile's scores under this tile's softmax
(:meth:`_Flash.pipelined_loop`), swizzled unpadded tiles, Q kept in shared memory. None beat
the default by more than the run-to-run spread, so all are off by default. ``wgmma`` builds
the Hopper kernel of :mod:`tilefuse.codegen.nvptx_wgmma_attention` instead (sm_90a), which the
executable times against this one when it loads.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import cache

from llvmlite import ir

from tilefuse.codegen.llvm_nvptx import PTX_TRIPLE, SM90, GpuTarget, emit_ptx, gpu_target_machine
from tilefuse.codegen.llvm_types import F32, I32, I64
from tilefuse.codegen.nvptx_prims import PtxBuilder, kernel_function, shared_array
from tilefuse.dtypes import DType
from tilefuse.errors import CompileError

LOG2_E = 1.4426950408889634
PAD = 8
"""Elements of padding per shared row (16 bytes)."""
MAX_STATIC_SHARED = 48 * 1024
SUPPORTED_DTYPES = frozenset({DType.bf16, DType.f16})
NEG_INF = float("-inf")


@dataclass(frozen=True)
class MaskLayout:
    """Where the additive mask's element for (batch·head, row, key) is: the batch dims ``bh``
    runs over (C order) with the mask's element stride along each (0 where it broadcasts),
    and its row and key strides (0 for a broadcast axis)."""

    batch: tuple[int, ...]
    batch_strides: tuple[int, ...]
    row_stride: int
    col_stride: int

    def pairs(self, sk: int) -> bool:
        """Whether two adjacent keys' values are one aligned 4-byte load."""
        return self.col_stride == 1 and sk % 2 == 0 and self.row_stride % 2 == 0 \
            and all(s % 2 == 0 for s in self.batch_strides)


@dataclass(frozen=True)
class FlashShape:
    """One attention's static sizes (see the module docstring)."""

    bh: int
    sq: int
    sk: int
    d: int
    dv: int
    scale: float
    dtype: DType = DType.bf16
    mask: MaskLayout | None = None

    @property
    def flops(self) -> float:
        """Multiply-adds of both products, counted as 2 operations each."""
        return 2.0 * self.bh * self.sq * self.sk * (self.d + self.dv)


@dataclass(frozen=True)
class FlashConfig:
    """The blocking: query rows per block, keys per tile, warps per block, and the blocks an
    SM should hold (``.minnctapersm``: the register cap ptxas works to)."""

    block_m: int = 128
    block_n: int = 64
    warps: int = 4
    min_blocks: int = 2
    sum_mma: int = 0
    """1: row sums by one more mma a k16 step, of P against a fragment of ones (f32
    accumulation of the rounded P the numerator uses; no adds, no final shuffles)."""
    pipeline: int = 0
    """1: the next tile's scores computed under this tile's softmax (``pipelined_loop``)."""
    swizzle: int = 0
    """1: shared rows unpadded, their 16-byte chunks XOR-swizzled by the row's low 3 bits, so
    ``ldmatrix`` and the copies stay conflict-free in 8/9 of the padded layout's bytes (D and
    Dv multiples of 64)."""
    q_shared: int = 0
    """1: the Q block stays in shared memory (its own region) and its fragments are read
    again every tile, which frees their registers."""
    exp_pairs: int = 0
    """1: two exponentials an instruction (``ex2.approx.ftz.bf16x2`` of the arguments
    rounded to bf16), which are then the P·V operand as they are; implies ``sum_mma``."""
    wgmma: int = 0
    """1: both products on Hopper's warpgroup MMA (sm_90a,
    :mod:`tilefuse.codegen.nvptx_wgmma_attention`): ``block_m = 16·warps``, ``swizzle``."""
    causal: int = 0
    """1: a block walks only the key tiles that start before its last query row (the rest
    are masked out by a causal mask, which the caller checks: a constant with every entry above
    the diagonal at most -65504); the mask is still added in the tiles walked. Sq = Sk, whole
    key tiles, not pipelined (about half the work of a causal prefill)."""

    @property
    def threads(self) -> int:
        return 32 * self.warps

    @property
    def row_tiles(self) -> int:
        """m16 tiles of query rows per warp."""
        return self.block_m // self.warps // 16


def default_config(shape: FlashShape) -> FlashConfig:
    """128 query rows × 64-key tiles over 4 warps for heads up to 64 wide; 64 × 32 above
    (the accumulators of 32 rows a warp would not fit the registers)."""
    if max(shape.d, shape.dv) <= 64:
        return FlashConfig()
    return FlashConfig(block_m=64, block_n=32, warps=4, min_blocks=3)


@dataclass(frozen=True)
class SharedLayout:
    """Element offsets in the kernel's shared array: stage ``s`` of K at ``s·stage``, of V
    at ``s·stage + k_tile``; the Q block at ``q`` (inside stage 1 when it fits)."""

    ldk: int
    ldv: int
    k_tile: int
    stage: int
    q: int
    elements: int

    @staticmethod
    def of(shape: FlashShape, config: FlashConfig) -> SharedLayout:
        pad = 0 if config.swizzle else PAD
        ldk, ldv = shape.d + pad, shape.dv + pad
        k_tile = config.block_n * ldk
        stage = k_tile + config.block_n * ldv
        q_elems = config.block_m * ldk
        q = stage if q_elems <= stage and not config.q_shared else 2 * stage
        return SharedLayout(ldk, ldv, k_tile, stage, q, max(2 * stage, q + q_elems))


def unsupported(shape: FlashShape, config: FlashConfig | None = None) -> str | None:
    """Why :func:`flash_attention` cannot build this attention, or None."""
    config = config or default_config(shape)
    if shape.dtype not in SUPPORTED_DTYPES:
        return f"the fused GPU attention takes bf16 or f16 operands, not {shape.dtype}"
    if shape.d % 16 or shape.dv % 16 or max(shape.d, shape.dv) > 128:
        return (f"the fused GPU attention takes head dims that are multiples of 16 up to 128, "
                f"not D={shape.d}, Dv={shape.dv}")
    if min(shape.bh, shape.sq, shape.sk) < 1:
        return "empty attention"
    if config.swizzle and (shape.d % 64 or shape.dv % 64):
        return f"swizzled attention tiles need D and Dv multiples of 64, not {shape.d}, " \
            f"{shape.dv}"
    if config.block_m % (16 * config.warps) or config.block_n % 16:
        return f"attention blocking {config} is not whole m16 tiles per warp and k16 key steps"
    if config.causal and (shape.sq != shape.sk or shape.sk % config.block_n or not shape.mask
                          or config.pipeline or config.wgmma):
        return "a causal tile skip needs Sq = Sk, whole key tiles, a mask and the plain loop"
    if config.wgmma:
        from tilefuse.codegen.nvptx_wgmma_attention import wgmma_unsupported

        reason = wgmma_unsupported(shape, config)
        if reason is not None:
            return reason
    nbytes = 2 * SharedLayout.of(shape, config).elements
    if nbytes > MAX_STATIC_SHARED:
        return f"attention blocking {config} needs {nbytes} bytes of shared memory"
    return None


@dataclass(frozen=True)
class FlashKernel:
    """One generated attention kernel: entry ``name`` taking ``(q, k, v[, mask], out)``."""

    name: str
    shape: FlashShape
    config: FlashConfig
    ptx: str

    @property
    def grid(self) -> int:
        return self.shape.bh * -(-self.shape.sq // self.config.block_m)

    @property
    def block(self) -> int:
        return self.config.threads

    @property
    def shared_bytes(self) -> int:
        return 2 * SharedLayout.of(self.shape, self.config).elements


@cache
def flash_attention(shape: FlashShape, config: FlashConfig | None = None,
                    target: GpuTarget = SM90) -> FlashKernel:
    """The fused attention kernel for ``shape`` (CompileError when unsupported)."""
    config = config or default_config(shape)
    reason = unsupported(shape, config)
    if reason is not None:
        raise CompileError(reason)
    knobs = "".join(f"_{k}" for k in ("sum_mma", "pipeline", "swizzle", "q_shared",
                                      "exp_pairs", "wgmma", "causal") if getattr(config, k))
    builder: type[_Flash] = _Flash
    if config.wgmma:   # sm_90a: the architecture-specific instructions
        from tilefuse.codegen.nvptx_wgmma import SM90A
        from tilefuse.codegen.nvptx_wgmma_attention import WgmmaFlash

        builder, target = WgmmaFlash, SM90A
    name = (f"flash_attention_{shape.bh}x{shape.sq}x{shape.sk}x{shape.d}x{shape.dv}_"
            f"{shape.dtype.value}{'_mask' if shape.mask else ''}_{config.block_m}x"
            f"{config.block_n}x{config.warps}{knobs}")
    module = ir.Module(name=name)
    module.triple = PTX_TRIPLE
    module.data_layout = str(gpu_target_machine(target).target_data)
    builder(module, name, shape, config).build()
    return FlashKernel(name, shape, config,
                       emit_ptx(module, target, f"the attention kernel {name}"))


Frag = list[ir.Value]
"""One m16n8 accumulator tile's 4 f32 registers (rows g, g, g+8, g+8; columns 2q, 2q+1)."""


class _Flash:
    """Emits one kernel (module docstring)."""

    def __init__(self, module: ir.Module, name: str, shape: FlashShape, config: FlashConfig):
        self.s, self.c = shape, config
        self.f16 = shape.dtype is DType.f16
        self.lay = SharedLayout.of(shape, config)
        self.fn = kernel_function(module, name, 5 if shape.mask else 4, config.threads,
                                  config.min_blocks)
        self.b = ir.IRBuilder(self.fn.append_basic_block("entry"))
        self.p = PtxBuilder(self.b, shared_array(module, "smem", self.lay.elements))
        self.full_tiles, self.tail_keys = divmod(shape.sk, config.block_n)
        self.sum_mma = bool(config.sum_mma or config.exp_pairs)
        self.tiles = self.full_tiles + (1 if self.tail_keys else 0)
        self.bound: ir.Value | None = None   # the tiles this block walks, when not all

    # ---- index helpers ------------------------------------------------------------------
    def i32(self, v: int) -> ir.Constant:
        return self.p.i32(v)

    def wide(self, v: ir.Value) -> ir.Value:
        return self.b.zext(v, I64)

    def build(self) -> None:
        b, p, s, c = self.b, self.p, self.s, self.c
        args = [p.global_ptr(a) for a in self.fn.args]
        self.q_ptr, self.k_ptr, self.v_ptr = args[:3]
        self.mask_ptr = args[3] if s.mask else None
        self.out_ptr = args[-1]
        self.tid = p.sreg("tid.x")
        bid = p.sreg("ctaid.x")
        q_blocks = -(-s.sq // c.block_m)
        self.bh = b.udiv(bid, self.i32(q_blocks))
        self.q0 = b.mul(b.urem(bid, self.i32(q_blocks)), self.i32(c.block_m))
        warp, lane = b.lshr(self.tid, self.i32(5)), b.and_(self.tid, self.i32(31))
        self.g = b.lshr(lane, self.i32(2))
        self.q2 = b.shl(b.and_(lane, self.i32(3)), self.i32(1))
        self.wrow = b.mul(warp, self.i32(c.block_m // c.warps))
        self.setup_lanes(lane)
        bh = self.wide(self.bh)
        self.q_base = b.mul(bh, p.i64(s.sq * s.d))
        self.k_base = b.mul(bh, p.i64(s.sk * s.d))
        self.v_base = b.mul(bh, p.i64(s.sk * s.dv))
        self.o_base = b.mul(bh, p.i64(s.sq * s.dv))
        self.mask_rows = self.mask_row_offsets() if s.mask else None
        state = self.pipelined_loop() if c.pipeline else self.key_loop(self.prologue())
        self.finish(*state)
        b.ret_void()

    def setup_lanes(self, lane: ir.Value) -> None:
        """This lane's ``ldmatrix`` row within a 16×16 operand and its 16-byte chunk (0 or 1):
        rows ``lane % 16``, chunk ``lane / 16`` for the A (Q) and trans-B (V) layouts; for K
        as the ``.col`` B operand of two adjacent n8 tiles, rows ``lane % 8 + 8·(lane / 16)``,
        chunk ``(lane / 8) % 2``. Swizzled, every such row's low 3 bits are ``lane % 8``."""
        b, c = self.b, self.c
        l16, hi = b.and_(lane, self.i32(15)), b.lshr(lane, self.i32(4))
        krow = b.add(b.and_(lane, self.i32(7)), b.shl(hi, self.i32(3)))
        kchunk = b.and_(b.lshr(lane, self.i32(3)), self.i32(1))
        self.lanes = {"q": (l16, hi, self.lay.ldk), "v": (l16, hi, self.lay.ldv),
                      "k": (krow, kchunk, self.lay.ldk)}
        low = b.and_(lane, self.i32(7))
        self.lane_at: dict[str, tuple[ir.Value, ir.Value | None]] = {}
        for kind, (row, chunk, ld) in self.lanes.items():
            if c.swizzle:
                self.lane_at[kind] = (b.mul(row, self.i32(ld)), b.xor(chunk, low))
            else:
                self.lane_at[kind] = (b.add(b.mul(row, self.i32(ld)), b.shl(chunk, self.i32(3))),
                                      None)

    def operand_at(self, kind: str, base: ir.Value, row: int, chunk: int) -> ir.Value:
        """The element this lane's ``ldmatrix`` row starts at, for the 16×16 operand of Q, K
        or V (``kind``) at tile row ``row`` and 16-byte chunk ``chunk`` (even) of the tile
        at ``base``."""
        b = self.b
        lane, swizzled = self.lane_at[kind]
        ld = self.lanes[kind][2]
        at = b.add(b.add(base, lane), self.i32(row * ld))
        if swizzled is None:
            return b.add(at, self.i32(chunk * 8))
        return b.add(at, b.shl(b.xor(swizzled, self.i32(chunk)), self.i32(3)))

    def rows_of_thread(self) -> list[tuple[int, int, ir.Value]]:
        """(m tile, half, block row) of the 2 rows a thread holds per m16 tile."""
        out = []
        for mt in range(self.c.row_tiles):
            for h in (0, 1):
                row = self.b.add(self.wrow, self.b.add(self.g, self.i32(mt * 16 + 8 * h)))
                out.append((mt, h, self.b.add(self.q0, row)))
        return out

    # ---- copies ---------------------------------------------------------------------------
    def copy_rows(self, dst: ir.Value | int, array: ir.Value, base: ir.Value, row0: ir.Value,
                  limit: int, rows: int, width: int, ld: int, bounded: bool) -> None:
        """Rows ``row0 .. row0+rows`` of the ``[*, width]`` global ``array`` from element
        ``base`` into shared rows of ``ld`` elements from ``dst``: 16-byte chunks,
        consecutive threads consecutive chunks; rows at or past ``limit`` zero-filled when
        ``bounded``."""
        b, p = self.b, self.p
        per_row = width // 8
        total = rows * per_row
        for first in range(0, total, self.c.threads):
            idx = b.add(self.tid, self.i32(first))
            guard = first + self.c.threads > total
            if guard:
                then = self.fn.append_basic_block("copy.part")
                after = self.fn.append_basic_block("copy.done")
                b.cbranch(b.icmp_unsigned("<", idx, self.i32(total)), then, after)
                b.position_at_end(then)
            row, chunk8 = b.udiv(idx, self.i32(per_row)), b.mul(b.urem(idx, self.i32(per_row)),
                                                               self.i32(8))
            slot = chunk8
            if self.c.swizzle:
                slot = b.shl(b.xor(b.lshr(chunk8, self.i32(3)), b.and_(row, self.i32(7))),
                             self.i32(3))
            at = b.add(b.add(dst if isinstance(dst, ir.Value) else self.i32(dst),
                             b.mul(row, self.i32(ld))), slot)
            grow = b.add(row0, row)
            size = None
            if bounded:
                inside = b.icmp_unsigned("<", grow, self.i32(limit))
                grow = b.select(inside, grow, self.i32(0))
                size = b.select(inside, self.i32(16), self.i32(0))
            src = b.add(base, b.add(b.mul(self.wide(grow), p.i64(width)), self.wide(chunk8)))
            p.cp_async16(p.shared_at(at), p.global_at(array, src), size)
            if guard:
                b.branch(after)
                b.position_at_end(after)

    def copy_tile(self, tile: ir.Value, stage: ir.Value | int, bounded: bool) -> None:
        """Key tile ``tile``'s K and V rows into stage ``stage`` (its element offset)."""
        self.copy_part(tile, stage, "k", bounded)
        self.copy_part(tile, stage, "v", bounded)

    def copy_part(self, tile: ir.Value, stage: ir.Value | int, part: str, bounded: bool
                  ) -> None:
        """Key tile ``tile``'s K (``part`` "k") or V rows into stage ``stage``."""
        s, c, lay = self.s, self.c, self.lay
        k0 = self.b.mul(tile, self.i32(c.block_n))
        st = stage if isinstance(stage, ir.Value) else self.i32(stage)
        if part == "k":
            self.copy_rows(st, self.k_ptr, self.k_base, k0, s.sk, c.block_n, s.d, lay.ldk,
                           bounded)
        else:
            self.copy_rows(self.b.add(st, self.i32(lay.k_tile)), self.v_ptr, self.v_base, k0,
                           s.sk, c.block_n, s.dv, lay.ldv, bounded)

    def prologue(self, with_v: bool = True) -> list[list[Frag]] | None:
        """The Q block and key tile 0 (its K only, unless ``with_v``) copied and published
        (:meth:`publish`, which the wgmma kernel extends); Q's A fragments ``[m tile][k16
        step]``, or None when the products read Q from shared memory (``q_shared``)."""
        s, c, p = self.s, self.c, self.p
        self.copy_rows(self.lay.q, self.q_ptr, self.q_base, self.q0, s.sq, c.block_m, s.d,
                       self.lay.ldk, s.sq % c.block_m != 0)
        bounded = self.tiles == 1 and self.tail_keys != 0
        if with_v:
            self.copy_tile(self.i32(0), 0, bounded)
        else:
            self.copy_part(self.i32(0), 0, "k", bounded)
        p.cp_async_commit()
        self.publish()
        return None if c.q_shared else self.q_fragments()

    def q_fragments(self) -> list[list[Frag]]:
        """Q's A fragments ``[m tile][k16 step]`` from its shared block."""
        b, c = self.b, self.c
        base = b.add(b.mul(self.wrow, self.i32(self.lay.ldk)), self.i32(self.lay.q))
        return [[self.p.ldmatrix_x4(self.operand_at("q", base, mt * 16, 2 * kt))
                 for kt in range(self.s.d // 16)] for mt in range(c.row_tiles)]

    # ---- the key loop --------------------------------------------------------------------
    def counted_loop(self, count: int | ir.Value, state: list[ir.Value],
                     body: Callable[[ir.Value, list[ir.Value]], list[ir.Value]]
                     ) -> list[ir.Value]:
        """``for j < count: state = body(j, state)`` with the f32 ``state`` in phis."""
        b = self.b
        before = b.block
        head = self.fn.append_basic_block("keys.head")
        loop_body = self.fn.append_basic_block("keys.body")
        done = self.fn.append_basic_block("keys.done")
        b.branch(head)
        b.position_at_end(head)
        j = b.phi(I32, name="tile")
        j.add_incoming(self.i32(0), before)
        phis = [b.phi(F32) for _ in state]
        for ph, v in zip(phis, state):
            ph.add_incoming(v, before)
        limit = self.i32(count) if isinstance(count, int) else count
        b.cbranch(b.icmp_unsigned("<", j, limit), loop_body, done)
        b.position_at_end(loop_body)
        out = body(j, list(phis))
        j.add_incoming(b.add(j, self.i32(1)), b.block)
        for ph, v in zip(phis, out):
            ph.add_incoming(v, b.block)
        b.branch(head)
        b.position_at_end(done)
        return list(phis)

    def initial_state(self) -> tuple[list[list[Frag]], list, list]:
        rows = 2 * self.c.row_tiles
        o = [[[self.p.f32(0.0)] * 4 for _ in range(self.s.dv // 8)]
             for _ in range(self.c.row_tiles)]
        return o, [self.p.f32(NEG_INF)] * rows, [self.p.f32(0.0)] * rows

    def stage_of(self, j: ir.Value) -> ir.Value:
        return self.b.mul(self.b.and_(j, self.i32(1)), self.i32(self.lay.stage))

    def key_loop(self, q_frags: list[list[Frag]] | None) -> tuple[list[list[Frag]], list, list]:
        """Every full key tile in a loop, then the partial last one peeled; returns the
        final (O, m, l)."""
        o, m, l_sum = self.initial_state()

        def body(j: ir.Value, flat: list[ir.Value]) -> list[ir.Value]:
            stage = self.stage_of(j)
            self.top_of_tile(self.b.add(j, self.i32(1)),
                             self.b.sub(self.i32(self.lay.stage), stage))
            state = self.tile(q_frags, j, stage, None, *self.unflatten(flat))
            return self.flatten(*state)

        count: int | ir.Value = self.full_tiles
        if self.c.causal:   # tiles starting before this block's last query row + 1
            b = self.b
            reach = b.udiv(b.add(self.q0, self.i32(self.c.block_m + self.c.block_n - 1)),
                           self.i32(self.c.block_n))
            count = self.bound = b.select(b.icmp_unsigned("<", reach, self.i32(self.full_tiles)),
                                          reach, self.i32(self.full_tiles))
        if self.full_tiles:
            o, m, l_sum = self.unflatten(self.counted_loop(count,
                                                           self.flatten(o, m, l_sum), body))
        if self.tail_keys:
            j = self.i32(self.full_tiles)
            self.top_of_tile(None, None)
            o, m, l_sum = self.tile(q_frags, j, self.i32((self.full_tiles % 2) * self.lay.stage),
                                    self.tail_keys, o, m, l_sum)
        return o, m, l_sum

    def pipelined_loop(self) -> tuple[list[list[Frag]], list, list]:
        """The ``pipeline`` schedule: tile ``j+1``'s scores are issued in the iteration that
        takes tile ``j``'s softmax and P·V, so the tensor cores have independent work while
        the exponentials run. K leads V by one tile: the copies an iteration issues are
        K ``j+2`` (into K ``j``'s stage) and V ``j+1`` (into V ``j-1``'s)."""
        p, last = self.p, self.tiles - 1
        q_frags = self.prologue(with_v=False)
        p.barrier()   # every warp has its Q fragments: the Q region (stage 1) is free
        if self.tiles > 1:
            self.copy_part(self.i32(1), self.lay.stage, "k", last == 1 and self.tail_keys > 0)
        self.copy_part(self.i32(0), 0, "v", last == 0 and self.tail_keys > 0)
        p.cp_async_commit()
        scores = self.scores(q_frags, self.i32(0))
        o, m, l_sum = self.initial_state()
        n_scores = len(self.flatten_scores(scores))

        def body(j: ir.Value, flat: list[ir.Value]) -> list[ir.Value]:
            b = self.b
            self.publish()
            stage, following = self.stage_of(j), b.add(j, self.i32(1))
            self.guarded(b.add(j, self.i32(2)), lambda: self.copy_part(
                b.add(j, self.i32(2)), stage, "k", self.tail_keys > 0))
            self.copy_part(following, b.sub(self.i32(self.lay.stage), stage), "v",
                           self.tail_keys > 0)
            p.cp_async_commit()
            upcoming = self.issue_scores(q_frags, b.sub(self.i32(self.lay.stage), stage))
            current = self.unflatten_scores(flat[:n_scores])
            state = self.update(current, j, stage, None, *self.unflatten(flat[n_scores:]))
            return self.flatten_scores(self.scores_ready(upcoming)) + self.flatten(*state)

        if last:
            flat = self.counted_loop(last, self.flatten_scores(scores) + self.flatten(o, m, l_sum),
                                     body)
            scores, (o, m, l_sum) = (self.unflatten_scores(flat[:n_scores]),
                                     self.unflatten(flat[n_scores:]))
        self.publish()
        return self.update(scores, self.i32(last), self.i32((last % 2) * self.lay.stage),
                           self.tail_keys or None, o, m, l_sum)

    def publish(self) -> None:
        """Wait for this thread's copies and publish them (and every warp's reads of the
        other stage) block-wide."""
        self.p.cp_async_wait(0)
        self.p.barrier()

    def issue_scores(self, q_frags: list[list[Frag]] | None, stage: ir.Value
                     ) -> list[list[Frag]]:
        """The next tile's scores in the pipelined loop (here computed at once; the wgmma
        kernel leaves them in flight until :meth:`scores_ready`)."""
        return self.scores(q_frags, stage)

    def scores_ready(self, scores: list[list[Frag]]) -> list[list[Frag]]:
        return scores

    def guarded(self, tile: ir.Value, emit: Callable[[], None]) -> None:
        """``emit()`` only when key tile ``tile`` exists."""
        b = self.b
        issue = self.fn.append_basic_block("prefetch")
        after = self.fn.append_basic_block("prefetch.done")
        limit = self.i32(self.tiles) if self.bound is None else self.bound
        b.cbranch(b.icmp_unsigned("<", tile, limit), issue, after)
        b.position_at_end(issue)
        emit()
        b.branch(after)
        b.position_at_end(after)

    @staticmethod
    def flatten(o: list[list[Frag]], m: list, l_sum: list) -> list[ir.Value]:
        return [x for tile in o for frag in tile for x in frag] + list(m) + list(l_sum)

    @staticmethod
    def flatten_scores(scores: list[list[Frag]]) -> list[ir.Value]:
        return [x for tile in scores for frag in tile for x in frag]

    def unflatten_scores(self, flat: list[ir.Value]) -> list[list[Frag]]:
        n = self.c.block_n // 8
        return [[list(flat[(mt * n + nt) * 4:(mt * n + nt) * 4 + 4]) for nt in range(n)]
                for mt in range(self.c.row_tiles)]

    def unflatten(self, flat: list) -> tuple[list[list[Frag]], list, list]:
        c, n = self.c, self.s.dv // 8
        count = c.row_tiles * n * 4
        o = [[list(flat[(mt * n + nt) * 4:(mt * n + nt) * 4 + 4]) for nt in range(n)]
             for mt in range(c.row_tiles)]
        rows = 2 * c.row_tiles
        return o, list(flat[count:count + rows]), list(flat[count + rows:count + 2 * rows])

    def top_of_tile(self, following: ir.Value | None, other_stage: ir.Value | None) -> None:
        """Wait for this tile's copies, publish them block-wide, then (when there is one)
        issue tile ``following`` into the other stage."""
        p = self.p
        self.publish()
        if following is None:
            return
        assert other_stage is not None
        self.guarded(following, lambda: self.copy_tile(following, other_stage,
                                                       self.tail_keys != 0))
        p.cp_async_commit()

    def tile(self, q_frags: list[list[Frag]] | None, j: ir.Value, stage: ir.Value, tail: int | None,
             o: list[list[Frag]], m: list, l_sum: list) -> tuple[list[list[Frag]], list, list]:
        """One key tile: scores, their softmax step, the rescale and O += P·V."""
        return self.update(self.scores(q_frags, stage), j, stage, tail, o, m, l_sum)

    def update(self, scores: list[list[Frag]], j: ir.Value, stage: ir.Value, tail: int | None,
               o: list[list[Frag]], m: list, l_sum: list) -> tuple[list[list[Frag]], list, list]:
        """Tile ``j``'s softmax step on its ``scores``, the rescale and O += P·V (V in
        ``stage``)."""
        k0 = self.b.mul(j, self.i32(self.c.block_n))
        probs, alpha, m, l_sum = self.softmax(scores, k0, tail, m, l_sum)
        o = [[[self.b.fmul(x, alpha[2 * mt + e // 2]) for e, x in enumerate(frag)]
              for frag in tile] for mt, tile in enumerate(o)]
        o, l_sum = self.pv(probs, stage, o, l_sum)
        return o, m, l_sum

    def scores(self, q_frags: list[list[Frag]] | None, stage: ir.Value) -> list[list[Frag]]:
        """S = Q·Kᵀ of this tile: ``[m tile][n8 key tile]`` accumulators."""
        p, c = self.p, self.c
        zero = [p.f32(0.0)] * 4
        acc = [[zero for _ in range(c.block_n // 8)] for _ in range(c.row_tiles)]
        if q_frags is None:   # q_shared: read again every tile
            q_frags = self.q_fragments()
        for pair in range(c.block_n // 16):
            for kt in range(self.s.d // 16):
                frag = p.ldmatrix_x4(self.operand_at("k", stage, pair * 16, 2 * kt))
                for mt in range(c.row_tiles):
                    for half in (0, 1):
                        nt = 2 * pair + half
                        acc[mt][nt] = p.mma_16816(q_frags[mt][kt], frag[2 * half:2 * half + 2],
                                                  acc[mt][nt], self.f16)
        return acc

    def pv(self, probs: list[list[Frag]], stage: ir.Value, o: list[list[Frag]], l_sum: list
           ) -> tuple[list[list[Frag]], list]:
        """O += P·V with P's packed pairs as the A fragments, as they are in registers (and,
        with ``sum_mma``, the row sums l += P·1 by one more product a k16 step)."""
        p, b, c = self.p, self.b, self.c
        base = b.add(stage, self.i32(self.lay.k_tile))
        ones = p.i32(0x3C003C00 if self.f16 else 0x3F803F80)
        sums = [[l_sum[2 * mt], l_sum[2 * mt], l_sum[2 * mt + 1], l_sum[2 * mt + 1]]
                for mt in range(c.row_tiles)]
        for kk in range(c.block_n // 16):
            a = [[*probs[mt][2 * kk], *probs[mt][2 * kk + 1]] for mt in range(c.row_tiles)]
            if self.sum_mma:
                sums = [p.mma_16816(a[mt], [ones, ones], sums[mt], self.f16)
                        for mt in range(c.row_tiles)]
            for pair in range(self.s.dv // 16):
                frag = p.ldmatrix_x4(self.operand_at("v", base, kk * 16, 2 * pair), trans=True)
                for mt in range(c.row_tiles):
                    for half in (0, 1):
                        nt = 2 * pair + half
                        o[mt][nt] = p.mma_16816(a[mt], frag[2 * half:2 * half + 2], o[mt][nt],
                                                self.f16)
        if self.sum_mma:
            l_sum = [x for frag in sums for x in (frag[0], frag[2])]
        return o, l_sum

    # ---- the online softmax --------------------------------------------------------------
    def softmax(self, scores: list[list[Frag]], k0: ir.Value, tail: int | None, m: list,
                l_sum: list) -> tuple[list[list[list]], list, list, list]:
        """Per row: the tile's probabilities as packed pairs ``[m tile][n8 tile][half]`` (the
        P·V A operand), the rescale factor, the running max and the running sum (the
        thread's partial sum; with ``sum_mma`` only rescaled here, :meth:`pv` adds)."""
        b, p, s = self.b, self.p, self.s
        fold = s.mask is None and s.scale > 0
        c = p.f32(s.scale * LOG2_E)
        probs: list[list[list]] = [[[None, None] for _ in tile] for tile in scores]
        alphas, m_out, l_out = [], [], []
        for mt, h, _row in self.rows_of_thread():
            r = 2 * mt + h
            cells = [(nt, 2 * h + e) for nt in range(len(scores[mt])) for e in (0, 1)]
            values = [scores[mt][nt][i] for nt, i in cells]
            if not fold:
                masks = self.mask_values(r, k0, tail, len(scores[mt])) if s.mask else None
                values = [b.fmul(v, c) if masks is None else p.fma(v, c, masks[i])
                          for i, v in enumerate(values)]
            if tail is not None:
                values = [self.past_keys(v, nt * 8 + i % 2, tail)
                          for (nt, _), i, v in zip(cells, range(len(cells)), values)]
            top = values[0]
            for v in values[1:]:
                top = p.fmax(top, v)
            top = p.quad_reduce(top, "max")
            if fold:
                top = b.fmul(top, c)
            m_new = p.fmax(m[r], top)
            m_use = b.select(b.fcmp_ordered("==", m_new, p.f32(NEG_INF)), p.f32(0.0), m_new)
            alpha = p.ex2(b.fsub(m[r], m_use))
            neg = b.fneg(m_use)
            args = [p.fma(v, c, neg) if fold else b.fadd(v, neg) for v in values]
            total = None
            for nt in range(len(scores[mt])):
                lo, hi = args[2 * nt], args[2 * nt + 1]
                if self.c.exp_pairs:
                    probs[mt][nt][h] = p.ex2_pair(p.pack2(lo, hi, self.f16), self.f16)
                    continue
                lo, hi = p.ex2(lo), p.ex2(hi)
                probs[mt][nt][h] = p.pack2(lo, hi, self.f16)
                if not self.sum_mma:
                    pair = b.fadd(lo, hi)
                    total = pair if total is None else b.fadd(total, pair)
            alphas.append(alpha)
            m_out.append(m_new)
            l_out.append(b.fmul(l_sum[r], alpha) if total is None
                         else p.fma(l_sum[r], alpha, total))
        return probs, alphas, m_out, l_out

    def past_keys(self, value: ir.Value, column: int, tail: int) -> ir.Value:
        """``value`` or -inf when this thread's key ``column + 2q`` of the last tile is past
        ``Sk`` (``tail`` keys are real)."""
        key = self.b.add(self.q2, self.i32(column))
        return self.b.select(self.b.icmp_unsigned("<", key, self.i32(tail)), value,
                             self.p.f32(NEG_INF))

    def mask_row_offsets(self) -> list[ir.Value]:
        """Per row a thread holds: the mask's element offset of (this batch·head, row, key 0);
        rows past ``Sq`` read row 0 (their results are never stored)."""
        b, p, s = self.b, self.p, self.s
        mask = s.mask
        assert mask is not None
        offset: ir.Value = p.i64(0)
        inner = 1
        for size, stride in reversed(list(zip(mask.batch, mask.batch_strides))):
            if stride and size > 1:
                index = b.urem(b.udiv(self.bh, self.i32(inner)), self.i32(size))
                offset = b.add(offset, b.mul(self.wide(index), p.i64(stride)))
            inner *= size
        out = []
        for _, _, row in self.rows_of_thread():
            if s.sq % self.c.block_m:
                row = b.select(b.icmp_unsigned("<", row, self.i32(s.sq)), row, self.i32(0))
            out.append(b.add(offset, b.mul(self.wide(row), p.i64(mask.row_stride))))
        return out

    def mask_values(self, r: int, k0: ir.Value, tail: int | None, tiles: int) -> list[ir.Value]:
        """The mask times log2 e at this thread's 2·tiles columns of row ``r`` (keys past
        ``Sk`` read key 0: they are -inf anyway)."""
        b, p, s = self.b, self.p, self.s
        mask = s.mask
        assert mask is not None and self.mask_rows is not None and self.mask_ptr is not None
        pairs = mask.pairs(s.sk)
        out = []
        for nt in range(tiles):
            key = b.add(k0, b.add(self.q2, self.i32(nt * 8)))
            for e in ((0,) if pairs else (0, 1)):
                at = b.add(key, self.i32(e))
                if tail is not None:
                    at = b.select(b.icmp_unsigned("<", at, self.i32(s.sk)), at, self.i32(0))
                ptr = p.global_at(self.mask_ptr, b.add(self.mask_rows[r], b.mul(
                    self.wide(at), p.i64(mask.col_stride))))
                if pairs:
                    word = b.load(ptr, typ=I32, align=4)
                    halves = [b.trunc(word, ir.IntType(16)),
                              b.trunc(b.lshr(word, self.i32(16)), ir.IntType(16))]
                else:
                    halves = [b.load(ptr, typ=ir.IntType(16), align=2)]
                out += [b.fmul(p.half_to_f32(x, self.f16), p.f32(LOG2_E)) for x in halves]
        return out

    # ---- finish ------------------------------------------------------------------------------
    def finish(self, o: list[list[Frag]], m: list, l_sum: list) -> None:
        """``out = O / l`` (the quad's partial sums added), rows past ``Sq`` skipped."""
        b, p, s = self.b, self.p, self.s
        del m
        for mt, h, row in self.rows_of_thread():
            total = l_sum[2 * mt + h]
            if not self.sum_mma:   # the quad's partial sums
                total = p.quad_reduce(total, "add")
            inverse = b.fdiv(p.f32(1.0), total)
            after = None
            if s.sq % self.c.block_m:
                store = self.fn.append_basic_block("store.row")
                after = self.fn.append_basic_block("store.done")
                b.cbranch(b.icmp_unsigned("<", row, self.i32(s.sq)), store, after)
                b.position_at_end(store)
            base = b.add(self.o_base, b.mul(self.wide(row), p.i64(s.dv)))
            for nt, frag in enumerate(o[mt]):
                pair = p.pack2(b.fmul(frag[2 * h], inverse), b.fmul(frag[2 * h + 1], inverse),
                               self.f16)
                col = self.wide(b.add(self.q2, self.i32(nt * 8)))
                b.store(pair, p.global_at(self.out_ptr, b.add(base, col)), align=4)
            if after is not None:
                b.branch(after)
                b.position_at_end(after)


__all__ = ["FlashConfig", "FlashKernel", "FlashShape", "MaskLayout", "SharedLayout",
           "default_config", "flash_attention", "unsupported"]
