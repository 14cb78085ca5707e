"""Shape and dtype rules shared by many ops, and helpers for NumPy references."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from tilefuse.dtypes import DType, from_numpy, is_bfloat16, promote_all
from tilefuse.errors import AttrError, ShapeError
from tilefuse.graph.ir import Attrs
from tilefuse.graph.types import Shape, Sym, broadcast_shapes, normalize_axes

# ---- shape rules -----------------------------------------------------------------------------


def same_shape(shapes: tuple[Shape, ...], attrs: Attrs) -> tuple[Shape, ...]:
    """One output with the shape of the (single) input."""
    return (shapes[0],)


def broadcast(shapes: tuple[Shape, ...], attrs: Attrs) -> tuple[Shape, ...]:
    """One output with the broadcast shape of all inputs."""
    return (broadcast_shapes(*shapes),)


# ---- dtype rules -----------------------------------------------------------------------------


def same_dtype(dtypes: tuple[DType, ...], attrs: Attrs) -> tuple[DType, ...]:
    return (dtypes[0],)


def promoted(dtypes: tuple[DType, ...], attrs: Attrs) -> tuple[DType, ...]:
    """NumPy promotion of all inputs."""
    return (promote_all(dtypes),)


def float_promoted(dtypes: tuple[DType, ...], attrs: Attrs) -> tuple[DType, ...]:
    """Promotion, then ints and bools become f64 (as NumPy's true division and exp do)."""
    t = promote_all(dtypes)
    return (t if t.is_float else DType.f64,)


def boolean(dtypes: tuple[DType, ...], attrs: Attrs) -> tuple[DType, ...]:
    return (DType.bool,)


def fixed(dtype: DType) -> Callable[[tuple[DType, ...], Attrs], tuple[DType, ...]]:
    def rule(dtypes: tuple[DType, ...], attrs: Attrs) -> tuple[DType, ...]:
        return (dtype,)
    return rule


# ---- references ------------------------------------------------------------------------------

def _low_precision(dtype: np.dtype) -> bool:
    return dtype == np.float16 or is_bfloat16(dtype)


def in_f32(fn: Callable[..., np.ndarray]) -> Callable[..., np.ndarray]:
    """Wraps a float reference so that f16 and bf16 inputs are computed in f32 and rounded back
    once: the result a careful kernel produces, and what the numerics contract compares with."""

    def ref(*arrays: np.ndarray, **attrs: object) -> np.ndarray:
        low = next((a.dtype for a in arrays if _low_precision(a.dtype)), None)
        if low is None:
            return fn(*arrays, **attrs)
        wide = [a.astype(np.float32) if _low_precision(a.dtype) else a for a in arrays]
        return np.asarray(fn(*wide, **attrs)).astype(low)

    ref.__name__ = getattr(fn, "__name__", "ref")
    ref.__doc__ = fn.__doc__
    return ref


def as_dtype(result: np.ndarray | np.generic, dtype: DType) -> np.ndarray:
    """``result`` as an array of exactly ``dtype`` (NumPy scalars and 0-d results included)."""
    return np.asarray(result).astype(dtype.np, copy=False)


# ---- shared helpers (op set) -----------------------------------------------------------------

LOW_PRECISION_TYPES = frozenset({DType.f16, DType.bf16})


def dtype_of(array: np.ndarray) -> DType:
    """The tilefuse DType of a NumPy array."""
    return from_numpy(array.dtype)


def work_dtype(dtype: DType) -> np.dtype:
    """The NumPy dtype a reference computes ``dtype`` results in: f32 for f16/bf16, else itself."""
    return np.dtype(np.float32) if dtype in LOW_PRECISION_TYPES else dtype.np


def quiet(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Runs a reference with NumPy's floating-point warnings silenced: NaN and Inf results are
    values like any other (division by zero, log of a negative, ...), not events."""

    def ref(*arrays: np.ndarray, **attrs: object) -> Any:
        with np.errstate(all="ignore"):
            return fn(*arrays, **attrs)

    ref.__name__ = getattr(fn, "__name__", "ref")
    ref.__doc__ = fn.__doc__
    return ref


def reduce_shape(shape: Shape, axes: tuple[int, ...] | None, keepdims: bool) -> Shape:
    """The shape left after reducing ``axes`` (None: all) of ``shape``."""
    reduced = set(normalize_axes(axes, len(shape)))
    if keepdims:
        return tuple(1 if i in reduced else d for i, d in enumerate(shape))
    return tuple(d for i, d in enumerate(shape) if i not in reduced)


def check_shape_attr(value: object, what: str = "shape") -> Shape:
    """Validates a shape given as an attribute: a tuple of non-negative ints and Syms."""
    if not isinstance(value, tuple):
        raise AttrError(f"{what} must be a tuple of ints and symbols, got {value!r}")
    for d in value:
        if isinstance(d, bool) or not isinstance(d, (int, Sym)) or (isinstance(d, int) and d < 0):
            raise AttrError(f"{what} entries must be non-negative ints or symbols, got {d!r}")
    return value


def concrete_shape(shape: Shape, what: str = "shape") -> tuple[int, ...]:
    """A shape attribute as ints, for a reference that must allocate it.

    References see symbols only when their caller did not substitute the symbols' bound sizes;
    then the size is unknown and this raises a ShapeError naming the symbol.
    """
    for d in shape:
        if isinstance(d, Sym):
            raise ShapeError(f"{what} holds symbol {d.name!r}, whose size is not known here")
    return tuple(int(d) for d in shape)
