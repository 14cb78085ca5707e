"""Native kernels of the quantized products (``qmatmul_i8``, ``matmul_w4``, ``matmul_u8s8``),
as LLVM IR (``dynamic_quantize_u8``'s is in :mod:`tilefuse.kernel.lower_qdynamic`, the
convolution's in :mod:`tilefuse.kernel.lower_qconv`; the IR builder, workers, epilogue and
compilation they share are in :mod:`tilefuse.kernel.quant_ir`).

These kernels are written directly in LLVM IR rather than in loop IR: their inner step is one
instruction the loop IR has no op for (``vpdpbusd``: 64 u8 x s8 products summed four at a time
into 16 i32 lanes), and their data layouts are fixed at build time. They keep the loop IR's
calling convention (``void name(ptr buffers, ptr scalars, i32 threads)``, parallel loops
through ``tilefuse_parallel``), so the native executable launches them like any other kernel.

**int8** (``qmatmul_i8``, AVX-512 VNNI), one entry, one parallel region over the tiles, each
tile running the row phase on its block of rows first unless the block's ready flag is set:

1. rows of x, a block of 6 at a time: ``amax = max|x|``,
   ``q = clip(rint(x * 127/amax), -127, 127) + 128`` stored as u8 (vpdpbusd's first operand is
   unsigned) in a scratch ``aq [Mp, Kp]`` (K padded to 4; the blocks' ready flags follow, and
   the entry clears them), and the row scale ``amax/127``. Two threads that reach one block
   at once both quantize it (the same bytes): nobody ever waits on another thread, which a
   second parallel region did at its start on a busy host;
2. tiles of MR=6 rows x 64 columns, taken one at a time from an atomic counter (panel-major,
   so threads share a panel while it is hot, and the first panel's tiles quantize the rows):
   24 i32 zmm accumulators, per 4 k one 64-byte load of each of the 4 B vectors and one 4-byte
   broadcast of each row of A. B is packed at build time as [N/64][K/4][64][4] bytes. The
   +128 offset is removed exactly by the build-time column sums
   ``comp[n] = 128 * sum_k w[k, n]``. Epilogue on the accumulators:
   ``f32(acc - comp) * (sa[m] * sw[n]) + bias[n]``, relu or GELU (the generated erf of
   :mod:`tilefuse.codegen.math_lib`), masked store of the N tail.

**u8 x s8** (``matmul_u8s8``, ONNX MatMulInteger): the same tiles (one region) on a u8 input
copied into ``aq`` (rows padded to 4) a block at a time, ``comp = a_zero * sum_k w`` at run
time, the i32 sums stored.

**int4** (``matmul_w4``, AVX-512F, weight-only): tiles of MR (min(M, 4)) rows x 64 columns;
per group of G rows of K the 64 scales and offsets (``-z*s``) are loaded once; per pair of k,
16 bytes per vector of 16 columns (two nibbles: even and odd k) are widened, masked / shifted,
converted and dequantized with one FMA each (``q*s + o``), then FMAs into MR x 4 f32
accumulators. Weights are packed at build time as [N/64][K/2][64] bytes.

Every integer kernel is checked bit for bit against NumPy (tests/kernel/test_qmatmul.py);
``build_int8(..., raw=True)`` is the integer core alone (``acc - comp`` stored as i32), for
that test. Kernels are named by shape, so groups of one shape share one compile in a process;
the native executable also passes them through its disk cache (``compiler``).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from tilefuse.codegen.jit import KernelSignature, aligned_empty
from tilefuse.codegen.target import CpuTarget, host_target
from tilefuse.dtypes import DType
from tilefuse.errors import CompileError
from tilefuse.kernel.quant_ir import (
    _DECLS,
    _V16F,
    _V16I,
    LANES,
    MAX_K8,
    MR4,
    MR8,
    NV,
    PANEL,
    STREAM_BYTES,
    Compiler,
    QuantKernel,
    _activate,
    _ceil,
    _codes,
    _entry,
    _epilogue_store,
    _Fn,
    _grab_worker,
    _lane_mask,
    _math,
    _padded,
    _tile_origin,
    check_target,
    compile_ir,
    compile_with,
    epilogue_ir,
    signature_function,
)
from tilefuse.ops.quant import DYNAMIC_QUANTIZE_U8, MATMUL_U8S8, MATMUL_W4, QCONV_I8, QMATMUL_I8

# ---- build-time packing ----------------------------------------------------------------------

def pack_int8(w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """i8 [K, N] -> (packed [Np/64][Kp/4][64][4] bytes, comp i32 [Np] = 128 * column sums)."""
    k, n = w.shape
    kp, np_ = _ceil(max(k, 1), 4), _ceil(max(n, 1), PANEL)
    pad = np.zeros((kp, np_), np.int8)
    pad[:k, :n] = w
    packed = aligned_empty(kp * np_, np.int8)
    packed[:] = pad.reshape(kp // 4, 4, np_ // PANEL, PANEL).transpose(2, 0, 3, 1).reshape(-1)
    comp = (pad.astype(np.int32).sum(axis=0) * 128).astype(np.int32)
    return packed, comp


def pack_int4(wq: np.ndarray) -> np.ndarray:
    """u8 [K/2, N] (nibble pairs along K) -> [Np/64][K/2][64] bytes."""
    k2, n = wq.shape
    np_ = _ceil(max(n, 1), PANEL)
    pad = np.zeros((k2, np_), np.uint8)
    pad[:, :n] = wq
    packed = aligned_empty(k2 * np_, np.uint8)
    packed[:] = pad.reshape(k2, np_ // PANEL, PANEL).transpose(1, 0, 2).reshape(-1)
    return packed


# ---- int8 ------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Int8Shape:
    m: int
    k: int
    n: int

    @property
    def kp(self) -> int:
        return _ceil(max(self.k, 1), 4)

    @property
    def mp(self) -> int:
        return _ceil(max(self.m, 1), MR8)

    @property
    def np_(self) -> int:
        return _ceil(max(self.n, 1), PANEL)

    @property
    def aq_bytes(self) -> int:
        """The scratch ``aq``: the u8 codes [Mp, Kp], then one ready flag a block of MR8 rows."""
        return self.mp * self.kp + self.mp // MR8


def _quant_rows(name: str, s: Int8Shape) -> str:
    """``void name(bufs, lo, hi)``: rows lo..hi of x (buffer 0) -> aq (6), sa (7)."""
    f = _Fn(f"define internal void @{name}(ptr %bufs, i64 %lo, i64 %hi) nounwind")
    x, aq, sa = f.buffer("%bufs", 0), f.buffer("%bufs", 6), f.buffer("%bufs", 7)
    full = s.k // LANES
    amax_v = f.alloca(_V16F)
    amax_s = f.alloca("float")

    def row(r: str) -> None:
        m = f(f"add i64 %lo, {r}")
        xrow = f(f"getelementptr float, ptr {x}, i64 {f(f'mul i64 {m}, {s.k}')}")
        arow = f(f"getelementptr i8, ptr {aq}, i64 {f(f'mul i64 {m}, {s.kp}')}")
        f.do(f"store {_V16F} zeroinitializer, ptr {amax_v}")

        def amax_step(i: str) -> None:
            p = f(f"getelementptr float, ptr {xrow}, i64 {f(f'mul i64 {i}, {LANES}')}")
            v = f(f"load {_V16F}, ptr {p}, align 4")
            v = f(f"call {_V16F} @llvm.fabs.v16f32({_V16F} {v})")
            old = f(f"load {_V16F}, ptr {amax_v}")
            new = f(f"call {_V16F} @llvm.maxnum.v16f32({_V16F} {old}, {_V16F} {v})")
            f.do(f"store {_V16F} {new}, ptr {amax_v}")

        f.counted_loop(f"amax{r[1:]}", full, amax_step)
        acc = f(f"call float @llvm.vector.reduce.fmax.v16f32({_V16F} "
                f"{f(f'load {_V16F}, ptr {amax_v}')})")
        for t in range(full * LANES, s.k):
            p = f(f"getelementptr float, ptr {xrow}, i64 {t}")
            a = f(f"call float @llvm.fabs.f32(float {f(f'load float, ptr {p}')})")
            acc = f(f"call float @llvm.maxnum.f32(float {acc}, float {a})")
        f.do(f"store float {acc}, ptr {amax_s}")
        amax = f(f"load float, ptr {amax_s}")
        pos = f(f"fcmp ogt float {amax}, 0.0")
        inv = f(f"select i1 {pos}, float {f(f'fdiv float 1.270000e+02, {amax}')}, float 0.0")
        f.do(f"store float {f(f'fdiv float {amax}, 1.270000e+02')}, ptr "
             f"{f(f'getelementptr float, ptr {sa}, i64 {m}')}")
        inv_v = f.splat(inv)

        def q_step(i: str) -> None:
            off = f(f"mul i64 {i}, {LANES}")
            v = f(f"load {_V16F}, ptr {f(f'getelementptr float, ptr {xrow}, i64 {off}')}, align 4")
            r_ = f(f"call {_V16F} @llvm.rint.v16f32({_V16F} {f(f'fmul {_V16F} {v}, {inv_v}')})")
            q = _codes(f, r_, -127, 127, 128)
            f.do(f"store <16 x i8> {q}, ptr {f(f'getelementptr i8, ptr {arow}, i64 {off}')}, "
                 "align 1")

        f.counted_loop(f"q{r[1:]}", full, q_step)
        for t in range(full * LANES, s.kp):
            dst = f(f"getelementptr i8, ptr {arow}, i64 {t}")
            if t >= s.k:
                f.do(f"store i8 -128, ptr {dst}")
                continue
            v = f(f"load float, ptr {f(f'getelementptr float, ptr {xrow}, i64 {t}')}")
            prod = f(f"fmul float {v}, {inv}")
            q = f(f"call i32 @llvm.fptosi.sat.i32.f32(float "
                  f"{f(f'call float @llvm.rint.f32(float {prod})')})")
            q = f(f"call i32 @llvm.smax.i32(i32 {q}, i32 -127)")
            q = f(f"call i32 @llvm.smin.i32(i32 {q}, i32 127)")
            q = f(f"add i32 {q}, 128")
            f.do(f"store i8 {f(f'trunc i32 {q} to i8')}, ptr {dst}")

    count = f("sub i64 %hi, %lo")
    f.counted_loop("row", count, row)
    f.do("ret void")
    return f.text()


Post = Callable[[_Fn, str, str, str, str], str]
"""``post(f, v, m, n0, mask)``: more epilogue on the 16 floats ``v`` of row m, columns
n0..n0+15 (after the activation), returning the value to store."""


def _int8_tiles(name: str, s: Int8Shape, act: str, raw: bool, zero_point: bool = False,
                post: Post | None = None, rows: str | None = None, stream: bool = False
                ) -> str:
    """``void name(bufs, lo, hi)``: tiles lo..hi (panel-major) of MR8 rows x 64 columns.
    ``raw``: store acc - comp as i32 (the integer core, for tests) instead of the epilogue.
    ``zero_point`` (``matmul_u8s8``, raw): buffers a, w, colsum, a_zero, out, aq, and comp is
    ``a_zero * colsum``. ``post``: a fused elementwise epilogue after the activation.
    ``rows``: the row phase ``void rows(bufs, lo, hi)``, called by a tile whose block of rows
    has no ready flag yet (:func:`int8_module`). ``stream`` (N a multiple of 16): a panel of
    full columns is stored with non-temporal stores when ``out`` is 64-byte aligned
    (:data:`STREAM_BYTES`)."""
    f = _Fn(f"define internal void @{name}(ptr %bufs, i64 %lo, i64 %hi) nounwind")
    if zero_point:
        w, comp, out, aq = (f.buffer("%bufs", i) for i in (1, 2, 4, 5))
        zp = f(f"load i8, ptr {f.buffer('%bufs', 3)}")
        zp = f.splat(f(f"zext i8 {zp} to i32"), "i32")
        sw = bias = sa = ""
    else:
        w, comp, sw, bias, out = (f.buffer("%bufs", i) for i in (1, 2, 3, 4, 5))
        aq, sa = f.buffer("%bufs", 6), f.buffer("%bufs", 7)
    accs = [[f.alloca(_V16I) for _ in range(NV)] for _ in range(MR8)]
    mblocks = s.mp // MR8
    k4 = s.kp // 4

    if stream:
        addr = f(f"ptrtoint ptr {out} to i64")
        aligned = f(f"icmp eq i64 {f(f'and i64 {addr}, 63')}, 0")

    def tile(r: str) -> None:
        nb, m0 = _tile_origin(f, r, mblocks, MR8)
        if stream:
            full = f(f"icmp sle i64 {f(f'mul i64 {nb}, {PANEL}')}, {s.n - PANEL}")
            streamed = f(f"and i1 {full}, {aligned}")
        if rows is not None:
            _ready_rows(f, r, rows, s, aq, m0)
        panel = f(f"getelementptr i8, ptr {w}, i64 {f(f'mul i64 {nb}, {k4 * PANEL * 4}')}")
        arows = []
        for i in range(MR8):
            mi = f(f"add i64 {m0}, {i}")
            arows.append(f(f"getelementptr i8, ptr {aq}, i64 {f(f'mul i64 {mi}, {s.kp}')}"))
        for row in accs:
            for a in row:
                f.do(f"store {_V16I} zeroinitializer, ptr {a}, align 64")

        def kstep(kk: str) -> None:
            bs = []
            for j in range(NV):
                off = f(f"add i64 {f(f'mul i64 {kk}, {PANEL * 4}')}, {j * LANES * 4}")
                bs.append(f(f"load {_V16I}, ptr {f(f'getelementptr i8, ptr {panel}, i64 {off}')}, "
                            "align 64"))
            for i in range(MR8):
                a = f(f"load i32, ptr {f(f'getelementptr i32, ptr {arows[i]}, i64 {kk}')}, align 1")
                av = f.splat(a, "i32")
                for j in range(NV):
                    old = f(f"load {_V16I}, ptr {accs[i][j]}, align 64")
                    new = f(f"call {_V16I} @llvm.x86.avx512.vpdpbusd.512({_V16I} {old}, "
                            f"{_V16I} {av}, {_V16I} {bs[j]})")
                    f.do(f"store {_V16I} {new}, ptr {accs[i][j]}, align 64")

        f.counted_loop(f"k{r[1:]}", k4, kstep)
        cols, masks, comps, scales, biases = [], [], [], [], []
        for j in range(NV):
            n0 = f(f"add i64 {f(f'mul i64 {nb}, {PANEL}')}, {j * LANES}")
            cols.append(n0)
            masks.append(_lane_mask(f, n0, s.n))
            comps.append(f.vload(_V16I, "i32", comp, n0))
            if zero_point:
                comps[-1] = f(f"mul {_V16I} {comps[-1]}, {zp}")
            if not raw:
                scales.append(f.vload(_V16F, "float", sw, n0))
                biases.append(f.vload(_V16F, "float", bias, n0))
        for i in range(MR8):
            m = f(f"add i64 {m0}, {i}")
            label = f"st{r[1:]}_{i}"
            f.do(f"br i1 {f(f'icmp slt i64 {m}, {s.m}')}, label %{label}, label %{label}.skip")
            f.label(label)
            sa_i = None if raw else f.splat(f(f"load float, ptr {f.at('float', sa, m)}"))
            for j in range(NV):
                acc = f(f"sub {_V16I} {f(f'load {_V16I}, ptr {accs[i][j]}, align 64')}, {comps[j]}")
                at = f(f"mul i64 {m}, {s.n}")
                dst = f(f"getelementptr float, ptr {out}, i64 {f(f'add i64 {at}, {cols[j]}')}")
                if raw and post is not None:   # matmul_u8s8's fused rescale
                    v = post(f, f(f"sitofp {_V16I} {acc} to {_V16F}"), m, cols[j], masks[j])
                    _epilogue_store(f, v, "none", dst, masks[j])
                    continue
                if raw:
                    f.do(f"call void @llvm.masked.store.v16i32.p0({_V16I} {acc}, ptr {dst}, "
                         f"i32 4, <16 x i1> {masks[j]})")
                    continue
                v = f(f"sitofp {_V16I} {acc} to {_V16F}")
                v = f(f"fmul {_V16F} {v}, {f(f'fmul {_V16F} {sa_i}, {scales[j]}')}")
                v = f(f"fadd {_V16F} {v}, {biases[j]}")
                if post is not None:
                    v = post(f, _activate(f, v, act), m, cols[j], masks[j])
                if stream:
                    v = _activate(f, v, "none" if post is not None else act)
                    _stream_store(f, v, dst, masks[j], streamed, f"{label}_{j}")
                    continue
                _epilogue_store(f, v, "none" if post is not None else act, dst, masks[j])
            f.do(f"br label %{label}.skip")
            f.label(f"{label}.skip")

    f.counted_loop("tile", f("sub i64 %hi, %lo"), tile)
    f.do("ret void")
    return f.text()


def _stream_store(f: _Fn, v: str, dst: str, mask: str, streamed: str, label: str) -> None:
    """16 floats to ``dst``: a non-temporal store (the line is written without being read
    first) when ``streamed``, else the masked store."""
    f.do(f"br i1 {streamed}, label %{label}.nt, label %{label}.m")
    f.label(f"{label}.nt")
    f.do(f"store {_V16F} {v}, ptr {dst}, align 64, !nontemporal !{{i32 1}}")
    f.do(f"br label %{label}.done")
    f.label(f"{label}.m")
    f.do(f"call void @llvm.masked.store.v16f32.p0({_V16F} {v}, ptr {dst}, i32 4, "
         f"<16 x i1> {mask})")
    f.do(f"br label %{label}.done")
    f.label(f"{label}.done")


def _ready_rows(f: _Fn, r: str, rows: str, s: Int8Shape, aq: str, m0: str) -> None:
    """Makes sure the tile's block of rows (from ``m0``) is quantized: its flag in ``aq``
    after the codes is read (acquire); if unset, this thread runs the row phase on the block
    and sets it (release). Two threads may quantize one block at once: they write the same
    bytes, and nobody waits on a thread the OS has preempted (one parallel region a call)."""
    flag = f.at("i8", aq, f(f"add i64 {f(f'udiv i64 {m0}, {MR8}')}, {s.mp * s.kp}"))
    label = f"q{r[1:]}"
    ready = f(f"load atomic i8, ptr {flag} acquire, align 1")
    f.do(f"br i1 {f(f'icmp ne i8 {ready}, 0')}, label %{label}.done, label %{label}.run")
    f.label(f"{label}.run")
    end = f(f"add i64 {m0}, {MR8}")
    end = f(f"select i1 {f(f'icmp slt i64 {end}, {s.m}')}, i64 {end}, i64 {s.m}")
    f.do(f"call void @{rows}(ptr %bufs, i64 {m0}, i64 {end})")
    f.do(f"store atomic i8 1, ptr {flag} release, align 1")
    f.do(f"br label %{label}.done")
    f.label(f"{label}.done")


def _copy_rows(name: str, s: Int8Shape) -> str:
    """``void name(bufs, lo, hi)``: rows lo..hi of a u8 input (buffer 0) copied into aq
    (buffer 5) with the row padded to Kp (the padding meets zero weights)."""
    f = _Fn(f"define internal void @{name}(ptr %bufs, i64 %lo, i64 %hi) nounwind")
    a, aq = f.buffer("%bufs", 0), f.buffer("%bufs", 5)

    def row(r: str) -> None:
        m = f(f"add i64 %lo, {r}")
        src = f.at("i8", a, f(f"mul i64 {m}, {s.k}"))
        dst = f.at("i8", aq, f(f"mul i64 {m}, {s.kp}"))
        f.do(f"call void @llvm.memcpy.p0.p0.i64(ptr {dst}, ptr {src}, i64 {s.k}, i1 false)")
        for t in range(s.k, s.kp):
            f.do(f"store i8 0, ptr {f.at('i8', dst, str(t))}")

    f.counted_loop("row", f("sub i64 %hi, %lo"), row)
    f.do("ret void")
    return f.text()


def u8s8_module(name: str, s: Int8Shape, steps: tuple = (),
                operands: tuple[int, ...] = ()) -> str:
    """The LLVM IR of ``matmul_u8s8``; buffers: a (u8), w (packed), colsum, a_zero, out (i32;
    f32 with a fused epilogue over the operands that follow), aq (scratch)."""
    post = epilogue_ir(steps, operands, s.n, len(U8S8_BUFFERS)) if steps else None
    return "".join([_DECLS, _math("gelu" if ("gelu",) in steps else "none"),
                    _copy_rows(f"{name}.copy", s),
                    _int8_tiles(f"{name}.tiles", s, "none", True, zero_point=True,
                                post=post, rows=f"{name}.copy"),
                    one_region(name, s, f"{name}.copy", f"{name}.tiles", aq=5)])


def one_region(name: str, s: Int8Shape, rows: str, tiles: str, aq: int = 6,
               fence: bool = False) -> str:
    """The worker and entry of an int8 kernel with one parallel region: the tiles (function
    ``tiles``, made with ``rows=rows``) quantize their blocks of rows on demand; the entry
    clears the blocks' ready flags (after the codes in ``aq``, buffer ``aq``) first.
    ``fence``: each thread ends with an sfence (its non-temporal stores made visible)."""
    count = (s.mp // MR8) * (s.np_ // PANEL)
    worker = _grab_worker(f"{name}.w1", tiles, count, 1)
    if fence:
        worker = worker.replace("done:\n  ret void", "done:\n  call void @llvm.x86.sse.sfence()"
                                "\n  ret void")
    entry = _entry(name, [f"{name}.w1"]).replace(
        "entry:\n", f"entry:\n  %aq.slot = getelementptr ptr, ptr %bufs, i64 {aq}\n"
        "  %aq = load ptr, ptr %aq.slot\n"
        f"  %flags = getelementptr i8, ptr %aq, i64 {s.mp * s.kp}\n"
        f"  call void @llvm.memset.p0.i64(ptr %flags, i8 0, i64 {s.mp // MR8}, i1 false)\n", 1)
    return "".join(["declare void @llvm.memset.p0.i64(ptr, i8, i64, i1)\n",
                    "declare void @llvm.x86.sse.sfence()\n" if fence else "", worker, entry])


def int8_module(name: str, s: Int8Shape, act: str = "none", raw: bool = False) -> str:
    """The LLVM IR of an int8 kernel; buffers: x, w (packed), comp, w_scale, bias, out, aq, sa.
    One parallel region (:func:`one_region`): two (the row phase, then the tiles) made every
    thread wait at the end of the first for one the OS had preempted. An f32 output of
    :data:`STREAM_BYTES` or more is written with non-temporal stores."""
    stream = not raw and s.n % LANES == 0 and s.m * s.n * 4 >= STREAM_BYTES
    return "".join([_DECLS, _math(act), _quant_rows(f"{name}.qrows", s),
                    _int8_tiles(f"{name}.tiles", s, act, raw, rows=f"{name}.qrows",
                                stream=stream),
                    one_region(name, s, f"{name}.qrows", f"{name}.tiles", fence=stream)])


# ---- int4 ------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Int4Shape:
    m: int
    k: int
    n: int
    group: int

    @property
    def mr(self) -> int:
        return max(1, min(MR4, self.m))

    @property
    def np_(self) -> int:
        return _ceil(max(self.n, 1), PANEL)


def _int4_tiles(name: str, s: Int4Shape, act: str) -> str:
    """``void name(bufs, lo, hi)``: tiles of mr rows x 64 columns; buffers x, wq (packed),
    scales, offsets (both [K/G, Np]), bias, out."""
    f = _Fn(f"define internal void @{name}(ptr %bufs, i64 %lo, i64 %hi) nounwind")
    x, wq, sc, of, bias, out = (f.buffer("%bufs", i) for i in range(6))
    mr = s.mr
    accs = [[f.alloca(_V16F) for _ in range(NV)] for _ in range(mr)]
    svec = [f.alloca(_V16F) for _ in range(NV)]
    ovec = [f.alloca(_V16F) for _ in range(NV)]
    mblocks = -(-s.m // mr)
    k2 = s.k // 2
    half = s.group // 2

    def tile(r: str) -> None:
        nb, m0 = _tile_origin(f, r, mblocks, mr)
        panel = f(f"getelementptr i8, ptr {wq}, i64 {f(f'mul i64 {nb}, {k2 * PANEL}')}")
        rows = []
        for i in range(mr):
            m = f(f"add i64 {m0}, {i}")
            m = f(f"select i1 {f(f'icmp slt i64 {m}, {s.m}')}, i64 {m}, i64 {s.m - 1}")
            rows.append(f(f"getelementptr float, ptr {x}, i64 {f(f'mul i64 {m}, {s.k}')}"))
        for row in accs:
            for a in row:
                f.do(f"store {_V16F} zeroinitializer, ptr {a}, align 64")
        col0 = f(f"mul i64 {nb}, {PANEL}")

        def group(g: str) -> None:
            base = f(f"add i64 {f(f'mul i64 {g}, {s.np_}')}, {col0}")
            for j in range(NV):
                at = f(f"add i64 {base}, {j * LANES}")
                for src, dst in ((sc, svec[j]), (of, ovec[j])):
                    f.do(f"store {_V16F} {f.vload(_V16F, 'float', src, at)}, ptr {dst}, align 64")

            def pair(p: str) -> None:
                kk = f(f"add i64 {f(f'mul i64 {g}, {half}')}, {p}")
                xe, xo = [], []
                for i in range(mr):
                    pe = f(f"getelementptr float, ptr {rows[i]}, i64 {f(f'mul i64 {kk}, 2')}")
                    xe.append(f.splat(f(f"load float, ptr {pe}")))
                    po = f(f"getelementptr float, ptr {pe}, i64 1")
                    xo.append(f.splat(f(f"load float, ptr {po}")))
                for j in range(NV):
                    off = f(f"add i64 {f(f'mul i64 {kk}, {PANEL}')}, {j * LANES}")
                    q = f.vload("<16 x i8>", "i8", panel, off, 16)
                    q = f(f"zext <16 x i8> {q} to {_V16I}")
                    lo_ = f(f"uitofp {_V16I} {f(f'and {_V16I} {q}, splat (i32 15)')} to {_V16F}")
                    hi_ = f(f"uitofp {_V16I} {f(f'lshr {_V16I} {q}, splat (i32 4)')} to {_V16F}")
                    s_ = f(f"load {_V16F}, ptr {svec[j]}, align 64")
                    o_ = f(f"load {_V16F}, ptr {ovec[j]}, align 64")
                    we, wo = f.fma(lo_, s_, o_), f.fma(hi_, s_, o_)
                    for i in range(mr):
                        a = f(f"load {_V16F}, ptr {accs[i][j]}, align 64")
                        a = f.fma(xo[i], wo, f.fma(xe[i], we, a))
                        f.do(f"store {_V16F} {a}, ptr {accs[i][j]}, align 64")

            f.counted_loop(f"p{r[1:]}_{g[1:]}", half, pair)

        f.counted_loop(f"g{r[1:]}", s.k // s.group, group)
        masks, biases, cols = [], [], []
        for j in range(NV):
            n0 = f(f"add i64 {col0}, {j * LANES}")
            cols.append(n0)
            masks.append(_lane_mask(f, n0, s.n))
            biases.append(f.vload(_V16F, "float", bias, n0))
        for i in range(mr):
            m = f(f"add i64 {m0}, {i}")
            label = f"st{r[1:]}_{i}"
            f.do(f"br i1 {f(f'icmp slt i64 {m}, {s.m}')}, label %{label}, label %{label}.skip")
            f.label(label)
            for j in range(NV):
                v = f(f"fadd {_V16F} {f(f'load {_V16F}, ptr {accs[i][j]}, align 64')}, {biases[j]}")
                at = f(f"mul i64 {m}, {s.n}")
                dst = f(f"getelementptr float, ptr {out}, i64 {f(f'add i64 {at}, {cols[j]}')}")
                _epilogue_store(f, v, act, dst, masks[j])
            f.do(f"br label %{label}.skip")
            f.label(f"{label}.skip")

    f.counted_loop("tile", f("sub i64 %hi, %lo"), tile)
    f.do("ret void")
    return f.text()


def int4_module(name: str, s: Int4Shape, act: str = "none") -> str:
    """The LLVM IR of an int4 kernel; buffers: x, wq (packed), scales, offsets, bias, out."""
    tiles = -(-s.m // s.mr) * (s.np_ // PANEL)
    return "".join([_DECLS, _math(act), _int4_tiles(f"{name}.tiles", s, act),
                    _grab_worker(f"{name}.w0", f"{name}.tiles", tiles, 1),
                    _entry(name, [f"{name}.w0"])])



INT8_BUFFERS = [("x", DType.f32, True), ("w", DType.i8, True), ("comp", DType.i32, True),
                ("w_scale", DType.f32, True), ("bias", DType.f32, True),
                ("out", DType.f32, False), ("aq", DType.u8, False), ("sa", DType.f32, False)]
INT4_BUFFERS = [("x", DType.f32, True), ("wq", DType.u8, True), ("scales", DType.f32, True),
                ("offsets", DType.f32, True), ("bias", DType.f32, True),
                ("out", DType.f32, False)]


def build_int8(name: str, m: int, w: np.ndarray, w_scale: np.ndarray, bias: np.ndarray,
               act: str = "none", raw: bool = False, target: CpuTarget | None = None,
               compiler: Compiler | None = None) -> QuantKernel:
    """The int8 kernel for x [m, K] against i8 ``w`` [K, N]; ``raw``: out holds acc (i32)."""
    target = target or host_target()
    check_target(target, vnni=True)
    k, n = w.shape
    if k > MAX_K8:
        raise CompileError(f"qmatmul_i8 with K = {k}: over {MAX_K8} the i32 sums of "
                           "(q + 128) * w could overflow")
    s = Int8Shape(m, k, n)
    name = f"{name}_q8_{m}x{k}x{n}_{act}{'_raw' if raw else ''}"
    text = int8_module(name, s, act, raw)
    buffers = list(INT8_BUFFERS)
    if raw:
        buffers[5] = ("out", DType.i32, False)
    fn = signature_function(name, buffers)
    kernel = compile_with(compiler, text, KernelSignature(name, fn.buffers, (), True), target)
    packed, comp = pack_int8(np.asarray(w, np.int8))
    consts = {"w": packed, "comp": _padded(comp, n, np.int32),
              "w_scale": _padded(np.asarray(w_scale, np.float32), n, np.float32),
              "bias": _padded(np.asarray(bias, np.float32), n, np.float32)}
    scratch = {"aq": (s.aq_bytes, np.dtype(np.uint8)), "sa": (s.mp * 4, np.dtype(np.float32))}
    return QuantKernel(fn, kernel, text, consts, scratch)


U8S8_BUFFERS = [("a", DType.u8, True), ("w", DType.i8, True), ("colsum", DType.i32, True),
                ("a_zero", DType.u8, True), ("out", DType.i32, False), ("aq", DType.u8, False)]


def build_u8s8(name: str, m: int, w: np.ndarray, target: CpuTarget | None = None,
               compiler: Compiler | None = None, steps: tuple = (),
               operands: tuple[int, ...] = ()) -> QuantKernel:
    """The exact integer product ``(a - a_zero) @ w`` (ONNX MatMulInteger with u8 activations
    and i8 weights) for a [m, K]; out is i32, or f32 through the fused epilogue ``steps``
    (the rescale an onnxruntime ``quantize_dynamic`` file writes after it)."""
    target = target or host_target()
    check_target(target, vnni=True)
    k, n = w.shape
    if k > MAX_K8:
        raise CompileError(f"matmul_u8s8 with K = {k}: over {MAX_K8} the i32 sums could "
                           "overflow")
    s = Int8Shape(m, k, n)
    name = f"{name}_u8s8_{m}x{k}x{n}"
    buffers = list(U8S8_BUFFERS)
    if steps:
        name += "_e" + hashlib.sha1(repr((steps, operands)).encode()).hexdigest()[:12]
        buffers[4] = ("out", DType.f32, False)
        buffers += [(f"e{i}", DType.f32, True) for i in range(len(operands))]
    text = u8s8_module(name, s, steps, operands)
    fn = signature_function(name, buffers)
    kernel = compile_with(compiler, text, KernelSignature(name, fn.buffers, (), True), target)
    packed, comp = pack_int8(np.asarray(w, np.int8))
    consts = {"w": packed, "colsum": _padded(comp // 128, n, np.int32)}
    return QuantKernel(fn, kernel, text, consts, {"aq": (s.aq_bytes, np.dtype(np.uint8))},
                       {"a": 0, "a_zero": 1, **{f"e{i}": 3 + i for i in range(len(operands))}})


def build_int4(name: str, m: int, wq: np.ndarray, scales: np.ndarray, zeros: np.ndarray,
               bias: np.ndarray, group: int, act: str = "none",
               target: CpuTarget | None = None, compiler: Compiler | None = None
               ) -> QuantKernel:
    """The int4 weight-only kernel for x [m, K] against packed nibbles ``wq`` [K/2, N]."""
    target = target or host_target()
    check_target(target, vnni=False)
    k2, n = wq.shape
    s = Int4Shape(m, 2 * k2, n, group)
    name = f"{name}_w4_{m}x{s.k}x{n}_g{group}_{act}"
    text = int4_module(name, s, act)
    fn = signature_function(name, INT4_BUFFERS)
    kernel = compile_with(compiler, text, KernelSignature(name, fn.buffers, (), True), target)
    scales = np.asarray(scales, np.float32)
    offsets = (-zeros.astype(np.float32) * scales).astype(np.float32)
    groups = scales.shape[0]
    sp = aligned_empty((groups, s.np_), np.float32)
    op = aligned_empty((groups, s.np_), np.float32)
    sp[:], op[:] = 0, 0
    sp[:, :n], op[:, :n] = scales, offsets
    consts = {"wq": pack_int4(np.asarray(wq, np.uint8)), "scales": sp.reshape(-1),
              "offsets": op.reshape(-1), "bias": _padded(np.asarray(bias, np.float32), n,
                                                         np.float32)}
    return QuantKernel(fn, kernel, text, consts, {})


__all__ = ["INT4_BUFFERS", "INT8_BUFFERS", "Int4Shape", "Int8Shape", "QuantKernel",
           "build_int4", "build_int8", "check_target", "compile_ir", "int4_module",
           "int8_module", "one_region", "pack_int4", "pack_int8"]


# ---- kernel groups ---------------------------------------------------------------------------

QUANT_OPS = frozenset({QMATMUL_I8, MATMUL_W4, MATMUL_U8S8, DYNAMIC_QUANTIZE_U8, QCONV_I8})
"""The ops lowered here (by OpDef, as nodes point at them)."""


def _kind(value: object) -> int:
    """An epilogue operand's kind for :func:`tilefuse.kernel.quant_ir.epilogue_ir`: 0 scalar,
    1 [N] vector, 2 [M, N] tensor."""
    shape = tuple(value.shape)  # type: ignore[attr-defined]
    return 0 if len(shape) == 0 or shape == (1,) else 1 if len(shape) == 1 else 2


def is_quant_group(group: object) -> bool:
    """A kernel group holding one quantized product (lowered here, not by the loop IR)."""
    nodes = getattr(group, "nodes", ())
    return len(nodes) == 1 and nodes[0].op in QUANT_OPS


def lower_quant_group(group: object, constants: dict, target: CpuTarget | None = None,
                      compiler: Compiler | None = None) -> QuantKernel:
    """The kernel of a quantized group; its weights must be constants (the quantize pass makes
    them so). ``QuantKernel.constants`` then holds every build-time buffer."""
    node = group.nodes[0]  # type: ignore[attr-defined]
    x = node.inputs[0]
    if not all(isinstance(d, int) for d in x.shape):
        raise CompileError(f"{node.op.name} needs static shapes, got {x.type}")
    m = int(np.prod(x.shape[:-1], dtype=np.int64))
    name = "tf"  # named by shape alone: groups of one shape (Q, K, V) share one compile
    if node.op is DYNAMIC_QUANTIZE_U8:
        from tilefuse.kernel.lower_qdynamic import build_dql

        return build_dql(name, int(np.prod(x.shape, dtype=np.int64)), target, compiler)
    if node.op is MATMUL_U8S8:
        w = constants.get(node.inputs[2])
        if w is None:
            raise CompileError("matmul_u8s8: the weight must be a constant")
        return build_u8s8(name, m, w, target, compiler, node.attrs["epilogue"],
                          tuple(_kind(v) for v in node.inputs[3:]))
    arrays = [constants.get(v) for v in node.inputs[1:4 if node.op is QCONV_I8 else None]]
    if any(a is None for a in arrays):
        raise CompileError(f"{node.op.name}: the weights, scales and bias must be constants")
    act = node.attrs["act"]
    if node.op is QCONV_I8:
        from tilefuse.kernel.lower_qconv import build_qconv, conv_shape, static_of

        w, scale, bias = arrays[:3]
        operands = tuple(_kind(v) for v in node.inputs[4:])
        return build_qconv(name, conv_shape(node), w, scale, bias, act, static_of(node.attrs),
                           raw=bool(node.attrs["raw"]), target=target, compiler=compiler,
                           steps=node.attrs["epilogue"],
                           operands=operands)
    if node.op is QMATMUL_I8:
        w, scale, bias = arrays
        return build_int8(name, m, w, scale, bias, act, target=target, compiler=compiler)
    wq, scales, zeros, bias = arrays
    return build_int4(name, m, wq, scales, zeros, bias, node.attrs["group"], act, target=target,
                      compiler=compiler)
