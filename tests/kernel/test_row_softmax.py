"""Softmax-shaped row groups (tilefuse/kernel/row_softmax.py): the max pass that ignores NaN
and the exp of non-positive arguments keep NumPy's results on rows holding NaN, +inf, -inf,
rows of only infinities and rows whose exps underflow, as the composite ops and written by
hand; and they are taken only where that is safe."""

from __future__ import annotations

import numpy as np
import pytest
from test_lower_elementwise import check_groups, plan_of
from test_lower_rows import composite_graph, count_op, row_loops

import tilefuse
from tilefuse.codegen import host_target
from tilefuse.dtypes import DType
from tilefuse.graph.parser import parse_graph
from tilefuse.kernel.fusion import KernelKind, form_kernels
from tilefuse.kernel.lower_rows import lower_rows
from tilefuse.kernel.schedule import default_schedule
from tilefuse.loop.ir import XOp
from tilefuse.passes.decompose import decompose_composites

NAN, INF = np.nan, np.inf


def special_rows(n: int, dtype: DType, seed: int) -> np.ndarray:
    """Rows of ``n``: plain ones and one per special case, in the vector body and the tail."""
    rng = np.random.default_rng(seed)
    rows = [rng.uniform(-3, 3, n) for _ in range(15)]
    edits = [(0, NAN), (n - 1, NAN), (n // 2, NAN), (0, INF), (n - 1, INF), (n // 2, -INF),
             (n - 1, -INF)]
    for row, (at, value) in zip(rows, edits):
        row[at] = value
    rows[7][:] = -INF                       # all -inf: NaN, as NumPy
    rows[8][:] = INF                        # all +inf: NaN
    rows[9][0], rows[9][-1] = INF, -INF      # inf - inf: NaN, -inf - inf: 0
    rows[10][0] = -80.0 if dtype is not DType.f16 else -60000.0   # exp underflows to 0
    if n > 17:                                # a NaN early in a lane, a larger value after it
        rows[11][1], rows[11][17] = NAN, 50.0
    rows[12][n // 3] = 1e30 if dtype is not DType.f16 else 60000.0
    return np.stack(rows).astype(dtype.np)


def numpy_softmax(x: np.ndarray, log: bool) -> np.ndarray:
    with np.errstate(all="ignore"):
        wide = x.astype(np.float64)
        d = wide - wide.max(axis=-1, keepdims=True)
        e = np.exp(d)
        s = e.sum(axis=-1, keepdims=True)
        return (d - np.log(s) if log else e / s).astype(x.dtype)


def same_nans_and_close(got: np.ndarray, want: np.ndarray) -> None:
    assert got.dtype == want.dtype
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    tol = {np.float16: 2e-3, np.float32: 2e-6, np.float64: 1e-13}[want.dtype.type]
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol)


@pytest.mark.parametrize("dtype", [DType.f32, DType.f64, DType.f16])
@pytest.mark.parametrize("n", [13, 77, 512, 513])
@pytest.mark.parametrize("op", ["softmax", "log_softmax"])
def test_composites_on_special_rows(op, n, dtype):
    graph = composite_graph(op, (15, n), dtype)
    plan = plan_of(graph)
    with np.errstate(all="ignore"):
        check_groups(plan.graph, plan.groups, [special_rows(n, dtype, n)], reduction=True)


def by_hand(x):
    e = np.exp(x - np.max(x, axis=-1, keepdims=True))
    return e / np.sum(e, axis=-1, keepdims=True)


def log_by_hand(x):
    m = np.max(x, axis=-1, keepdims=True)
    return x - m - np.log(np.sum(np.exp(x - m), axis=-1, keepdims=True))


@pytest.mark.parametrize("dtype", [DType.f32, DType.f64])
@pytest.mark.parametrize("n", [13, 512, 1000])
@pytest.mark.parametrize("fn", [by_hand, log_by_hand])
def test_written_by_hand_on_special_rows(fn, n, dtype):
    x = special_rows(n, dtype, n + 1)
    with np.errstate(all="ignore"):
        got = tilefuse.jit(fn)(x)
    same_nans_and_close(got, numpy_softmax(x, fn is log_by_hand))


def _row_kernel(fn, x: np.ndarray):
    [group] = form_kernels(decompose_composites(tilefuse.jit(fn).lower(x).optimized)[0]).groups
    assert group.kind is KernelKind.ROW_REDUCTION
    return lower_rows(group, default_schedule(group, host_target()))


@pytest.mark.parametrize("fn", [by_hand, log_by_hand])
def test_the_fast_forms_are_taken(fn):
    """The max pass accumulates with a select (one vmaxps), not the NaN-propagating max; the
    sum pass's exp is exp_nonpos."""
    kernel = _row_kernel(fn, np.zeros((4, 100), np.float32))
    passes, _ = row_loops(kernel)
    assert sum(count_op(p, XOp.EXP_NONPOS) for p in passes) >= 1
    assert not any(count_op(p, XOp.EXP) for p in passes)
    max_pass = [p for p in passes if count_op(p, XOp.SELECT) and not count_op(p, XOp.EXP_NONPOS)]
    assert max_pass and not any(count_op(p, XOp.MAX) for p in max_pass)


def test_a_max_that_is_returned_keeps_propagating_nan():
    """The row's max is an output: it must be NaN on rows with NaN, so no NaN-free pass; the
    exp of x - max is still exp_nonpos."""
    graph = parse_graph("""
    graph @m(%x: f32[15,77]) -> (f32[15,77], f32[15,1]) {
      %m = max(%x) {axes=[1], keepdims=true} : f32[15,1]
      %d = sub(%x, %m) : f32[15,77]
      %e = exp(%d) : f32[15,77]
      %s = sum(%e) {axes=[1], keepdims=true} : f32[15,1]
      %y = div(%e, %s) : f32[15,77]
      return %y, %m
    }""")
    plan = plan_of(graph)
    with np.errstate(all="ignore"):
        [fn] = check_groups(plan.graph, plan.groups, [special_rows(77, DType.f32, 3)],
                            reduction=True)
    passes, _ = row_loops(fn)
    assert any(count_op(p, XOp.MAX) for p in passes)
    assert any(count_op(p, XOp.EXP_NONPOS) for p in passes)


def test_an_exp_of_another_max_stays_exp():
    """exp(x - max(y)) may be positive: the full exp."""
    graph = parse_graph("""
    graph @o(%x: f32[6,40], %y: f32[6,40]) -> f32[6,40] {
      %m = max(%y) {axes=[1], keepdims=true} : f32[6,1]
      %d = sub(%x, %m) : f32[6,40]
      %e = exp(%d) : f32[6,40]
      %s = sum(%e) {axes=[1], keepdims=true} : f32[6,1]
      %z = div(%e, %s) : f32[6,40]
      return %z
    }""")
    plan = plan_of(graph)
    rng = np.random.default_rng(5)
    x, y = (rng.uniform(-3, 3, (6, 40)).astype(np.float32) for _ in range(2))
    [fn] = check_groups(plan.graph, plan.groups, [x + 4, y], reduction=True)
    assert count_op(fn.body, XOp.EXP) and not count_op(fn.body, XOp.EXP_NONPOS)


def test_the_nan_free_max_has_no_unordered_compares():
    """The max pass's accumulators and its horizontal reduction take vmaxps: no unordered
    compare (NumPy's NaN rule) on the row's critical path between the max and the exp pass."""
    from tilefuse.codegen import compile_kernel

    if not host_target().has("avx512f"):
        pytest.skip("needs AVX-512")
    asm = compile_kernel(_row_kernel(by_hand, np.zeros((4, 512), np.float32))).assembly()
    assert "vcmpunordps" not in asm
    assert "vscalefps" in asm and "vmaxps" in asm
