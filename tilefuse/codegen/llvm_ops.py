"""The scalar-op protocol over llvmlite values: one method per loop-IR value op.

Floats here are f32/f64 (and f16 for casts): the caller (:func:`emit_value_op`) converts f16 and
bf16 operands to f32 first and rounds the result back, as NumPy does for those types. Math
functions come from :mod:`tilefuse.codegen.math_lib`; rounding, sqrt and fabs are LLVM intrinsics
that x86 (SSE4.1 and later) and NVPTX implement as instructions.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace

from llvmlite import ir

from tilefuse.codegen.llvm_types import (
    F32,
    HALF_TYPES,
    I32,
    constant,
    intrinsic,
    llvm_type,
    saturating_fptoi,
    vector_of,
)
from tilefuse.codegen.math_lib import MathLib
from tilefuse.codegen.scalar_ops import apply_op, reduction_identity
from tilefuse.dtypes import DType
from tilefuse.loop.ir import Expr, LType, XOp

Value = ir.Value
_UNSIGNED = frozenset({DType.u8, DType.bool})
_NO_PROMOTION = frozenset({XOp.CONST, XOp.BROADCAST, XOp.SELECT, XOp.CAST})


def _is_signed(dtype: DType) -> bool:
    return dtype.is_int and dtype not in _UNSIGNED


def _width(dtype: DType) -> int:
    return 1 if dtype.is_bool else dtype.itemsize * 8


class LLVMOps:
    """Emits each op at the current position of ``builder``."""

    def __init__(self, builder: ir.IRBuilder, math: MathLib):
        self.b = builder
        self.math = math

    # ------------------------------------------------------------------ structure
    def const(self, t: LType, value: int | float | bool) -> Value:
        return constant(t, value)

    def broadcast(self, t: LType, x: Value, lanes: int) -> Value:
        if lanes == 1:
            return x
        vty = ir.VectorType(llvm_type(t), lanes)
        v = self.b.insert_element(ir.Constant(vty, ir.Undefined), x, ir.Constant(I32, 0))
        return self.b.shuffle_vector(v, ir.Constant(vty, ir.Undefined), _mask([0] * lanes))

    def select(self, t: LType, cond: Value, a: Value, b: Value) -> Value:
        return self.b.select(cond, a, b)

    def cast(self, t: LType, x: Value, to: LType) -> Value:
        src, dst, b = t.dtype, to.dtype, self.b
        if src is dst:
            return x
        if src is DType.f64 and dst in HALF_TYPES:   # through f32, still rounded once
            x, t, src = self.f64_to_f32_odd(x, t.lanes), LType(DType.f32, t.lanes), DType.f32
        if src is DType.bf16:
            return self.cast(LType(DType.f32, t.lanes), self.bf16_to_f32(x, t.lanes), to)
        if dst is DType.bf16:
            wide = self.cast(t, x, LType(DType.f32, t.lanes))
            return self.f32_to_bf16(wide, t.lanes)
        if dst.is_bool:
            if src.is_float:
                return b.fcmp_unordered("!=", x, constant(t, 0.0))
            return b.icmp_unsigned("!=", x, constant(t, 0))
        target = llvm_type(to)
        if src.is_float and dst.is_float:
            return (b.fpext if _width(dst) > _width(src) else b.fptrunc)(x, target)
        if src.is_float:
            if src is DType.f16:
                x = b.fpext(x, vector_of(F32, t.lanes))
            return saturating_fptoi(b, x, target, _is_signed(dst))
        if dst.is_float:
            return (b.sitofp if _is_signed(src) else b.uitofp)(x, target)
        if _width(dst) == _width(src):
            return x
        if _width(dst) < _width(src):
            return b.trunc(x, target)
        return (b.sext if _is_signed(src) else b.zext)(x, target)

    def f64_to_f32_odd(self, x: Value, lanes: int) -> Value:
        """``x`` rounded to f32 to odd (toward zero, the last bit set when inexact), so that
        rounding that to f16 or bf16 is f64 to that type rounded once, as NumPy and ml_dtypes
        round (24 bits >= 2 * 11 + 2). Through f32 rounded to nearest, a value just above a
        tie of the narrow type lands on the tie; and without AVX512-FP16, LLVM lowers an f64
        to f16 ``fptrunc`` to a call of ``__truncdfhf2``, which the JIT cannot resolve."""
        b = self.b
        i32 = LType(DType.i32, lanes)
        near = b.fptrunc(x, vector_of(F32, lanes))                  # to nearest even
        back = b.fpext(near, x.type)
        positive = b.fcmp_ordered(">", x, constant(LType(DType.f64, lanes), 0.0))
        above, below = b.fcmp_ordered(">", back, x), b.fcmp_ordered("<", back, x)
        away = b.select(positive, above, below)                    # rounded away from zero
        bits = b.bitcast(near, vector_of(I32, lanes))
        bits = b.select(away, b.sub(bits, constant(i32, 1)), bits)  # one step toward zero
        inexact = b.fcmp_unordered("!=", back, x)                  # NaN too: it stays NaN
        bits = b.select(inexact, b.or_(bits, constant(i32, 1)), bits)
        return b.bitcast(bits, vector_of(F32, lanes))

    def bf16_to_f32(self, x: Value, lanes: int) -> Value:
        wide = self.b.zext(x, vector_of(I32, lanes))
        wide = self.b.shl(wide, constant(LType(DType.i32, lanes), 16))
        return self.b.bitcast(wide, vector_of(F32, lanes))

    def f32_to_bf16(self, x: Value, lanes: int) -> Value:
        """Round to nearest even; NaN stays NaN (quiet, sign kept)."""
        b = self.b
        i32 = LType(DType.i32, lanes)
        bits = b.bitcast(x, llvm_type(i32))
        upper = b.lshr(bits, constant(i32, 16))
        lsb = b.and_(upper, constant(i32, 1))
        rounded = b.lshr(b.add(b.add(bits, constant(i32, 0x7FFF)), lsb), constant(i32, 16))
        quiet = b.or_(upper, constant(i32, 0x40))
        result = b.select(b.fcmp_unordered("uno", x, x), quiet, rounded)
        return b.trunc(result, llvm_type(LType(DType.bf16, lanes)))

    def fma(self, t: LType, a: Value, b: Value, c: Value) -> Value:
        if t.dtype.is_float:
            return intrinsic(self.b, "fma", [a, b, c])
        return self.b.add(self.b.mul(a, b), c)

    # ------------------------------------------------------------------ arithmetic
    def add(self, t: LType, a: Value, b: Value) -> Value:
        return self.b.fadd(a, b) if t.dtype.is_float else self.b.add(a, b)

    def sub(self, t: LType, a: Value, b: Value) -> Value:
        return self.b.fsub(a, b) if t.dtype.is_float else self.b.sub(a, b)

    def mul(self, t: LType, a: Value, b: Value) -> Value:
        return self.b.fmul(a, b) if t.dtype.is_float else self.b.mul(a, b)

    def div(self, t: LType, a: Value, b: Value) -> Value:
        return self.b.fdiv(a, b)

    def _divmod(self, t: LType, a: Value, d: Value) -> tuple[Value, Value]:
        """Python's floor division and modulo; a zero divisor gives 0 (as NumPy), never a trap."""
        b = self.b
        zero, one = constant(t, 0), constant(t, 1)
        is_zero = b.icmp_unsigned("==", d, zero)
        if not _is_signed(t.dtype):
            safe = b.select(is_zero, one, d)
            q, r = b.udiv(a, safe), b.urem(a, safe)
            return b.select(is_zero, zero, q), b.select(is_zero, zero, r)
        is_m1 = b.icmp_signed("==", d, constant(t, -1))  # MIN // -1 would trap
        safe = b.select(b.or_(is_zero, is_m1), one, d)
        q, r = b.sdiv(a, safe), b.srem(a, safe)
        adjust = b.and_(b.icmp_signed("!=", r, zero), b.icmp_signed("<", b.xor(r, d), zero))
        q = b.select(adjust, b.sub(q, one), q)
        r = b.select(adjust, b.add(r, d), r)
        q = b.select(is_m1, b.neg(a), q)
        r = b.select(is_m1, zero, r)
        return b.select(is_zero, zero, q), b.select(is_zero, zero, r)

    def floordiv(self, t: LType, a: Value, b: Value) -> Value:
        return self._divmod(t, a, b)[0]

    def mod(self, t: LType, a: Value, b: Value) -> Value:
        return self._divmod(t, a, b)[1]

    def _pick(self, t: LType, a: Value, b: Value, op: str) -> Value:
        """min (op '<') or max (op '>'): ``a`` if it wins or is NaN, else ``b`` (NumPy's rule)."""
        if t.dtype.is_float:
            wins = self.b.or_(self.b.fcmp_ordered(op, a, b), self.b.fcmp_unordered("uno", a, a))
        elif _is_signed(t.dtype):
            wins = self.b.icmp_signed(op, a, b)
        else:
            wins = self.b.icmp_unsigned(op, a, b)
        return self.b.select(wins, a, b)

    def min(self, t: LType, a: Value, b: Value) -> Value:
        return self._pick(t, a, b, "<")

    def max(self, t: LType, a: Value, b: Value) -> Value:
        return self._pick(t, a, b, ">")

    def pow(self, t: LType, a: Value, b: Value) -> Value:
        return self.math.call(self.b, "pow", t, [a, b])

    def and_(self, t: LType, a: Value, b: Value) -> Value:
        return self.b.and_(a, b)

    def or_(self, t: LType, a: Value, b: Value) -> Value:
        return self.b.or_(a, b)

    def xor(self, t: LType, a: Value, b: Value) -> Value:
        return self.b.xor(a, b)

    def neg(self, t: LType, x: Value) -> Value:
        return self.b.fneg(x) if t.dtype.is_float else self.b.neg(x)

    def not_(self, t: LType, x: Value) -> Value:
        return self.b.not_(x)

    def abs(self, t: LType, x: Value) -> Value:
        if t.dtype.is_float:
            return intrinsic(self.b, "fabs", [x])
        if not _is_signed(t.dtype):
            return x
        negative = self.b.icmp_signed("<", x, constant(t, 0))
        return self.b.select(negative, self.b.neg(x), x)

    def isnan(self, t: LType, x: Value) -> Value:
        return self.b.fcmp_unordered("uno", x, x)

    # ------------------------------------------------------------------ comparisons
    def _compare(self, t: LType, op: str, a: Value, b: Value) -> Value:
        if t.dtype.is_float:
            if op == "!=":
                return self.b.fcmp_unordered(op, a, b)  # NaN != x is true
            return self.b.fcmp_ordered(op, a, b)
        if _is_signed(t.dtype):
            return self.b.icmp_signed(op, a, b)
        return self.b.icmp_unsigned(op, a, b)

    def lt(self, t: LType, a: Value, b: Value) -> Value:
        return self._compare(t, "<", a, b)

    def le(self, t: LType, a: Value, b: Value) -> Value:
        return self._compare(t, "<=", a, b)

    def eq(self, t: LType, a: Value, b: Value) -> Value:
        return self._compare(t, "==", a, b)

    def ne(self, t: LType, a: Value, b: Value) -> Value:
        return self._compare(t, "!=", a, b)

    def gt(self, t: LType, a: Value, b: Value) -> Value:
        return self._compare(t, ">", a, b)

    def ge(self, t: LType, a: Value, b: Value) -> Value:
        return self._compare(t, ">=", a, b)

    # ------------------------------------------------------------------ math
    def _call(self, name: str, t: LType, x: Value) -> Value:
        return self.math.call(self.b, name, t, [x])

    def exp(self, t: LType, x: Value) -> Value:
        return self._call("exp", t, x)

    def exp_nonpos(self, t: LType, x: Value) -> Value:
        return self._call("exp_nonpos", t, x)

    def log(self, t: LType, x: Value) -> Value:
        return self._call("log", t, x)

    def log1p(self, t: LType, x: Value) -> Value:
        return self._call("log1p", t, x)

    def expm1(self, t: LType, x: Value) -> Value:
        return self._call("expm1", t, x)

    def tanh(self, t: LType, x: Value) -> Value:
        return self._call("tanh", t, x)

    def sigmoid(self, t: LType, x: Value) -> Value:
        return self._call("sigmoid", t, x)

    def erf(self, t: LType, x: Value) -> Value:
        return self._call("erf", t, x)

    def sin(self, t: LType, x: Value) -> Value:
        return self._call("sin", t, x)

    def cos(self, t: LType, x: Value) -> Value:
        return self._call("cos", t, x)

    def sqrt(self, t: LType, x: Value) -> Value:
        return intrinsic(self.b, "sqrt", [x])

    def rsqrt(self, t: LType, x: Value) -> Value:
        return self.b.fdiv(constant(t, 1.0), intrinsic(self.b, "sqrt", [x]))

    def floor(self, t: LType, x: Value) -> Value:
        return intrinsic(self.b, "floor", [x])

    def ceil(self, t: LType, x: Value) -> Value:
        return intrinsic(self.b, "ceil", [x])

    def round(self, t: LType, x: Value) -> Value:
        return intrinsic(self.b, "roundeven", [x])

    # ------------------------------------------------------------------ reductions
    def _tree(self, t: LType, x: Value, op: XOp, combine: Callable[..., Value]) -> Value:
        """Pads to a power of two with the identity, then folds halves (as the interpreter)."""
        n = t.lanes
        if n == 1:
            return x
        width = 1 << (n - 1).bit_length()
        if width != n:
            pad = constant(t, reduction_identity(op, t.dtype))
            x = self.b.shuffle_vector(x, pad, _mask(list(range(n)) + [n] * (width - n)))
        while width > 1:
            half = width // 2
            lo = self.b.shuffle_vector(x, x, _mask(list(range(half))))
            hi = self.b.shuffle_vector(x, x, _mask(list(range(half, width))))
            x = combine(t.with_lanes(half), lo, hi)
            width = half
        return self.b.extract_element(x, ir.Constant(I32, 0))

    def reduce_add(self, t: LType, x: Value) -> Value:
        return self._tree(t, x, XOp.REDUCE_ADD, self.add)

    def reduce_max(self, t: LType, x: Value) -> Value:
        return self._tree(t, x, XOp.REDUCE_MAX, self.max)

    def reduce_min(self, t: LType, x: Value) -> Value:
        return self._tree(t, x, XOp.REDUCE_MIN, self.min)


def _mask(indices: list[int]) -> ir.Constant:
    return ir.Constant(ir.VectorType(I32, len(indices)), indices)


def emit_value_op(ops: LLVMOps, e: Expr, args: Sequence[Value]) -> Value:
    """Emits value node ``e``; f16/bf16 arithmetic is done in f32 and rounded back."""
    operand = e.args[0].type if e.args else e.type
    if operand.dtype not in HALF_TYPES or e.op in _NO_PROMOTION:
        return apply_op(ops, e, args)
    f32 = LType(DType.f32, operand.lanes)
    wide = [ops.cast(operand, a, f32) for a in args]  # every operand has the operand type here
    rounds_back = e.dtype is operand.dtype  # not for comparisons and isnan (bool results)
    result_type = LType(DType.f32, e.lanes) if rounds_back else e.type
    promoted = Expr(e.op, result_type, tuple(replace(a, type=f32) for a in e.args), e.arg)
    result = apply_op(ops, promoted, wide)
    return ops.cast(result_type, result, e.type) if rounds_back else result
