"""The compass workloads (benchmarks/workloads.py) at small odd sizes: each compiles to native
kernels only (no host fallback, one native entry) and matches NumPy."""

from __future__ import annotations

import math

import numpy as np
import pytest
import scipy.special

import tilefuse
from tilefuse.dtypes import DType
from tilefuse.testing import assert_close, random_array


def _gelu_ffn(w: np.ndarray, b: np.ndarray):
    def ffn(x: np.ndarray) -> np.ndarray:
        y = x @ w + b
        return 0.5 * y * (1.0 + scipy.special.erf(y / math.sqrt(2.0)))
    return ffn


def _layer_norm(g: np.ndarray, b: np.ndarray):
    def norm(x: np.ndarray) -> np.ndarray:
        mean = x.mean(axis=-1, keepdims=True)
        var = ((x - mean) ** 2).mean(axis=-1, keepdims=True)
        return (x - mean) / np.sqrt(var + 1e-5) * g + b
    return norm


def _softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def _mlp(params: list[np.ndarray]):
    w1, b1, w2, b2, w3, b3 = params
    def mlp(x: np.ndarray) -> np.ndarray:
        h = np.maximum(x @ w1 + b1, 0.0)
        h = np.maximum(h @ w2 + b2, 0.0)
        return h @ w3 + b3
    return mlp


def _swish_like(x: np.ndarray) -> np.ndarray:
    return np.maximum(2.0 * x + 1.0, 0.0) * scipy.special.expit(x)


def _cases(rng: np.random.Generator):
    f32 = DType.f32
    yield "W1", _gelu_ffn(random_array(rng, (77, 513), f32) / 9, random_array(rng, (513,), f32)), \
        (37, 77), True
    yield "W2", _layer_norm(random_array(rng, (513,), f32), random_array(rng, (513,), f32)), \
        (7, 513), True
    yield "W3", _softmax, (3, 7, 513), True
    mlp = [random_array(rng, s, f32) / 4 for s in ((65, 65), (65,), (65, 65), (65,), (65, 7),
                                                    (7,))]
    yield "W5", _mlp(mlp), (1, 65), True
    yield "W7", _swish_like, (4099,), False


@pytest.mark.parametrize("case", list(_cases(np.random.default_rng(17))), ids=lambda c: c[0])
def test_workload_is_all_native_and_matches_numpy(case):
    name, fn, shape, reduction = case
    jitted = tilefuse.jit(fn)
    x = random_array(np.random.default_rng(int(name[1:])), shape, DType.f32)
    got = jitted(x)
    exe = jitted.lower(x).executable
    assert exe.fallbacks == [] and exe.single_entry, f"{name}: {exe.fallbacks}"
    assert_close(got, fn(x).astype(np.float32), reduction=reduction, msg=name)
