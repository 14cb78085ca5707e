"""Dynamic shapes through tilefuse.jit: explicit and automatic dynamic dims, the symbolic cache
key, per-size specialisations, guards on the symbols, the recompile limit."""

from __future__ import annotations

import logging

import numpy as np
import pytest

from tilefuse.dtypes import DType
from tilefuse.errors import GuardError, TraceError
from tilefuse.frontend import jit
from tilefuse.frontend.jit import RecompileLimitError
from tilefuse.testing import assert_close, random_array


def arr(seed: int, shape: tuple[int, ...]) -> np.ndarray:
    return random_array(np.random.default_rng(seed), shape, DType.f32)


W = arr(1, (16, 24))
B = arr(2, (24,))


def mlp(x):
    h = x @ W + B
    return np.maximum(h, 0.0) * np.tanh(h)


def rows(x):
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


@pytest.mark.parametrize("target", ["cpu", "reference"])
def test_explicit_dynamic_dim_compiles_once_for_every_size(target):
    f = jit(mlp, dynamic={"x": {0: "batch"}}, target=target)
    for seed, n in enumerate([1, 7, 513, 7, 2]):
        x = arr(seed + 10, (n, 16))
        assert_close(f(x), mlp(x), reduction=True)
    info = f.cache_info()
    assert (info.compiles, info.entries) == (1, 1)
    # cpu: one symbolic native build serves every size; reference: per-size specialisations
    # (1, 7, 513, 2: the second 7 is served again)
    assert info.specializations == (0 if target == "cpu" else 4)
    assert "f32[batch,16]" in str(f.lower(arr(0, (3, 16))).optimized)


def test_row_reductions_with_two_symbolic_dims():
    f = jit(rows, dynamic={"x": {0: "b", 1: "n"}})
    for seed, shape in enumerate([(1, 1), (3, 7), (2, 513)]):
        x = arr(seed, shape)
        assert_close(f(x), rows(x), reduction=True)
    assert f.cache_info().compiles == 1


def test_automatic_dynamic_after_the_second_size_keeps_compiles_at_two(caplog):
    caplog.set_level(logging.DEBUG, logger="tilefuse.recompiles")
    f = jit(mlp)
    sizes = np.random.default_rng(3).integers(1, 65, size=100)
    for i, n in enumerate(sizes):
        x = arr(i, (int(n), 16))
        out = f(x)
        if i % 17 == 0:
            assert_close(out, mlp(x), reduction=True)
    info = f.cache_info()
    assert info.compiles == 2, info
    messages = [r.getMessage() for r in caplog.records]
    assert any("x[0] changed size" in m and "dynamic from now on" in m for m in messages)


def test_automatic_dims_of_equal_sizes_share_a_symbol_and_a_broken_sharing_recompiles():
    def f(x, y):
        return x.sum(0) + y.sum(0)

    j = jit(f)
    for n in (4, 5):
        x, y = arr(n, (n, 3)), arr(n + 1, (n, 3))
        assert_close(j(x, y), f(x, y), reduction=True)
    assert "f32[x_0,3]" in str(j.lower(arr(0, (6, 3)), arr(1, (6, 3))).captured)
    x, y = arr(7, (6, 3)), arr(8, (9, 3))   # x_0 would be 6 and 9: a static entry of its own
    assert_close(j(x, y), f(x, y), reduction=True)
    assert j.cache_info().compiles == 3


def test_one_name_for_two_dims_is_a_guard():
    f = jit(lambda x, y: x.sum() + y.sum(), dynamic={"x": {0: "n"}, "y": {0: "n"}})
    assert_close(f(arr(0, (5,)), arr(1, (5,))), arr(0, (5,)).sum() + arr(1, (5,)).sum(),
                 reduction=True)
    with pytest.raises(GuardError, match=r"symbol n must be one size.*x\[0\] = 5.*y\[0\] = 6"):
        f(arr(0, (5,)), arr(1, (6,)))


def test_a_symbol_broadcast_against_n_must_be_1_or_n():
    y = arr(4, (5,))

    def f(x):
        return x + y

    j = jit(f, dynamic={"x": {0: "b"}})
    for n in (1, 5):
        x = arr(n, (n,))
        assert_close(j(x), f(x))
    with pytest.raises(GuardError, match="b=3 break a constraint"):
        j(arr(3, (3,)))


def test_recompile_limit_is_loud_and_names_the_fix(caplog):
    f = jit(mlp, dynamic=False, max_recompiles=2)
    for n in (1, 2, 3):
        f(arr(n, (n, 16)))
    with pytest.raises(RecompileLimitError) as err:
        f(arr(4, (4, 16)))
    message = str(err.value)
    assert "recompiled 2 times" in message and "max_recompiles=2" in message
    assert "x[0] (1, 2, 3, 4)" in message and "dynamic={'x': {0: 'x_0'}}" in message
    assert any(r.levelno == logging.WARNING and "max_recompiles" in r.getMessage()
               for r in caplog.records)


def test_dynamic_true_makes_the_leading_dims_one_batch_symbol():
    def f(x, m):
        return x * m

    j = jit(f, dynamic=True)
    for n in (2, 9):
        x, m = arr(n, (n, 4)), arr(n + 1, (n, 1))
        assert_close(j(x, m), f(x, m))
    assert j.cache_info().compiles == 1
    assert "f32[batch,4]" in str(j.lower(arr(0, (3, 4)), arr(1, (3, 1))).captured)


def test_a_dim_the_trace_cannot_take_symbolically_falls_back_to_static(caplog):
    def f(x):
        return x.reshape(x.shape[0] * 2, -1)   # arithmetic on a symbolic size

    j = jit(f, dynamic={"x": {0: "n"}})
    x = arr(0, (3, 4))
    assert_close(j(x), f(x))
    assert any("cannot compile with x[0] dynamic" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("spec", [{"x": {"0": "n"}}, {"x": {0: "not a name"}}, {"x": 0}, 3])
def test_bad_dynamic_specs_are_trace_errors(spec):
    with pytest.raises(TraceError):
        jit(mlp, dynamic=spec)


def test_guard_of_the_dynamic_executable_checks_static_dims_and_dtypes():
    f = jit(mlp, dynamic={"x": {0: "batch"}})
    f(arr(0, (3, 16)))
    exe = f.lower(arr(0, (3, 16))).executable
    assert_close(exe(arr(1, (6, 16)))[0], mlp(arr(1, (6, 16))), reduction=True)
    with pytest.raises(GuardError, match=r"must be a f32\[batch,16\] array"):
        exe(arr(1, (6, 15)))
    with pytest.raises(GuardError):
        exe(arr(1, (6, 16)).astype(np.float64))
    with pytest.raises(GuardError):
        exe()
