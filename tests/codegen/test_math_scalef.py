"""With AVX-512, the exp family scales by 2**n with one vscalef per 512-bit vector: the same
results as the two-step scaling of other targets (bit for bit where the result is normal, within
one subnormal step below), every special value kept, and the instruction really used."""

from __future__ import annotations

import numpy as np
import pytest
from loopkernels import one_op
from test_codegen_math import wide_inputs

from tilefuse.codegen import compile_kernel, host_target
from tilefuse.codegen.target import CpuTarget
from tilefuse.dtypes import DType
from tilefuse.loop import XOp

HOST = host_target()
pytestmark = pytest.mark.skipif(not HOST.has("avx512f"), reason="needs AVX-512")
AVX2 = CpuTarget(HOST.triple, "haswell", "+avx,+avx2,+fma,+f16c,+popcnt,+sse4.2")


@pytest.mark.parametrize("op", [XOp.EXP, XOp.EXPM1, XOp.TANH, XOp.SIGMOID])
@pytest.mark.parametrize("dtype", [DType.f32, DType.f64])
def test_vscalef_matches_the_two_step_scaling(op, dtype):
    lanes = 512 // (8 * dtype.itemsize)
    fn = one_op(op, dtype, lanes=lanes)
    fast, plain = compile_kernel(fn), compile_kernel(fn, target=AVX2)
    assert "vscalef" in fast.assembly() and "vscalef" not in plain.assembly()
    x = wide_inputs(dtype, seed=11)
    got, want = np.empty_like(x), np.empty_like(x)
    fast(x, got, x.size)
    plain(x, want, x.size)
    assert np.array_equal(np.isnan(got), np.isnan(want))
    tiny = np.finfo(dtype.np).tiny
    normal = ~np.isnan(want) & ~(np.abs(want) < tiny)
    np.testing.assert_array_equal(got[normal], want[normal])
    step = np.finfo(dtype.np).smallest_subnormal
    assert np.all(np.abs(got[~normal & ~np.isnan(want)] - want[~normal & ~np.isnan(want)])
                  <= step)
