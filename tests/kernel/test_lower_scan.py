"""cumsum and cumprod (ops/scan.py) run natively (kernel/lower_scan.py) along any axis, negative
axes too, in f32, f64, f16, i32, i64 and bool, on odd shapes, against the reference and NumPy;
np.cumsum / np.cumprod trace to them (axis None scans the flattened array)."""

from __future__ import annotations

import numpy as np
import pytest

from tilefuse.dtypes import DType
from tilefuse.graph.builder import GraphBuilder
from tilefuse.graph.interpreter import interpret
from tilefuse.runtime.native import NativeExecutable
from tilefuse.testing import assert_close, random_array


@pytest.mark.parametrize("dtype", [DType.f32, DType.f64, DType.f16, DType.i32, DType.i64,
                                   DType.bool])
@pytest.mark.parametrize("op", ["cumsum", "cumprod"])
@pytest.mark.parametrize("shape,axis", [((13, 6), 0), ((13, 6), -1), ((4, 37, 5), 1),
                                        ((300, 70), 0), ((1,), 0), ((5, 0, 3), 1)])
def test_scans(op, dtype, shape, axis):
    rng = np.random.default_rng()
    b = GraphBuilder(op)
    x = b.input((shape, dtype), "x")
    graph = b.build([b.add1(op, [x], {"axis": axis})])
    exe = NativeExecutable(graph)
    assert exe.fallbacks == []
    low, high = (0.8, 1.2) if op == "cumprod" else (-2.0, 2.0)
    xv = random_array(rng, shape, dtype, low, high)
    (want,) = interpret(graph, xv)
    assert_close(exe(xv)[0], want, reduction=True)
    if dtype in (DType.f32, DType.f64, DType.i64):  # NumPy's own order: exact
        np.testing.assert_array_equal(exe(xv)[0], getattr(np, op)(xv, axis=axis))


def test_np_cumsum_traces_and_runs_natively():
    import tilefuse

    def f(x):
        return np.cumsum(np.exp(x), axis=1) + np.cumprod(x)[-1]

    x = np.random.default_rng().uniform(0.5, 1.5, (9, 33)).astype(np.float32)
    g = tilefuse.jit(f)
    np.testing.assert_allclose(g(x), f(x), rtol=1e-5)
    exe = g.lower(x).executable
    assert exe is not None and exe.fallbacks == []
