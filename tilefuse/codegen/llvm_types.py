"""LLVM types for loop-IR types, constants, and intrinsic declarations by full name.

Register types: ``bool`` is ``i1``, ``bf16`` is its ``i16`` bit pattern (llvmlite has no bfloat
type; arithmetic converts to f32 and back), ``u8`` is ``i8`` (unsigned ops are chosen by dtype).
In memory a ``bool`` is one byte.
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir

from tilefuse.dtypes import DType
from tilefuse.loop.ir import LType

I1 = ir.IntType(1)
I8 = ir.IntType(8)
I16 = ir.IntType(16)
I32 = ir.IntType(32)
I64 = ir.IntType(64)
F32 = ir.FloatType()
F64 = ir.DoubleType()
PTR = ir.PointerType()
VOID = ir.VoidType()

HALF_TYPES = frozenset({DType.f16, DType.bf16})

_SCALAR: dict[DType, ir.Type] = {
    DType.f64: F64, DType.f32: F32, DType.f16: ir.HalfType(), DType.bf16: I16,
    DType.i64: I64, DType.i32: I32, DType.i16: I16, DType.i8: I8, DType.u8: I8, DType.bool: I1,
}


def vector_of(elem: ir.Type, lanes: int) -> ir.Type:
    return elem if lanes == 1 else ir.VectorType(elem, lanes)


def scalar_type(dtype: DType, *, memory: bool = False) -> ir.Type:
    """The LLVM type of one ``dtype`` element in registers (or in memory)."""
    if memory and dtype is DType.bool:
        return I8
    return _SCALAR[dtype]


def llvm_type(t: LType, *, memory: bool = False) -> ir.Type:
    return vector_of(scalar_type(t.dtype, memory=memory), t.lanes)


def constant(t: LType, value: int | float | bool) -> ir.Constant:
    """A (splat) constant of type ``t``."""
    elem = scalar_type(t.dtype)
    if t.dtype is DType.bf16:
        value = int(np.array(value, DType.bf16.np).view(np.uint16))
    elif t.dtype.is_float:
        value = float(np.array(value, t.dtype.np))  # rounded as the type stores it
    elif t.dtype.is_bool:
        value = int(bool(value))
    scalar = ir.Constant(elem, value)
    if t.lanes == 1:
        return scalar
    return ir.Constant(ir.VectorType(elem, t.lanes), [scalar] * t.lanes)


def type_suffix(ty: ir.Type) -> str:
    """The overload suffix LLVM intrinsics use: ``f32``, ``v16f32``, ``v8i64``..."""
    if isinstance(ty, ir.VectorType):
        return f"v{ty.count}{type_suffix(ty.element)}"
    if isinstance(ty, ir.IntType):
        return f"i{ty.width}"
    if isinstance(ty, ir.HalfType):
        return "f16"
    return "f64" if isinstance(ty, ir.DoubleType) else "f32"


def declare(module: ir.Module, name: str, ret: ir.Type, args: list[ir.Type]) -> ir.Function:
    """The function ``name`` of ``module``, declared on first use."""
    found = module.globals.get(name)
    if found is not None:
        return found  # type: ignore[return-value]
    return ir.Function(module, ir.FunctionType(ret, args), name)


def intrinsic(builder: ir.IRBuilder, base: str, args: list[ir.Value],
              ret: ir.Type | None = None, overloads: list[ir.Type] | None = None) -> ir.Value:
    """Calls ``llvm.<base>.<suffixes>``, declared by its full name (vector types included).

    The suffixes are those of ``overloads`` (default: the return type).
    """
    ret = ret or args[0].type
    suffix = ".".join(type_suffix(t) for t in (overloads or [ret]))
    fn = declare(builder.module, f"llvm.{base}.{suffix}", ret, [a.type for a in args])
    return builder.call(fn, args)


def saturating_fptoi(builder: ir.IRBuilder, x: ir.Value, target: ir.Type, signed: bool) -> ir.Value:
    """Float to int, truncating toward zero, saturating at the type's range, NaN giving 0.

    The same result as ``llvm.fptosi.sat``/``fptoui.sat``, written as a plain conversion and
    selects: the x86 backend scalarises the ``.sat`` intrinsics lane by lane (about 8
    instructions a lane), while this form stays one ``vcvttps2dq`` and three blends. The plain
    conversion is poison only in lanes that a select replaces.
    """
    elem = target.element if isinstance(target, ir.VectorType) else target
    bits = elem.width
    lanes = target.count if isinstance(target, ir.VectorType) else 1
    ftype = x.type.element if isinstance(x.type, ir.VectorType) else x.type

    def fconst(v: float) -> ir.Constant:
        c = ir.Constant(ftype, v)
        return c if lanes == 1 else ir.Constant(x.type, [c] * lanes)

    def iconst(v: int) -> ir.Constant:
        c = ir.Constant(elem, v)
        return c if lanes == 1 else ir.Constant(target, [c] * lanes)

    if signed:
        lo, hi = -(2.0 ** (bits - 1)), 2.0 ** (bits - 1)
        imin, imax = -(1 << (bits - 1)), (1 << (bits - 1)) - 1
        raw = builder.fptosi(x, target)
    else:
        lo, hi, imin, imax = 0.0, 2.0 ** bits, 0, (1 << bits) - 1
        raw = builder.fptoui(x, target)
    result = builder.select(builder.fcmp_ordered("<", x, fconst(lo)), iconst(imin), raw)
    result = builder.select(builder.fcmp_ordered(">=", x, fconst(hi)), iconst(imax), result)
    return builder.select(builder.fcmp_unordered("uno", x, x), iconst(0), result)
