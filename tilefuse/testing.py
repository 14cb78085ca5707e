"""The numerics contract, written once: tolerances per dtype and the comparison every test uses.

Elementwise results must match the reference within ``rtol``/``atol`` of their dtype. Long
reductions and contractions accumulate rounding error, so they get the looser ``reduction``
tolerance, scaled by nothing else. Integers and bools must match exactly. NaNs must be in the
same places.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tilefuse.dtypes import DType, from_numpy


@dataclass(frozen=True)
class Tolerance:
    rtol: float
    atol: float


ELEMENTWISE: dict[DType, Tolerance] = {
    DType.f64: Tolerance(1e-12, 1e-12),
    DType.f32: Tolerance(1e-5, 1e-5),
    DType.f16: Tolerance(1e-3, 1e-3),
    DType.bf16: Tolerance(1.6e-2, 1.6e-2),
}
REDUCTION: dict[DType, Tolerance] = {
    DType.f64: Tolerance(1e-10, 1e-10),
    DType.f32: Tolerance(1e-4, 1e-4),
    DType.f16: Tolerance(1e-2, 1e-2),
    DType.bf16: Tolerance(5e-2, 5e-2),
}


# Gradients are checked against central differences in f64 with step FD_STEP; the truncation
# error is O(step^2) times the third derivative, far below this tolerance for the smooth test
# functions (float rounding of the difference quotient is about 1e-10 relative).
FD_STEP = 1e-6
FINITE_DIFFERENCE = Tolerance(1e-5, 1e-6)


def tolerance(dtype: DType, *, reduction: bool = False) -> Tolerance:
    table = REDUCTION if reduction else ELEMENTWISE
    return table.get(dtype, Tolerance(0.0, 0.0))


def assert_close(actual: np.ndarray, expected: np.ndarray, *, reduction: bool = False,
                 msg: str = "") -> None:
    """Asserts equal shape and dtype and values within the dtype's tolerance."""
    actual = np.asarray(actual)
    expected = np.asarray(expected)
    assert actual.shape == expected.shape, f"{msg} shape {actual.shape} != {expected.shape}"
    assert actual.dtype == expected.dtype, f"{msg} dtype {actual.dtype} != {expected.dtype}"
    dtype = from_numpy(expected.dtype)
    if not dtype.is_float:
        np.testing.assert_array_equal(actual, expected, err_msg=msg)
        return
    tol = tolerance(dtype, reduction=reduction)
    np.testing.assert_allclose(actual.astype(np.float64), expected.astype(np.float64),
                               rtol=tol.rtol, atol=tol.atol, equal_nan=True, err_msg=msg)


def random_array(rng: np.random.Generator, shape: tuple[int, ...], dtype: DType,
                 low: float = -2.0, high: float = 2.0) -> np.ndarray:
    """Fresh random values (never all zeros) of ``dtype``: uniform floats, small ints, bools."""
    if dtype.is_float:
        return rng.uniform(low, high, size=shape).astype(dtype.np)
    if dtype is DType.bool:
        return rng.random(size=shape) < 0.5
    if dtype is DType.u8:
        return rng.integers(0, 10, size=shape).astype(np.uint8)
    return rng.integers(-9, 10, size=shape).astype(dtype.np)
