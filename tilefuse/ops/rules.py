"""Shape and dtype rules shared by many ops, and helpers for NumPy references."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from tilefuse.dtypes import DType, promote_all
from tilefuse.graph.ir import Attrs
from tilefuse.graph.types import Shape, broadcast_shapes

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

_LOW_PRECISION = (np.dtype(np.float16), DType.bf16.np)


def in_f32(fn: Callable[..., np.ndarray]) -> Callable[..., np.ndarray]:
    """Wraps a float reference so that f16 and bf16 inputs are computed in f32 and rounded back
    once: the result a careful kernel produces, and what the numerics contract compares with."""

    def ref(*arrays: np.ndarray, **attrs: object) -> np.ndarray:
        low = next((a.dtype for a in arrays if a.dtype in _LOW_PRECISION), None)
        if low is None:
            return fn(*arrays, **attrs)
        wide = [a.astype(np.float32) if a.dtype in _LOW_PRECISION else a for a in arrays]
        return np.asarray(fn(*wide, **attrs)).astype(low)

    ref.__name__ = getattr(fn, "__name__", "ref")
    ref.__doc__ = fn.__doc__
    return ref


def as_dtype(result: np.ndarray | np.generic, dtype: DType) -> np.ndarray:
    """``result`` as an array of exactly ``dtype`` (NumPy scalars and 0-d results included)."""
    return np.asarray(result).astype(dtype.np, copy=False)
