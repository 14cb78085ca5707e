"""A generated tensor-core matrix product for the ``cuda`` target: ``C[M,N] = A[M,K] · B[K,N]``,
bf16 operands, f32 accumulation, bf16 or f32 output, emitted as LLVM IR through llvmlite and
compiled by LLVM's NVPTX back end (``mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32``
from the ``llvm.nvvm.mma.m16n8k16.row.col.bf16`` intrinsic).

Schedule (fixed; the executable times it against cuBLAS and keeps the faster):

* a block of 256 threads (8 warps) owns a 128×128 tile of C; warp ``w`` owns rows
  ``(w // 4)·64 ..+64`` and columns ``(w % 4)·32 ..+32`` of it: 4×4 ``m16n8`` accumulators,
  64 f32 registers a thread;
* per step of 32 along K the block stages A's 128×32 tile in shared memory as is (16-byte
  loads and stores, two a thread) and B's 32×128 tile transposed (``Bᵀ[n][k]``), so every
  fragment register is one 32-bit shared load of two consecutive k; rows are padded to 40
  elements (80 bytes), so the fragment loads of a warp hit 32 different banks;
* fragments follow PTX's m16n8k16 layout: thread ``lane`` holds A rows ``lane/4`` and
  ``lane/4 + 8``, k pairs ``2·(lane%4)`` and ``+8``; B column ``lane/4``; C rows ``lane/4``,
  ``+8`` and column pairs ``2·(lane%4)``;
* two barriers a step (after staging, after the step's products); no double buffering.

Shapes: M and N multiples of 128, K of 32 (else :class:`CompileError`: the product stays on
cuBLAS). No epilogue is fused yet: the group's epilogue runs as the next kernel either way.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache

import llvmlite.binding as llvm
from llvmlite import ir

from tilefuse.codegen.llvm_nvptx import PTX_TRIPLE, SM90, GpuTarget, gpu_target_machine
from tilefuse.codegen.llvm_types import F32, I32, I64, PTR, VOID, declare
from tilefuse.dtypes import DType
from tilefuse.errors import CompileError

TILE_M = TILE_N = 128
TILE_K = 32
THREADS = 256
PAD = 40  # elements per shared row (32 + 8): 80 bytes, conflict-free fragment loads
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
    try:
        parsed = llvm.parse_assembly(str(module))
        parsed.verify()
    except RuntimeError as exc:
        raise CompileError(f"LLVM rejected the tensor-core kernel {name}: {exc}") from exc
    from tilefuse.codegen.jit import optimise

    tm = gpu_target_machine(target)
    optimise(parsed, tm)
    return MmaGemm(name, m, n, k, out_dtype, tm.emit_assembly(parsed))


class _Kernel:
    def __init__(self, module: ir.Module, name: str, m: int, n: int, k: int, out: DType):
        self.module, self.m, self.n, self.k, self.out = module, m, n, k, out
        fn = ir.Function(module, ir.FunctionType(VOID, [PTR, PTR, PTR]), name)
        fn.calling_convention = "ptx_kernel"
        for arg in fn.args:
            arg.add_attribute("noalias")
        self.fn = fn
        self.b = ir.IRBuilder(fn.append_basic_block("entry"))
        shared = ir.ArrayType(I16, TILE_M * PAD)
        self.a_s = self._shared("a_tile", shared)
        self.bt_s = self._shared("bt_tile", shared)

    def _shared(self, name: str, ty: ir.Type) -> ir.GlobalVariable:
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
        a, bm_, c = self.fn.args
        tid, bid = self.sreg("tid.x"), self.sreg("ctaid.x")
        blocks_n = self.n // TILE_N
        self.row0 = b.mul(b.udiv(bid, self.i32(blocks_n)), self.i32(TILE_M))
        self.col0 = b.mul(b.urem(bid, self.i32(blocks_n)), self.i32(TILE_N))
        warp, lane = b.lshr(tid, self.i32(5)), b.and_(tid, self.i32(31))
        self.wm = b.mul(b.lshr(warp, self.i32(2)), self.i32(64))
        self.wn = b.mul(b.and_(warp, self.i32(3)), self.i32(32))
        self.g, self.q2 = b.lshr(lane, self.i32(2)), b.shl(b.and_(lane, self.i32(3)),
                                                         self.i32(1))
        self.tid = tid
        zero = ir.Constant(F32, 0.0)
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
            p.add_incoming(zero, before)
        b.cbranch(b.icmp_unsigned("<", kt, self.i32(self.k // TILE_K)), body, done)
        b.position_at_end(body)
        k0 = b.mul(kt, self.i32(TILE_K))
        self.stage(a, bm_, k0)
        new = list(accs)
        for kk in (0, 16):
            new = self.products(kk, new)
        self.barrier()
        kt.add_incoming(b.add(kt, self.i32(1)), b.block)
        for p, v in zip(accs, new):
            p.add_incoming(v, b.block)
        b.branch(head)
        b.position_at_end(done)
        self.store(c, accs)
        b.ret_void()

    def barrier(self) -> None:
        self.b.call(declare(self.module, "llvm.nvvm.barrier0", VOID, []), [])

    def stage(self, a: ir.Value, bmat: ir.Value, k0: ir.Value) -> None:
        """A's and Bᵀ's tiles for this K step into shared memory, then a barrier."""
        b = self.b
        v4 = ir.VectorType(I32, 4)
        v8 = ir.VectorType(I16, 8)
        for r in range(2):
            idx = b.add(self.tid, self.i32(r * THREADS))
            row, c8 = b.lshr(idx, self.i32(2)), b.shl(b.and_(idx, self.i32(3)), self.i32(3))
            at = b.add(b.mul(b.zext(b.add(self.row0, row), I64), ir.Constant(I64, self.k)),
                       b.zext(b.add(k0, c8), I64))
            value = b.load(self.global_at(a, at), typ=v4, align=16)
            b.store(value, self.shared_at(self.a_s, b.add(b.mul(row, self.i32(PAD)), c8)),
                    align=16)
            krow, n8 = b.lshr(idx, self.i32(4)), b.shl(b.and_(idx, self.i32(15)), self.i32(3))
            at = b.add(b.mul(b.zext(b.add(k0, krow), I64), ir.Constant(I64, self.n)),
                       b.zext(b.add(self.col0, n8), I64))
            row8 = b.load(self.global_at(bmat, at), typ=v8, align=16)
            for e in range(8):
                slot = b.add(b.mul(b.add(n8, self.i32(e)), self.i32(PAD)), krow)
                b.store(b.extract_element(row8, self.i32(e)), self.shared_at(self.bt_s, slot),
                        align=2)
        self.barrier()

    def pair(self, base: ir.GlobalVariable, row: ir.Value, col: ir.Value) -> ir.Value:
        """Two consecutive bf16 of a shared tile as one i32."""
        b = self.b
        ptr = self.shared_at(base, b.add(b.mul(row, self.i32(PAD)), col))
        return b.load(ptr, typ=I32, align=4)

    def products(self, kk: int, accs: list[ir.Value]) -> list[ir.Value]:
        b = self.b
        col = b.add(self.q2, self.i32(kk))
        col8 = b.add(col, self.i32(8))
        frag_a = []
        for i in range(4):
            r = b.add(self.wm, b.add(self.g, self.i32(i * 16)))
            r8 = b.add(r, self.i32(8))
            frag_a.append([self.pair(self.a_s, r, col), self.pair(self.a_s, r8, col),
                           self.pair(self.a_s, r, col8), self.pair(self.a_s, r8, col8)])
        frag_b = []
        for j in range(4):
            nn = b.add(self.wn, b.add(self.g, self.i32(j * 8)))
            frag_b.append([self.pair(self.bt_s, nn, col), self.pair(self.bt_s, nn, col8)])
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
