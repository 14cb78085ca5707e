"""Quantized matrix products: ``qmatmul_i8`` (int8 weights and dynamically quantized int8
activations) and ``matmul_w4`` (int4 weights, f32 activations).

Both take an f32 activation ``x [..., K]`` and a constant weight made by the ``quantize`` pass
(:mod:`tilefuse.passes.quantize`), and return f32 ``[..., N]`` with the bias added and an
optional activation (``act``: "none", "relu" or "gelu") applied: the epilogue the native
kernels fuse.
Their references are the exact semantics the kernels are held to:

- ``qmatmul_i8(x, w i8[K,N], w_scale f32[N], bias f32[N])``: each row of x is quantized
  symmetrically, ``amax = max|x|``, ``q = clip(rint(x * (127/amax)), -127, 127)`` (f32
  arithmetic, half to even; a zero row gives q = 0; NaNs are left out of amax and get code 0,
  so a NaN in x does not propagate), the integer product ``q @ w`` is exact in
  i32, and ``out = f32(acc) * (amax/127 * w_scale[n]) + bias[n]`` (one rounding per operation,
  in that order). The integer part is bit-exact in the kernel.
- ``matmul_w4(x, wq u8[K/2,N], scales f32[K/G,N], zero_points u8[K/G,N], bias f32[N])``: two
  4-bit weights a byte along K (low nibble: even k), ``w = (q - z) * s`` per group of G rows
  of K; ``out = x @ w + bias`` in f32 (the kernel dequantizes with one FMA, so results agree
  to f32 rounding, not bit for bit).
- ``qconv_i8(p f32[N, Hp, Wp, C], w i8[KH*KW*C, O], w_scale, bias)``: a convolution's int8
  product whose rows are the KHxKW windows of the (already padded) NHWC input, read in place
  by the kernel (no im2col matrix). Rows are quantized per row as above (``x_scale`` 0: what
  ``quantize="int8"`` makes) or by a static ONNX QuantizeLinear (``x_scale``, ``x_zero``, codes
  ``[x_min, x_max]``: a QDQ model's activation), then the same exact i32 sums and epilogue,
  then an optional fused elementwise ``epilogue`` (steps over scalars and extra f32 operands
  of shape [O] or [N*OH*OW, O]: what follows a QDQ model's convolution, its batch norm, the
  next QuantizeLinear/DequantizeLinear, a residual add and relu; :func:`run_epilogue`).
  With ``raw`` the output is the exact i32 sums alone (ONNX ConvInteger: scale 1 and zero
  point x_zero on the centred input ``x - x_zero``, whose codes are then the input's own).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from tilefuse.dtypes import DType
from tilefuse.errors import DTypeError, ShapeError
from tilefuse.graph.ir import Attrs
from tilefuse.graph.types import Shape, format_shape
from tilefuse.ops.registry import AttrType, OpDef, OpKind, Trait, attr
from tilefuse.special import erf

ACTIVATIONS = ("none", "relu", "gelu")
_F32 = np.float32


def _check_vector(shape: Shape, n: Any, what: str) -> None:
    if tuple(shape) != (n,):
        raise ShapeError(f"{what} must be [{n}], got {format_shape(shape)}")


def _i8_rule(shapes: tuple[Shape, ...], attrs: Attrs) -> tuple[Shape, ...]:
    x, w, scale, bias = shapes
    if len(x) < 1 or len(w) != 2:
        raise ShapeError(f"qmatmul_i8 needs x [..., K] and w [K, N], got {format_shape(x)} "
                         f"and {format_shape(w)}")
    if x[-1] != w[0]:
        raise ShapeError(f"contraction dims differ: {x[-1]} (last of {format_shape(x)}) vs "
                         f"{w[0]} (first of {format_shape(w)})")
    _check_vector(scale, w[1], "w_scale")
    _check_vector(bias, w[1], "bias")
    return ((*x[:-1], w[1]),)


def _i8_dtypes(dtypes: tuple[DType, ...], attrs: Attrs) -> tuple[DType, ...]:
    want = (DType.f32, DType.i8, DType.f32, DType.f32)
    if dtypes != want:
        raise DTypeError("qmatmul_i8 takes (f32, i8, f32, f32), got "
                         f"({', '.join(d.value for d in dtypes)})")
    return (DType.f32,)


def quantize_rows(x2: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The dynamic per-row quantization of an f32 matrix, as the kernel does it: q (i32, in
    [-127, 127]) and each row's scale amax/127 (f32)."""
    x2 = np.asarray(x2, _F32)
    amax = np.fmax.reduce(np.abs(x2), axis=1) if x2.shape[1] else np.zeros(x2.shape[0], _F32)
    with np.errstate(divide="ignore", invalid="ignore"):
        inv = np.where(amax > 0, _F32(127) / amax, _F32(0)).astype(_F32)
        q = np.nan_to_num(np.clip(np.rint(x2 * inv[:, None]), -127, 127), nan=0.0)
    q = q.astype(np.int32)
    return q, (amax / _F32(127)).astype(_F32)


def epilogue(v: np.ndarray, act: str) -> np.ndarray:
    """The fused activation: relu, or the exact (erf) GELU in the order ops.elementwise's
    ``gelu`` reference computes it."""
    if act == "gelu":
        return (_F32(0.5) * v * (_F32(1) + erf(v / _F32(np.sqrt(2.0))))
                ).astype(_F32)
    return np.maximum(v, _F32(0)) if act == "relu" else v


def _i8_reference(x: np.ndarray, w: np.ndarray, w_scale: np.ndarray, bias: np.ndarray, *,
                  act: str) -> np.ndarray:
    k, n = w.shape
    x2 = x.reshape(-1, k)
    q, sa = quantize_rows(x2)
    acc = (q.astype(np.int64) @ w.astype(np.int64)).astype(np.int32)
    out = acc.astype(_F32) * (sa[:, None] * w_scale[None, :].astype(_F32)) + bias.astype(_F32)
    return epilogue(out.astype(_F32), act).reshape(*x.shape[:-1], n)


def _w4_rule(shapes: tuple[Shape, ...], attrs: Attrs) -> tuple[Shape, ...]:
    x, wq, scales, zeros, bias = shapes
    g = attrs["group"]
    if len(x) < 1 or len(wq) != 2:
        raise ShapeError(f"matmul_w4 needs x [..., K] and wq [K/2, N], got {format_shape(x)} "
                         f"and {format_shape(wq)}")
    k, n = x[-1], wq[1]
    if not isinstance(k, int) or k % g or k % 2 or wq[0] != k // 2:
        raise ShapeError(f"matmul_w4: K = {k} must be a multiple of the group {g} (and even) "
                         f"with wq [K/2, N], got wq {format_shape(wq)}")
    for shape, what in ((scales, "scales"), (zeros, "zero_points")):
        if tuple(shape) != (k // g, n):
            raise ShapeError(f"{what} must be [{k // g}, {n}], got {format_shape(shape)}")
    _check_vector(bias, n, "bias")
    return ((*x[:-1], n),)


def _w4_dtypes(dtypes: tuple[DType, ...], attrs: Attrs) -> tuple[DType, ...]:
    want = (DType.f32, DType.u8, DType.f32, DType.u8, DType.f32)
    if dtypes != want:
        raise DTypeError("matmul_w4 takes (f32, u8, f32, u8, f32), got "
                         f"({', '.join(d.value for d in dtypes)})")
    return (DType.f32,)


def unpack_w4(wq: np.ndarray) -> np.ndarray:
    """[K/2, N] bytes -> [K, N] nibbles (u8, 0..15), low nibble first."""
    out = np.empty((wq.shape[0] * 2, wq.shape[1]), np.uint8)
    out[0::2] = wq & 0xF
    out[1::2] = wq >> 4
    return out


def dequantize_w4(wq: np.ndarray, scales: np.ndarray, zeros: np.ndarray, group: int
                  ) -> np.ndarray:
    """The f32 weight [K, N] a ``matmul_w4`` stands for."""
    q = unpack_w4(wq).astype(_F32)
    s = np.repeat(scales.astype(_F32), group, axis=0)
    z = np.repeat(zeros.astype(_F32), group, axis=0)
    return ((q - z) * s).astype(_F32)


def _w4_reference(x: np.ndarray, wq: np.ndarray, scales: np.ndarray, zeros: np.ndarray,
                  bias: np.ndarray, *, group: int, act: str) -> np.ndarray:
    w = dequantize_w4(wq, scales, zeros, group)
    k, n = w.shape
    out = (x.reshape(-1, k).astype(_F32) @ w + bias.astype(_F32)).astype(_F32)
    return epilogue(out, act).reshape(*x.shape[:-1], n)


QMATMUL_I8 = OpDef(
    "qmatmul_i8", OpKind.OPAQUE, 4, _i8_rule, _i8_dtypes, _i8_reference,
    attrs=(attr("act", AttrType.STR, "none", ACTIVATIONS),),
    accepts=frozenset({DType.f32, DType.i8}),
    doc="x @ dequant(w) with x quantized per row to int8 (exact i32 products), bias, act")

MATMUL_W4 = OpDef(
    "matmul_w4", OpKind.OPAQUE, 5, _w4_rule, _w4_dtypes, _w4_reference,
    attrs=(attr("group", AttrType.INT, 128, (32, 64, 128)),
           attr("act", AttrType.STR, "none", ACTIVATIONS)),
    accepts=frozenset({DType.f32, DType.u8}),
    doc="x @ ((q - z) * s) with 4-bit weights q per group of K rows, bias, act")

def _conv_rule(shapes: tuple[Shape, ...], attrs: Attrs) -> tuple[Shape, ...]:
    if len(shapes) < 4:
        raise ShapeError(f"qconv_i8 takes p, w, w_scale, bias and the epilogue's operands, got "
                         f"{len(shapes)} inputs")
    p, w, scale, bias = shapes[:4]
    if attrs["nhwc"] is not None:   # p read as this NHWC shape (a row-major reshape, in place)
        if not all(isinstance(d, int) for d in p) or \
                int(np.prod(p, dtype=np.int64)) != int(np.prod(attrs["nhwc"], dtype=np.int64)):
            raise ShapeError(f"qconv_i8: nhwc {list(attrs['nhwc'])} does not hold the "
                             f"{format_shape(p)} input")
        p = tuple(attrs["nhwc"])
    (kh, kw), (sh, sw), (dh, dw) = attrs["kernel"], attrs["strides"], attrs["dilations"]
    if len(p) != 4 or len(w) != 2 or not all(isinstance(d, int) for d in (*p, *w)):
        raise ShapeError(f"qconv_i8 needs a static NHWC input [N, Hp, Wp, C] and w [KH*KW*C, O], "
                         f"got {format_shape(p)} and {format_shape(w)}")
    n, hp, wp, c = p
    if w[0] != kh * kw * c:
        raise ShapeError(f"qconv_i8: w has {w[0]} rows, the {kh}x{kw} window over {c} channels "
                         f"needs {kh * kw * c}")
    top, bottom, left, right = attrs["pads"]
    if len(attrs["pads"]) != 4 or min(attrs["pads"]) < 0:
        raise ShapeError(f"qconv_i8: pads must be 4 non-negative ints, got {attrs['pads']}")
    hp, wp = hp + top + bottom, wp + left + right
    oh, ow = (hp - dh * (kh - 1) - 1) // sh + 1, (wp - dw * (kw - 1) - 1) // sw + 1
    if oh < 1 or ow < 1:
        raise ShapeError(f"qconv_i8: a {kh}x{kw} window does not fit {format_shape(p)}")
    _check_vector(scale, w[1], "w_scale")
    _check_vector(bias, w[1], "bias")
    out = (n * oh * ow, w[1])
    for extra in shapes[4:]:
        if tuple(extra) not in ((), (1,), (w[1],), out):
            raise ShapeError(f"qconv_i8: an epilogue operand must be a scalar, [{w[1]}] or "
                             f"{format_shape(out)}, got {format_shape(extra)}")
    check_epilogue(attrs["epilogue"], len(shapes) - 4)
    if attrs["raw"] and (attrs["act"] != "none" or attrs["epilogue"]):
        raise ShapeError("qconv_i8 with raw i32 sums takes no activation or epilogue")
    return (out,)


EPILOGUE_BINARY = ("add", "sub", "mul", "div", "maximum", "minimum")


def check_epilogue(steps: tuple, operands: int) -> None:
    """ShapeError unless ``steps`` is a well-formed fused epilogue over ``operands`` inputs:
    ``("round",)``, ``("relu",)``, ``("gelu",)`` (exact, erf), ``("clip", lo, hi)`` or
    ``(op, kind, x, swapped)`` with op one of :data:`EPILOGUE_BINARY`, kind "s" (x a float) or
    "t" (x an operand index)."""
    for step in steps:
        ok = (step in (("round",), ("relu",), ("gelu",))
              or (len(step) == 3 and step[0] == "clip")
              or (len(step) == 4 and step[0] in EPILOGUE_BINARY
                  and (step[1] == "s" or (step[1] == "t" and 0 <= step[2] < operands))))
        if not ok:
            raise ShapeError(f"qconv_i8: bad epilogue step {step!r}")


def run_epilogue(v: np.ndarray, steps: tuple, operands: tuple[np.ndarray, ...]) -> np.ndarray:
    """The fused epilogue in f32, step by step (the order the kernel computes it)."""
    fns = {"add": np.add, "sub": np.subtract, "mul": np.multiply, "div": np.divide,
           "maximum": np.maximum, "minimum": np.minimum}
    with np.errstate(all="ignore"):
        for step in steps:
            if step[0] == "round":
                v = np.rint(v)
            elif step[0] == "gelu":
                v = epilogue(v, "gelu")
            elif step[0] == "relu":
                v = np.maximum(v, _F32(0))
            elif step[0] == "clip":
                v = np.clip(v, _F32(step[1]), _F32(step[2]))
            else:
                x = _F32(step[2]) if step[1] == "s" else np.asarray(operands[step[2]], _F32)
                v = fns[step[0]](x, v) if step[3] else fns[step[0]](v, x)
            v = v.astype(_F32)
    return v


def _conv_dtypes(dtypes: tuple[DType, ...], attrs: Attrs) -> tuple[DType, ...]:
    if any(d is not DType.f32 for d in dtypes[4:]):
        raise DTypeError("qconv_i8's epilogue operands must be f32, got "
                         f"({', '.join(d.value for d in dtypes[4:])})")
    out = _i8_dtypes(dtypes[:4], attrs)
    return (DType.i32,) if attrs["raw"] else out


def _conv_reference(p: np.ndarray, w: np.ndarray, w_scale: np.ndarray, bias: np.ndarray,
                    *operands: np.ndarray, kernel: tuple[int, ...], strides: tuple[int, ...],
                    dilations: tuple[int, ...], act: str, x_scale: float, x_zero: int,
                    x_min: int, x_max: int, epilogue: tuple = (),
                    nhwc: tuple[int, ...] | None = None,
                    pads: tuple[int, ...] = (0, 0, 0, 0), raw: bool = False) -> np.ndarray:
    from tilefuse.ops.movement import _window_ref

    p = np.asarray(p, _F32) if nhwc is None else np.asarray(p, _F32).reshape(nhwc)
    p = np.pad(p, [(0, 0), (pads[0], pads[1]), (pads[2], pads[3]), (0, 0)])
    a = _window_ref(p, kernel, strides, dilations)
    a = a.reshape(-1, w.shape[0])
    q, sa = window_codes(a, x_scale, x_zero, x_min, x_max)
    acc = (q.astype(np.int64) @ w.astype(np.int64)).astype(np.int32)
    if raw:
        return acc
    out = acc.astype(_F32) * (sa[:, None] * w_scale[None, :].astype(_F32)) + bias.astype(_F32)
    return run_epilogue(_ACT(out.astype(_F32), act), epilogue, operands)


@dataclass(frozen=True)
class Static:
    """A static activation quantization (ONNX QuantizeLinear): scale, zero point, code range."""

    scale: float
    zero: int
    lo: int
    hi: int

    @property
    def offset(self) -> int:
        """What the stored u8 code adds to the centred code ``q - zero``."""
        return self.zero - self.lo


def window_codes(a: np.ndarray, x_scale: float, x_zero: int, x_min: int, x_max: int
                 ) -> tuple[np.ndarray, np.ndarray]:
    """The centred codes (i32) of the rows of ``a`` and each row's scale: dynamic per row
    (:func:`quantize_rows`) when ``x_scale`` is 0, else ONNX QuantizeLinear's
    ``clip(rint(a / x_scale) + x_zero, x_min, x_max) - x_zero`` (f32 division; NaN codes 0)."""
    if x_scale == 0:
        return quantize_rows(a)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        r = np.nan_to_num(np.rint(a / _F32(x_scale)), nan=0.0, posinf=1e9, neginf=-1e9)
    q = np.clip(r, x_min - x_zero, x_max - x_zero).astype(np.int32)
    return q, np.full(a.shape[0], _F32(x_scale), _F32)


_ACT = epilogue   # the activation, under a name the reference's ``epilogue`` attr leaves free

QCONV_I8 = OpDef(
    "qconv_i8", OpKind.OPAQUE, None, _conv_rule, _conv_dtypes, _conv_reference,
    attrs=(attr("kernel", AttrType.INTS), attr("strides", AttrType.INTS, (1, 1)),
           attr("dilations", AttrType.INTS, (1, 1)),
           attr("act", AttrType.STR, "none", ACTIVATIONS),
           attr("x_scale", AttrType.FLOAT, 0.0), attr("x_zero", AttrType.INT, 0),
           attr("x_min", AttrType.INT, -128), attr("x_max", AttrType.INT, 127),
           attr("epilogue", AttrType.ANY, ()), attr("nhwc", AttrType.OPT_INTS, None),
           attr("pads", AttrType.INTS, (0, 0, 0, 0)), attr("raw", AttrType.BOOL, False)),
    accepts=frozenset({DType.f32, DType.i8}),
    doc="a convolution as an int8 product over the KHxKW windows of an NHWC input read in "
        "place: rows quantized per row (x_scale 0) or by a static QuantizeLinear (x_scale, "
        "x_zero, [x_min, x_max]), exact i32 sums, out [N*OH*OW, O] = f32(acc) * (sa * "
        "w_scale) + bias, act, then the fused elementwise epilogue on its extra operands; "
        "raw: the i32 sums alone (ONNX ConvInteger)")

def _u8s8_rule(shapes: tuple[Shape, ...], attrs: Attrs) -> tuple[Shape, ...]:
    if len(shapes) < 3:
        raise ShapeError(f"matmul_u8s8 takes a, a_zero, w and the epilogue's operands, got "
                         f"{len(shapes)} inputs")
    a, zero, w = shapes[:3]
    if len(a) < 1 or len(w) != 2 or a[-1] != w[0]:
        raise ShapeError(f"matmul_u8s8 needs a [..., K] and w [K, N], got {format_shape(a)} "
                         f"and {format_shape(w)}")
    if tuple(zero) not in ((), (1,)):
        raise ShapeError(f"a_zero must be a scalar, got {format_shape(zero)}")
    out = (*a[:-1], w[1])
    rows = (int(np.prod(a[:-1], dtype=np.int64)), w[1]) if all(
        isinstance(d, int) for d in a[:-1]) else None
    for extra in shapes[3:]:
        if tuple(extra) not in ((), (1,), (w[1],), rows):
            raise ShapeError(f"matmul_u8s8: an epilogue operand must be a scalar, [{w[1]}] or "
                             f"{format_shape(out)} as rows, got {format_shape(extra)}")
    check_epilogue(attrs["epilogue"], len(shapes) - 3)
    return (out,)


def _u8s8_dtypes(dtypes: tuple[DType, ...], attrs: Attrs) -> tuple[DType, ...]:
    if dtypes[:3] != (DType.u8, DType.u8, DType.i8) or any(d is not DType.f32
                                                          for d in dtypes[3:]):
        raise DTypeError("matmul_u8s8 takes (u8, u8, i8) and f32 epilogue operands, got "
                         f"({', '.join(d.value for d in dtypes)})")
    return (DType.f32 if attrs["epilogue"] else DType.i32,)


def _u8s8_reference(a: np.ndarray, zero: np.ndarray, w: np.ndarray, *operands: np.ndarray,
                    epilogue: tuple = ()) -> np.ndarray:
    centred = a.astype(np.int64) - np.int64(zero.reshape(()))
    k, n = w.shape
    out = (centred.reshape(-1, k) @ w.astype(np.int64)).astype(np.int32)
    if epilogue:
        flat = tuple(np.asarray(o, _F32).reshape(() if o.size == 1 else o.shape)
                     for o in operands)
        out = run_epilogue(out.astype(_F32), epilogue, flat)
    return out.reshape(*a.shape[:-1], n)


MATMUL_U8S8 = OpDef(
    "matmul_u8s8", OpKind.OPAQUE, None, _u8s8_rule, _u8s8_dtypes, _u8s8_reference,
    attrs=(attr("epilogue", AttrType.ANY, ()),),
    accepts=frozenset({DType.u8, DType.i8, DType.f32}),
    doc="(a - a_zero) @ w in exact i32: ONNX MatMulInteger with u8 activations, i8 weights; "
        "with an epilogue, f32(acc) through it (the rescale that follows it in a "
        "quantize_dynamic file)")

def _dql_rule(shapes: tuple[Shape, ...], attrs: Attrs) -> tuple[Shape, ...]:
    return (shapes[0], (), ())


def _dql_dtypes(dtypes: tuple[DType, ...], attrs: Attrs) -> tuple[DType, ...]:
    if dtypes != (DType.f32,):
        raise DTypeError(f"dynamic_quantize_u8 takes f32, got {dtypes[0].value}")
    return (DType.u8, DType.f32, DType.u8)


def _dql_reference(x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """ONNX DynamicQuantizeLinear in f32: the range [min(x, 0), max(x, 0)] over 255 steps;
    NaN codes (a zero scale) become 0."""
    zero = _F32(0)
    lo = np.minimum(np.min(x), zero) if x.size else zero
    hi = np.maximum(np.max(x), zero) if x.size else zero
    scale = _F32((hi - lo) / _F32(255))
    with np.errstate(invalid="ignore", divide="ignore"):
        point = np.nan_to_num(np.clip(np.rint(-(lo / scale)), 0, 255), nan=0.0)
        q = np.nan_to_num(np.clip(np.rint(x / scale) + _F32(point), 0, 255), nan=0.0)
    return q.astype(np.uint8), np.asarray(scale, _F32), np.asarray(point, np.uint8)


DYNAMIC_QUANTIZE_U8 = OpDef(
    "dynamic_quantize_u8", OpKind.OPAQUE, 1, _dql_rule, _dql_dtypes, _dql_reference,
    traits=frozenset({Trait.MULTI_OUTPUT}), accepts=frozenset({DType.f32}),
    doc="ONNX DynamicQuantizeLinear: u8 codes, scale and zero point over the whole tensor")

DEFINITIONS: tuple[OpDef, ...] = (QMATMUL_I8, MATMUL_W4, MATMUL_U8S8, DYNAMIC_QUANTIZE_U8,
                                  QCONV_I8)

WEIGHT_QUANTIZED = frozenset({QMATMUL_I8, MATMUL_W4, QCONV_I8})
"""The products the ``quantize`` pass makes from f32 weights (what reports count)."""
INTEGER_PRODUCTS = frozenset({QMATMUL_I8, MATMUL_W4, MATMUL_U8S8})
"""Every quantized product: ``x[..., K] @ w[K, N]``-shaped work, 2·M·N·K operations."""

__all__ = [
    "ACTIVATIONS",
    "DEFINITIONS",
    "DYNAMIC_QUANTIZE_U8",
    "INTEGER_PRODUCTS",
    "MATMUL_U8S8",
    "MATMUL_W4",
    "QCONV_I8",
    "QMATMUL_I8",
    "WEIGHT_QUANTIZED",
    "Static",
    "check_epilogue",
    "dequantize_w4",
    "quantize_rows",
    "run_epilogue",
    "unpack_w4",
    "window_codes",
]
