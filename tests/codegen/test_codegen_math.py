"""The generated math functions against NumPy/scipy: ulp distance over wide ranges (with
infinities, NaN, huge and tiny values), exact special values, and no libm calls."""

from __future__ import annotations

import re
import zlib

import numpy as np
import pytest
import scipy.special
from loopkernels import one_op

from tilefuse.codegen import compile_kernel
from tilefuse.dtypes import DType
from tilefuse.loop import XOp

F32, F64 = DType.f32, DType.f64


def _sigmoid(x: np.ndarray) -> np.ndarray:
    e = np.exp(-np.abs(x))
    return np.where(x >= 0, 1 / (1 + e), e / (1 + e))


# references: computed in float64 (f32 results) or long double (f64 results, where NumPy has it)
REFERENCE = {
    XOp.EXP: np.exp, XOp.LOG: np.log, XOp.TANH: np.tanh, XOp.SIGMOID: _sigmoid,
    XOp.ERF: scipy.special.erf, XOp.LOG1P: np.log1p, XOp.EXPM1: np.expm1,
    XOp.SIN: np.sin, XOp.COS: np.cos,
}
# max ulp error asserted, per (op, dtype); see tilefuse/codegen/math_lib.py
BOUND = {
    (XOp.EXP, F32): 4, (XOp.LOG, F32): 4, (XOp.TANH, F32): 4, (XOp.SIGMOID, F32): 4,
    (XOp.ERF, F32): 4, (XOp.LOG1P, F32): 4, (XOp.EXPM1, F32): 4,
    (XOp.SIN, F32): 1, (XOp.COS, F32): 1,
    (XOp.EXP, F64): 2, (XOp.LOG, F64): 2, (XOp.TANH, F64): 4, (XOp.SIGMOID, F64): 4,
    (XOp.ERF, F64): 4, (XOp.LOG1P, F64): 3, (XOp.EXPM1, F64): 3,
    (XOp.SIN, F64): 2, (XOp.COS, F64): 2,
}
# where exp/expm1/sigmoid overflow or underflow into subnormals, in f32 and f64
NEAR_THRESHOLDS = [88.7, 88.72283, 88.7229, 89.0, -87.3, -103.9, -103.98, -104.0, 709.78,
                   709.79, -708.4, -745.1, -745.2, 0.3465, -0.3466, 1e-8, -1e-8]


def wide_inputs(dtype: DType, seed: int, n: int = 60_000) -> np.ndarray:
    """Uniform values at several scales, log-uniform magnitudes over the whole finite range
    (subnormals included), and the special values."""
    rng = np.random.default_rng(seed)
    info = np.finfo(dtype.np)
    magnitudes = np.exp(rng.uniform(np.log(float(info.smallest_subnormal)),
                                    np.log(float(info.max)), n))
    parts = [rng.uniform(-1, 1, n), rng.uniform(-12, 12, n), rng.uniform(-800, 800, n),
             magnitudes * rng.choice([-1.0, 1.0], n),
             [0.0, -0.0, np.inf, -np.inf, np.nan, info.max, -info.max, info.tiny,
              info.smallest_subnormal, -info.smallest_subnormal, 1.0, -1.0],
             NEAR_THRESHOLDS]
    with np.errstate(over="ignore"):
        return np.concatenate([np.asarray(p, np.float64) for p in parts]).astype(dtype.np)


def run(op: XOp, dtype: DType, x: np.ndarray) -> np.ndarray:
    y = np.empty_like(x)
    compile_kernel(one_op(op, dtype))(x, y, x.size)
    return y


def reference(op: XOp, dtype: DType, x: np.ndarray) -> np.ndarray:
    wide = np.longdouble if dtype is F64 and op is not XOp.ERF else np.float64
    with np.errstate(all="ignore"):
        return REFERENCE[op](x.astype(wide)).astype(np.float64)


def ulp_error(got: np.ndarray, ref: np.ndarray) -> np.ndarray:
    """|got - ref| in units of the last place of ``ref`` rounded to got's type; 0 where both are
    NaN or the same infinity, inf where only one is NaN or an infinity is wrong."""
    with np.errstate(all="ignore"):
        rounded = ref.astype(got.dtype)
        err = np.abs(got.astype(np.float64) - ref) / np.spacing(np.abs(rounded)).astype(
            np.float64)
    nan_got, nan_ref = np.isnan(got), np.isnan(ref)
    inf_any = np.isinf(got) | np.isinf(rounded)
    err[inf_any] = np.where(got[inf_any] == rounded[inf_any], 0.0, np.inf)
    err[nan_got & nan_ref] = 0.0
    err[nan_got != nan_ref] = np.inf
    return err


@pytest.mark.parametrize(("op", "dtype"), sorted(BOUND, key=lambda k: (k[0].value, k[1].value)))
def test_ulp_error_over_wide_ranges(op, dtype):
    x = wide_inputs(dtype, seed=zlib.crc32(op.value.encode()))
    err = ulp_error(run(op, dtype, x), reference(op, dtype, x))
    worst = int(np.argmax(err))
    assert err[worst] <= BOUND[(op, dtype)], f"{op} {dtype}: {err[worst]} ulp at x={x[worst]!r}"


INF, NAN = np.inf, np.nan
SPECIAL = {  # op: [(x, exact expected)], for f32 and f64
    XOp.EXP: [(-INF, 0.0), (INF, INF), (NAN, NAN), (-0.0, 1.0), (800.0, INF), (-800.0, 0.0)],
    XOp.LOG: [(0.0, -INF), (-0.0, -INF), (-1.0, NAN), (INF, INF), (-INF, NAN), (NAN, NAN),
              (1.0, 0.0)],
    XOp.TANH: [(INF, 1.0), (-INF, -1.0), (NAN, NAN), (-0.0, -0.0), (30.0, 1.0), (-30.0, -1.0)],
    XOp.SIGMOID: [(-INF, 0.0), (INF, 1.0), (NAN, NAN), (200.0, 1.0), (-800.0, 0.0)],
    XOp.ERF: [(INF, 1.0), (-INF, -1.0), (NAN, NAN), (10.0, 1.0), (-10.0, -1.0), (-0.0, -0.0)],
    XOp.LOG1P: [(-1.0, -INF), (-2.0, NAN), (INF, INF), (NAN, NAN), (-0.0, -0.0)],
    XOp.EXPM1: [(-INF, -1.0), (INF, INF), (NAN, NAN), (-0.0, -0.0), (1000.0, INF),
                (-100.0, -1.0)],
    XOp.SIN: [(INF, NAN), (-INF, NAN), (NAN, NAN), (-0.0, -0.0)],
    XOp.COS: [(INF, NAN), (NAN, NAN), (-0.0, 1.0)],
}


@pytest.mark.parametrize("dtype", [F32, F64])
@pytest.mark.parametrize("op", list(SPECIAL))
def test_special_values(op, dtype):
    cases = SPECIAL[op]
    x = np.array([c[0] for c in cases] * 3, dtype.np)  # 3 copies: some lanes are scalar tails
    expected = np.array([c[1] for c in cases] * 3, dtype.np)
    got = run(op, dtype, x)
    same = (got == expected) & (np.signbit(got) == np.signbit(expected))
    same |= np.isnan(got) & np.isnan(expected)
    assert same.all(), f"{op} {dtype}: x={x[~same]} got {got[~same]} want {expected[~same]}"


def test_sigmoid_of_minus_100_is_tiny_not_nan():
    got = run(XOp.SIGMOID, F32, np.full(20, -100.0, np.float32))
    ref = reference(XOp.SIGMOID, F32, np.full(20, -100.0, np.float32))
    assert np.all(ulp_error(got, ref) <= 1) and np.all(got > 0)


@pytest.mark.parametrize("dtype", [F32, F64])
@pytest.mark.parametrize("op", [XOp.SIN, XOp.COS])
def test_sin_cos_near_multiples_of_half_pi(op, dtype):
    """Arguments that the range reduction must cancel most precisely: rounded k*pi/2 for k up
    to 2**60, and the hardest f64 case known (6381956970095103 * 2**797)."""
    k = np.unique(np.exp(np.random.default_rng(6).uniform(0, np.log(2.0**60), 400)).round())
    x = np.concatenate([k * (np.pi / 2), [6381956970095103 * 2.0**797]])
    x = x[np.abs(x) <= np.finfo(dtype.np).max].astype(dtype.np)
    err = ulp_error(run(op, dtype, x), reference(op, dtype, x))
    assert err.max() <= BOUND[(op, dtype)], f"{err.max()} ulp at x={x[np.argmax(err)]!r}"


_POW_X = [0.0, -0.0, 1.0, -1.0, 2.0, -2.0, 0.5, -0.5, INF, -INF, NAN, 3.7, 1e-30]
_POW_Y = [0.0, -0.0, 1.0, -1.0, 2.0, 3.0, -3.0, 0.5, -0.5, 2.5, INF, -INF, NAN]


@pytest.mark.parametrize("dtype", [F32, F64])
def test_pow_special_cases_match_numpy(dtype):
    x, y = np.meshgrid(np.array(_POW_X, dtype.np), np.array(_POW_Y, dtype.np))
    x, y = x.ravel().copy(), y.ravel().copy()
    got = np.empty_like(x)
    compile_kernel(one_op(XOp.POW, dtype, arity=2))(x, y, got, x.size)
    with np.errstate(all="ignore"):
        want = np.power(x, y)
    # f64 pow is exp(y*log|x|): its error grows with |y*log x| (here up to ~200)
    rtol = 4 * np.finfo(np.float32).eps if dtype is F32 else 1e-13
    close = np.isclose(got, want, rtol=rtol, atol=0, equal_nan=True)
    close &= (np.signbit(got) == np.signbit(want)) | np.isnan(want)
    bad = ~close
    assert close.all(), f"pow({x[bad]}, {y[bad]}) = {got[bad]}, want {want[bad]}"


def test_pow_f32_is_within_one_ulp():
    rng = np.random.default_rng(9)
    x = np.exp(rng.uniform(-20, 20, 30_000)).astype(np.float32)
    y = rng.uniform(-8, 8, 30_000).astype(np.float32)
    got = np.empty_like(x)
    compile_kernel(one_op(XOp.POW, F32, arity=2))(x, y, got, x.size)
    with np.errstate(all="ignore"):
        ref = np.power(x.astype(np.float64), y.astype(np.float64))
    assert ulp_error(got, ref).max() <= 1


def test_math_makes_no_library_calls():
    ops = [*REFERENCE, XOp.SQRT, XOp.RSQRT, XOp.FLOOR, XOp.CEIL, XOp.ROUND]
    for dtype in (F32, F64):
        for op in ops:
            text = compile_kernel(one_op(op, dtype)).assembly()
            calls = re.findall(r"^\s*call\w*\s+(.*)$", text, flags=re.M)
            assert not calls, f"{op} {dtype} calls {calls}"


def test_f32_erf_polynomials_keep_their_stated_error():
    """The f32 erf's two polynomials in float64, against scipy: erf(x)/x in x² on [0, 1]
    within 2e-9 relative, and 1 - exp(-x²)·erfcx(x) on [1, 4] within 0.1 ulp of f32 erf
    (what rounding in f32 leaves the 4-ulp bound to)."""
    from numpy.polynomial import polynomial

    from tilefuse.codegen.math_lib import _ERF_SMALL_F32, _ERFCX_CHEB, _ERFCX_F32_MONOMIALS

    x = np.linspace(1e-6, 1.0, 100_001)
    small = x * polynomial.polyval(x * x, _ERF_SMALL_F32[::-1])
    assert np.max(np.abs(small / scipy.special.erf(x) - 1)) < 2e-9
    lo, hi, _ = _ERFCX_CHEB[F32]
    x = np.linspace(lo, hi, 100_001)
    u = (2 * x - (hi + lo)) / (hi - lo)
    big = 1 - np.exp(-x * x) * polynomial.polyval(u, _ERFCX_F32_MONOMIALS[::-1])
    ref = scipy.special.erf(x)
    assert np.max(np.abs(big - ref) / np.spacing(ref.astype(np.float32))) < 0.1
