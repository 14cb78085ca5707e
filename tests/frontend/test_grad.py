"""tilefuse.grad / tilefuse.value_and_grad: forward and backward compiled as one graph.

The target case is a NumPy MLP with a softmax cross-entropy loss: the compiled gradients match
central finite differences of the NumPy function in f64, on fresh random inputs with odd sizes,
and the f32 build matches the f64 one within f32 tolerance, and both match ``jax.grad`` of the
same function (skipped where jax is not importable). The speed against
``jax.jit(jax.value_and_grad)`` is measured by ``benchmarks/training.py --models numpy-mlp``."""

from __future__ import annotations

import numpy as np
import pytest

import tilefuse
from tilefuse.errors import GradientError, TraceError
from tilefuse.testing import FD_STEP

rng = np.random.default_rng(3)


def mlp_loss(w1, b1, w2, b2, x, labels):
    h = np.tanh(x @ w1 + b1)
    logits = h @ w2 + b2
    z = logits - np.max(logits, axis=1, keepdims=True)
    logp = z - np.log(np.sum(np.exp(z), axis=1, keepdims=True))
    return -np.mean(np.take_along_axis(logp, labels[:, None], axis=1))


def _mlp_args(dtype=np.float64, batch=13, features=7, hidden=19, classes=5):
    return [rng.normal(size=(features, hidden)).astype(dtype) * 0.4,
            rng.normal(size=(hidden,)).astype(dtype) * 0.1,
            rng.normal(size=(hidden, classes)).astype(dtype) * 0.4,
            rng.normal(size=(classes,)).astype(dtype) * 0.1,
            rng.normal(size=(batch, features)).astype(dtype),
            rng.integers(0, classes, size=batch)]


def _finite_differences(fn, args, i):
    grad = np.zeros_like(args[i])
    for index in np.ndindex(args[i].shape):
        plus, minus = list(args), list(args)
        plus[i], minus[i] = args[i].copy(), args[i].copy()
        plus[i][index] += FD_STEP
        minus[i][index] -= FD_STEP
        grad[index] = (fn(*plus) - fn(*minus)) / (2 * FD_STEP)
    return grad


@pytest.mark.parametrize("target", ["cpu", "reference"])
def test_mlp_cross_entropy_matches_finite_differences(target: str) -> None:
    args = _mlp_args()
    value, grads = tilefuse.value_and_grad(mlp_loss, argnums=(0, 1, 2, 3), target=target)(*args)
    np.testing.assert_allclose(value, mlp_loss(*args), rtol=1e-12)
    for i, g in enumerate(grads):
        assert g.shape == args[i].shape and g.dtype == np.float64
        np.testing.assert_allclose(g, _finite_differences(mlp_loss, args, i), rtol=1e-5,
                                   atol=1e-7, err_msg=f"gradient of argument {i}")


def test_f32_matches_f64() -> None:
    args64 = _mlp_args(batch=9, hidden=33)
    args32 = [a.astype(np.float32) if a.dtype.kind == "f" else a for a in args64]
    g64 = tilefuse.grad(mlp_loss, argnums=(0, 2))(*args64)
    g32 = tilefuse.grad(mlp_loss, argnums=(0, 2))(*args32)
    for a, b in zip(g32, g64):
        assert a.dtype == np.float32
        np.testing.assert_allclose(a, b, rtol=2e-4, atol=1e-5)


def test_grad_single_argnum_and_cache() -> None:
    def f(x, y):
        return np.sum(np.sin(x) * y)

    g = tilefuse.grad(f)
    x, y = rng.normal(size=(3, 4)), rng.normal(size=(4,))
    np.testing.assert_allclose(g(x, y), np.cos(x) * y, rtol=1e-12)
    x2 = rng.normal(size=(3, 4))
    np.testing.assert_allclose(g(x2, y), np.cos(x2) * y, rtol=1e-12)
    assert g.cache_info().hits == 1 and g.cache_info().compiles == 1
    gy = tilefuse.grad(f, argnums=-1)(x, y)
    np.testing.assert_allclose(gy, np.sin(x).sum(axis=0), rtol=1e-12)


def test_one_graph_for_forward_and_backward() -> None:
    args = _mlp_args(batch=4)
    lowered = tilefuse.value_and_grad(mlp_loss, argnums=0).lower(*args)
    assert len(lowered.optimized.outputs) == 2
    assert lowered.captured.name == "grad_mlp_loss"
    # tanh is computed once: the backward reuses the forward's value
    assert sum(n.op.name == "tanh" for n in lowered.optimized.nodes) == 1


def test_errors_are_named() -> None:
    x = rng.normal(size=(3,))
    with pytest.raises(GradientError, match="must return one scalar"):
        tilefuse.grad(lambda x: np.exp(x))(x)
    with pytest.raises(GradientError, match="argnums 1 is not an argument"):
        tilefuse.grad(lambda x: np.sum(x), argnums=1)(x)
    with pytest.raises(GradientError, match="floating-point"):
        tilefuse.grad(lambda x: np.sum(x * 1.0))(np.arange(3))
    with pytest.raises(TraceError, match="argnums"):
        tilefuse.grad(lambda x: np.sum(x), argnums=(0, 0))
    inner = tilefuse.grad(lambda x: np.sum(x * x))
    with pytest.raises(TraceError, match="inside another traced function"):
        tilefuse.jit(lambda x: inner(x))(x)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_matches_jax_when_installed(dtype: type) -> None:
    jax = pytest.importorskip("jax")
    jnp = pytest.importorskip("jax.numpy")
    jax.config.update("jax_enable_x64", True)

    def jloss(w1, b1, w2, b2, x, labels):
        h = jnp.tanh(x @ w1 + b1)
        logp = jax.nn.log_softmax(h @ w2 + b2, axis=1)
        return -jnp.mean(jnp.take_along_axis(logp, labels[:, None], axis=1))

    args = _mlp_args(dtype, batch=17, features=6, hidden=23, classes=9)
    want_value, want = jax.value_and_grad(jloss, argnums=(0, 1, 2, 3))(*args)
    value, got = tilefuse.value_and_grad(mlp_loss, argnums=(0, 1, 2, 3))(*args)
    tol = dict(rtol=1e-10, atol=1e-12) if dtype == np.float64 else dict(rtol=2e-4, atol=2e-6)
    np.testing.assert_allclose(value, float(want_value), **tol)
    for a, b in zip(got, want):
        assert a.dtype == dtype and a.shape == b.shape
        assert np.abs(np.asarray(b)).max() > 1e-3   # the gradients are not all zero
        np.testing.assert_allclose(a, np.asarray(b), **tol)
