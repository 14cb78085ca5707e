"""``exp_nonpos``: the exp of softmax's ``x - max`` (arguments <= 0 or NaN), without an
overflow path or a NaN select (tilefuse/codegen/math_lib.py). Accuracy over the whole
non-positive range in 16-lane f32 (the vscalef form), 8 lanes and f64 (the full exp), and the
special values softmax rows produce."""

from __future__ import annotations

import numpy as np
import pytest
from loopkernels import one_op
from test_codegen_math import reference, ulp_error, wide_inputs

from tilefuse.codegen import compile_kernel
from tilefuse.codegen.target import host_target
from tilefuse.dtypes import DType
from tilefuse.loop import XOp


def run(dtype: DType, lanes: int, x: np.ndarray) -> np.ndarray:
    y = np.empty_like(x)
    compile_kernel(one_op(XOp.EXP_NONPOS, dtype, lanes=lanes))(x, y, x.size)
    return y


@pytest.mark.parametrize(("dtype", "lanes", "near", "far"),
                         [(DType.f32, 16, 1.5, 5), (DType.f32, 8, 1.5, 5),
                          (DType.f32, 4, 1.5, 5), (DType.f64, 8, 2, 2)])
def test_ulp_error_over_the_non_positive_range(dtype, lanes, near, far):
    """f32 (vscalef form): ``near`` ulp for x >= -20, ``far`` below (the one-constant ln2
    reduction's error grows with |n|; there exp(x) < 2e-9, nothing next to a row's max)."""
    x = wide_inputs(dtype, seed=28)
    x = -np.abs(x[~np.isnan(x)])
    x = np.concatenate([x, -np.random.default_rng(1).uniform(0, 110, 50_000).astype(x.dtype),
                        -np.random.default_rng(2).uniform(0, 20, 50_000).astype(x.dtype)])
    err = ulp_error(run(dtype, lanes, x), reference(XOp.EXP, dtype, x))
    for part, bound in ((x >= -20, near), (x < -20, far)):
        worst = int(np.argmax(np.where(part, err, -1)))
        assert err[worst] <= bound, f"{dtype}x{lanes}: {err[worst]} ulp at x={x[worst]!r}"


def test_exp_of_zero_is_one():
    """A row's max gives exp(0): exactly 1 at every width (softmax of one element is 1)."""
    for lanes in (16, 8, 4):   # and the 1-lane tail: 33 elements
        x = np.array([0.0, -0.0] * 16 + [0.0], np.float32)
        assert (run(DType.f32, lanes, x) == 1.0).all()


@pytest.mark.parametrize(("dtype", "lanes"),
                         [(DType.f32, 16), (DType.f32, 8), (DType.f32, 4), (DType.f64, 8)])
def test_special_values(dtype, lanes):
    cases = [(-np.inf, 0.0), (np.nan, np.nan), (-0.0, 1.0), (0.0, 1.0), (-800.0, 0.0),
             (-104.0, float(np.exp(np.float64(-104.0)).astype(dtype.np)))]
    x = np.array([c[0] for c in cases] * 7, dtype.np)   # vector lanes and the scalar tail
    want = np.array([c[1] for c in cases] * 7, dtype.np)
    got = run(dtype, lanes, x)
    same = (got == want) | (np.isnan(got) & np.isnan(want))
    assert same.all(), f"x={x[~same]} got {got[~same]} want {want[~same]}"


@pytest.mark.parametrize(("lanes", "register"), [(16, "zmm"), (8, "ymm")])
def test_the_avx512_form_has_no_compare_or_blend(lanes, register):
    """f32 on AVX-512 (VL for 8 lanes): a vmaxps clamp (NaN passes), no unordered compare, one
    vscalef."""
    if not (host_target().has("avx512f") and host_target().has("avx512vl")):
        pytest.skip("needs AVX-512 with VL")
    asm = compile_kernel(one_op(XOp.EXP_NONPOS, DType.f32, lanes=lanes)).assembly()
    lines = [line for line in asm.splitlines() if register in line]
    start = next(i for i, line in enumerate(lines) if "vmaxps" in line)
    end = next(i for i, line in enumerate(lines) if "vscalefps" in line)
    body = lines[start:end + 1]   # one exp of the vector loop (LLVM may vectorise the tail too)
    assert len(body) <= 14, "\n".join(body)
    assert not any("vcmp" in line or "vblendm" in line for line in body), "\n".join(body)
