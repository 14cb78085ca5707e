"""A kernel result that is only reshaped into a graph output is written into the output
buffer (``backend/cpu.py: output_reshapes``): no arena buffer and no copy step for it, and the
values are NumPy's (also when the result is read by another kernel too, or is a graph output
itself, which keeps its own buffer)."""

from __future__ import annotations

import numpy as np

import tilefuse
from tilefuse.runtime.launch import NativeStep

rng = np.random.default_rng(11)


def test_row_softmax_reshaped_into_the_output_has_no_copy() -> None:
    def f(x):
        z = x - x.max(axis=1, keepdims=True)
        e = np.exp(z)
        return (e / e.sum(axis=1, keepdims=True)).reshape(4, 33, 257)

    x = rng.normal(size=(132, 257)).astype(np.float32)
    jitted = tilefuse.jit(f)
    np.testing.assert_allclose(jitted(x), f(x), rtol=1e-5, atol=1e-7)
    executable = jitted.lower(x).executable
    assert all(isinstance(s, NativeStep) for s in executable.steps)
    # the softmax's [132, 257] result is the output's buffer: nothing of that size in the arena
    assert executable.memory_plan.arena_bytes < 132 * 257 * 4, executable.memory_plan.summary()
    for _ in range(2):   # a second call writes the reused output buffer again
        x = rng.normal(size=(132, 257)).astype(np.float32)
        np.testing.assert_allclose(jitted(x), f(x), rtol=1e-5, atol=1e-7)


def test_result_also_read_elsewhere_or_returned_stays_right() -> None:
    def f(a, b):
        p = np.tanh(a @ b)
        return p.reshape(6, 5, 16), p.sum(axis=0), p

    a = rng.normal(size=(30, 12)).astype(np.float32)
    b = rng.normal(size=(12, 16)).astype(np.float32)
    got = tilefuse.jit(f)(a, b)
    for g, w in zip(got, f(a, b), strict=True):
        assert g.shape == w.shape
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)
    assert not np.shares_memory(got[0], got[2])
