"""Warp reductions of 64-bit values (i64 counts such as a loss's token count, f64 sums) build
for the GPU without a host step: each shuffle moves the value as two 32-bit halves. Without a
GPU: zero host steps, the simulated program matches NumPy, ptxas accepts the PTX; on one: the
compiled kernels match NumPy."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

import tilefuse
from tilefuse.runtime.cuda_driver import cuda_available
from tilefuse.runtime.gpu_cross import assemble, cross_compile
from tilefuse.runtime.gpu_simulate import simulate

RNG = np.random.default_rng(64)
CASES = {
    "i64_count": (lambda x: (x != -100).sum(), RNG.integers(-100, 3, (8, 515))),
    "i64_row_max": (lambda x: x.max(axis=1), RNG.integers(-10**12, 10**12, (7, 4099))),
    "f64_row_sum": (lambda x: x.sum(axis=1), RNG.standard_normal((9, 4097))),
    "f64_min": (lambda x: x.min(), RNG.standard_normal((33, 65))),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_cross_compiled_64_bit_warp_reductions(name):
    fn, x = CASES[name]
    built = cross_compile(tilefuse.jit(fn).lower(x).captured)
    assert not built.host_steps
    np.testing.assert_allclose(simulate(built.program, [x])[0], fn(x), rtol=1e-12)
    if shutil.which("ptxas"):
        for ptx in built.ptx().values():
            assemble(ptx)


@pytest.mark.skipif(not cuda_available(), reason="no CUDA device here")
@pytest.mark.parametrize("name", sorted(CASES))
def test_64_bit_warp_reductions_on_the_device(name):
    fn, x = CASES[name]
    got = tilefuse.jit(fn, target="cuda")(x)
    np.testing.assert_allclose(got, fn(x), rtol=1e-12)
