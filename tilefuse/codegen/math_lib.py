"""Math functions generated as vectorisable LLVM IR (no libm calls), for f32 and f64.

Each function becomes an internal, always-inlined LLVM function ``tf.<name>.<type>`` (for example
``tf.exp.v16f32``) built from IEEE arithmetic, ``llvm.fma``, ``llvm.rint``/``llvm.floor`` and bit
manipulation: Cephes/fdlibm-style range reduction plus a polynomial, then explicit selects for
NaN, infinities, overflow and underflow. The same IR serves the GPU later (no libm there either).
Coefficients are Taylor coefficients (exact rationals, one or two terms beyond what the reduced
range needs) except erf's, which are a Chebyshev interpolant of erfcx computed with mpmath:
``c_j = 2/N * sum_k erfcx(x_k) cos(j theta_k)`` over N Chebyshev nodes (``c_0`` halved), and,
for f32 below 1, an interpolant of erf(x)/x in x² (:data:`_ERF_SMALL_F32`). f32 evaluates both
by Horner's rule (f32 erfcx: its first 12 Chebyshev terms turned into monomials), a third of
the operations of the Taylor series and Clenshaw's recurrence, which GELU epilogues pay for
every element.

Accuracy (max ulp against float64/mpmath references, measured by tests/codegen/test_math.py):
exp, log, tanh, sigmoid, erf, log1p, expm1 <= 4 ulp in f32; exp_nonpos (x <= 0) <= 1.5 for
x >= -20 and <= 5 below (f32 with vscalef: one-constant ln2 reduction, measured 1.48 and 4.42;
softmax outputs' error is the same as with two constants, and no larger than onnxruntime's;
tests/codegen/test_exp_nonpos.py). sin/cos compute in float64 over the whole
range: Cody-Waite with a three-double pi/2 (fma) below 2**45, and above it (branching only
when some lane needs it) a table-free Payne-Hanek reduction with 2/pi as a sum of doubles. f32
pow is computed in float64; f64 pow is exp(y*log|x|), whose error grows with |y*log x|.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from types import MappingProxyType

import numpy as np
from llvmlite import ir
from numpy.polynomial import chebyshev

from tilefuse.codegen.llvm_types import (
    I32,
    I64,
    constant,
    declare,
    intrinsic,
    llvm_type,
    saturating_fptoi,
    type_suffix,
    vector_of,
)
from tilefuse.dtypes import DType
from tilefuse.errors import CompileError
from tilefuse.loop.ir import LType

LOG2E = 1.4426950408889634
LN2 = math.log(2.0)
INF = math.inf
NAN = math.nan


def _taylor(coeff: Callable[[int], float], degree: int) -> list[float]:
    """Coefficients ``coeff(k)`` for k = degree .. 0 (highest first, as Horner wants them)."""
    return [coeff(k) for k in range(degree, -1, -1)]


class _Em:
    """An IR builder with typed helpers for one float type (f32 or f64) and lane count."""

    def __init__(self, b: ir.IRBuilder, lib: MathLib, dtype: DType, lanes: int):
        self.b, self.lib, self.dtype, self.lanes = b, lib, dtype, lanes
        self.t = LType(dtype, lanes)
        self.wide = dtype is DType.f64
        self.fty = llvm_type(self.t)
        self.ity = vector_of(I64 if self.wide else I32, lanes)
        self.mant, self.bias = (52, 1023) if self.wide else (23, 127)

    def widened(self) -> _Em:
        return _Em(self.b, self.lib, DType.f64, self.lanes)

    # constants and calls
    def f(self, value: float) -> ir.Constant:
        return constant(self.t, value)

    def i(self, value: int) -> ir.Constant:
        return constant(LType(DType.i64 if self.wide else DType.i32, self.lanes), value)

    def call(self, name: str, *args: ir.Value) -> ir.Value:
        return self.lib.call(self.b, name, self.t, list(args))

    # float arithmetic
    def add(self, a: ir.Value, b: ir.Value) -> ir.Value:
        return self.b.fadd(a, b)

    def sub(self, a: ir.Value, b: ir.Value) -> ir.Value:
        return self.b.fsub(a, b)

    def mul(self, a: ir.Value, b: ir.Value) -> ir.Value:
        return self.b.fmul(a, b)

    def div(self, a: ir.Value, b: ir.Value) -> ir.Value:
        return self.b.fdiv(a, b)

    def neg(self, a: ir.Value) -> ir.Value:
        return self.b.fneg(a)

    def fma(self, a: ir.Value, b: ir.Value, c: ir.Value) -> ir.Value:
        return intrinsic(self.b, "fma", [a, b, c])

    def unary(self, name: str, x: ir.Value) -> ir.Value:
        return intrinsic(self.b, name, [x])

    def copysign(self, mag: ir.Value, sign: ir.Value) -> ir.Value:
        return intrinsic(self.b, "copysign", [mag, sign])

    def poly(self, x: ir.Value, coeffs: list[float]) -> ir.Value:
        """Horner's rule with fma; ``coeffs`` highest degree first."""
        acc: ir.Value = self.f(coeffs[0])
        for c in coeffs[1:]:
            acc = self.fma(acc, x, self.f(c))
        return acc

    # comparisons and selection
    def cmp(self, op: str, a: ir.Value, b: ir.Value) -> ir.Value:
        return self.b.fcmp_ordered(op, a, b)

    def ugt(self, a: ir.Value, b: ir.Value) -> ir.Value:
        return self.b.fcmp_unordered(">", a, b)

    def isnan(self, x: ir.Value) -> ir.Value:
        return self.b.fcmp_unordered("uno", x, x)

    def sel(self, cond: ir.Value, a: ir.Value, b: ir.Value) -> ir.Value:
        return self.b.select(cond, a, b)

    def clamp(self, x: ir.Value, lo: float, hi: float) -> ir.Value:
        """``x`` limited to [lo, hi]; NaN becomes ``hi`` (callers restore NaN at the end)."""
        return self.sel(self.ugt(x, self.f(hi)), self.f(hi),
                        self.sel(self.cmp("<", x, self.f(lo)), self.f(lo), x))

    # integers and bits
    def bits(self, x: ir.Value) -> ir.Value:
        return self.b.bitcast(x, self.ity)

    def from_bits(self, n: ir.Value) -> ir.Value:
        return self.b.bitcast(n, self.fty)

    def to_int(self, x: ir.Value) -> ir.Value:
        """Integral-valued, in-range float to int (saturating, so never poison)."""
        return saturating_fptoi(self.b, x, self.ity, signed=True)

    def to_int_in_range(self, x: ir.Value) -> ir.Value:
        """Float to int for values known to be integral, finite and in range (a clamped, rounded
        exponent): one conversion instruction, without the saturation selects of to_int."""
        return self.b.fptosi(x, self.ity)

    def to_float(self, n: ir.Value) -> ir.Value:
        return self.b.sitofp(n, self.fty)

    def pow2(self, n: ir.Value) -> ir.Value:
        """2**n for an int ``n`` in the normal exponent range."""
        return self.from_bits(self.b.shl(self.b.add(n, self.i(self.bias)), self.i(self.mant)))


# ----------------------------------------------------------------------------- exp family

# clamp range, Cody-Waite ln2 = hi + lo, polynomial degree
_EXP_CONSTS = {
    DType.f32: (-104.0, 89.0, 0.693359375, -2.12194440e-4, 7),
    DType.f64: (-746.0, 710.0, 6.93147180369123816490e-01, 1.90821492927058770002e-10, 13),
}


def _reduce_ln2(em: _Em, x: ir.Value, lo: float, hi: float) -> tuple[ir.Value, ir.Value]:
    """x = n*ln2 + r with |r| <= ln2/2; returns (r, n as float)."""
    _, _, ln2_hi, ln2_lo, _ = _EXP_CONSTS[em.dtype]
    xc = em.clamp(x, lo, hi)
    n = em.unary("rint", em.mul(xc, em.f(LOG2E)))
    r = em.fma(n, em.f(-ln2_hi), xc)
    return em.fma(n, em.f(-ln2_lo), r), n


def _scale(em: _Em, p: ir.Value, n: ir.Value, n_float: ir.Value | None = None) -> ir.Value:
    """p * 2**n in two steps, so that n beyond the exponent range over/underflows correctly.
    With AVX-512 and a 512-bit vector (``MathLib.scalef``), one ``vscalefps``/``vscalefpd`` of
    ``n_float`` (n as a float, when the caller has it) instead: the same product, rounded once
    in the subnormal range, 1 instruction for 9 (softmax's exp is most of its arithmetic)."""
    bits = 32 if em.dtype is DType.f32 else 64
    if em.lib.scalef and em.lanes * bits == 512:
        exponent = n_float if n_float is not None else em.to_float(n)
        mask = ir.IntType(em.lanes)
        name = f"llvm.x86.avx512.mask.scalef.{'ps' if bits == 32 else 'pd'}.512"
        fn = declare(em.b.module, name, p.type, [p.type, p.type, p.type, mask, I32])
        return em.b.call(fn, [p, exponent, p, ir.Constant(mask, -1), ir.Constant(I32, 4)])
    n1 = em.b.ashr(n, em.i(1))
    n2 = em.b.sub(n, n1)
    return em.mul(em.mul(p, em.pow2(n1)), em.pow2(n2))


def _exp(em: _Em, x: ir.Value) -> ir.Value:
    lo, hi, _, _, degree = _EXP_CONSTS[em.dtype]
    r, n = _reduce_ln2(em, x, lo, hi)
    p = em.poly(r, _taylor(lambda k: 1.0 / math.factorial(k), degree))
    # n comes from the clamped x (NaN clamps to the upper bound), so it is always in range.
    return em.sel(em.isnan(x), x, _scale(em, p, em.to_int_in_range(n), n))


_EXP_NONPOS_F32 = [float(c) * (2.0 / LN2) ** k for k, c in enumerate(chebyshev.cheb2poly(
    chebyshev.chebinterpolate(lambda t: np.exp(t * (LN2 / 2)), 6)))][::-1]
"""exp(r) for |r| <= ln2/2 as a polynomial in r, highest degree first: the degree-6
Chebyshev interpolant (relative error ~2e-9, below f32's half ulp), one fma fewer than the
Taylor series of the same accuracy."""


def _exp_nonpos(em: _Em, x: ir.Value) -> ir.Value:
    """exp(x) for x <= 0 or NaN (softmax's and log-softmax's ``exp(x - max)``): no overflow
    path and no NaN select. With vscalef (512-bit f32) the clamp below is one vmaxps that lets
    NaN through, and NaN then flows through the arithmetic: ~12 instructions per vector where
    :func:`_exp` takes ~16; 8 and 4 lanes the same with AVX-512VL's narrower vscalef. Elsewhere
    it is :func:`_exp` (correct for every x)."""
    # a row's 8- and 4-lane tail vectors, and its single elements (vscalefss): the same
    # arithmetic at every width, so a value stored by one pass and recomputed by another agree
    vl = em.lib.scalef_vl and em.lanes in (1, 4, 8)
    if not (em.dtype is DType.f32 and ((em.lib.scalef and em.lanes == 16) or vl)):
        return _exp(em, x)
    lo = _EXP_CONSTS[em.dtype][0]
    xc = em.sel(em.cmp("<", x, em.f(lo)), em.f(lo), x)  # NaN compares false: stays NaN
    n = em.unary("rint", em.mul(xc, em.f(LOG2E)))
    # one fma with ln2 rounded to f32 (error 1.9e-9), not the two of Cody-Waite: r is off by
    # |n| * 1.9e-9, so <= 1.5 ulp for x >= -20 and <= 4.5 ulp below, where exp(x - max) is
    # < 2e-9 of the row's largest term and vanishes in its sum. The FMA pipes bound softmax:
    # one fma fewer is ~5-8 % of the kernel; its outputs' error is unchanged (module doc).
    r = em.fma(n, em.f(-LN2), xc)
    p = em.poly(r, _EXP_NONPOS_F32)
    if vl:
        return _scalef_narrow(em, p, n)
    return _scale(em, p, em.to_int_in_range(n), n)


def _scalef_narrow(em: _Em, p: ir.Value, n: ir.Value) -> ir.Value:
    """p * 2**n for 8 or 4 f32 lanes (AVX-512VL vscalefps) or one (vscalefss), rounded once."""
    mask = ir.IntType(8)
    if em.lanes > 1:
        name = f"llvm.x86.avx512.mask.scalef.ps.{32 * em.lanes}"
        fn = declare(em.b.module, name, p.type, [p.type, p.type, p.type, mask])
        return em.b.call(fn, [p, n, p, ir.Constant(mask, -1)])
    v4 = ir.VectorType(p.type, 4)
    zero = ir.Constant(I32, 0)
    pv, nv = (em.b.insert_element(ir.Constant(v4, None), a, zero) for a in (p, n))
    fn = declare(em.b.module, "llvm.x86.avx512.mask.scalef.ss", v4, [v4, v4, v4, mask, I32])
    return em.b.extract_element(em.b.call(fn, [pv, nv, pv, ir.Constant(mask, -1),
                                               ir.Constant(I32, 4)]), zero)


def _expm1(em: _Em, x: ir.Value) -> ir.Value:
    lo, big_n, degree = (-60.0, 1000, 14) if em.wide else (-40.0, 120, 8)
    r, n = _reduce_ln2(em, x, lo, _EXP_CONSTS[em.dtype][1])
    tail = _taylor(lambda k: 1.0 / math.factorial(k + 2), degree - 2)
    p = em.fma(em.mul(r, r), em.poly(r, tail), r)  # expm1(r)
    ni = em.to_int(n)
    is_big = em.b.icmp_signed(">", ni, em.i(big_n))
    s = em.pow2(em.b.select(is_big, em.i(big_n), ni))
    small = em.fma(s, p, em.sub(s, em.f(1.0)))  # 2^n*expm1(r) + (2^n - 1)
    big = _scale(em, em.add(p, em.f(1.0)), ni)
    res = em.sel(is_big, big, small)
    res = em.sel(em.cmp("==", x, em.f(0.0)), x, res)  # keeps -0
    return em.sel(em.isnan(x), x, res)


def _tanh(em: _Em, x: ir.Value) -> ir.Value:
    cut = 20.0 if em.wide else 10.0  # tanh rounds to 1 beyond
    a = em.unary("fabs", x)
    a = em.sel(em.cmp(">", a, em.f(cut)), em.f(cut), a)
    t = em.call("expm1", em.add(a, a))
    return em.copysign(em.div(t, em.add(t, em.f(2.0))), x)


def _sigmoid(em: _Em, x: ir.Value) -> ir.Value:
    e = em.call("exp", em.neg(em.unary("fabs", x)))  # never overflows
    num = em.sel(em.cmp(">=", x, em.f(0.0)), em.f(1.0), e)
    return em.div(num, em.add(em.f(1.0), e))


# ----------------------------------------------------------------------------- log family

_LOG_CONSTS = {  # Cody-Waite ln2 = hi + lo, atanh-series terms
    DType.f32: (0.693359375, -2.12194440e-4, 4),
    DType.f64: (6.93147180369123816490e-01, 1.90821492927058770002e-10, 10),
}


def _log(em: _Em, x: ir.Value) -> ir.Value:
    ln2_hi, ln2_lo, terms = _LOG_CONSTS[em.dtype]
    b = em.b
    tiny = em.cmp("<", x, em.f(2.0 ** (1 - em.bias)))  # subnormal: scale up first
    xs = em.sel(tiny, em.mul(x, em.f(2.0 ** em.mant)), x)
    bits = em.bits(xs)
    e = b.sub(b.and_(b.lshr(bits, em.i(em.mant)), em.i(2 * em.bias + 1)), em.i(em.bias - 1))
    e = b.add(e, b.select(tiny, em.i(-em.mant), em.i(0)))
    half_bits = (em.bias - 1) << em.mant
    m = em.from_bits(b.or_(b.and_(bits, em.i((1 << em.mant) - 1)), em.i(half_bits)))  # [.5, 1)
    low = em.cmp("<", m, em.f(math.sqrt(0.5)))
    m = em.sel(low, em.add(m, m), m)
    e = b.select(low, b.sub(e, em.i(1)), e)
    # log(1+f) = f - (hfsq - s*(hfsq + R)), s = f/(2+f), R = 2z/3 + 2z^2/5 + ... (fdlibm)
    f = em.sub(m, em.f(1.0))
    s = em.div(f, em.add(f, em.f(2.0)))
    z = em.mul(s, s)
    big_r = em.mul(z, em.poly(z, [2.0 / (2 * k + 1) for k in range(terms, 0, -1)]))
    hfsq = em.mul(em.f(0.5), em.mul(f, f))
    dk = em.to_float(e)
    inner = em.fma(dk, em.f(ln2_lo), em.mul(s, em.add(hfsq, big_r)))
    res = em.fma(dk, em.f(ln2_hi), em.neg(em.sub(em.sub(hfsq, inner), f)))
    res = em.sel(em.cmp("==", x, em.f(INF)), x, res)
    res = em.sel(em.cmp("==", x, em.f(0.0)), em.f(-INF), res)
    res = em.sel(em.cmp("<", x, em.f(0.0)), em.f(NAN), res)
    return em.sel(em.isnan(x), x, res)


def _log1p(em: _Em, x: ir.Value) -> ir.Value:
    u = em.add(em.f(1.0), x)
    d = em.sub(u, em.f(1.0))
    res = em.mul(em.call("log", u), em.div(x, d))  # log(u) * x/(u-1) corrects u's rounding
    res = em.sel(em.cmp("==", d, em.f(0.0)), x, res)
    return em.sel(em.cmp("==", x, em.f(INF)), x, res)


def _pow(em: _Em, x: ir.Value, y: ir.Value) -> ir.Value:
    if em.wide:
        r = em.call("exp", em.mul(y, em.call("log", em.unary("fabs", x))))
    else:  # f32: in f64, so the product y*log|x| carries no visible error
        w = em.widened()
        xd, yd = em.b.fpext(x, w.fty), em.b.fpext(y, w.fty)
        wide = w.call("exp", w.mul(yd, w.call("log", w.unary("fabs", xd))))
        r = em.b.fptrunc(wide, em.fty)
    b = em.b
    fy = em.unary("floor", y)
    y_int = em.cmp("==", fy, y)
    half = em.mul(y, em.f(0.5))
    y_odd = b.and_(y_int, em.cmp("!=", em.unary("floor", half), half))
    x_neg_sign = b.icmp_signed("<", em.bits(x), em.i(0))
    r = em.sel(b.and_(x_neg_sign, y_odd), em.neg(r), r)
    finite_neg = b.and_(em.cmp("<", x, em.f(0.0)), em.cmp(">", x, em.f(-INF)))
    r = em.sel(b.and_(finite_neg, b.not_(y_int)), em.f(NAN), r)
    unit = b.and_(em.cmp("==", em.unary("fabs", x), em.f(1.0)),
                  em.cmp("==", em.unary("fabs", y), em.f(INF)))
    one = b.or_(b.or_(em.cmp("==", y, em.f(0.0)), em.cmp("==", x, em.f(1.0))), unit)
    return em.sel(one, em.f(1.0), r)


# ----------------------------------------------------------------------------- erf

_ERF_SMALL_TERMS = {DType.f32: 11, DType.f64: 17}
# Chebyshev coefficients of erfcx on [lo, hi] (see the module docstring)
_ERFCX_CHEB = {
    DType.f32: (1.0, 4.0, (
        0.24442575284923573, -0.13589862891594598, 0.03563511414853497, -0.00888409861822249,
        0.0021184239975531745, -0.0004853987640800181, 0.00010727375453759483,
        -2.2936634481117746e-05, 4.756874686608845e-06, -9.589944524084722e-07,
        1.8828988017399766e-07, -3.606207238400481e-08, 6.740900663684181e-09,
        -1.1960274878860078e-09)),
    DType.f64: (1.0, 6.0, (
        0.20196598791223083, -0.147884835533987, 0.05188222158351389, -0.017525709964867527,
        0.005721802417478219, -0.0018109803028142997, 0.0005570714353927344,
        -0.00016689473052528832, 4.878565911493746e-05, -1.3935932859822488e-05,
        3.895514595190115e-06, -1.0668392337070025e-06, 2.865502572057316e-07,
        -7.555861081756622e-08, 1.957586342968354e-08, -4.987110132992565e-09,
        1.2501871239431183e-09, -3.0858852312872416e-10, 7.504484747602063e-11,
        -1.7990193064431427e-11, 4.253478301217652e-12, -9.923156075211234e-13,
        2.2852946881888867e-13, -5.1975450866167244e-14, 1.1678400541510938e-14,
        -2.5932901330272067e-15, 5.692635243339303e-16, -1.2335300698913424e-16,
        2.5358417099784882e-17)),
}


def _clenshaw(em: _Em, u: ir.Value, coeffs: tuple[float, ...]) -> ir.Value:
    two_u = em.add(u, u)
    b1: ir.Value = em.f(0.0)
    b2: ir.Value = em.f(0.0)
    for c in coeffs[:0:-1]:
        b1, b2 = em.sub(em.fma(two_u, b1, em.f(c)), b2), b1
    return em.sub(em.fma(u, b1, em.f(coeffs[0])), b2)


_ERF_SMALL_F32 = [7.875875119940506e-05, -0.0008016864304837285, 0.005189087425483087,
                  -0.026854212011727024, 0.11283594715187227, -0.376126266667228,
                  1.1283791658483513]
"""erf(x)/x as a polynomial in t = x² on [0, 1] (highest degree first): NumPy's ``chebfit``
of it at 7 Chebyshev nodes of t, in float64, turned into monomials; relative error 1.3e-9."""
_ERFCX_F32_TERMS = 12
"""Chebyshev terms of f32 erfcx kept for Horner's rule (0.33 ulp in erf with f32 rounding)."""
_ERFCX_F32_MONOMIALS = [float(c) for c in chebyshev.cheb2poly(
    _ERFCX_CHEB[DType.f32][2][:_ERFCX_F32_TERMS])[::-1]]
"""f32 erfcx on [lo, hi] as a polynomial in u ∈ [-1, 1], highest degree first."""


def _erf(em: _Em, x: ir.Value) -> ir.Value:
    # |x| < 1: x * P(x^2); else 1 - exp(-x^2) * erfcx(|x|)
    f32 = em.dtype is DType.f32
    if f32:
        series = _ERF_SMALL_F32
    else:
        scale = 2.0 / math.sqrt(math.pi)
        series = _taylor(lambda n: scale * (-1) ** n / (math.factorial(n) * (2 * n + 1)),
                         _ERF_SMALL_TERMS[em.dtype])
    small = em.mul(x, em.poly(em.mul(x, x), series))
    lo, hi, cheb = _ERFCX_CHEB[em.dtype]
    a = em.unary("fabs", x)
    a = em.sel(em.cmp(">", a, em.f(hi)), em.f(hi), a)  # erf rounds to 1 beyond hi
    u = em.fma(a, em.f(2.0 / (hi - lo)), em.f(-(hi + lo) / (hi - lo)))
    erfcx = em.poly(u, _ERFCX_F32_MONOMIALS) if f32 else _clenshaw(em, u, cheb)
    erfc = em.mul(em.call("exp_nonpos", em.neg(em.mul(a, a))), erfcx)  # -a² <= 0 or NaN
    big = em.copysign(em.sub(em.f(1.0), erfc), x)
    return em.sel(em.cmp("<", em.unary("fabs", x), em.f(1.0)), small, big)


# ----------------------------------------------------------------------------- sin, cos

_PIO2 = (1.5707963267948966, 6.123233995736766e-17, -1.4973849048591698e-33)
_SIN_TAIL = _taylor(lambda k: (-1) ** (k + 1) / math.factorial(2 * k + 3), 7)  # r^3 * P(r^2)
_COS = _taylor(lambda k: (-1) ** k / math.factorial(2 * k), 9)
#: beyond this |x|, n = rint(x * 2/pi) is no longer exact in f64: reduce the slow way
_HUGE_ARG = 2.0 ** 45
#: 2**600 * 2/pi as a sum of doubles (mpmath, 3000 bits: each term is the rounded remainder)
_TWO_OVER_PI_2P600 = tuple(float.fromhex(h) for h in (
    "0x1.45f306dc9c883p+599", "-0x1.6b01ec5417056p+545", "-0x1.6447e493ad4cep+491",
    "0x1.e21c820ff28b2p+437", "-0x1.508510ea79237p+382", "0x1.b8e909374b802p+326",
    "-0x1.b6d115f62e6dep+272", "-0x1.80f10a71a76b3p+217", "0x1.cfba208d7d4bbp+162",
    "-0x1.2edec598e3f65p+106", "-0x1.741037d8cdc54p+51", "0x1.cc1a99cfa4e42p-3",
    "0x1.7e2ef7e4a0ec8p-58", "-0x1.da00087e99fc0p-118", "-0x1.0d0ee74a5f593p-172",
    "0x1.f6d367ecf27cbp-228", "0x1.36e9e8c7ecd3dp-285", "-0x1.00ae9456c229cp-339",
    "-0x1.41a0e84c2f8c6p-396", "-0x1.0eb5ada2b2809p-453", "-0x1.0277039517bd5p-507",
    "0x1.98237e3db5d60p-567", "-0x1.e6087beca1794p-621"))


def _mod4(w: _Em, n: ir.Value) -> ir.Value:
    """n mod 4 in [0, 4) for an integer-valued double n."""
    return w.sub(n, w.mul(w.f(4.0), w.unary("floor", w.mul(n, w.f(0.25)))))


def _near_mod4(w: _Em, t: ir.Value) -> ir.Value:
    """t minus the multiple of 4 nearest to it: in [-2, 2], exact for any double t (unlike a
    result in [0, 4), which would round away the low bits of a tiny negative t)."""
    return w.sub(t, w.mul(w.f(4.0), w.unary("rint", w.mul(t, w.f(0.25)))))


def _reduce_fast(w: _Em, x: ir.Value) -> tuple[ir.Value, ir.Value]:
    """Cody-Waite with a three-double pi/2 and fma: (n mod 4, x - n*pi/2) for |x| < 2**45."""
    n = w.unary("rint", w.mul(x, w.f(2.0 / math.pi)))
    r = x
    for part in _PIO2:
        r = w.fma(n, w.f(-part), r)
    return _mod4(w, n), r


def _reduce_huge(w: _Em, x: ir.Value, terms: int) -> tuple[ir.Value, ir.Value]:
    """Payne-Hanek style reduction for |x| >= 2**45, in f64 without tables: each product of x
    with a term of 2/pi is split exactly (fma) and reduced mod 4 exactly; the integer parts are
    summed exactly and the fractions in double-double. Returns (quadrant, r)."""
    x = w.mul(x, w.f(2.0 ** -600))  # exact; the terms carry the 2**600
    ints, s, err = w.f(0.0), w.f(0.0), w.f(0.0)
    for c in _TWO_OVER_PI_2P600[:terms]:
        hi = w.mul(x, w.f(c))
        for t in (hi, w.fma(x, w.f(c), w.neg(hi))):
            t = _near_mod4(w, t)
            whole = w.unary("rint", t)
            ints = w.add(ints, whole)
            s, e = _two_sum(w, s, w.sub(t, whole))
            err = w.add(err, e)
    whole = w.unary("rint", s)
    s, ints = w.sub(s, whole), w.add(ints, whole)
    frac_hi = w.add(s, err)
    frac_lo = w.sub(err, w.sub(frac_hi, s))
    r = w.fma(frac_hi, w.f(_PIO2[0]), w.fma(frac_lo, w.f(_PIO2[0]),
                                              w.mul(frac_hi, w.f(_PIO2[1]))))
    return _mod4(w, ints), r


def _two_sum(w: _Em, a: ir.Value, b: ir.Value) -> tuple[ir.Value, ir.Value]:
    """a + b = s + e exactly (Knuth)."""
    s = w.add(a, b)
    bb = w.sub(s, a)
    return s, w.add(w.sub(a, w.sub(s, bb)), w.sub(b, bb))


def _reduce_pio2(w: _Em, x: ir.Value, terms: int) -> tuple[ir.Value, ir.Value]:
    """(quadrant in [0, 4), r in [-pi/4, pi/4]) with x = (quadrant + 4k)*pi/2 + r; the slow
    reduction runs only when some lane needs it."""
    b = w.b
    q, r = _reduce_fast(w, x)
    huge = w.cmp(">=", w.unary("fabs", x), w.f(_HUGE_ARG))
    any_huge = huge if w.lanes == 1 else intrinsic(
        b, "vector.reduce.or", [huge], ret=ir.IntType(1), overloads=[huge.type])
    before = b.block
    with b.if_then(any_huge, likely=False):
        q_huge, r_huge = _reduce_huge(w, x, terms)
        q_slow, r_slow = w.sel(huge, q_huge, q), w.sel(huge, r_huge, r)
        slow = b.block
    q_phi, r_phi = b.phi(q.type), b.phi(r.type)
    for phi, fast_v, slow_v in ((q_phi, q, q_slow), (r_phi, r, r_slow)):
        phi.add_incoming(fast_v, before)
        phi.add_incoming(slow_v, slow)
    return q_phi, r_phi


def _sincos(em: _Em, x: ir.Value, *, cos: bool) -> ir.Value:
    """sin or cos, computed in f64 (f32 arguments are widened, the result rounded once)."""
    w = em.widened()
    b = em.b
    xd = x if em.wide else b.fpext(x, w.fty)
    quadrant, r = _reduce_pio2(w, xd, 23 if em.wide else 6)  # 2/pi terms for |x| < 2**1024, 2**128
    q = w.to_int(quadrant)
    if cos:
        q = b.add(q, w.i(1))
    z = w.mul(r, r)
    s = w.fma(w.mul(z, r), w.poly(z, _SIN_TAIL), r)
    c = w.poly(z, _COS)
    v = w.sel(b.icmp_signed("!=", b.and_(q, w.i(1)), w.i(0)), c, s)
    v = w.sel(b.icmp_signed("!=", b.and_(q, w.i(2)), w.i(0)), w.neg(v), v)
    bad = b.or_(w.isnan(xd), w.cmp("==", w.unary("fabs", xd), w.f(INF)))
    v = w.sel(bad, w.f(NAN), v)
    if not cos:
        v = w.sel(w.cmp("==", xd, w.f(0.0)), xd, v)  # sin(-0) = -0
    return v if em.wide else b.fptrunc(v, em.fty)


# ----------------------------------------------------------------------------- the library

_GENERATORS: MappingProxyType[str, tuple[int, Callable[..., ir.Value]]] = MappingProxyType({
    "exp": (1, _exp),
    "exp_nonpos": (1, _exp_nonpos),
    "expm1": (1, _expm1),
    "log": (1, _log),
    "log1p": (1, _log1p),
    "tanh": (1, _tanh),
    "sigmoid": (1, _sigmoid),
    "erf": (1, _erf),
    "sin": (1, lambda em, x: _sincos(em, x, cos=False)),
    "cos": (1, lambda em, x: _sincos(em, x, cos=True)),
    "pow": (2, _pow),
})

FUNCTIONS = frozenset(_GENERATORS)


class MathLib:
    """Defines math functions in one LLVM module on first use and calls them."""

    def __init__(self, module: ir.Module, *, scalef: bool = False):
        self.module = module
        self.scalef = scalef
        """The target has AVX-512: 512-bit vectors scale by 2**n with vscalef (:func:`_scale`)."""
        self.scalef_vl = False
        """It has AVX-512VL too: 128- and 256-bit vscalef (``exp_nonpos``'s tail vectors)."""

    def call(self, builder: ir.IRBuilder, name: str, t: LType, args: list[ir.Value]) -> ir.Value:
        return builder.call(self.function(name, t), args)

    def function(self, name: str, t: LType) -> ir.Function:
        """The function computing ``name`` on ``t`` (f32 or f64, any lanes)."""
        if name not in _GENERATORS:
            raise CompileError(f"no generated math function {name!r}")
        if t.dtype not in (DType.f32, DType.f64):
            raise CompileError(f"math function {name} is generated for f32/f64, not {t.dtype}")
        ty = llvm_type(t)
        fname = f"tf.{name}.{type_suffix(ty)}"
        found = self.module.globals.get(fname)
        if found is not None:
            return found  # type: ignore[return-value]
        arity, generate = _GENERATORS[name]
        fn = ir.Function(self.module, ir.FunctionType(ty, [ty] * arity), fname)
        fn.linkage = "internal"
        fn.attributes.add("alwaysinline")
        fn.attributes.add("nounwind")
        em = _Em(ir.IRBuilder(fn.append_basic_block("entry")), self, t.dtype, t.lanes)
        em.b.ret(generate(em, *fn.args))
        return fn

