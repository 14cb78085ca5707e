"""Element types, their NumPy storage, and NumPy-style promotion (bf16 included)."""

from __future__ import annotations

import enum
import functools
import sys

import numpy as np

from tilefuse.errors import DTypeError


class DType(enum.Enum):
    """An element type. The value is the short name used in printed IR."""

    f64 = "f64"
    f32 = "f32"
    f16 = "f16"
    bf16 = "bf16"
    i64 = "i64"
    i32 = "i32"
    i16 = "i16"
    i8 = "i8"
    u8 = "u8"
    bool = "bool"

    def __repr__(self) -> str:
        return f"DType.{self.value}"

    def __str__(self) -> str:
        return self.value

    @property
    def np(self) -> np.dtype:
        """The NumPy dtype that stores this type (bf16 through ml_dtypes)."""
        return bfloat16() if self is DType.bf16 else _TO_NUMPY[self]

    @property
    def itemsize(self) -> int:
        return self.np.itemsize

    @property
    def is_float(self) -> bool:
        return self in FLOAT_TYPES

    @property
    def is_int(self) -> bool:
        return self in INT_TYPES

    @property
    def is_bool(self) -> bool:
        return self is DType.bool


FLOAT_TYPES = frozenset({DType.f64, DType.f32, DType.f16, DType.bf16})
SIGNED_INT_TYPES = frozenset({DType.i64, DType.i32, DType.i16, DType.i8})
INT_TYPES = SIGNED_INT_TYPES | {DType.u8}
NUMERIC_TYPES = FLOAT_TYPES | INT_TYPES
ALL_TYPES = frozenset(DType)

_TO_NUMPY: dict[DType, np.dtype] = {
    DType.f64: np.dtype(np.float64),
    DType.f32: np.dtype(np.float32),
    DType.f16: np.dtype(np.float16),
    DType.i64: np.dtype(np.int64),
    DType.i32: np.dtype(np.int32),
    DType.i16: np.dtype(np.int16),
    DType.i8: np.dtype(np.int8),
    DType.u8: np.dtype(np.uint8),
    DType.bool: np.dtype(np.bool_),
}
_FROM_NUMPY: dict[np.dtype, DType] = {v: k for k, v in _TO_NUMPY.items()}


@functools.cache
def bfloat16() -> np.dtype:
    """ml_dtypes' bfloat16, imported on first use: initialising ml_dtypes takes ~1.2 s here,
    most of ``import tilefuse``, and only bf16 programs need it."""
    import ml_dtypes

    return np.dtype(ml_dtypes.bfloat16)


def is_bfloat16(dtype: np.dtype) -> bool:
    """Whether ``dtype`` is ml_dtypes' bfloat16 (without importing ml_dtypes: an array of it
    exists only once its maker imported it)."""
    return "ml_dtypes" in sys.modules and dtype == bfloat16()


def from_numpy(dtype: object) -> DType:
    """The DType for a NumPy dtype (or anything np.dtype accepts); DTypeError if unsupported."""
    if isinstance(dtype, DType):
        return dtype
    try:
        key = np.dtype(dtype)  # type: ignore[call-overload]
    except TypeError as exc:
        raise DTypeError(f"not a dtype: {dtype!r}") from exc
    found = _FROM_NUMPY.get(key)
    if found is None and is_bfloat16(key):
        found = DType.bf16
    if found is None:
        raise DTypeError(f"unsupported dtype {key}; tilefuse supports "
                         + ", ".join(t.value for t in DType))
    return found


def parse_dtype(name: str) -> DType:
    """The DType printed as ``name`` (``f32``, ``bf16``, ...)."""
    try:
        return DType(name)
    except ValueError as exc:
        raise DTypeError(f"unknown dtype name {name!r}") from exc


def promote(a: DType, b: DType) -> DType:
    """NumPy's promotion of two array dtypes, extended to bf16 (bf16 with f16 gives f32)."""
    if a is b:
        return a
    if DType.bf16 in (a, b):
        other = b if a is DType.bf16 else a
        if other in (DType.f32, DType.f64):
            return other
        if other is DType.f16:
            return DType.f32
        if other in (DType.bool, DType.i8, DType.u8):
            return DType.bf16
        return DType.f32 if other is DType.i16 else DType.f64
    return from_numpy(np.promote_types(a.np, b.np))


def promote_all(types: list[DType] | tuple[DType, ...]) -> DType:
    result = types[0]
    for t in types[1:]:
        result = promote(result, t)
    return result


def weak_scalar_dtype(value: bool | int | float, partner: DType) -> DType:
    """The dtype a Python scalar takes next to an array of type ``partner`` (NEP 50: weak scalars).

    A Python float next to an integer array promotes to f64 as in NumPy 2; an int next to a float
    array takes the float type; a bool takes the partner's type.
    """
    if isinstance(value, bool):
        return partner
    if isinstance(value, int):
        return partner if partner is not DType.bool else DType.i64
    if isinstance(value, float):
        return partner if partner.is_float else DType.f64
    raise DTypeError(f"not a scalar: {value!r}")
