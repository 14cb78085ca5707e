"""Warp-level PTX building blocks for kernels emitted directly as LLVM IR (the tensor-core
kernels: :mod:`tilefuse.codegen.nvptx_attention`).

One :class:`PtxBuilder` wraps an ``ir.IRBuilder`` positioned in a ``ptx_kernel`` function and
emits each primitive through an NVVM intrinsic or, where the intrinsic's name or signature
changed between LLVM versions (``cp.async`` with a source size, the packing conversions),
through inline PTX with the memory clobber that keeps LLVM from moving shared-memory accesses
across it. Every primitive is a thin, documented wrapper so that the kernels read as the
algorithm they implement.

Shared memory is one ``i16`` array per kernel (``addrspace(3)``); indices are in 16-bit
elements. Global pointers arrive generic and are cast to ``addrspace(1)`` once.
"""

from __future__ import annotations

from collections.abc import Sequence

from llvmlite import ir

from tilefuse.codegen.llvm_types import F32, I32, I64, PTR, VOID, declare

I16 = ir.IntType(16)
SHARED = 3
GLOBAL = 1
SHARED_PTR = ir.PointerType(addrspace=SHARED)
GLOBAL_PTR = ir.PointerType(addrspace=GLOBAL)


def kernel_function(module: ir.Module, name: str, params: int, threads: int,
                    min_blocks: int) -> ir.Function:
    """A ``ptx_kernel`` entry of ``params`` noalias pointers, annotated with its block size
    (``.maxntid``) and the blocks an SM should hold (``.minnctapersm``: ptxas caps the
    registers a thread so that many fit)."""
    fn = ir.Function(module, ir.FunctionType(VOID, [PTR] * params), name)
    fn.calling_convention = "ptx_kernel"
    fn.attributes.add("nounwind")
    for arg in fn.args:
        arg.add_attribute("noalias")
    annotations = module.add_named_metadata("nvvm.annotations")
    annotations.add(module.add_metadata([fn, ir.MetaDataString(module, "maxntidx"),
                                         ir.Constant(I32, threads)]))
    annotations.add(module.add_metadata([fn, ir.MetaDataString(module, "minctasm"),
                                         ir.Constant(I32, min_blocks)]))
    return fn


def shared_array(module: ir.Module, name: str, elements: int) -> ir.GlobalVariable:
    """A 16-byte aligned ``i16`` array in shared memory (opaque pointer: any access type)."""
    ty = ir.ArrayType(I16, elements)
    g = ir.GlobalVariable(module, ty, name, addrspace=SHARED)
    g.align = 16
    g.linkage = "internal"
    g.initializer = ir.Constant(ty, ir.Undefined)
    g.type = SHARED_PTR
    return g


class PtxBuilder:
    """Primitives over ``b`` (module docstring)."""

    def __init__(self, b: ir.IRBuilder, smem: ir.GlobalVariable):
        self.b = b
        self.module = b.module
        self.smem = smem

    # ---- constants, registers, addresses ----------------------------------------------
    @staticmethod
    def i32(v: int) -> ir.Constant:
        return ir.Constant(I32, v)

    @staticmethod
    def i64(v: int) -> ir.Constant:
        return ir.Constant(I64, v)

    @staticmethod
    def f32(v: float) -> ir.Constant:
        return ir.Constant(F32, v)

    def sreg(self, reg: str) -> ir.Value:
        return self.b.call(declare(self.module, f"llvm.nvvm.read.ptx.sreg.{reg}", I32, []), [])

    def shared_at(self, index: ir.Value) -> ir.Value:
        """The shared-memory address of element ``index`` (i32) of the kernel's array."""
        return self.b.gep(self.smem, [self.i32(0), index], inbounds=True,
                          source_etype=self.smem.value_type)

    def global_ptr(self, ptr: ir.Value) -> ir.Value:
        return self.b.addrspacecast(ptr, GLOBAL_PTR)

    def global_at(self, base: ir.Value, index: ir.Value) -> ir.Value:
        """Element ``index`` (i64) of the 16-bit global array ``base`` (addrspace 1)."""
        return self.b.gep(base, [index], inbounds=True, source_etype=I16)

    def asm(self, ret: ir.Type, args: Sequence[ir.Value], text: str, constraints: str,
            side_effect: bool = False) -> ir.Value:
        fn = ir.InlineAsm(ir.FunctionType(ret, [a.type for a in args]), text, constraints,
                          side_effect=side_effect)
        return self.b.call(fn, list(args))

    # ---- synchronisation and asynchronous copies --------------------------------------
    def barrier(self) -> None:
        self.b.call(declare(self.module, "llvm.nvvm.barrier0", VOID, []), [])

    def cp_async16(self, dst: ir.Value, src: ir.Value, src_bytes: ir.Value | None = None
                   ) -> None:
        """``cp.async.cg.shared.global`` of 16 bytes from global ``src`` to shared ``dst``
        (L2 only, bypassing L1); with ``src_bytes`` (i32: 16 or 0) the rest is zero-filled,
        so a copy of a row past the end writes zeros and reads nothing."""
        if src_bytes is None:
            self.asm(VOID, [dst, src], "cp.async.cg.shared.global [$0], [$1], 16;",
                     "l,l,~{memory}", side_effect=True)
        else:
            self.asm(VOID, [dst, src, src_bytes],
                     "cp.async.cg.shared.global [$0], [$1], 16, $2;", "l,l,r,~{memory}",
                     side_effect=True)

    def cp_async_commit(self) -> None:
        self.asm(VOID, [], "cp.async.commit_group;", "~{memory}", side_effect=True)

    def cp_async_wait(self, pending: int) -> None:
        """Wait until at most ``pending`` of this thread's committed copy groups are in
        flight (the copies are then visible to this thread; a barrier makes them visible
        to the block)."""
        self.asm(VOID, [], f"cp.async.wait_group {pending};", "~{memory}", side_effect=True)

    # ---- tensor-core fragments ---------------------------------------------------------
    def ldmatrix_x4(self, index: ir.Value, trans: bool = False) -> list[ir.Value]:
        """Four 8×8 b16 matrices from shared memory: this lane's row starts at element
        ``index``; lanes 8i..8i+7 address matrix i. Returns the four fragment registers."""
        name = "llvm.nvvm.ldmatrix.sync.aligned.m8n8.x4" + (".trans" if trans else "") + ".b16"
        fn = declare(self.module, name, ir.LiteralStructType([I32] * 4), [SHARED_PTR])
        got = self.b.call(fn, [self.shared_at(index)])
        return [self.b.extract_value(got, e) for e in range(4)]

    def mma_16816(self, a: Sequence[ir.Value], b2: Sequence[ir.Value],
                  c: Sequence[ir.Value], f16: bool = False) -> list[ir.Value]:
        """``D = A·B + C``, m16n8k16, bf16 (or f16) operands, f32 accumulators."""
        name = "llvm.nvvm.mma.m16n8k16.row.col." + ("f32.f32" if f16 else "bf16")
        operand = ir.VectorType(ir.HalfType(), 2) if f16 else I32
        fn = declare(self.module, name, ir.LiteralStructType([F32] * 4),
                     [operand] * 6 + [F32] * 4)
        ops = [self.b.bitcast(x, operand) for x in (*a, *b2)] if f16 else [*a, *b2]
        d = self.b.call(fn, [*ops, *c])
        return [self.b.extract_value(d, e) for e in range(4)]

    def pack2(self, lo: ir.Value, hi: ir.Value, f16: bool = False) -> ir.Value:
        """Two f32 rounded to nearest even into one b32 register of two 16-bit floats,
        ``lo`` in the low half (the layout of an mma operand pair)."""
        kind = "f16x2" if f16 else "bf16x2"
        return self.asm(I32, [hi, lo], f"cvt.rn.{kind}.f32 $0, $1, $2;", "=r,f,f")

    # ---- arithmetic ---------------------------------------------------------------------
    def ex2(self, x: ir.Value) -> ir.Value:
        """2**x on the special-function unit (``ex2.approx.ftz.f32``: -inf gives 0)."""
        return self.b.call(declare(self.module, "llvm.nvvm.ex2.approx.ftz.f", F32, [F32]), [x])

    def ex2_pair(self, x: ir.Value, f16: bool = False) -> ir.Value:
        """2**x of both 16-bit halves of ``x`` in one special-function instruction
        (``ex2.approx.ftz.bf16x2``, sm_90; ``ex2.approx.f16x2`` for f16)."""
        text = "ex2.approx.f16x2 $0, $1;" if f16 else "ex2.approx.ftz.bf16x2 $0, $1;"
        return self.asm(I32, [x], text, "=r,r")

    def fmax(self, a: ir.Value, b: ir.Value) -> ir.Value:
        return self.b.call(declare(self.module, "llvm.maxnum.f32", F32, [F32, F32]), [a, b])

    def fma(self, a: ir.Value, b: ir.Value, c: ir.Value) -> ir.Value:
        return self.b.call(declare(self.module, "llvm.fma.f32", F32, [F32, F32, F32]),
                           [a, b, c])

    def shfl_xor(self, x: ir.Value, mask: int) -> ir.Value:
        fn = declare(self.module, "llvm.nvvm.shfl.sync.bfly.f32", F32, [I32, F32, I32, I32])
        return self.b.call(fn, [self.i32(-1), x, self.i32(mask), self.i32(0x1F)])

    def quad_reduce(self, x: ir.Value, combine: str) -> ir.Value:
        """``x`` combined over the 4 lanes of a quad (lanes 4g..4g+3: one mma row)."""
        for mask in (1, 2):
            other = self.shfl_xor(x, mask)
            x = self.fmax(x, other) if combine == "max" else self.b.fadd(x, other)
        return x

    def half_to_f32(self, bits: ir.Value, f16: bool = False) -> ir.Value:
        """A 16-bit float (as i16) widened to f32 exactly."""
        if f16:
            return self.b.fpext(self.b.bitcast(bits, ir.HalfType()), F32)
        return self.b.bitcast(self.b.shl(self.b.zext(bits, I32), self.i32(16)), F32)


__all__ = ["GLOBAL_PTR", "I16", "SHARED_PTR", "PtxBuilder", "kernel_function", "shared_array"]
