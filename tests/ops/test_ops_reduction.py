"""Reductions against NumPy: sum, mean, max, min, prod, var, argmax, argmin."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import array_shapes
from opcheck import FLOATS, INTS, LOW, array, in_f64, noncontiguous, rng, run1, seeds

from tilefuse.dtypes import DType
from tilefuse.testing import assert_close

SHAPES_AXES = [
    ((513,), None), ((513,), (0,)), ((1,), (-1,)), ((7, 1, 5), None), ((7, 1, 5), (0,)),
    ((7, 1, 5), (1,)), ((7, 1, 5), (0, 2)), ((7, 1, 5), (-1, 0)), ((7, 1, 5), ()),
    ((3, 513), (1,)),
]


def _expect(name: str, x: np.ndarray, axes, keepdims: bool, dtype: DType) -> np.ndarray:
    """The NumPy expression, with NumPy's own accumulation dtypes where tilefuse agrees."""
    kw = {"axis": axes, "keepdims": keepdims}
    fn = {"sum": np.sum, "prod": np.prod, "mean": np.mean, "var": np.var, "max": np.max,
          "min": np.min}[name]
    if dtype in LOW:
        return in_f64(lambda v: fn(v, **kw), x, out=dtype)
    if name in ("sum", "prod") and not dtype.is_float:
        return np.asarray(fn(x, dtype=np.int64, **kw))  # NumPy gives u64 for u8: no u64 here
    return np.asarray(fn(x, **kw))


@pytest.mark.parametrize("dtype", FLOATS + INTS + (DType.bool,))
@pytest.mark.parametrize("name", ["sum", "prod", "mean", "var", "max", "min"])
def test_reductions(name: str, dtype: DType) -> None:
    r = rng(name, dtype.value)
    low, high = (0.5, 1.5) if name == "prod" else (-2.0, 2.0)
    for shape, axes in SHAPES_AXES:
        x = array(r, shape, dtype, low, high)
        for keepdims in (False, True):
            got = run1(name, [noncontiguous(x)], {"axes": axes, "keepdims": keepdims})
            assert_close(got, _expect(name, x, axes, keepdims, dtype), reduction=True,
                         msg=f"{name} {shape} axes={axes} keepdims={keepdims}")


def test_result_dtypes_follow_numpy() -> None:
    x8 = array(rng(1), (7,), DType.i8)
    assert run1("sum", [x8]).dtype == np.int64
    assert run1("sum", [x8 > 0]).dtype == np.int64
    assert run1("mean", [x8]).dtype == np.float64
    assert run1("var", [x8]).dtype == np.float64
    assert run1("max", [x8]).dtype == np.int8
    assert run1("sum", [array(rng(2), (7,), DType.bf16)]).dtype == DType.bf16.np


@pytest.mark.parametrize("ddof", [0, 1, 3])
def test_var_ddof(ddof: int) -> None:
    x = array(rng(ddof), (7, 513), DType.f32)
    assert_close(run1("var", [x], {"axes": (1,), "ddof": ddof}), np.var(x, axis=1, ddof=ddof),
                 reduction=True)


@pytest.mark.parametrize("dtype", [DType.f32, DType.f64, DType.bf16, DType.i32, DType.u8,
                                   DType.bool])
@pytest.mark.parametrize("name", ["argmax", "argmin"])
def test_argmax_argmin(name: str, dtype: DType) -> None:
    fn = getattr(np, name)
    r = rng(name, dtype.value)
    for shape in ((1,), (513,), (7, 3, 5)):
        x = array(r, shape, dtype)
        for axis in (None, 0, -1):
            for keepdims in (False, True):
                got = run1(name, [noncontiguous(x)], {"axis": axis, "keepdims": keepdims})
                expect = fn(x.astype(np.float64) if dtype in LOW else x, axis=axis,
                            keepdims=keepdims)
                assert_close(got, np.asarray(expect, dtype=np.int64))


def test_nan_propagation() -> None:
    x = np.array([[1.0, np.nan, 3.0], [4.0, 5.0, 6.0]], dtype=np.float32)
    assert_close(run1("max", [x], {"axes": (1,)}), np.max(x, axis=1))
    assert_close(run1("sum", [x], {"axes": (1,)}), np.sum(x, axis=1))
    np.testing.assert_array_equal(run1("argmax", [x], {"axis": 1}), np.argmax(x, axis=1))
    np.testing.assert_array_equal(run1("argmin", [x], {"axis": 1}), np.argmin(x, axis=1))


@settings(max_examples=30, deadline=None)
@given(shape=array_shapes(min_dims=1, max_dims=4, max_side=5), data=st.data(), seed=seeds)
def test_random_axes(shape, data, seed: int) -> None:
    axes = data.draw(st.lists(st.integers(0, len(shape) - 1), unique=True, max_size=len(shape)))
    keepdims = data.draw(st.booleans())
    x = array(rng(seed), shape, DType.f64)
    for name in ("sum", "mean", "max", "var"):
        got = run1(name, [x], {"axes": tuple(axes), "keepdims": keepdims})
        assert_close(got, _expect(name, x, tuple(axes), keepdims, DType.f64), reduction=True)
