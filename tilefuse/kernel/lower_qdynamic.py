"""The native kernel of ``dynamic_quantize_u8`` (ONNX DynamicQuantizeLinear), in LLVM IR with
the helpers of :mod:`tilefuse.kernel.lower_qmatmul`.

One entry, three steps: the min and max of each 4096-element chunk of x in parallel (chunks
taken from an atomic counter, partial results in a scratch ``part``), the scale
``(max(hi, 0) - min(lo, 0)) / 255`` and zero point ``clip(rint(-lo / scale), 0, 255)`` on one
thread, then the codes ``clip(rint(x / scale) + zero, 0, 255)`` in parallel: the roundings and
order of :func:`tilefuse.ops.quant._dql_reference`, so the result is bit-identical to it (a
zero scale gives NaN codes there, mapped to 0 in both).
"""

from __future__ import annotations

import numpy as np

from tilefuse.codegen.jit import KernelSignature
from tilefuse.codegen.target import CpuTarget, host_target
from tilefuse.dtypes import DType
from tilefuse.kernel.quant_ir import (
    _DECLS,
    _V16F,
    _V16I,
    LANES,
    Compiler,
    QuantKernel,
    _Fn,
    _grab_worker,
    check_target,
    compile_with,
    signature_function,
)

DQL_CHUNK = 4096
"""Elements a grain of the dynamic quantizer's two passes (a multiple of the lanes)."""


def _dql_pass(name: str, total: int, quantize: bool) -> str:
    """``void name(bufs, lo, hi)`` over chunks lo..hi of x (buffer 0): the min and max of each
    chunk into part (buffer 4), or (``quantize``) the u8 codes into q (buffer 1) with the
    scale and zero point (buffers 2, 3)."""
    f = _Fn(f"define internal void @{name}(ptr %bufs, i64 %lo, i64 %hi) nounwind")
    x, q, sc, zp, part = (f.buffer("%bufs", i) for i in range(5))
    vmin, vmax = f.alloca(_V16F), f.alloca(_V16F)
    smin, smax = f.alloca("float"), f.alloca("float")
    s_scale = f(f"load float, ptr {sc}") if quantize else ""
    s_point = f(f"uitofp i8 {f(f'load i8, ptr {zp}')} to float") if quantize else ""
    scale = f.splat(s_scale) if quantize else ""
    point = f.splat(s_point) if quantize else ""

    def code(v: str, ty: str, suffix: str, div: str, add: str) -> str:
        """clip(rint(v / scale) + point, 0, 255) with NaN -> 0 (maxnum drops the NaN)."""
        y = f(f"fdiv {ty} {v}, {div}")
        y = f(f"call {ty} @llvm.rint.{suffix}({ty} {y})")
        y = f(f"fadd {ty} {y}, {add}")
        zero = "zeroinitializer" if ty == _V16F else "0.0"
        top = "splat (float 2.550000e+02)" if ty == _V16F else "2.550000e+02"
        y = f(f"call {ty} @llvm.maxnum.{suffix}({ty} {y}, {ty} {zero})")
        return f(f"call {ty} @llvm.minnum.{suffix}({ty} {y}, {ty} {top})")

    def fold(acc: str, ty: str, fn: str, suffix: str, v: str) -> None:
        old = f(f"load {ty}, ptr {acc}")
        f.do(f"store {ty} {f(f'call {ty} @llvm.{fn}.{suffix}({ty} {old}, {ty} {v})')}, "
             f"ptr {acc}")

    def chunk(r: str) -> None:
        c = f(f"add i64 %lo, {r}")
        start = f(f"mul i64 {c}, {DQL_CHUNK}")
        end = f(f"add i64 {start}, {DQL_CHUNK}")
        end = f(f"select i1 {f(f'icmp slt i64 {end}, {total}')}, i64 {end}, i64 {total}")
        vecs = f(f"sdiv i64 {f(f'sub i64 {end}, {start}')}, {LANES}")
        if not quantize:
            f.do(f"store {_V16F} splat (float 0x7FF0000000000000), ptr {vmin}")
            f.do(f"store {_V16F} splat (float 0xFFF0000000000000), ptr {vmax}")

        def vec(i: str) -> None:
            at = f(f"add i64 {start}, {f(f'mul i64 {i}, {LANES}')}")
            v = f.vload(_V16F, "float", x, at)
            if quantize:
                y = f(f"fptoui {_V16F} {code(v, _V16F, 'v16f32', scale, point)} to {_V16I}")
                y = f(f"trunc {_V16I} {y} to <16 x i8>")
                f.do(f"store <16 x i8> {y}, ptr {f.at('i8', q, at)}, align 1")
                return
            fold(vmin, _V16F, "minnum", "v16f32", v)
            fold(vmax, _V16F, "maxnum", "v16f32", v)

        f.counted_loop(f"v{r[1:]}", vecs, vec)
        if not quantize:
            for acc, fn, dst in ((vmin, "fmin", smin), (vmax, "fmax", smax)):
                v = f(f"load {_V16F}, ptr {acc}")
                v = f(f"call float @llvm.vector.reduce.{fn}.v16f32({_V16F} {v})")
                f.do(f"store float {v}, ptr {dst}")
        tail = f(f"add i64 {start}, {f(f'mul i64 {vecs}, {LANES}')}")

        def one(i: str) -> None:
            at = f(f"add i64 {tail}, {i}")
            v = f(f"load float, ptr {f.at('float', x, at)}")
            if quantize:
                y = f(f"fptoui float {code(v, 'float', 'f32', s_scale, s_point)} to i32")
                f.do(f"store i8 {f(f'trunc i32 {y} to i8')}, ptr {f.at('i8', q, at)}")
                return
            fold(smin, "float", "minnum", "f32", v)
            fold(smax, "float", "maxnum", "f32", v)

        f.counted_loop(f"s{r[1:]}", f(f"sub i64 {end}, {tail}"), one)
        if not quantize:
            slot = f(f"mul i64 {c}, 2")
            f.do(f"store float {f(f'load float, ptr {smin}')}, ptr {f.at('float', part, slot)}")
            high = f.at("float", part, f(f"add i64 {slot}, 1"))
            f.do(f"store float {f(f'load float, ptr {smax}')}, ptr {high}")

    f.counted_loop("chunk", f("sub i64 %hi, %lo"), chunk)
    f.do("ret void")
    return f.text()


def _dql_entry(name: str, chunks: int) -> str:
    """The entry: min/max per chunk in parallel, the scale and zero point from them (one
    thread), then the codes in parallel."""
    f = _Fn(f"define void @{name}(ptr %bufs, ptr %scalars, i32 %threads) nounwind")
    ctx = f.alloca("{ptr, i64}")
    counter = f.at("i8", ctx, "8")

    def run(worker: str) -> None:
        f.do(f"store ptr %bufs, ptr {ctx}")
        f.do(f"store i64 0, ptr {counter}")
        f.do(f"call void @tilefuse_parallel(ptr @{worker}, ptr {ctx}, i32 %threads)")

    run(f"{name}.w0")
    part, sc, zp = f.buffer("%bufs", 4), f.buffer("%bufs", 2), f.buffer("%bufs", 3)
    lo, hi = f.alloca("float"), f.alloca("float")
    f.do(f"store float 0.0, ptr {lo}")
    f.do(f"store float 0.0, ptr {hi}")

    def combine(i: str) -> None:
        slot = f(f"mul i64 {i}, 2")
        for acc, fn, off in ((lo, "minnum", slot), (hi, "maxnum", f(f"add i64 {slot}, 1"))):
            v = f(f"load float, ptr {f.at('float', part, off)}")
            old = f(f"load float, ptr {acc}")
            f.do(f"store float {f(f'call float @llvm.{fn}.f32(float {old}, float {v})')}, "
                 f"ptr {acc}")

    f.counted_loop("combine", chunks, combine)
    low, high = f(f"load float, ptr {lo}"), f(f"load float, ptr {hi}")
    scale = f(f"fdiv float {f(f'fsub float {high}, {low}')}, 2.550000e+02")
    f.do(f"store float {scale}, ptr {sc}")
    p = f(f"fneg float {f(f'fdiv float {low}, {scale}')}")
    p = f(f"call float @llvm.rint.f32(float {p})")
    p = f(f"call float @llvm.maxnum.f32(float {p}, float 0.0)")
    p = f(f"call float @llvm.minnum.f32(float {p}, float 2.550000e+02)")
    p = f(f"fptoui float {p} to i32")
    f.do(f"store i8 {f(f'trunc i32 {p} to i8')}, ptr {zp}")
    run(f"{name}.w1")
    f.do("ret void")
    return f.text()


DQL_BUFFERS = [("x", DType.f32, True), ("q", DType.u8, False), ("scale", DType.f32, False),
               ("zero", DType.u8, False), ("part", DType.f32, False)]


def build_dql(name: str, total: int, target: CpuTarget | None = None,
              compiler: Compiler | None = None) -> QuantKernel:
    """ONNX DynamicQuantizeLinear of ``total`` f32 elements (op ``dynamic_quantize_u8``)."""
    target = target or host_target()
    check_target(target, vnni=False)
    chunks = max(1, -(-total // DQL_CHUNK))
    name = f"{name}_dql_{total}"
    text = "".join([_DECLS, _dql_pass(f"{name}.minmax", total, False),
                    _dql_pass(f"{name}.codes", total, True),
                    _grab_worker(f"{name}.w0", f"{name}.minmax", chunks, 1),
                    _grab_worker(f"{name}.w1", f"{name}.codes", chunks, 1),
                    _dql_entry(name, chunks)])
    fn = signature_function(name, DQL_BUFFERS)
    kernel = compile_with(compiler, text, KernelSignature(name, fn.buffers, (), True), target)
    return QuantKernel(fn, kernel, text, {}, {"part": (chunks * 8, np.dtype(np.float32))},
                       {"x": 0}, {"q": 0, "scale": 1, "zero": 2})


__all__ = ["DQL_BUFFERS", "DQL_CHUNK", "build_dql"]
