"""Helpers for the frontend tests: run a function through ``tilefuse.jit`` and through plain NumPy
on the same fresh random inputs, and compare every output under the numerics contract."""

from __future__ import annotations

import zlib
from collections.abc import Callable
from typing import Any

import numpy as np

from tilefuse.dtypes import DType
from tilefuse.frontend import JitFunction, jit
from tilefuse.testing import assert_close, random_array

ODD_SIZES = (1, 7, 513)


def rng(*key: object) -> np.random.Generator:
    """A generator seeded from ``key`` (stable across runs, different per test case)."""
    return np.random.default_rng(zlib.crc32(repr(key).encode()))


def arr(gen: np.random.Generator, shape: tuple[int, ...], dtype: DType = DType.f32,
        low: float = -2.0, high: float = 2.0) -> np.ndarray:
    return random_array(gen, shape, dtype, low, high)


def noncontiguous(gen: np.random.Generator, shape: tuple[int, ...],
                  dtype: DType = DType.f32, low: float = -2.0, high: float = 2.0) -> np.ndarray:
    """A random array of ``shape`` that is a strided view (every other column of a wider one)."""
    if not shape:
        return arr(gen, shape, dtype, low, high)
    wide = arr(gen, (*shape[:-1], 2 * shape[-1]), dtype, low, high)
    view = wide[..., ::2]
    assert not view.flags.c_contiguous or view.size <= 1
    return view


def _compare(actual: Any, expected: Any, reduction: bool, where: str) -> None:
    if isinstance(expected, (tuple, list)):
        assert type(actual) is type(expected), f"{where}: {type(actual)} != {type(expected)}"
        assert len(actual) == len(expected), f"{where}: {len(actual)} != {len(expected)} items"
        for i, (a, e) in enumerate(zip(actual, expected)):
            _compare(a, e, reduction, f"{where}[{i}]")
        return
    assert isinstance(actual, np.ndarray), f"{where}: got {type(actual).__name__}"
    assert_close(actual, np.asarray(expected), reduction=reduction, msg=where)


def check_jit(fn: Callable[..., Any], *args: Any, reduction: bool = False,
              **jit_options: Any) -> JitFunction:
    """Asserts ``jit(fn)(*args)`` equals ``fn(*args)`` (values, shapes, dtypes, structure) on the
    first call (a compile) and the second (a cache hit); returns the jitted function."""
    expected = fn(*args)
    jitted = jit(fn, **jit_options)
    _compare(jitted(*args), expected, reduction, "compiled call")
    _compare(jitted(*args), expected, reduction, "cached call")
    info = jitted.cache_info()
    assert (info.compiles, info.hits) == (1, 1), info
    return jitted
