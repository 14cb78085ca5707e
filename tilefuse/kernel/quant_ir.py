"""The shared pieces of the hand-written quantized kernels (:mod:`tilefuse.kernel.lower_qmatmul`,
:mod:`tilefuse.kernel.lower_qconv`, :mod:`tilefuse.kernel.lower_qdynamic`): tile constants, the
LLVM IR text builder (:class:`_Fn`), the parallel workers and entry with the loop IR's ABI, the
fused epilogue, and compilation to machine code.

Split out of lower_qmatmul.py so that each file holds one job: this one writes and compiles IR,
the others decide what the kernels compute.
"""

from __future__ import annotations

import struct
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

import llvmlite.binding as llvm
import numpy as np

from tilefuse.codegen.jit import CompiledKernel, KernelSignature, aligned_empty, optimise
from tilefuse.codegen.pool import thread_pool
from tilefuse.codegen.target import CpuTarget, host_target, target_machine
from tilefuse.dtypes import DType
from tilefuse.errors import CompileError
from tilefuse.loop.ir import Block, BufferParam, LoopFunction

MR8, NV, LANES = 6, 4, 16
PANEL = NV * LANES          # 64 columns a tile
MR4 = 4
MAX_K8 = 65536
"""Largest K of the int8 kernel: |sum_k (q + 128) * w| <= 255 * 128 * K stays below 2**31."""
STREAM_BYTES = 4 << 20
"""An int8 product's f32 output of this many bytes or more is written with non-temporal
stores: larger than this host's L2s together (2 x 1 MiB), it would not stay in cache for the
next kernel, and reading each line in before writing it cost W1 (6 MiB out) ~30 % of its
time (single thread: 70 % -> 83 % of the vpdpbusd peak)."""


def _ceil(a: int, b: int) -> int:
    return -(-a // b) * b


def _padded(v: np.ndarray, n: int, dtype: type) -> np.ndarray:
    out = aligned_empty(_ceil(max(n, 1), PANEL), dtype)
    out[:] = 0
    out[:v.shape[-1]] = v
    return out



# ---- IR text helpers -------------------------------------------------------------------------

_V16F, _V16I = "<16 x float>", "<16 x i32>"
_SQRT2 = f"0x{struct.unpack('<Q', struct.pack('<d', float(np.float32(np.sqrt(2.0)))))[0]:016X}"
"""sqrt(2) rounded to f32, as LLVM writes a float constant (the f64 bits of the f32 value)."""
_IOTA = "<" + ", ".join(f"i32 {i}" for i in range(LANES)) + ">"

_DECLS = """
declare void @tilefuse_parallel(ptr, ptr, i32)
declare <16 x i32> @llvm.x86.avx512.vpdpbusd.512(<16 x i32>, <16 x i32>, <16 x i32>)
declare <16 x float> @llvm.fabs.v16f32(<16 x float>)
declare <16 x float> @llvm.rint.v16f32(<16 x float>)
declare <16 x float> @llvm.maxnum.v16f32(<16 x float>, <16 x float>)
declare <16 x float> @llvm.fma.v16f32(<16 x float>, <16 x float>, <16 x float>)
declare float @llvm.fabs.f32(float)
declare float @llvm.rint.f32(float)
declare float @llvm.maxnum.f32(float, float)
declare float @llvm.minnum.f32(float, float)
declare <16 x float> @llvm.minnum.v16f32(<16 x float>, <16 x float>)
declare float @llvm.vector.reduce.fmin.v16f32(<16 x float>)
declare float @llvm.vector.reduce.fmax.v16f32(<16 x float>)
declare <16 x i32> @llvm.smax.v16i32(<16 x i32>, <16 x i32>)
declare <16 x i32> @llvm.smin.v16i32(<16 x i32>, <16 x i32>)
declare i32 @llvm.smax.i32(i32, i32)
declare i32 @llvm.smin.i32(i32, i32)
declare void @llvm.masked.store.v16f32.p0(<16 x float>, ptr, i32, <16 x i1>)
declare void @llvm.masked.store.v16i32.p0(<16 x i32>, ptr, i32, <16 x i1>)
declare void @llvm.memcpy.p0.p0.i64(ptr, ptr, i64, i1)
declare <16 x float> @llvm.masked.load.v16f32.p0(ptr, i32, <16 x i1>, <16 x float>)
declare <16 x i32> @llvm.fptosi.sat.v16i32.v16f32(<16 x float>)
declare i32 @llvm.fptosi.sat.i32.f32(float)
"""


class _Fn:
    """Lines of one LLVM function with fresh SSA names."""

    def __init__(self, header: str):
        self.lines = [header + " {", "entry:"]
        self.count = 0

    def tmp(self) -> str:
        self.count += 1
        return f"%t{self.count}"

    def __call__(self, rhs: str) -> str:
        name = self.tmp()
        self.lines.append(f"  {name} = {rhs}")
        return name

    def alloca(self, ty: str) -> str:
        """An alloca in the entry block (where mem2reg promotes it to registers)."""
        name = self.tmp()
        self.lines.insert(2, f"  {name} = alloca {ty}, align 64")
        return name

    def at(self, elem: str, base: str, index: str) -> str:
        """The address of element ``index`` of type ``elem`` from ``base``."""
        return self(f"getelementptr {elem}, ptr {base}, i64 {index}")

    def vload(self, ty: str, elem: str, base: str, index: str, align: int = 4) -> str:
        return self(f"load {ty}, ptr {self.at(elem, base, index)}, align {align}")

    def fma(self, a: str, b: str, c: str) -> str:
        return self(f"call {_V16F} @llvm.fma.v16f32({_V16F} {a}, {_V16F} {b}, {_V16F} {c})")

    def do(self, line: str) -> None:
        self.lines.append(f"  {line}")

    def label(self, name: str) -> None:
        self.lines.append(f"{name}:")

    def splat(self, scalar: str, ty: str = "float") -> str:
        v = self(f"insertelement <16 x {ty}> poison, {ty} {scalar}, i32 0")
        return self(f"shufflevector <16 x {ty}> {v}, <16 x {ty}> poison, <16 x i32> "
                    "zeroinitializer")

    def buffer(self, bufs: str, index: int) -> str:
        slot = self(f"getelementptr ptr, ptr {bufs}, i64 {index}")
        return self(f"load ptr, ptr {slot}")

    def counted_loop(self, name: str, count: int | str, body: callable) -> None:
        """for (i = 0; i < count; i++) body(i) with the counter in an alloca (mem2reg)."""
        var = self.alloca("i64")
        self.do(f"store i64 0, ptr {var}")
        self.do(f"br label %{name}.head")
        self.label(f"{name}.head")
        i = self(f"load i64, ptr {var}")
        more = self(f"icmp slt i64 {i}, {count}")
        self.do(f"br i1 {more}, label %{name}.body, label %{name}.end")
        self.label(f"{name}.body")
        body(i)
        nxt = self(f"add i64 {i}, 1")
        self.do(f"store i64 {nxt}, ptr {var}")
        self.do(f"br label %{name}.head")
        self.label(f"{name}.end")

    def text(self) -> str:
        return "\n".join([*self.lines, "}"]) + "\n"


def _grab_worker(name: str, body: str, total: int, grain: int) -> str:
    """``void name(ptr ctx, i64 tid, i64 n)``: takes ``grain`` items at a time of ``total``
    from the counter in ``ctx`` ({ptr buffers, i64 counter}) and calls ``body(bufs, lo, hi)``."""
    return f"""
define internal void @{name}(ptr %ctx, i64 %tid, i64 %n) nounwind {{
entry:
  %bufs = load ptr, ptr %ctx
  %cnt = getelementptr i8, ptr %ctx, i64 8
  br label %grab
grab:
  %lo = atomicrmw add ptr %cnt, i64 {grain} monotonic
  %more = icmp slt i64 %lo, {total}
  br i1 %more, label %run, label %done
run:
  %end = add i64 %lo, {grain}
  %short = icmp slt i64 %end, {total}
  %hi = select i1 %short, i64 %end, i64 {total}
  call void @{body}(ptr %bufs, i64 %lo, i64 %hi)
  br label %grab
done:
  ret void
}}
"""


def _entry(name: str, workers: list[str]) -> str:
    lines = [f"define void @{name}(ptr %bufs, ptr %scalars, i32 %threads) nounwind {{", "entry:"]
    for i, worker in enumerate(workers):
        lines += [f"  %ctx{i} = alloca {{ptr, i64}}, align 64",
                  f"  store ptr %bufs, ptr %ctx{i}",
                  f"  %cnt{i} = getelementptr i8, ptr %ctx{i}, i64 8",
                  f"  store i64 0, ptr %cnt{i}",
                  f"  call void @tilefuse_parallel(ptr @{worker}, ptr %ctx{i}, i32 %threads)"]
    return "\n".join([*lines, "  ret void", "}"]) + "\n"


def _erf_text() -> str:
    """``tf.erf.v16f32`` from the generated math library (codegen/math_lib.py), as IR text
    without the declarations the module already has."""
    from llvmlite import ir

    from tilefuse.codegen.math_lib import MathLib
    from tilefuse.loop.ir import LType

    module = ir.Module()
    MathLib(module).function("erf", LType(DType.f32, LANES))
    have = {line.split("@")[1].split("(")[0] for line in _DECLS.splitlines()
            if line.startswith("declare")}
    kept = []
    for line in str(module).splitlines():
        if line.startswith(("; ModuleID", "target ")):
            continue
        if line.startswith("declare"):
            name = line.split("@")[1].split("(")[0].strip('"')
            if name in have:
                continue
        kept.append(line)
    return "\n".join(kept) + "\n"


def _math(act: str) -> str:
    return _erf_text() if act == "gelu" else ""


def _epilogue_store(f: _Fn, v: str, act: str, ptr: str, mask: str) -> None:
    v = _activate(f, v, act)
    f.do(f"call void @llvm.masked.store.v16f32.p0({_V16F} {v}, ptr {ptr}, i32 4, "
         f"<16 x i1> {mask})")


def _activate(f: _Fn, v: str, act: str) -> str:
    """``act`` ("none", "relu", "gelu") applied to 16 floats."""
    if act == "gelu":   # 0.5·v · (1 + erf(v / sqrt 2)), in the reference's order
        half = f(f"fmul {_V16F} splat (float 5.000000e-01), {v}")
        scaled = f(f"fdiv {_V16F} {v}, splat (float {_SQRT2})")
        e = f(f'call {_V16F} @"tf.erf.v16f32"({_V16F} {scaled})')
        v = f(f"fmul {_V16F} {half}, {f(f'fadd {_V16F} splat (float 1.000000e+00), {e}')}")
    if act == "relu":
        neg = f(f"fcmp olt {_V16F} {v}, zeroinitializer")
        v = f(f"select <16 x i1> {neg}, {_V16F} zeroinitializer, {_V16F} {v}")
    return v


_BINARY_IR = {"add": "fadd", "sub": "fsub", "mul": "fmul", "div": "fdiv"}


def _float(x: float) -> str:
    return f"0x{np.float64(np.float32(x)).view(np.uint64):016X}"


def epilogue_ir(steps: tuple, operands: tuple[int, ...], n: int, first: int) -> Callable:
    """The fused epilogue as IR, a ``post(f, v, m, n0, mask)`` for the int8 tiles
    (:func:`tilefuse.ops.quant.run_epilogue` is its reference): operand i is buffer
    ``first + i``: a scalar (``operands[i]`` 0, splat), an [N] vector (1, read at the columns)
    or an [M, N] tensor (2, read at the row and columns), masked at the N tail."""
    def post(f: _Fn, v: str, m: str, n0: str, mask: str) -> str:
        loaded: dict[int, str] = {}

        def operand(i: int) -> str:
            if i not in loaded:
                base = f.buffer("%bufs", first + i)
                if operands[i] == 0:
                    loaded[i] = f.splat(f(f"load float, ptr {base}"))
                    return loaded[i]
                at = f(f"add i64 {f(f'mul i64 {m}, {n}')}, {n0}") if operands[i] == 2 else n0
                loaded[i] = f(f"call {_V16F} @llvm.masked.load.v16f32.p0(ptr "
                              f"{f.at('float', base, at)}, i32 4, <16 x i1> {mask}, {_V16F} "
                              "zeroinitializer)")
            return loaded[i]

        for step in steps:
            if step[0] == "round":
                v = f(f"call {_V16F} @llvm.rint.v16f32({_V16F} {v})")
            elif step[0] == "gelu":   # the module holds tf.erf (_math("gelu"))
                v = _activate(f, v, "gelu")
            elif step[0] in ("relu", "clip"):
                lo, hi = (0.0, None) if step[0] == "relu" else (step[1], step[2])
                low = f"splat (float {_float(lo)})"
                v = f(f"select <16 x i1> {f(f'fcmp olt {_V16F} {v}, {low}')}, {_V16F} {low}, "
                      f"{_V16F} {v}")
                if hi is not None:
                    high = f"splat (float {_float(hi)})"
                    v = f(f"select <16 x i1> {f(f'fcmp ogt {_V16F} {v}, {high}')}, {_V16F} "
                          f"{high}, {_V16F} {v}")
            else:
                op, kind, x, swapped = step
                x = f"splat (float {_float(x)})" if kind == "s" else operand(x)
                a, b = (x, v) if swapped else (v, x)
                if op in _BINARY_IR:
                    v = f(f"{_BINARY_IR[op]} {_V16F} {a}, {b}")
                else:   # maximum / minimum: NaN-propagating, as NumPy's
                    pred = "ogt" if op == "maximum" else "olt"
                    pick = f(f"fcmp {pred} {_V16F} {a}, {b}")
                    nan = f(f"fcmp uno {_V16F} {a}, {b}")
                    v = f(f"select <16 x i1> {pick}, {_V16F} {a}, {_V16F} {b}")
                    v = f(f"select <16 x i1> {nan}, {_V16F} splat (float 0x7FF8000000000000), "
                          f"{_V16F} {v}")
        return v

    return post


def _codes(f: _Fn, r: str, lo: int, hi: int, offset: int) -> str:
    """The u8 codes ``clip(r, lo, hi) + offset`` of 16 rounded floats, a NaN lane coded as
    ``offset`` (centred 0). Clamped in f32 before a plain conversion: ``fptosi.sat`` on a
    vector is split into 16 scalar conversions with branches by LLVM's x86 backend."""
    ordered = f(f"fcmp ord {_V16F} {r}, zeroinitializer")
    r = f(f"select <16 x i1> {ordered}, {_V16F} {r}, {_V16F} zeroinitializer")
    low = f"splat (float {float(lo):e})"
    high = f"splat (float {float(hi):e})"
    r = f(f"select <16 x i1> {f(f'fcmp olt {_V16F} {r}, {low}')}, {_V16F} {low}, {_V16F} {r}")
    r = f(f"select <16 x i1> {f(f'fcmp ogt {_V16F} {r}, {high}')}, {_V16F} {high}, "
          f"{_V16F} {r}")
    q = f(f"fptosi {_V16F} {r} to {_V16I}")
    return f(f"trunc {_V16I} {f(f'add {_V16I} {q}, splat (i32 {offset})')} to <16 x i8>")


def _lane_mask(f: _Fn, n0: str, n: int) -> str:
    base = f.splat(f(f"trunc i64 {n0} to i32"), "i32")
    idx = f(f"add {_V16I} {base}, {_IOTA}")
    limit = f.splat(str(n), "i32")
    return f(f"icmp slt {_V16I} {idx}, {limit}")



def _tile_origin(f: _Fn, r: str, mblocks: int, rows: int) -> tuple[str, str]:
    """A worker's tile ``%lo + r`` as (its N panel, its first row): tiles run M-block fastest,
    so consecutive tiles share one packed weight panel."""
    t = f(f"add i64 %lo, {r}")
    nb = f(f"udiv i64 {t}, {mblocks}")
    return nb, f(f"mul i64 {f(f'urem i64 {t}, {mblocks}')}, {rows}")



# ---- compilation -----------------------------------------------------------------------------

_COMPILED: dict[tuple[str, CpuTarget], CompiledKernel] = {}
_LOCK = threading.Lock()


Compiler = Callable[[str, KernelSignature], CompiledKernel]
"""Turns a kernel's IR text and signature into machine code (:func:`compile_ir`, or the
native executable's disk cache around it)."""


def check_target(target: CpuTarget, vnni: bool) -> None:
    """CompileError unless ``target`` has the instructions these kernels use."""
    need = ["avx512f", "avx512bw"] + (["avx512vnni"] if vnni else [])
    missing = [f for f in need if not target.has(f)]
    if missing:
        raise CompileError(f"the quantized kernels need {', '.join(missing)}, which {target.cpu} "
                           "lacks")


def compile_ir(text: str, signature: KernelSignature, target: CpuTarget | None = None
               ) -> CompiledKernel:
    """Parses, optimises (O3) and JIT-compiles hand-written IR with the loop IR's entry ABI;
    one compile per distinct text in this process."""
    target = target or host_target()
    key = (text, target)
    with _LOCK:
        if key in _COMPILED and _COMPILED[key].name == signature.name:
            return _COMPILED[key]
    tm = target_machine(target)
    try:
        module = llvm.parse_assembly(text)
        module.triple = target.triple
        module.data_layout = str(tm.target_data)
        module.verify()
    except RuntimeError as exc:
        raise CompileError(f"LLVM rejected the IR of kernel {signature.name}: {exc}") from exc
    optimise(module, tm)
    thread_pool()
    engine = llvm.create_mcjit_compiler(module, tm)
    engine.finalize_object()
    kernel = CompiledKernel(signature, engine, target, str(module))
    with _LOCK:
        _COMPILED[key] = kernel
    return kernel


def compile_with(compiler: Compiler | None, text: str, signature: KernelSignature,
                 target: CpuTarget) -> CompiledKernel:
    """``compiler(text, signature)`` when given, else :func:`compile_ir` for ``target``."""
    return compile_ir(text, signature, target) if compiler is None else compiler(text, signature)


def signature_function(name: str, buffers: list[tuple[str, DType, bool]]) -> LoopFunction:
    """A loop-IR function with these buffers and no body: the signature the runtime binds and
    launches (the code is the hand-written IR)."""
    return LoopFunction(name, tuple(BufferParam(n, d, ro) for n, d, ro in buffers), (),
                        Block(()))



@dataclass
class QuantKernel:
    """A compiled quantized kernel, its signature function and the arrays made at build time
    (keyed by buffer name); ``scratch`` gives the per-call scratch sizes in bytes."""

    fn: LoopFunction
    kernel: CompiledKernel
    ir: str
    constants: dict[str, np.ndarray]
    scratch: dict[str, tuple[int, np.dtype]]
    inputs: dict[str, int] = field(default_factory=lambda: {"x": 0})
    """Buffers bound to the node's inputs (name -> input position)."""
    outputs: dict[str, int] = field(default_factory=lambda: {"out": 0})
    """Buffers bound to the node's outputs (name -> output position)."""
