"""The ``qconv_i8`` kernel (kernel/lower_qconv.py) against NumPy: the window rows' u8 codes and
the i32 sums exactly equal to NumPy int64 sums over an explicit im2col (dynamic per-row and
static QuantizeLinear codes, u8 and i8 ranges, odd channel counts, strides, row dilation, a
7x7 stem over 3 channels), and the f32 epilogue bit for bit against the op's reference."""

from __future__ import annotations

import numpy as np
import pytest

from tilefuse.codegen.jit import aligned_empty
from tilefuse.codegen.target import host_target
from tilefuse.errors import CompileError
from tilefuse.kernel.lower_qconv import ConvShape, Static, build_qconv
from tilefuse.ops.movement import _window_ref
from tilefuse.ops.quant import _conv_reference, window_codes
from tilefuse.passes.quantize import quantize_int8

pytestmark = pytest.mark.skipif(
    not host_target().has("avx512vnni"), reason="the int8 kernel needs AVX-512 VNNI")

rng = np.random.default_rng(2930)

# n, hp, wp, c, kh, kw, sh, sw, dh, o
SHAPES = [
    ConvShape(1, 5, 5, 3, 3, 3, 1, 1, 1, 5),
    ConvShape(2, 9, 8, 17, 3, 3, 2, 2, 1, 70),
    ConvShape(1, 13, 13, 3, 7, 7, 2, 2, 1, 64),     # a ResNet stem
    ConvShape(1, 7, 7, 64, 1, 1, 2, 2, 1, 129),     # 1x1 stride 2
    ConvShape(1, 9, 6, 20, 3, 2, 1, 1, 2, 33),      # dilated rows, a 3x2 window
    ConvShape(1, 1, 37, 48, 1, 1, 1, 1, 1, 96),     # a plain [M, K] product
    ConvShape(2, 7, 6, 40, 3, 3, 1, 1, 1, 70, (1, 1, 1, 1)),   # padding read in the row phase
    ConvShape(1, 11, 11, 3, 7, 7, 2, 2, 1, 64, (3, 3, 3, 3)),  # a padded stem
    ConvShape(1, 8, 9, 17, 3, 2, 2, 1, 2, 33, (2, 0, 0, 1)),   # uneven padding, row dilation
]
STATICS = [None, Static(0.05, 128, 0, 255), Static(0.03, -5, -128, 127), Static(0.2, 0, 0, 255)]


def _run(qk, cs: ConvShape, p: np.ndarray, dtype: type) -> tuple[np.ndarray, ...]:
    s = cs.int8
    aq = aligned_empty(s.aq_bytes, np.uint8)
    aq[:] = 0xAB   # stale codes and set ready flags: the entry must clear the flags
    sa = aligned_empty(s.mp, np.float32)
    out = np.full((s.m, s.n), -7, dtype)
    c = qk.constants
    qk.kernel(p, c["w"], c["comp"], c["w_scale"], c["bias"], out, aq, sa)
    return out, aq[:s.mp * s.kp].reshape(s.mp, s.kp)[:s.m, :s.k], sa[:s.m]


def _input(cs: ConvShape, static: Static | None) -> np.ndarray:
    scale = 0.05 if static is None else static.scale
    p = (rng.standard_normal((cs.n, cs.hp, cs.wp, cs.c)) * 60 * scale).astype(np.float32)
    p.reshape(-1)[:5] = [1e30, -1e30, 0.0, 2.5 * scale, -0.5 * scale][:p.size]
    return p


def _windows(cs: ConvShape, p: np.ndarray) -> np.ndarray:
    t, b, le, r = cs.pads
    p = np.pad(p, [(0, 0), (t, b), (le, r), (0, 0)])
    a = _window_ref(p, (cs.kh, cs.kw), (cs.sh, cs.sw), (cs.dh, 1))
    return a.reshape(cs.int8.m, cs.int8.k)


def _attrs(cs: ConvShape, static: Static | None, act: str) -> dict:
    st = static or Static(0.0, 0, -128, 127)
    return {"kernel": (cs.kh, cs.kw), "strides": (cs.sh, cs.sw), "dilations": (cs.dh, 1),
            "act": act, "x_scale": st.scale, "x_zero": st.zero, "x_min": st.lo, "x_max": st.hi,
            "pads": cs.pads}


@pytest.mark.parametrize("static", STATICS, ids=["dynamic", "u8z128", "i8z-5", "u8z0"])
@pytest.mark.parametrize("cs", SHAPES,
                         ids=lambda c: f"{c.kh}x{c.kw}s{c.sh}c{c.c}o{c.o}p{sum(c.pads)}")
def test_qconv_integer_core_is_exact(cs: ConvShape, static: Static | None) -> None:
    w = rng.integers(-128, 128, size=(cs.int8.k, cs.o)).astype(np.int8)   # the full s8 range
    qk = build_qconv("t", cs, w, np.ones(cs.o, np.float32), np.zeros(cs.o, np.float32),
                     static=static, raw=True)
    p = _input(cs, static)
    out, aq, sa = _run(qk, cs, p, np.int32)
    a = _windows(cs, p)
    st = static or Static(0.0, 0, -128, 127)
    q, scale = window_codes(a, st.scale, st.zero, st.lo, st.hi)
    offset = 128 if static is None else static.offset
    np.testing.assert_array_equal(aq.astype(np.int32) - offset, q)
    np.testing.assert_array_equal(sa, scale)
    np.testing.assert_array_equal(out, q.astype(np.int64) @ w.astype(np.int64))


@pytest.mark.parametrize("act", ["none", "relu", "gelu"])
@pytest.mark.parametrize("static", STATICS[:2], ids=["dynamic", "u8z128"])
@pytest.mark.parametrize("cs", [*SHAPES[1:4], SHAPES[7]],
                         ids=lambda c: f"{c.kh}x{c.kw}s{c.sh}c{c.c}p{sum(c.pads)}")
def test_qconv_epilogue_matches_reference_bitwise(cs: ConvShape, static: Static | None,
                                                  act: str) -> None:
    wf = rng.standard_normal((cs.int8.k, cs.o)).astype(np.float32)
    q, scale = quantize_int8(wf)
    bias = rng.standard_normal(cs.o).astype(np.float32)
    qk = build_qconv("t", cs, q, scale, bias, act, static)
    p = _input(cs, static)
    out, _, _ = _run(qk, cs, p, np.float32)
    ref = _conv_reference(p, q, scale, bias, **_attrs(cs, static, act))
    if act == "gelu":
        np.testing.assert_allclose(out, ref, rtol=2e-6, atol=1e-6 * np.abs(ref).max())
    else:
        np.testing.assert_array_equal(out, ref)


def test_qconv_refuses_codes_wider_than_a_byte() -> None:
    cs = SHAPES[0]
    w = np.zeros((cs.int8.k, cs.o), np.int8)
    with pytest.raises(CompileError, match="do not fit a byte"):
        build_qconv("t", cs, w, np.ones(cs.o, np.float32), np.zeros(cs.o, np.float32),
                    static=Static(0.1, 0, -32768, 32767))


EPILOGUE = (("div", "s", 0.07, False), ("round",), ("add", "s", 3.0, False), ("round",),
            ("clip", -128.0, 127.0), ("sub", "s", 3.0, False), ("mul", "s", 0.07, False),
            ("mul", "t", 0, False), ("add", "t", 1, False), ("sub", "t", 2, True),
            ("maximum", "s", -0.5, True), ("minimum", "t", 0, False), ("relu",))


@pytest.mark.parametrize("cs", [SHAPES[1], SHAPES[3], SHAPES[6]],
                         ids=lambda c: f"{c.kh}x{c.kw}s{c.sh}c{c.c}")
def test_qconv_fused_epilogue_matches_reference_bitwise(cs: ConvShape) -> None:
    """A QDQ pair, a batch norm, a residual operand and relu in the tile epilogue: bit for bit
    the op's reference (f32, step by step)."""
    wf = rng.standard_normal((cs.int8.k, cs.o)).astype(np.float32)
    q, scale = quantize_int8(wf)
    bias = rng.standard_normal(cs.o).astype(np.float32)
    s = cs.int8
    operands = (rng.uniform(0.5, 2, cs.o).astype(np.float32),
                rng.standard_normal(cs.o).astype(np.float32),
                rng.standard_normal((s.m, s.n)).astype(np.float32))
    static = Static(0.05, 128, 0, 255)
    qk = build_qconv("t", cs, q, scale, bias, "none", static, steps=EPILOGUE,
                     operands=(1, 1, 2))
    p = _input(cs, static)
    aq = aligned_empty(s.aq_bytes, np.uint8)
    aq[:] = 0xAB   # stale codes and set ready flags: the entry must clear the flags
    sa = aligned_empty(s.mp, np.float32)
    out = np.full((s.m, s.n), -7, np.float32)
    c = qk.constants
    qk.kernel(p, c["w"], c["comp"], c["w_scale"], c["bias"], out, aq, sa, *operands)
    ref = _conv_reference(p, q, scale, bias, *operands, **_attrs(cs, static, "none"),
                          epilogue=EPILOGUE)
    np.testing.assert_array_equal(out, ref)
    assert len(np.unique(out)) > 10
