"""A generated tensor-core matrix product for the ``cuda`` target: ``C[M,N] = A[M,K] · B[K,N]``,
bf16 operands, f32 accumulation, bf16 or f32 output, emitted as LLVM IR through llvmlite and
compiled by LLVM's NVPTX back end (``mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32``
from the ``llvm.nvvm.mma.m16n8k16.row.col.bf16`` intrinsic).

Schedule (fixed; the executable times it against cuBLAS and keeps the faster):

* a block of 256 threads (8 warps) owns a 128×128 tile of C; warp ``w`` owns rows
  ``(w // 4)·64 ..+64`` and columns ``(w % 4)·32 ..+32`` of it: 4×4 ``m16n8`` accumulators,
  64 f32 registers a thread;
* per step of 32 along K the block stages A's 128×32 and B's 32×128 tiles in shared memory
  as they are in global memory (16-byte loads and stores, four a thread), two stages deep:
  the next step's tiles are loaded into registers before this step's products and stored
  into the other stage after them, one barrier a step; rows are padded (A: 40 elements,
  B: 136), so the 8 rows an ``ldmatrix`` phase reads hit 32 different banks;
* fragments come from ``ldmatrix.x4`` (A) and ``ldmatrix.x4.trans`` (B: the transposition
  gives the k pairs the ``.col`` operand wants), in PTX's m16n8k16 layout: C rows
  ``lane/4``, ``+8`` and column pairs ``2·(lane%4)``.

Shapes: M and N multiples of 128, K of 32 (else :class:`CompileError`: the product stays on
cuBLAS). No epilogue is fused yet: the group's epilogue runs as the next kernel either way.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache

from llvmlite import ir

from tilefuse.codegen.llvm_nvptx import PTX_TRIPLE, SM90, GpuTarget, emit_ptx, gpu_target_machine
from tilefuse.codegen.llvm_types import F32, I32, I64, PTR, VOID, declare
from tilefuse.dtypes import DType
from tilefuse.errors import CompileError

TILE_M = TILE_N = 128
TILE_K = 32
THREADS = 256
PAD = 40  # elements per shared A row (32 + 8): 80 bytes, conflict-free ldmatrix rows
B_PAD = TILE_N + 8  # elements per shared B row: 272 bytes, likewise
A_STAGE = TILE_M * PAD
B_STAGE = TILE_K * B_PAD
I16 = ir.IntType(16)
SHARED = 3


@dataclass(frozen=True)
class MmaGemm:
    """One generated product: its PTX, entry name and launch shape."""

    name: str
    m: int
    n: int
    k: int
    out_dtype: DType
    ptx: str

    @property
    def grid(self) -> int:
        return (self.m // TILE_M) * (self.n // TILE_N)

    @property
    def block(self) -> int:
        return THREADS


def supports(m: int, n: int, k: int, dtype: DType, out_dtype: DType) -> bool:
    """Whether :func:`mma_gemm` builds this product."""
    return dtype is DType.bf16 and out_dtype in (DType.bf16, DType.f32) and m % TILE_M == 0 \
        and n % TILE_N == 0 and k % TILE_K == 0


@cache
def mma_gemm(m: int, n: int, k: int, out_dtype: DType = DType.bf16,
             target: GpuTarget = SM90) -> MmaGemm:
    """The tensor-core product kernel for this shape (CompileError when unsupported)."""
    if not supports(m, n, k, DType.bf16, out_dtype):
        raise CompileError(f"no generated tensor-core product for {m}x{k} · {k}x{n} "
                           f"-> {out_dtype} (bf16 operands, M, N multiples of {TILE_M}, "
                           f"K of {TILE_K})")
    name = f"mma_gemm_{m}x{n}x{k}_{out_dtype.value}"
    module = ir.Module(name=name)
    module.triple = PTX_TRIPLE
    module.data_layout = str(gpu_target_machine(target).target_data)
    _Kernel(module, name, m, n, k, out_dtype).build()
    ptx = emit_ptx(module, target, f"the tensor-core kernel {name}")
    return MmaGemm(name, m, n, k, out_dtype, ptx)


class _Kernel:
    def __init__(self, module: ir.Module, name: str, m: int, n: int, k: int, out: DType):
        self.module, self.m, self.n, self.k, self.out = module, m, n, k, out
        fn = ir.Function(module, ir.FunctionType(VOID, [PTR, PTR, PTR]), name)
        fn.calling_convention = "ptx_kernel"
        for arg in fn.args:
            arg.add_attribute("noalias")
        self.fn = fn
        self.b = ir.IRBuilder(fn.append_basic_block("entry"))
        self.a_s = self._shared("a_tiles", 2 * A_STAGE)
        self.b_s = self._shared("b_tiles", 2 * B_STAGE)

    def _shared(self, name: str, count: int) -> ir.GlobalVariable:
        ty = ir.ArrayType(I16, count)
        g = ir.GlobalVariable(self.module, ty, name, addrspace=SHARED)
        g.align = 16
        g.linkage = "internal"
        g.initializer = ir.Constant(ty, ir.Undefined)
        g.type = ir.PointerType(addrspace=SHARED)  # opaque, so any access type goes
        return g

    def i32(self, v: int) -> ir.Constant:
        return ir.Constant(I32, v)

    def sreg(self, reg: str) -> ir.Value:
        return self.b.call(declare(self.module, f"llvm.nvvm.read.ptx.sreg.{reg}", I32, []), [])

    def shared_at(self, base: ir.GlobalVariable, index: ir.Value) -> ir.Value:
        return self.b.gep(base, [self.i32(0), index], inbounds=True,
                          source_etype=base.value_type)

    def global_at(self, ptr: ir.Value, index: ir.Value) -> ir.Value:
        return self.b.gep(ptr, [index], inbounds=True, source_etype=I16)

    def build(self) -> None:
        b = self.b
        a, bmat, c = self.fn.args
        tid, bid = self.sreg("tid.x"), self.sreg("ctaid.x")
        blocks_n = self.n // TILE_N
        self.row0 = b.mul(b.udiv(bid, self.i32(blocks_n)), self.i32(TILE_M))
        self.col0 = b.mul(b.urem(bid, self.i32(blocks_n)), self.i32(TILE_N))
        warp, lane = b.lshr(tid, self.i32(5)), b.and_(tid, self.i32(31))
        self.wm = b.mul(b.lshr(warp, self.i32(2)), self.i32(64))
        self.wn = b.mul(b.and_(warp, self.i32(3)), self.i32(32))
        self.g, self.q2 = b.lshr(lane, self.i32(2)), b.shl(b.and_(lane, self.i32(3)),
                                                         self.i32(1))
        self.row16 = b.and_(lane, self.i32(15))                      # ldmatrix row of the lane
        self.half8 = b.mul(b.lshr(lane, self.i32(4)), self.i32(8))   # ... and its 8-column half
        self.tid = tid
        steps = self.k // TILE_K
        self.store_stage(self.load_tile(a, bmat, self.i32(0)), self.i32(0))
        self.barrier()
        before = b.block
        head = self.fn.append_basic_block("k.head")
        body = self.fn.append_basic_block("k.body")
        done = self.fn.append_basic_block("k.done")
        b.branch(head)
        b.position_at_end(head)
        kt = b.phi(I32, name="kt")
        kt.add_incoming(self.i32(0), before)
        accs = [b.phi(F32) for _ in range(64)]
        for p in accs:
            p.add_incoming(ir.Constant(F32, 0.0), before)
        b.cbranch(b.icmp_unsigned("<", kt, self.i32(steps)), body, done)
        b.position_at_end(body)
        following = b.add(kt, self.i32(1))
        # the next step's tiles into registers first (the last step reloads its own: harmless)
        nxt = b.select(b.icmp_unsigned("<", following, self.i32(steps)), following, kt)
        tiles = self.load_tile(a, bmat, b.mul(nxt, self.i32(TILE_K)))
        stage = b.and_(kt, self.i32(1))
        new = list(accs)
        for kk in (0, 16):
            new = self.products(stage, kk, new)
        self.store_stage(tiles, b.xor(stage, self.i32(1)))
        self.barrier()
        kt.add_incoming(following, b.block)
        for p, v in zip(accs, new):
            p.add_incoming(v, b.block)
        b.branch(head)
        b.position_at_end(done)
        self.store(c, accs)
        b.ret_void()

    def barrier(self) -> None:
        self.b.call(declare(self.module, "llvm.nvvm.barrier0", VOID, []), [])

    def load_tile(self, a: ir.Value, bmat: ir.Value, k0: ir.Value) -> list[tuple]:
        """This thread's share of A's 128×32 and B's 32×128 tiles at ``k0``: four 16-byte
        global loads, with the shared slots they go to."""
        b = self.b
        v4 = ir.VectorType(I32, 4)
        out = []
        for r in range(2):
            idx = b.add(self.tid, self.i32(r * THREADS))
            row, c8 = b.lshr(idx, self.i32(2)), b.shl(b.and_(idx, self.i32(3)), self.i32(3))
            at = b.add(b.mul(b.zext(b.add(self.row0, row), I64), ir.Constant(I64, self.k)),
                       b.zext(b.add(k0, c8), I64))
            out.append((self.a_s, A_STAGE, b.add(b.mul(row, self.i32(PAD)), c8),
                        b.load(self.global_at(a, at), typ=v4, align=16)))
            krow, n8 = b.lshr(idx, self.i32(4)), b.shl(b.and_(idx, self.i32(15)), self.i32(3))
            at = b.add(b.mul(b.zext(b.add(k0, krow), I64), ir.Constant(I64, self.n)),
                       b.zext(b.add(self.col0, n8), I64))
            out.append((self.b_s, B_STAGE, b.add(b.mul(krow, self.i32(B_PAD)), n8),
                        b.load(self.global_at(bmat, at), typ=v4, align=16)))
        return out

    def store_stage(self, tiles: list[tuple], stage: ir.Value) -> None:
        b = self.b
        for base, size, slot, value in tiles:
            at = b.add(b.mul(stage, self.i32(size)), slot)
            b.store(value, self.shared_at(base, at), align=16)

    def ldmatrix(self, base: ir.GlobalVariable, index: ir.Value, trans: bool) -> list[ir.Value]:
        """Four 8×8 b16 matrices from shared memory (``ldmatrix...x4``, ``.trans`` for B):
        this lane's row address is ``index``; returns the four fragment registers."""
        name = "llvm.nvvm.ldmatrix.sync.aligned.m8n8.x4" + (".trans" if trans else "") + ".b16"
        fn = declare(self.module, name, ir.LiteralStructType([I32] * 4),
                     [ir.PointerType(addrspace=SHARED)])
        got = self.b.call(fn, [self.shared_at(base, index)])
        return [self.b.extract_value(got, e) for e in range(4)]

    def products(self, stage: ir.Value, kk: int, accs: list[ir.Value]) -> list[ir.Value]:
        b = self.b
        a_base = b.mul(stage, self.i32(A_STAGE))
        b_base = b.mul(stage, self.i32(B_STAGE))
        frag_a = []
        for i in range(4):  # A rows wm + 16i + (lane % 16), columns kk + 8·(lane / 16)
            row = b.add(self.wm, b.add(self.row16, self.i32(i * 16)))
            col = b.add(self.half8, self.i32(kk))
            frag_a.append(self.ldmatrix(self.a_s, b.add(a_base, b.add(
                b.mul(row, self.i32(PAD)), col)), trans=False))
        frag_b = []
        for jj in range(2):  # B rows kk + (lane % 16), columns wn + 16jj + 8·(lane / 16)
            krow = b.add(self.row16, self.i32(kk))
            col = b.add(self.wn, b.add(self.half8, self.i32(jj * 16)))
            r = self.ldmatrix(self.b_s, b.add(b_base, b.add(b.mul(krow, self.i32(B_PAD)), col)),
                              trans=True)
            frag_b += [r[0:2], r[2:4]]
        result = ir.LiteralStructType([F32] * 4)
        mma = declare(self.module, "llvm.nvvm.mma.m16n8k16.row.col.bf16", result,
                      [I32] * 6 + [F32] * 4)
        out = list(accs)
        for i in range(4):
            for j in range(4):
                at = (i * 4 + j) * 4
                d = b.call(mma, [*frag_a[i], *frag_b[j], *accs[at:at + 4]])
                out[at:at + 4] = [b.extract_value(d, e) for e in range(4)]
        return out

    def store(self, c: ir.Value, accs: list[ir.Value]) -> None:
        b = self.b
        cvt = ir.InlineAsm(ir.FunctionType(I16, [F32]), "cvt.rn.bf16.f32 $0, $1;", "=h,f")
        for i in range(4):
            for j in range(4):
                at = (i * 4 + j) * 4
                row = b.add(self.row0, b.add(self.wm, b.add(self.g, self.i32(i * 16))))
                col = b.add(self.col0, b.add(self.wn, b.add(self.q2, self.i32(j * 8))))
                for half, rr in ((0, row), (2, b.add(row, self.i32(8)))):
                    index = b.add(b.mul(b.zext(rr, I64), ir.Constant(I64, self.n)),
                                  b.zext(col, I64))
                    lo, hi = accs[at + half], accs[at + half + 1]
                    if self.out is DType.f32:
                        pair = b.insert_element(b.insert_element(
                            ir.Constant(ir.VectorType(F32, 2), ir.Undefined), lo,
                            self.i32(0)), hi, self.i32(1))
                        ptr = b.gep(c, [index], inbounds=True, source_etype=F32)
                        b.store(pair, ptr, align=8)
                    else:
                        pair = b.insert_element(b.insert_element(
                            ir.Constant(ir.VectorType(I16, 2), ir.Undefined),
                            b.call(cvt, [lo]), self.i32(0)), b.call(cvt, [hi]), self.i32(1))
                        b.store(pair, self.global_at(c, index), align=4)


__all__ = ["MmaGemm", "mma_gemm", "supports"]
