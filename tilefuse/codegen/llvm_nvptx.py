"""Loop IR -> LLVM IR -> PTX for NVIDIA GPUs (``nvptx64-nvidia-cuda``, sm_90 by default).

The same loop IR the CPU compiles becomes a GPU kernel: statements, expressions and the vector
math are the CPU lowering's (:class:`~tilefuse.codegen.llvm_cpu.LoopLowering`); only the entry
point and ``parallel`` loops change. The kernel is::

    .entry <name>(ptr buffer0, ..., i64 scalar0, ...)

(``ptx_kernel`` calling convention; the driver passes each argument by address).

Execution model, written once here and checked by :func:`check_gpu_kernel`:

* Every thread of the launch runs the kernel body. A top-level ``parallel`` loop is a
  *grid-stride* loop: thread ``g`` of ``T`` (``g = blockIdx.x * blockDim.x + threadIdx.x``,
  ``T = gridDim.x * blockDim.x``) runs iterations ``start + (g + j*T) * step``, so any grid
  size is correct and consecutive threads touch consecutive iterations (coalesced accesses
  when the iteration indexes the innermost axis).
* A top-level ``let`` runs on every thread (it only reads); any other top-level statement (a
  scalar tail, a one-element store) runs on thread 0 alone.
* Top-level statements run concurrently, so none may read a buffer another one writes (there
  is no grid-wide barrier); a ``parallel`` loop may not sit inside another loop or an ``If``;
  ``thread_id`` (the CPU's per-thread scratch index) has no meaning on the GPU. Kernels that
  break these rules get a :class:`CompileError` naming the rule.
* A vector access of ``n`` lanes is aligned to ``n`` elements (so it becomes one
  ``ld.global.v4``): the GPU lowerings emit vectors only at lane-multiple indices of buffers
  with the output's layout, and device buffers are 256-byte aligned. (The CPU assumes element
  alignment only.)
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from functools import cache

import llvmlite.binding as llvm
from llvmlite import ir

from tilefuse.codegen.llvm_cpu import FnState, LoopLowering
from tilefuse.codegen.llvm_ops import LLVMOps
from tilefuse.codegen.llvm_types import (
    F32,
    I32,
    I64,
    PTR,
    VOID,
    constant,
    declare,
    intrinsic,
    llvm_type,
)
from tilefuse.codegen.simt import LANE, to_simt
from tilefuse.dtypes import DType
from tilefuse.errors import CompileError, TilefuseError
from tilefuse.loop.ir import (
    REDUCE,
    Block,
    BufferParam,
    Expr,
    For,
    Let,
    LoopFunction,
    LoopKind,
    LType,
    Stmt,
    Store,
    XOp,
    expr_children,
    walk_expr,
    walk_stmts,
)
from tilefuse.loop.simplify import fold_expr
from tilefuse.loop.verify import verify

PTX_TRIPLE = "nvptx64-nvidia-cuda"
LOG2_E = 1.4426950408889634
_COMBINE = {XOp.REDUCE_ADD: "add", XOp.REDUCE_MAX: "max", XOp.REDUCE_MIN: "min"}


@dataclass(frozen=True)
class GpuTarget:
    """The GPU a kernel is compiled for: compute capability (``sm_90``: Hopper) and the PTX ISA
    version LLVM emits (8.0 is the first with sm_90)."""

    arch: str = "sm_90"
    ptx_isa: int = 80
    block_threads: int = 256
    max_blocks: int = 1 << 20
    """At most this many blocks a launch: enough that every warp of a static kernel runs one
    iteration of its grid-stride loop (a cap of 16 blocks an SM was slower: PERFORMANCE_LOG)."""
    row_unroll: int = 4
    """Independent accumulators per warp in row reductions (loads in flight)."""
    elementwise_unroll: int = 4
    """16-byte runs per thread and iteration in flat elementwise kernels (loads in flight)."""
    register_row: int = 128
    """Rows of at most this many elements per warp thread are held in registers (read once)."""
    long_row_block: int = 128
    """Threads a block for register rows of more than 64 elements a thread (~255 registers)."""
    reciprocal_divisors: int = 0
    """1: divide by a broadcast f32 scalar (softmax's row sum) through its reciprocal."""
    resident_grid: int = 0
    """1: launch at most the blocks the device holds at once (from the driver's occupancy).
    Off by default: measured on an H200 it slowed layer norm (f32 [32768,4096] 0.287 ->
    0.333 ms) and changed the other workloads by at most 1 %."""

    @property
    def triple(self) -> str:
        return PTX_TRIPLE

    def __str__(self) -> str:
        return f"{PTX_TRIPLE} {self.arch} ptx{self.ptx_isa}"


SM90 = GpuTarget()
"""The default: Hopper (H100, H200)."""


@cache
def gpu_target_machine(target: GpuTarget) -> llvm.TargetMachine:
    llvm.initialize_all_targets()
    llvm.initialize_all_asmprinters()
    return llvm.Target.from_triple(PTX_TRIPLE).create_target_machine(
        cpu=target.arch, features=f"+ptx{target.ptx_isa}", opt=3)


# ----------------------------------------------------------------------------- rules


def check_gpu_kernel(fn: LoopFunction) -> None:
    """CompileError unless ``fn`` follows the GPU execution model (module docstring)."""
    top = fn.body.stmts if isinstance(fn.body, Block) else (fn.body,)
    writes = [_stored_buffers(s) for s in top]
    for i, s in enumerate(top):
        nested = [n for n in walk_stmts(s) if isinstance(n, For)
                  and n.kind is LoopKind.PARALLEL and n is not s]
        if nested:
            raise CompileError(f"kernel {fn.name}: a parallel loop ({nested[0].var}) inside "
                               f"another statement cannot run on the GPU")
        if any(e.op is XOp.THREAD_ID for n in walk_stmts(s) for c in expr_children(n)
               for e in walk_expr(c)):
            raise CompileError(f"kernel {fn.name}: thread_id (per-thread CPU scratch) has "
                               f"no GPU meaning")
        reads = _loaded_buffers(s)
        for j, written in enumerate(writes):
            clash = reads & written if j != i else set()
            if clash:
                raise CompileError(f"kernel {fn.name}: statement {i} reads {sorted(clash)} "
                                   f"written by statement {j}; the GPU has no grid barrier")


def _stored_buffers(s: Stmt) -> set[str]:
    return {n.buffer for n in walk_stmts(s) if isinstance(n, Store)}


def _loaded_buffers(s: Stmt) -> set[str]:
    return {e.arg for n in walk_stmts(s) for c in expr_children(n)  # type: ignore[misc]
            for e in walk_expr(c) if e.op is XOp.LOAD}


def launch_extent(fn: LoopFunction) -> int | None:
    """The most iterations any top-level parallel loop of ``fn`` has (1 without one): the
    number of threads worth launching; None when a bound is not a constant (the grid-stride
    loops are correct for any launch, so the caller picks a full grid)."""
    top = fn.body.stmts if isinstance(fn.body, Block) else (fn.body,)
    most = 1
    for s in top:
        if isinstance(s, For) and s.kind is LoopKind.PARALLEL:
            start, stop = fold_expr(s.start), fold_expr(s.stop)
            if start.op is not XOp.CONST or stop.op is not XOp.CONST:
                return None
            most = max(most, -(-(int(stop.arg) - int(start.arg)) // s.step))  # type: ignore
    return most


# ----------------------------------------------------------------------------- lowering


class NvptxOps(LLVMOps):
    """The scalar ops with the GPU's special-function unit for f32 (the CPU's generated
    polynomials for everything else): ``exp`` as ``ex2.approx`` of ``x·log2(e)``, division as
    ``div.full`` (2 ulp), ``rsqrt`` as ``rsqrt.approx``, ``sigmoid`` from those. Each is within
    a few ulp of the correctly rounded result (relative error below 1e-6 for the arguments the
    numerics contract covers), an order of magnitude inside the f32 tolerance; this is the
    trade every GPU compiler makes for memory-bound kernels to stay memory-bound."""

    def _nvvm(self, name: str, x: ir.Value, *more: ir.Value) -> ir.Value:
        """``name`` applied lane by lane (the NVVM intrinsics are scalar)."""
        args = (x, *more)
        fn = declare(self.b.module, name, F32, [F32] * len(args))
        if not isinstance(x.type, ir.VectorType):
            return self.b.call(fn, list(args))
        out: ir.Value = ir.Constant(x.type, ir.Undefined)
        for lane in range(x.type.count):
            index = ir.Constant(I32, lane)
            parts = [self.b.extract_element(a, index) for a in args]
            out = self.b.insert_element(out, self.b.call(fn, parts), index)
        return out

    def exp(self, t: LType, x: ir.Value) -> ir.Value:
        if t.dtype is not DType.f32:
            return super().exp(t, x)
        return self._nvvm("llvm.nvvm.ex2.approx.f", self.b.fmul(x, constant(t, LOG2_E)))

    def exp_nonpos(self, t: LType, x: ir.Value) -> ir.Value:
        return self.exp(t, x)

    def div(self, t: LType, a: ir.Value, b: ir.Value) -> ir.Value:
        if t.dtype is not DType.f32:
            return super().div(t, a, b)
        return self._nvvm("llvm.nvvm.div.full", a, b)

    def rsqrt(self, t: LType, x: ir.Value) -> ir.Value:
        if t.dtype is not DType.f32:
            return super().rsqrt(t, x)
        return self._nvvm("llvm.nvvm.rsqrt.approx.f", x)

    def f32_to_bf16(self, x: ir.Value, lanes: int) -> ir.Value:
        """Round to nearest even with the hardware's ``cvt.rn.bf16.f32`` (sm_80+), lane by
        lane: one instruction instead of the CPU's eight integer ones (a NaN becomes the
        canonical NaN)."""
        i16 = ir.IntType(16)
        cvt = ir.InlineAsm(ir.FunctionType(i16, [F32]), "cvt.rn.bf16.f32 $0, $1;", "=h,f")
        if lanes == 1:
            return self.b.call(cvt, [x])
        out: ir.Value = ir.Constant(ir.VectorType(i16, lanes), ir.Undefined)
        for lane in range(lanes):
            index = ir.Constant(I32, lane)
            out = self.b.insert_element(out, self.b.call(cvt, [self.b.extract_element(x, index)]),
                                        index)
        return out

    def erf(self, t: LType, x: ir.Value) -> ir.Value:
        """f32 erf, branch-free: ``x + x·P(x²)`` below 475/512, ``1 - exp(Q(|x|))`` (sign
        restored) above, with the ``ex2.approx`` exp; the minimax polynomials of N. Juffa's
        ``erff`` (about 1 ulp with a correctly rounded exp; 1.2 ulp measured here over
        [-6, 6] against SciPy). The CPU's erf evaluates a 14-term Chebyshev series and a
        polynomial exp for every element, which made GELU epilogues compute-bound."""
        if t.dtype is not DType.f32:
            return super().erf(t, x)
        a = intrinsic(self.b, "fabs", [x])
        s = self.b.fmul(x, x)

        def horner(v: ir.Value, first: ir.Value, coeffs: tuple[float, ...]) -> ir.Value:
            for c in coeffs:
                first = self.fma(t, first, v, constant(t, c))
            return first

        r = horner(s, self.fma(t, constant(t, -1.72853470e-5), a, constant(t, 3.83197126e-4)),
                   ())
        u = self.fma(t, constant(t, -3.88396438e-3), a, constant(t, 2.42546219e-2))
        r = horner(a, self.fma(t, r, s, u), (-1.06777877e-1, -6.34846687e-1, -1.28717512e-1))
        r = self.fma(t, r, a, self.b.fneg(a))
        big = intrinsic(self.b, "copysign", [self.b.fsub(constant(t, 1.0), self.exp(t, r)), x])
        small = horner(s, constant(t, -5.96761703e-4),
                       (4.99119423e-3, -2.67681349e-2, 1.12819925e-1, -3.76125336e-1,
                        1.28379166e-1))
        small = self.fma(t, small, x, x)
        return self.b.select(self.b.fcmp_ordered(">", a, constant(t, 0.927734375)), big, small)

    def sigmoid(self, t: LType, x: ir.Value) -> ir.Value:
        if t.dtype is not DType.f32:
            return super().sigmoid(t, x)
        return self.div(t, constant(t, 1.0), self.b.fadd(constant(t, 1.0),
                                                         self.exp(t, self.b.fneg(x))))


class NvptxLowering(LoopLowering):
    """:class:`LoopLowering` with a ``ptx_kernel`` entry and grid-stride parallel loops.

    With ``simt_width`` > 1 the function is in per-thread warp form (:mod:`tilefuse.codegen.simt`):
    the *workers* that parallel loops and thread-0 sections count are warps, not threads, and
    ``reduce_*`` combine across the warp with butterfly shuffles."""

    ops_class = NvptxOps

    def __init__(self, fn: LoopFunction, module: ir.Module, simt_width: int = 1,
                 reciprocal_divisors: bool = False):
        super().__init__(fn, module)
        self.simt_width = simt_width
        self.reciprocal_divisors = reciprocal_divisors
        self._splats: dict[str, Expr] = {}   # let name -> the scalar it broadcasts

    def stmt(self, st: FnState, s: Stmt) -> None:
        if isinstance(s, Let) and s.value.op is XOp.BROADCAST:
            self._splats[s.name] = s.value.args[0]
        super().stmt(st, s)

    def _splat_of(self, e: Expr) -> Expr | None:
        """The scalar a vector expression broadcasts (directly or through a ``let``)."""
        if e.op is XOp.BROADCAST:
            return e.args[0]
        return self._splats.get(e.arg) if e.op is XOp.VAR else None  # type: ignore[arg-type]

    def reciprocal_divide(self, st: FnState, e: Expr, memo: dict[int, ir.Value]
                          ) -> ir.Value | None:
        """``x / bcast(s)`` as ``x · bcast(1/s)`` (one ``div.full`` per row instead of one per
        element; ~1 ulp more), when enabled and the divisor is a broadcast f32 scalar."""
        scalar = self._splat_of(e.args[1]) if self.reciprocal_divisors else None
        if scalar is None or e.type.dtype is not DType.f32 or e.lanes == 1:
            return None
        inverse = st.ops.div(scalar.type, constant(scalar.type, 1.0),
                             self.expr(st, scalar, memo))
        splat = st.b.insert_element(ir.Constant(llvm_type(e.type), ir.Undefined), inverse,
                                    ir.Constant(I32, 0))
        splat = st.b.shuffle_vector(splat, ir.Constant(llvm_type(e.type), ir.Undefined),
                                    ir.Constant(ir.VectorType(I32, e.lanes), [0] * e.lanes))
        return st.b.fmul(self.expr(st, e.args[0], memo), splat)

    def lower(self) -> None:
        names = [(s, I64) for s in self.fn.scalars]
        impl, state = self.define(f"{self.fn.name}.impl", list(self.fn.buffers), names)
        b = state.b
        tid = self._sreg(b, "tid.x")
        ntid = self._sreg(b, "ntid.x")
        ctaid = self._sreg(b, "ctaid.x")
        nctaid = self._sreg(b, "nctaid.x")
        gid = b.add(b.mul(ctaid, ntid), tid, name="gid")
        threads = b.mul(nctaid, ntid, name="nthreads")
        if self.simt_width > 1:
            shift = ir.Constant(I64, self.simt_width.bit_length() - 1)
            state.env[LANE] = b.and_(tid, ir.Constant(I64, self.simt_width - 1), name="lane")
            gid, threads = b.lshr(gid, shift, name="warp"), b.lshr(threads, shift)
        self.global_id, self.grid_threads = gid, threads
        top = self.fn.body.stmts if isinstance(self.fn.body, Block) else (self.fn.body,)
        serial: list[Stmt] = []
        for s in top:
            if (isinstance(s, For) and s.kind is LoopKind.PARALLEL) or isinstance(s, Let):
                self._on_thread_zero(state, serial)
                serial = []
                self.stmt(state, s)
            else:
                serial.append(s)
        self._on_thread_zero(state, serial)
        state.b.ret_void()
        self.define_entry(impl)

    def define_entry(self, impl: ir.Function) -> None:
        params = [PTR] * len(self.fn.buffers) + [I64] * len(self.fn.scalars)
        entry = ir.Function(self.module, ir.FunctionType(VOID, params), self.fn.name)
        entry.calling_convention = "ptx_kernel"
        entry.attributes.add("nounwind")
        for arg, buf in zip(entry.args, self.fn.buffers):
            arg.name = buf.name
        b = ir.IRBuilder(entry.append_basic_block("entry"))
        b.call(impl, list(entry.args))
        b.ret_void()

    def _sreg(self, b: ir.IRBuilder, reg: str) -> ir.Value:
        fn = declare(self.module, f"llvm.nvvm.read.ptx.sreg.{reg}", I32, [])
        return b.zext(b.call(fn, []), I64)

    def _on_thread_zero(self, st: FnState, stmts: list[Stmt]) -> None:
        """``stmts`` on thread 0 only (``let``s run on every thread: they only read)."""
        if not stmts:
            return
        b = st.b
        then_bb = st.fn.append_basic_block("thread0")
        merge = st.fn.append_basic_block("thread0.done")
        b.cbranch(b.icmp_unsigned("==", self.global_id, ir.Constant(I64, 0)), then_bb, merge)
        b.position_at_end(then_bb)
        for s in stmts:
            self.stmt(st, s)
        b.branch(merge)
        b.position_at_end(merge)

    def parallel(self, st: FnState, s: For, start: ir.Value, stop: ir.Value) -> None:
        """A grid-stride loop: this thread's iterations are ``start + (gid + j*T) * step``."""
        b = st.b
        step = ir.Constant(I64, s.step)
        first = b.add(start, b.mul(self.global_id, step))
        stride = b.mul(self.grid_threads, step)
        self.serial(st, s.var, first, stop, stride, s.body)

    def access_align(self, buf: BufferParam, lanes: int) -> int:
        """Vector accesses are lane-aligned on the GPU (module docstring): 128-bit loads."""
        return buf.dtype.itemsize * lanes

    def expr(self, st: FnState, e: Expr, memo: dict[int, ir.Value]) -> ir.Value:
        if e.op is XOp.THREAD_ID:
            raise CompileError(f"kernel {self.fn.name}: thread_id has no GPU meaning")
        if self.simt_width > 1 and e.op in REDUCE and id(e) not in memo:
            memo[id(e)] = self.warp_reduce(st, e, memo)
        if e.op is XOp.DIV and id(e) not in memo:
            value = self.reciprocal_divide(st, e, memo)
            if value is not None:
                memo[id(e)] = value
        return super().expr(st, e, memo)

    def warp_reduce(self, st: FnState, e: Expr, memo: dict[int, ir.Value]) -> ir.Value:
        """The thread's lanes folded, then folded across the warp (every lane gets it)."""
        arg = e.args[0]
        wide = _SHUFFLED.get(arg.dtype)
        if wide is None:
            raise CompileError(f"kernel {self.fn.name}: warp {e.op} of {arg.dtype} is not "
                               f"supported")
        value = self.expr(st, arg, memo) if arg.lanes == 1 else super().expr(st, e, memo)
        if wide is not arg.dtype:  # narrow types fold as i32 / f32 (exact for max, min, add)
            value = self._convert(st, value, arg.dtype, wide)
        scalar = LType(wide)
        ty = llvm_type(scalar)
        suffix = "f32" if wide is DType.f32 else "i32"
        shuffle = declare(self.module, f"llvm.nvvm.shfl.sync.bfly.{suffix}",
                          ty if wide.itemsize == 4 else I32, [I32, ty, I32, I32]
                          if wide.itemsize == 4 else [I32, I32, I32, I32])
        combine = getattr(st.ops, _COMBINE[e.op])
        offset = self.simt_width // 2
        while offset:
            args = [ir.Constant(I32, offset), ir.Constant(I32, 0x1F)]
            if wide.itemsize == 4:
                other = st.b.call(shuffle, [ir.Constant(I32, -1), value, *args])
            else:  # 64-bit values cross the warp as two 32-bit halves
                other = self._shuffle64(st, shuffle, value, ty, args)
            value = combine(scalar, value, other)
            offset //= 2
        if wide is not arg.dtype:
            value = self._convert(st, value, wide, arg.dtype)
        return value

    @staticmethod
    def _shuffle64(st: FnState, shuffle: ir.Function, value: ir.Value, ty: ir.Type,
                   args: list[ir.Value]) -> ir.Value:
        """A 64-bit ``value`` (i64 or f64) shuffled as its low and high 32-bit halves."""
        i64 = ir.IntType(64)
        bits = st.b.bitcast(value, i64) if ty != i64 else value
        lo = st.b.trunc(bits, I32)
        hi = st.b.trunc(st.b.lshr(bits, ir.Constant(i64, 32)), I32)
        lo, hi = (st.b.call(shuffle, [ir.Constant(I32, -1), half, *args]) for half in (lo, hi))
        joined = st.b.or_(st.b.shl(st.b.zext(hi, i64), ir.Constant(i64, 32)), st.b.zext(lo, i64))
        return st.b.bitcast(joined, ty) if ty != i64 else joined

    @staticmethod
    def _convert(st: FnState, value: ir.Value, source: DType, dest: DType) -> ir.Value:
        """``value`` from ``source`` to ``dest`` (one of them is _SHUFFLED's wide type)."""
        to = llvm_type(LType(dest))
        if dest.is_float:
            return st.b.fpext(value, to) if dest.itemsize > source.itemsize \
                else st.b.fptrunc(value, to)
        if to.width <= value.type.width:
            return st.b.trunc(value, to) if value.type != to else value
        return st.b.zext(value, to) if source in _UNSIGNED else st.b.sext(value, to)


_UNSIGNED = frozenset({DType.bool, DType.u8})
_SHUFFLED = {DType.f32: DType.f32, DType.i32: DType.i32, DType.f16: DType.f32,
             DType.bf16: DType.f32, DType.bool: DType.i32, DType.u8: DType.i32,
             DType.i8: DType.i32, DType.i16: DType.i32, DType.i64: DType.i64,
             DType.f64: DType.f64}
"""The type a warp reduction of each dtype shuffles (32-bit shuffles; 64-bit types in two)."""


def lower_to_nvptx_ir(fn: LoopFunction, target: GpuTarget = SM90,
                      simt_width: int = 1) -> ir.Module:
    """The LLVM module (NVPTX triple and data layout) of ``fn``; CompileError if ``fn`` breaks
    the GPU execution model or lowering fails. ``simt_width`` > 1 spreads vectors over warps
    of that many threads (:mod:`tilefuse.codegen.simt`)."""
    verify(fn)
    check_gpu_kernel(fn)
    if simt_width > 1:
        fn = to_simt(fn, simt_width)
    module = ir.Module(name=fn.name)
    module.triple = PTX_TRIPLE
    module.data_layout = str(gpu_target_machine(target).target_data)
    try:
        NvptxLowering(fn, module, simt_width, bool(target.reciprocal_divisors)).lower()
    except TilefuseError:
        raise
    except (TypeError, ValueError, KeyError, IndexError, AttributeError, AssertionError) as exc:
        raise CompileError(f"lowering kernel {fn.name} to NVPTX failed: {exc}") from exc
    return module


def emit_ptx(module: ir.Module, target: GpuTarget, what: str) -> str:
    """PTX text of an NVPTX LLVM module: parsed, verified (CompileError naming ``what`` when
    LLVM rejects it), optimised at O3 and emitted by LLVM's NVPTX back end."""
    from tilefuse.codegen.jit import optimise

    try:
        parsed = llvm.parse_assembly(str(module))
        parsed.verify()
    except RuntimeError as exc:
        raise CompileError(f"LLVM rejected {what}: {exc}") from exc
    tm = gpu_target_machine(target)
    optimise(parsed, tm)
    return tm.emit_assembly(parsed)


CANONICAL_NAME = "tf_canonical_kernel"
"""The entry name PTX is compiled under in :func:`compile_ptx`'s cache (renamed per kernel)."""
PTX_CACHE_SIZE = 1024
_PTX_CACHE: dict[tuple[str, GpuTarget, int], str] = {}


def entry_pattern(name: str) -> re.Pattern[str]:
    """Where the kernel ``name`` is named in its PTX: the entry and its ``<name>_param_<i>``
    parameters (never inside another identifier)."""
    return re.compile(rf"(?<![\w$.%]){re.escape(name)}(?=_param_|[^\w$]|$)")


def compile_ptx(fn: LoopFunction, target: GpuTarget = SM90, simt_width: int = 1) -> str:
    """PTX text for ``fn``: lowered, then :func:`emit_ptx`. Identical kernels under other
    names (a transformer's layers repeat theirs: 90 kernels of the decode step are 28
    distinct ones) are compiled once: the PTX is kept by the kernel's printed loop IR under
    a canonical name (the printer shows every field the lowering reads) and renamed."""
    from tilefuse.loop.printer import format_function

    key = (format_function(replace(fn, name=CANONICAL_NAME)), target, simt_width)
    ptx = _PTX_CACHE.get(key)
    if ptx is None:
        ptx = emit_ptx(lower_to_nvptx_ir(replace(fn, name=CANONICAL_NAME), target, simt_width),
                       target, f"the NVPTX IR of kernel {fn.name}")
        if len(_PTX_CACHE) >= PTX_CACHE_SIZE:
            _PTX_CACHE.pop(next(iter(_PTX_CACHE)))
        _PTX_CACHE[key] = ptx
    return entry_pattern(CANONICAL_NAME).sub(fn.name, ptx)


__all__ = ["CANONICAL_NAME", "PTX_TRIPLE", "SM90", "GpuTarget", "NvptxLowering", "check_gpu_kernel",
           "compile_ptx", "emit_ptx", "entry_pattern", "gpu_target_machine", "launch_extent",
           "lower_to_nvptx_ir"]
