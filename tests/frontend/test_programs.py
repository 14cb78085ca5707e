"""Whole NumPy programs traced by tilefuse.jit and compared with plain NumPy on the same inputs."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.special
from jitcheck import ODD_SIZES, arr, check_jit, noncontiguous, rng

from tilefuse.dtypes import DType
from tilefuse.frontend import jit
from tilefuse.testing import assert_close


def gelu_erf(x, w, b):
    y = x @ w + b
    return 0.5 * y * (1 + scipy.special.erf(y / np.sqrt(2)))


def gelu_erf_f32(x, w, b):
    y = x @ w + b
    return 0.5 * y * (1.0 + scipy.special.erf(y / np.sqrt(np.float32(2.0))))


def gelu_tanh(x, w, b):
    y = np.matmul(x, w) + b
    return 0.5 * y * (1.0 + np.tanh(np.float32(np.sqrt(2.0 / np.pi)) * (y + 0.044715 * y**3)))


def softmax(x):
    e = np.exp(x - np.max(x, axis=-1, keepdims=True))
    return e / np.sum(e, axis=-1, keepdims=True)


def layer_norm(x, gamma, beta):
    mean = x.mean(axis=-1, keepdims=True)
    var = ((x - mean) ** 2).mean(axis=-1, keepdims=True)
    return (x - mean) / np.sqrt(var + 1e-5) * gamma + beta


MKN = ((1, 1, 1), (7, 13, 5), (2, 513, 7), (513, 3, 1))


@pytest.mark.parametrize("m,k,n", MKN)
def test_gelu_of_linear_in_f64_as_numpy_promotes_it(m, k, n):
    g = rng("gelu64", m, k, n)
    # np.sqrt(2) is a float64 scalar, so NumPy computes in f64: f64 inputs keep that exact.
    x, w, b = (arr(g, s, DType.f64) for s in ((m, k), (k, n), (n,)))
    check_jit(gelu_erf, x, w, b, reduction=True)


def test_gelu_with_f32_inputs_follows_numpys_promotion_to_f64():
    g = rng("gelu-promote")
    x, w, b = arr(g, (7, 5)), arr(g, (5, 3)), arr(g, (3,))
    assert check_jit(gelu_erf, x, w, b, reduction=True)(x, w, b).dtype == np.float64


@pytest.mark.parametrize("m,k,n", MKN)
@pytest.mark.parametrize("fn", [gelu_erf_f32, gelu_tanh], ids=["erf", "tanh"])
def test_gelu_of_linear_in_f32(fn, m, k, n):
    g = rng(fn.__name__, m, k, n)
    x, w, b = arr(g, (m, k)), arr(g, (k, n)), arr(g, (n,))
    jitted = check_jit(fn, x, w, b, reduction=True)
    assert jitted(x, w, b).dtype == np.float32


@pytest.mark.parametrize("shape", [(1, 1), (7, 1), (3, 513), (2, 7, 13)])
@pytest.mark.parametrize("dtype", [DType.f32, DType.f64, DType.f16])
def test_softmax_by_hand(shape, dtype):
    check_jit(softmax, arr(rng("softmax", shape, dtype), shape, dtype, -5, 5), reduction=True)


def test_softmax_on_a_transposed_input():
    x = arr(rng("softmax-T"), (13, 7)).T
    check_jit(softmax, x, reduction=True)


@pytest.mark.parametrize("rows,cols", [(1, 1), (7, 7), (5, 513)])
def test_layer_norm_by_hand(rows, cols):
    g = rng("layer_norm", rows, cols)
    check_jit(layer_norm, arr(g, (rows, cols)), arr(g, (cols,)), arr(g, (cols,)),
              reduction=True)


@pytest.mark.parametrize("size", ODD_SIZES)
def test_broadcasting_with_odd_sizes(size):
    g = rng("broadcast", size)

    def fn(a, b, c):
        return (a + b) * c - a / (np.abs(c) + 1)

    check_jit(fn, arr(g, (size, 1)), arr(g, (1, 7)), arr(g, (7,)))


def test_broadcasting_of_noncontiguous_inputs():
    g = rng("noncontiguous")

    def fn(a, b):
        return np.maximum(a, b) * 2.0 - np.minimum(a, b)

    check_jit(fn, noncontiguous(g, (7, 5)), noncontiguous(g, (5,)))


def test_mlp_with_two_layers_and_relu():
    g = rng("mlp")

    def mlp(x, w1, b1, w2):
        h = np.maximum(x @ w1 + b1, 0.0)
        return softmax(h @ w2)

    check_jit(mlp, arr(g, (7, 13)), arr(g, (13, 9)), arr(g, (9,)), arr(g, (9, 3)),
              reduction=True)


def test_attention_scores_with_einsum_and_swapaxes():
    g = rng("attention")

    def attention(q, k, v):
        scores = np.einsum("bqd,bkd->bqk", q, k) / np.sqrt(np.float32(q.shape[-1]))
        return softmax(scores) @ v, k.swapaxes(1, 2)

    q, k, v = (arr(g, (2, 7, 5)) for _ in range(3))
    check_jit(attention, q, k, v, reduction=True)


@pytest.mark.parametrize("dtype", [DType.i32, DType.i64, DType.i8, DType.u8])
def test_integer_arithmetic_keeps_numpy_dtypes(dtype):
    g = rng("ints", dtype)
    a = arr(g, (7, 5), dtype)
    b = np.abs(arr(g, (5,), dtype)) + 1   # positive divisors

    def fn(a, b):
        return a + b, a * 3, a - 1, a // b, a % b, a / b, a > b, -(a + 2), a.sum(axis=0)

    if dtype is DType.u8:  # NumPy sums u8 in u64, which tilefuse lacks: it sums in i64
        fn_no_sum = lambda a, b: fn(a, b)[:-1]  # noqa: E731
        check_jit(fn_no_sum, a, b)
        total = jit(lambda a: a.sum(axis=0))(a)
        assert_close(total, a.sum(axis=0).astype(np.int64))
        return
    check_jit(fn, a, b)


def test_bool_logic():
    g = rng("bools")
    p, q = arr(g, (7, 5), DType.bool), arr(g, (5,), DType.bool)

    def fn(p, q):
        return (p & q, p | q, p ^ q, ~p, np.logical_not(q), np.logical_xor(p, q),
                np.where(p, 1.5, -1.5), p.sum(), np.logical_and(p, 3))

    check_jit(fn, p, q)


def test_python_scalars_are_weak_and_numpy_scalars_are_strong():
    g = rng("scalars")
    x, i = arr(g, (7,)), arr(g, (7,), DType.i32)

    def fn(x, i):
        return (x * 2.0, x + 1, 3 - x, i + 1, i * 2, i * 0.5, x * np.float64(2.0),
                i + np.int8(1), x ** 2, 2.0 ** x, True + x, x / 3)

    jitted = check_jit(fn, x, i)
    dtypes = [o.dtype for o in jitted(x, i)]
    assert dtypes[:6] == [np.float32, np.float32, np.float32, np.int32, np.int32, np.float64]
    assert dtypes[6] == np.float64


def test_zero_d_arrays_and_numpy_scalars_as_arguments():
    g = rng("0d")
    x = arr(g, (7,))
    s = np.float32(g.uniform(1, 2))

    def fn(x, s):
        return x * s + s, np.exp(s), s + 1.0, s * 2   # Python scalars stay 0-d constants

    check_jit(fn, x, s)
    check_jit(fn, x, np.asarray(s))


def test_constants_closed_over_become_graph_constants():
    g = rng("closure")
    weight = arr(g, (5, 3))
    bias = arr(g, (3,))

    def fn(x):
        return x @ weight + bias * np.arange(3, dtype=np.float32)

    jitted = check_jit(fn, arr(g, (7, 5)), reduction=True)
    captured = jitted.lower(arr(g, (7, 5))).captured
    # weight, and bias * arange (NumPy computes that product itself: no tracer is involved)
    assert sum(node.op.name == "constant" for node in captured.nodes) == 2


def test_reductions_and_reshapes_chain():
    g = rng("chain")
    x = arr(g, (4, 6, 5))

    def fn(x):
        y = x.reshape(4, 30).T.reshape(5, 6, 4)
        z = np.transpose(y, (2, 0, 1)).sum(axis=(1, 2))
        return z, y.max(axis=1), y.min(), y.prod(axis=0), y.var(axis=2), y.argmax(axis=0)

    check_jit(fn, x, reduction=True)


def test_a_closed_over_array_changed_during_the_trace_is_seen_as_numpy_sees_it():
    g = rng("mutating-closure")
    w = arr(g, (5,))

    def fn(x):
        first = x * w
        w[0] += 1.0   # NumPy's second product sees the new value; so must the trace
        return first, x * w

    x = arr(g, (5,))
    saved = w.copy()
    expected = fn(x)
    w[...] = saved
    actual = jit(fn)(x)
    for a, e in zip(actual, expected):
        assert_close(a, e)
