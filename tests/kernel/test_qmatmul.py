"""The quantized kernels (kernel/lower_qmatmul.py) against NumPy: the int8 kernel's integer
core and its activation quantization bit for bit (i32 accumulation), its f32 epilogue bit for
bit against the op reference, and the int4 kernel exactly on integer-valued data and to f32
rounding on random data, at odd sizes (tails in M, K and N)."""

from __future__ import annotations

import numpy as np
import pytest

from tilefuse.codegen.jit import aligned_empty
from tilefuse.codegen.target import CpuTarget, host_target
from tilefuse.errors import CompileError
from tilefuse.kernel import lower_qmatmul as L
from tilefuse.ops.quant import _i8_reference, _w4_reference, quantize_rows
from tilefuse.passes.quantize import quantize_int4, quantize_int8

pytestmark = pytest.mark.skipif(
    not host_target().has("avx512vnni"), reason="the int8 kernel needs AVX-512 VNNI")

rng = np.random.default_rng(29)
SIZES = [(1, 1, 1), (1, 3, 17), (5, 37, 70), (7, 64, 64), (13, 100, 130), (6, 768, 65)]


def _run_int8(qk: L.QuantKernel, x: np.ndarray, out_dtype: type) -> tuple[np.ndarray, ...]:
    m, k = x.shape
    s = L.Int8Shape(m, k, qk.constants["w_scale"].shape[0])
    aq = aligned_empty(s.aq_bytes, np.uint8)
    aq[:] = 0xAB   # stale codes and set ready flags: the entry must clear the flags
    sa = aligned_empty(s.mp, np.float32)
    width = int(qk.fn.name.split("_q8_")[1].split("_")[0].split("x")[2])
    out = np.full((m, width), -7, out_dtype)
    c = qk.constants
    qk.kernel(x, c["w"], c["comp"], c["w_scale"], c["bias"], out, aq, sa)
    return out, aq[:s.mp * s.kp].reshape(s.mp, s.kp)[:m, :k], sa[:m]


def _activations(m: int, k: int) -> np.ndarray:
    x = (rng.standard_normal((m, k)) * rng.uniform(0.01, 100)).astype(np.float32)
    if m > 2:
        x[1] = 0.0                              # a zero row: scale 0, all codes 0
        x[2, : min(k, 3)] = [1e30, -1e30, 0.5][: min(k, 3)]
    return x


@pytest.mark.parametrize("m,k,n", SIZES)
def test_int8_integer_core_is_exact(m: int, k: int, n: int) -> None:
    w = rng.integers(-128, 128, size=(k, n)).astype(np.int8)   # the full s8 range
    qk = L.build_int8("t", m, w, np.ones(n, np.float32), np.zeros(n, np.float32), raw=True)
    x = _activations(m, k)
    out, aq, sa = _run_int8(qk, x, np.int32)
    q, scale = quantize_rows(x)
    np.testing.assert_array_equal(aq.astype(np.int32) - 128, q)
    np.testing.assert_array_equal(sa, scale)
    np.testing.assert_array_equal(out, q.astype(np.int64) @ w.astype(np.int64))


@pytest.mark.parametrize("act", ["none", "relu", "gelu"])
@pytest.mark.parametrize("m,k,n", SIZES[1:])
def test_int8_epilogue_matches_reference_bitwise(m: int, k: int, n: int, act: str) -> None:
    """Bit for bit but for GELU, whose erf is the generated one (<= 4 ulp from SciPy's)."""
    wf = rng.standard_normal((k, n)).astype(np.float32)
    q, scale = quantize_int8(wf)
    bias = rng.standard_normal(n).astype(np.float32)
    qk = L.build_int8("t", m, q, scale, bias, act)
    x = _activations(m, k)
    out, _, _ = _run_int8(qk, x, np.float32)
    ref = _i8_reference(x, q, scale, bias, act=act)
    if act == "gelu":
        np.testing.assert_allclose(out, ref, rtol=2e-6, atol=1e-6 * np.abs(ref).max())
    else:
        np.testing.assert_array_equal(out, ref)


@pytest.mark.parametrize("shift", [0, 4])
def test_int8_streamed_output_matches_reference_bitwise(shift: int) -> None:
    """An output of STREAM_BYTES or more: full panels written with non-temporal stores when
    out is 64-byte aligned (shift 0), the partial last panel (N = 64 * 64 + 16) and an
    unaligned out (shift 4 bytes) through the masked stores."""
    from tilefuse.kernel.quant_ir import STREAM_BYTES

    m, k, n = 257, 37, 64 * 64 + 16
    assert m * n * 4 >= STREAM_BYTES
    wf = rng.standard_normal((k, n)).astype(np.float32)
    q, scale = quantize_int8(wf)
    bias = rng.standard_normal(n).astype(np.float32)
    qk = L.build_int8("t", m, q, scale, bias, "relu")
    assert "!nontemporal" in qk.ir and "sfence" in qk.ir
    x = _activations(m, k)
    s = L.Int8Shape(m, k, n)
    aq, sa = aligned_empty(s.aq_bytes, np.uint8), aligned_empty(s.mp, np.float32)
    raw = aligned_empty(m * n * 4 + 64, np.uint8)
    out = raw[shift:shift + m * n * 4].view(np.float32).reshape(m, n)
    out[:] = np.nan
    c = qk.constants
    qk.kernel(x, c["w"], c["comp"], c["w_scale"], c["bias"], out, aq, sa)
    np.testing.assert_array_equal(out, _i8_reference(x, q, scale, bias, act="relu"))


def _run_int4(qk: L.QuantKernel, x: np.ndarray, n: int) -> np.ndarray:
    out = np.full((x.shape[0], n), np.nan, np.float32)
    c = qk.constants
    qk.kernel(x, c["wq"], c["scales"], c["offsets"], c["bias"], out)
    return out


@pytest.mark.parametrize("m,k,n,group", [(1, 64, 70, 32), (2, 192, 40, 64), (5, 256, 130, 64),
                                         (3, 128, 64, 128), (9, 384, 17, 128)])
def test_int4_exact_on_integer_data(m: int, k: int, n: int, group: int) -> None:
    """Integer activations, unit scales: every product and sum is an exact f32 integer, so the
    kernel must equal the NumPy int32 product of the codes minus their zero points."""
    codes = rng.integers(0, 16, size=(k, n)).astype(np.uint8)
    packed = (codes[0::2] | (codes[1::2] << 4)).astype(np.uint8)
    zeros = rng.integers(0, 16, size=(k // group, n)).astype(np.uint8)
    scales = np.ones((k // group, n), np.float32)
    bias = rng.integers(-50, 50, size=n).astype(np.float32)
    x = rng.integers(-20, 21, size=(m, k)).astype(np.float32)
    qk = L.build_int4("t", m, packed, scales, zeros, bias, group)
    centred = codes.astype(np.int32) - np.repeat(zeros.astype(np.int32), group, axis=0)
    expected = x.astype(np.int32) @ centred + bias.astype(np.int32)
    np.testing.assert_array_equal(_run_int4(qk, x, n), expected.astype(np.float32))


@pytest.mark.parametrize("zero_points", [False, True])
@pytest.mark.parametrize("act", ["none", "relu", "gelu"])
def test_int4_random_matches_reference(zero_points: bool, act: str) -> None:
    m, k, n, g = (6, 320, 100, 64) if act != "none" else (2, 320, 100, 64)
    w = rng.standard_normal((k, n)).astype(np.float32)
    packed, scales, zeros = quantize_int4(w, g, zero_points)
    bias = rng.standard_normal(n).astype(np.float32)
    qk = L.build_int4("t", m, packed, scales, zeros, bias, g, act)
    x = rng.standard_normal((m, k)).astype(np.float32)
    ref = _w4_reference(x, packed, scales, zeros, bias, group=g, act=act)
    np.testing.assert_allclose(_run_int4(qk, x, n), ref, rtol=1e-4, atol=1e-4)


def test_packing_round_trips() -> None:
    w = rng.integers(-128, 128, size=(10, 70)).astype(np.int8)
    packed, comp = L.pack_int8(w)
    kp, np_ = 12, 128
    back = packed.reshape(np_ // 64, kp // 4, 64, 4).transpose(1, 3, 0, 2).reshape(kp, np_)
    np.testing.assert_array_equal(back[:10, :70], w)
    assert not back[10:].any() and not back[:, 70:].any()
    np.testing.assert_array_equal(comp[:70], 128 * w.astype(np.int32).sum(axis=0))


def test_targets_without_vnni_are_refused() -> None:
    avx2 = CpuTarget("x86_64-unknown-linux-gnu", "znver3", "+avx2,+fma")
    with pytest.raises(CompileError, match="avx512vnni"):
        L.check_target(avx2, vnni=True)
    with pytest.raises(CompileError, match="avx512f"):
        L.check_target(avx2, vnni=False)


@pytest.mark.parametrize("m,k,n", [(1, 3, 17), (5, 37, 70), (13, 100, 130)])
def test_u8s8_integer_product_is_exact(m: int, k: int, n: int) -> None:
    """ONNX MatMulInteger's kernel: (a - a_zero) @ w in i32, any u8 zero point."""
    w = rng.integers(-128, 128, size=(k, n)).astype(np.int8)
    qk = L.build_u8s8("t", m, w)
    aq = aligned_empty(L.Int8Shape(m, k, n).aq_bytes, np.uint8)
    aq[:] = 0xAB   # set ready flags, and then last call's rows: the entry must clear them
    for zero in (0, 1, 128, 255):
        a = rng.integers(0, 256, size=(m, k)).astype(np.uint8)
        out = np.full((m, n), -7, np.int32)
        qk.kernel(a, qk.constants["w"], qk.constants["colsum"], np.array(zero, np.uint8), out,
                  aq)
        expected = (a.astype(np.int64) - zero) @ w.astype(np.int64)
        np.testing.assert_array_equal(out, expected)


@pytest.mark.parametrize("size", [1, 15, 4096, 4096 * 3 + 77])
def test_dynamic_quantize_matches_reference(size: int) -> None:
    from tilefuse.kernel.lower_qdynamic import DQL_CHUNK, build_dql
    from tilefuse.ops.quant import _dql_reference

    qk = build_dql("t", size)
    cases = [rng.standard_normal(size).astype(np.float32) * 3,
             np.abs(rng.standard_normal(size)).astype(np.float32),   # min above 0
             np.zeros(size, np.float32)]                              # scale 0: codes 0
    for x in cases:
        q, scale, zero = np.full(size, 7, np.uint8), np.zeros(1, np.float32), \
            np.zeros(1, np.uint8)
        part = np.zeros(2 * max(1, -(-size // DQL_CHUNK)), np.float32)
        qk.kernel(x, q, scale, zero, part)
        rq, rs, rz = _dql_reference(x)
        np.testing.assert_array_equal(scale[0], rs)
        np.testing.assert_array_equal(zero[0], rz)
        np.testing.assert_array_equal(q, rq)


def test_int8_non_finite_activations_are_defined() -> None:
    """NaN is left out of a row's max and coded 0, inf makes the row's codes 0 (a zero
    scale factor): the kernel and the reference agree on every code."""
    m, k, n = 4, 40, 20
    w = rng.integers(-128, 128, size=(k, n)).astype(np.int8)
    qk = L.build_int8("t", m, w, np.ones(n, np.float32), np.zeros(n, np.float32), raw=True)
    x = rng.standard_normal((m, k)).astype(np.float32)
    x[0, 3], x[1, 5], x[2, 7] = np.nan, np.inf, -np.inf
    out, aq, sa = _run_int8(qk, x, np.int32)
    q, scale = quantize_rows(x)
    np.testing.assert_array_equal(aq.astype(np.int32) - 128, q)
    np.testing.assert_array_equal(sa, scale)
    np.testing.assert_array_equal(out, q.astype(np.int64) @ w.astype(np.int64))


def test_u8s8_fused_rescale_matches_reference_bitwise() -> None:
    """matmul_u8s8 with the rescale of a quantize_dynamic file in its epilogue: a runtime
    scalar (the activation's scale times the weight's), a bias vector, relu."""
    from tilefuse.ops.quant import _u8s8_reference

    m, k, n = 13, 100, 130
    w = rng.integers(-128, 128, size=(k, n)).astype(np.int8)
    steps = (("mul", "t", 0, False), ("add", "t", 1, True), ("relu",))
    qk = L.build_u8s8("t", m, w, steps=steps, operands=(0, 1))
    a = rng.integers(0, 256, size=(m, k)).astype(np.uint8)
    zero = np.array(131, np.uint8)
    scale = np.array(0.0123, np.float32)
    bias = rng.standard_normal(n).astype(np.float32)
    s = L.Int8Shape(m, k, n)
    aq = aligned_empty(s.aq_bytes, np.uint8)
    aq[:] = 0xAB   # set ready flags: the entry must clear them
    out = np.full((m, n), np.nan, np.float32)
    c = qk.constants
    qk.kernel(a, c["w"], c["colsum"], zero, out, aq, scale, bias)
    ref = _u8s8_reference(a, zero, w, scale, bias, epilogue=steps)
    np.testing.assert_array_equal(out, ref)
    acc = (a.astype(np.int64) - 131) @ w.astype(np.int64)
    np.testing.assert_allclose(out, np.maximum(acc * np.float32(0.0123) + bias, 0), rtol=1e-5,
                               atol=1e-3)
