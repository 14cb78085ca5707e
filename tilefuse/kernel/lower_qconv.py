"""The native kernel of ``qconv_i8``: a convolution as an int8 VNNI product whose A rows are the
windows of an NHWC input read in place (implicit GEMM, no f32 im2col matrix).

``conv_lowering`` writes a convolution as ``matmul(reshape(window_patches(P)), W)``; the
quantize pass turns that into ``qconv_i8(P, w, w_scale, bias)`` so the int8 kernel reads P
itself. One entry and one parallel region, like ``qmatmul_i8``
(:mod:`tilefuse.kernel.lower_qmatmul`): a tile first makes sure its block of 6 rows has been
through the window-row phase (a ready flag per block; unset, the tile runs the phase on the
block itself), so no thread waits at a phase boundary for one the OS has preempted:

1. **window rows**: output pixel ``m = (n, oh, ow)`` reads KH runs of ``KW·C`` contiguous floats
   of P (unit dilation along W), ``dh·Wp·C`` apart, and writes their u8 codes into the scratch
   ``aq [Mp, Kp]`` (the u8 im2col row, a quarter of the f32 one, written once and read by the
   tiles while hot) and the row's scale into ``sa``. Dynamic (``x_scale`` 0): ``amax`` over
   the whole window, ``q = clip(rint(x·127/amax), ±127)``, code ``q + 128``. Static (a QDQ
   model's QuantizeLinear): ``q = clip(rint(x / x_scale), x_min - z, x_max - z)`` (the f32
   division the operator specifies), code ``q + z - x_min`` in 0..255, ``sa = x_scale``.
2. **tiles**: the int8 tiles of :func:`tilefuse.kernel.lower_qmatmul._int8_tiles` unchanged:
   vpdpbusd into 6x64 i32 accumulators, ``comp[n] = offset · Σk w[k, n]`` (built here)
   removes the code offset exactly, then ``f32(acc) · (sa[m] · w_scale[n]) + bias[n]`` and
   the activation.

Checked bit for bit against the op's NumPy reference (int32 sums) in
tests/kernel/test_qconv.py; ``raw=True`` stores the integer sums alone.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np

from tilefuse.codegen.jit import KernelSignature
from tilefuse.codegen.target import CpuTarget, host_target
from tilefuse.dtypes import DType
from tilefuse.errors import CompileError
from tilefuse.kernel.lower_qmatmul import (
    INT8_BUFFERS,
    Int8Shape,
    _int8_tiles,
    one_region,
    pack_int8,
)
from tilefuse.kernel.quant_ir import (
    _DECLS,
    _V16F,
    LANES,
    MAX_K8,
    Compiler,
    QuantKernel,
    _codes,
    _Fn,
    _math,
    _padded,
    check_target,
    compile_with,
    epilogue_ir,
    signature_function,
)
from tilefuse.ops.quant import Static

_MASKED = """
declare void @llvm.masked.store.v16i8.p0(<16 x i8>, ptr, i32, <16 x i1>)
"""


@dataclass(frozen=True)
class ConvShape:
    """A ``qconv_i8``: padded input [n, hp, wp, c], a kh x kw window with strides (sh, sw) and
    row dilation dh (unit along W), o output channels."""

    n: int
    hp: int
    wp: int
    c: int
    kh: int
    kw: int
    sh: int
    sw: int
    dh: int
    o: int
    pads: tuple[int, int, int, int] = (0, 0, 0, 0)
    """Zero padding (top, bottom, left, right) read by the row phase: hp, wp are the input's."""

    @property
    def oh(self) -> int:
        return (self.hp + self.pads[0] + self.pads[1] - self.dh * (self.kh - 1) - 1) \
            // self.sh + 1

    @property
    def ow(self) -> int:
        return (self.wp + self.pads[2] + self.pads[3] - self.kw) // self.sw + 1

    @property
    def run(self) -> int:
        return self.kw * self.c

    @property
    def int8(self) -> Int8Shape:
        return Int8Shape(self.n * self.oh * self.ow, self.kh * self.run, self.o)


def _mask(count: int) -> str:
    return "<" + ", ".join(f"i1 {int(i < count)}" for i in range(LANES)) + ">"


def _window_rows(name: str, cs: ConvShape, static: Static | None) -> str:
    """``void name(bufs, lo, hi)``: output pixels lo..hi: their windows of P (buffer 0) as u8
    codes into aq (6) and their scales into sa (7)."""
    s = cs.int8
    f = _Fn(f"define internal void @{name}(ptr %bufs, i64 %lo, i64 %hi) nounwind")
    p, aq, sa = f.buffer("%bufs", 0), f.buffer("%bufs", 6), f.buffer("%bufs", 7)
    padded = any(cs.pads)
    full, tail = divmod(cs.c if padded else cs.run, LANES)
    tail_mask = _mask(tail)
    amax_v = f.alloca(_V16F)
    pixel = cs.oh * cs.ow
    offset = 128 if static is None else static.offset
    lo, hi = (-127, 127) if static is None else (static.lo - static.zero,
                                                 static.hi - static.zero)

    def load(src: str, at: str, mask: str | None) -> str:
        ptr = f(f"getelementptr float, ptr {src}, i64 {at}")
        if mask is None:
            return f(f"load {_V16F}, ptr {ptr}, align 4")
        return f(f"call {_V16F} @llvm.masked.load.v16f32.p0(ptr {ptr}, i32 4, <16 x i1> "
                 f"{mask}, {_V16F} zeroinitializer)")

    def row(r: str) -> None:
        m = f(f"add i64 %lo, {r}")
        img, rest = f(f"udiv i64 {m}, {pixel}"), f(f"urem i64 {m}, {pixel}")
        oh, ow = f(f"udiv i64 {rest}, {cs.ow}"), f(f"urem i64 {rest}, {cs.ow}")
        base = f(f"mul i64 {img}, {cs.hp * cs.wp * cs.c}")
        arow = f(f"getelementptr i8, ptr {aq}, i64 {f(f'mul i64 {m}, {s.kp}')}")
        if not padded:
            base = f(f"add i64 {base}, {f(f'mul i64 {oh}, {cs.sh * cs.wp * cs.c}')}")
            base = f(f"add i64 {base}, {f(f'mul i64 {ow}, {cs.sw * cs.c}')}")
        else:
            ih0 = f(f"sub i64 {f(f'mul i64 {oh}, {cs.sh}')}, {cs.pads[0]}")
            iw0 = f(f"sub i64 {f(f'mul i64 {ow}, {cs.sw}')}, {cs.pads[2]}")

        def run(tag: str, src: str, dst: str, body) -> None:
            f.counted_loop(tag, full, lambda i: body(src, dst, f(f"mul i64 {i}, {LANES}"), None))
            if tail:
                body(src, dst, str(full * LANES), tail_mask)

        def segments(tag: str, body, fill=None) -> None:
            """body(src, dst_offset, vector index, mask) over every vector of every run; with
            padding, fill(dst_offset, vector index, mask) over the runs outside the input."""
            def seg(t: str) -> None:
                step = f(f"mul i64 {t}, {cs.dh * cs.wp * cs.c}")
                src = f(f"getelementptr float, ptr {p}, i64 {f(f'add i64 {base}, {step}')}")
                run(f"{tag}{r[1:]}_{t[1:]}", src, f(f"mul i64 {t}, {cs.run}"), body)

            def tap(t: str, u: str) -> None:
                ih = f(f"add i64 {ih0}, {f(f'mul i64 {t}, {cs.dh}')}")
                iw = f(f"add i64 {iw0}, {u}")
                inside = f(f"and i1 {f(f'icmp ult i64 {ih}, {cs.hp}')}, "
                           f"{f(f'icmp ult i64 {iw}, {cs.wp}')}")   # unsigned: < 0 is huge
                tap_index = f(f"add i64 {f(f'mul i64 {t}, {cs.kw}')}, {u}")
                dst = f(f"mul i64 {tap_index}, {cs.c}")
                label = f"{tag}{r[1:]}_{t[1:]}_{u[1:]}"
                f.do(f"br i1 {inside}, label %{label}.in, label %{label}.out")
                f.label(f"{label}.in")
                at = f(f"add i64 {base}, {f(f'mul i64 {ih}, {cs.wp * cs.c}')}")
                at = f(f"add i64 {at}, {f(f'mul i64 {iw}, {cs.c}')}")
                run(f"{label}.v", f(f"getelementptr float, ptr {p}, i64 {at}"), dst, body)
                f.do(f"br label %{label}.end")
                f.label(f"{label}.out")
                if fill is not None:
                    run(f"{label}.f", "", dst, lambda _s, d, i, k: fill(d, i, k))
                f.do(f"br label %{label}.end")
                f.label(f"{label}.end")

            if padded:
                f.counted_loop(f"{tag}s{r[1:]}", cs.kh,
                               lambda t: f.counted_loop(f"{tag}w{r[1:]}_{t[1:]}", cs.kw,
                                                        lambda u: tap(t, u)))
            else:
                f.counted_loop(f"{tag}s{r[1:]}", cs.kh, seg)

        if static is None:
            f.do(f"store {_V16F} zeroinitializer, ptr {amax_v}")

            def amax_step(src: str, dst: str, at: str, mask: str | None) -> None:
                v = f(f"call {_V16F} @llvm.fabs.v16f32({_V16F} {load(src, at, mask)})")
                old = f(f"load {_V16F}, ptr {amax_v}")
                new = f(f"call {_V16F} @llvm.maxnum.v16f32({_V16F} {old}, {_V16F} {v})")
                f.do(f"store {_V16F} {new}, ptr {amax_v}")

            segments("amax", amax_step)
            amax = f(f"call float @llvm.vector.reduce.fmax.v16f32({_V16F} "
                     f"{f(f'load {_V16F}, ptr {amax_v}')})")
            pos = f(f"fcmp ogt float {amax}, 0.0")
            inv = f(f"select i1 {pos}, float {f(f'fdiv float 1.270000e+02, {amax}')}, "
                    "float 0.0")
            scale = f(f"fdiv float {amax}, 1.270000e+02")
            factor = f.splat(inv)
        else:
            scale = f"0x{np.float64(np.float32(static.scale)).view(np.uint64):016X}"
            factor = f.splat(scale)
        f.do(f"store float {scale}, ptr {f(f'getelementptr float, ptr {sa}, i64 {m}')}")

        def q_step(src: str, dst: str, at: str, mask: str | None) -> None:
            v = load(src, at, mask)
            op = "fmul" if static is None else "fdiv"
            r_ = f(f"call {_V16F} @llvm.rint.v16f32({_V16F} {f(f'{op} {_V16F} {v}, {factor}')})")
            q = _codes(f, r_, lo, hi, offset)
            ptr = f(f"getelementptr i8, ptr {arow}, i64 {f(f'add i64 {dst}, {at}')}")
            if mask is None:
                f.do(f"store <16 x i8> {q}, ptr {ptr}, align 1")
            else:
                f.do(f"call void @llvm.masked.store.v16i8.p0(<16 x i8> {q}, ptr {ptr}, i32 1, "
                     f"<16 x i1> {mask})")

        def pad_step(dst: str, at: str, mask: str | None) -> None:
            code = offset - 256 if offset > 127 else offset
            q = f"splat (i8 {code})"
            ptr = f(f"getelementptr i8, ptr {arow}, i64 {f(f'add i64 {dst}, {at}')}")
            if mask is None:
                f.do(f"store <16 x i8> {q}, ptr {ptr}, align 1")
            else:
                f.do(f"call void @llvm.masked.store.v16i8.p0(<16 x i8> {q}, ptr {ptr}, i32 1, "
                     f"<16 x i1> {mask})")

        segments("q", q_step, pad_step)
        for t in range(s.k, s.kp):   # K padding: meets zero weights; the offset codes 0
            f.do(f"store i8 {offset - 256 if offset > 127 else offset}, ptr "
                 f"{f(f'getelementptr i8, ptr {arow}, i64 {t}')}")

    f.counted_loop("row", f("sub i64 %hi, %lo"), row)
    f.do("ret void")
    return f.text()


def qconv_module(name: str, cs: ConvShape, act: str, static: Static | None,
                 raw: bool = False, steps: tuple = (), operands: tuple[int, ...] = ()
                 ) -> str:
    """The LLVM IR of a ``qconv_i8``; buffers as ``INT8_BUFFERS`` with x the padded input,
    then the epilogue's operands."""
    s = cs.int8
    post = epilogue_ir(steps, operands, s.n, len(INT8_BUFFERS)) if steps else None
    erf = act == "gelu" or ("gelu",) in steps
    return "".join([_DECLS, _MASKED, _math("gelu" if erf else act),
                    _window_rows(f"{name}.rows", cs, static),
                    _int8_tiles(f"{name}.tiles", s, act, raw, post=post, rows=f"{name}.rows"),
                    one_region(name, s, f"{name}.rows", f"{name}.tiles")])


def build_qconv(name: str, cs: ConvShape, w: np.ndarray, w_scale: np.ndarray,
                bias: np.ndarray, act: str = "none", static: Static | None = None,
                raw: bool = False, target: CpuTarget | None = None,
                compiler: Compiler | None = None, steps: tuple = (),
                operands: tuple[int, ...] = ()) -> QuantKernel:
    """The ``qconv_i8`` kernel for the padded input of ``cs`` against i8 ``w`` [KH*KW*C, O];
    ``raw``: out holds the exact i32 sums of the centred codes. ``steps``: a fused epilogue
    whose operand i is a scalar, an [N] vector or an [M, N] tensor (``operands[i]`` 0, 1
    or 2: :func:`tilefuse.kernel.quant_ir.epilogue_ir`)."""
    target = target or host_target()
    check_target(target, vnni=True)
    s = cs.int8
    if tuple(w.shape) != (s.k, s.n):
        raise CompileError(f"qconv_i8: w is {list(w.shape)}, the window needs [{s.k}, {s.n}]")
    if s.k > MAX_K8:
        raise CompileError(f"qconv_i8 with K = {s.k}: over {MAX_K8} the i32 sums could overflow")
    if static is not None and not (0 <= static.hi - static.lo <= 255
                                   and static.lo <= static.zero <= static.hi):
        raise CompileError(f"qconv_i8: codes [{static.lo}, {static.hi}] with zero point "
                           f"{static.zero} do not fit a byte")
    tag = "dyn" if static is None else f"s{np.float32(static.scale).view(np.uint32):08x}_" \
        f"{static.zero}_{static.lo}_{static.hi}"
    pads = "p" + "_".join(map(str, cs.pads)) if any(cs.pads) else ""
    name = (f"{name}_qc8_{cs.n}x{cs.hp}x{cs.wp}x{cs.c}_{cs.kh}x{cs.kw}s{cs.sh}{cs.sw}d{cs.dh}"
            f"{pads}_{cs.o}_{act}_{tag}{'_raw' if raw else ''}")
    if steps:
        digest = hashlib.sha1(repr((steps, operands)).encode()).hexdigest()[:12]
        name = f"{name}_e{digest}"
    text = qconv_module(name, cs, act, static, raw, steps, operands)
    buffers = list(INT8_BUFFERS) + [(f"e{i}", DType.f32, True) for i in range(len(operands))]
    if raw:
        buffers[5] = ("out", DType.i32, False)
    fn = signature_function(name, buffers)
    kernel = compile_with(compiler, text, KernelSignature(name, fn.buffers, (), True), target)
    packed, comp = pack_int8(np.asarray(w, np.int8))
    offset = 128 if static is None else static.offset
    comp = (comp // 128 * offset).astype(np.int32)
    consts = {"w": packed, "comp": _padded(comp, s.n, np.int32),
              "w_scale": _padded(np.asarray(w_scale, np.float32), s.n, np.float32),
              "bias": _padded(np.asarray(bias, np.float32), s.n, np.float32)}
    scratch = {"aq": (s.aq_bytes, np.dtype(np.uint8)), "sa": (s.mp * 4, np.dtype(np.float32))}
    inputs = {"x": 0, **{f"e{i}": 4 + i for i in range(len(operands))}}
    return QuantKernel(fn, kernel, text, consts, scratch, inputs)


def conv_shape(node: object) -> ConvShape:
    """The :class:`ConvShape` of a ``qconv_i8`` node (CompileError for a dilation along W)."""
    (kh, kw), (sh, sw), (dh, dw) = (node.attrs[a] for a in  # type: ignore[attr-defined]
                                    ("kernel", "strides", "dilations"))
    if dw != 1:
        raise CompileError(f"qconv_i8 reads runs along W: dilation {dw} along W is not "
                           "supported")
    shape = node.attrs["nhwc"] or node.inputs[0].shape  # type: ignore[attr-defined]
    n, hp, wp, c = (int(d) for d in shape)
    o = int(node.inputs[1].shape[1])  # type: ignore[attr-defined]
    pads = tuple(node.attrs["pads"])  # type: ignore[attr-defined]
    return ConvShape(n, hp, wp, c, kh, kw, sh, sw, dh, o, pads)  # type: ignore[arg-type]


def static_of(attrs: object) -> Static | None:
    """The static quantization a ``qconv_i8``'s attrs name, or None (dynamic)."""
    if attrs["x_scale"] == 0:  # type: ignore[index]
        return None
    return Static(float(attrs["x_scale"]), int(attrs["x_zero"]),  # type: ignore[index]
                  int(attrs["x_min"]), int(attrs["x_max"]))  # type: ignore[index]


__all__ = ["ConvShape", "Static", "build_qconv", "conv_shape", "qconv_module", "static_of"]
