"""Generated code for whole kernels against the loop interpreter and NumPy, on random inputs of
odd sizes (vector width 16 with tails)."""

from __future__ import annotations

import numpy as np
import pytest
from loopkernels import matmul_4x32, relu_sigmoid, relu_sigmoid_reference, row_sum_max

from tilefuse.codegen import compile_kernel
from tilefuse.dtypes import DType
from tilefuse.loop import interpret, simplify
from tilefuse.testing import assert_close, random_array

F32 = DType.f32


@pytest.fixture(scope="module")
def relu_sigmoid_kernel():
    return compile_kernel(relu_sigmoid())


@pytest.mark.parametrize("n", [1, 7, 513, 4099])
@pytest.mark.parametrize("threads", [1, 2])
def test_relu_sigmoid_matches_numpy_and_interpreter(relu_sigmoid_kernel, n, threads):
    rng = np.random.default_rng(n)
    x = random_array(rng, (n,), F32, -6.0, 6.0)
    y = np.full(n, np.nan, np.float32)
    relu_sigmoid_kernel(x, y, n, num_threads=threads)
    assert_close(y, relu_sigmoid_reference(x))
    if n <= 513:
        y_interp = np.full(n, np.nan, np.float32)
        interpret(relu_sigmoid(), x, y_interp, n)
        assert_close(y, y_interp)


def test_relu_sigmoid_touches_only_its_range(relu_sigmoid_kernel):
    rng = np.random.default_rng(5)
    x = random_array(rng, (600,), F32)
    y = np.full(600, 7.0, np.float32)
    relu_sigmoid_kernel(x, y, 513)
    assert_close(y[:513], relu_sigmoid_reference(x[:513]))
    assert np.all(y[513:] == 7.0)


@pytest.mark.parametrize(("rows", "cols"), [(1, 1), (7, 7), (3, 513), (2, 4099)])
def test_row_sum_and_max(rows, cols):
    rng = np.random.default_rng(rows * 10007 + cols)
    x = random_array(rng, (rows, cols), F32)
    s, m = np.zeros(rows, np.float32), np.zeros(rows, np.float32)
    kernel = compile_kernel(row_sum_max())
    kernel(x, s, m, rows, cols, num_threads=2)
    assert_close(s, x.astype(np.float64).sum(axis=1).astype(np.float32), reduction=True)
    assert_close(m, x.max(axis=1))
    if cols <= 513:
        s_i, m_i = np.zeros(rows, np.float32), np.zeros(rows, np.float32)
        interpret(row_sum_max(), x, s_i, m_i, rows, cols)
        assert_close(s, s_i, reduction=True)
        assert_close(m, m_i)


def test_row_max_propagates_nan():
    rng = np.random.default_rng(3)
    x = random_array(rng, (2, 40), F32)
    x[0, 5] = np.nan  # in the vector part
    x[1, 37] = np.nan  # in the scalar tail
    s, m = np.zeros(2, np.float32), np.zeros(2, np.float32)
    compile_kernel(row_sum_max())(x, s, m, 2, 40)
    assert np.isnan(m).all() and np.isnan(s).all()


@pytest.mark.parametrize(("m", "n", "k"), [(4, 32, 1), (8, 64, 7), (12, 32, 513)])
def test_matmul_micro_kernel(m, n, k):
    rng = np.random.default_rng(m * 1000 + k)
    a = random_array(rng, (m, k), F32)
    b = random_array(rng, (k, n), F32)
    c = np.full((m, n), np.nan, np.float32)
    compile_kernel(matmul_4x32())(a, b, c, m, n, k, num_threads=2)
    assert_close(c, a @ b, reduction=True)
    if k <= 7:
        c_i = np.full((m, n), np.nan, np.float32)
        interpret(matmul_4x32(), a, b, c_i, m, n, k)
        assert_close(c, c_i, reduction=True)


def test_simplified_kernels_compute_the_same():
    rng = np.random.default_rng(11)
    x = random_array(rng, (3, 70), F32)
    for build in (row_sum_max,):
        fn, changed = simplify(build())
        assert changed
        s0, m0 = np.zeros(3, np.float32), np.zeros(3, np.float32)
        s1, m1 = np.zeros(3, np.float32), np.zeros(3, np.float32)
        compile_kernel(build())(x, s0, m0, 3, 70)
        compile_kernel(fn)(x, s1, m1, 3, 70)
        assert_close(s1, s0, reduction=True)
        assert_close(m1, m0)
