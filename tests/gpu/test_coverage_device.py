"""On a GPU: the kinds tests/cross/test_gpu_coverage_more.py cross-compiles (scatters, integer
products, var, pools of inputs, grouped convolutions with a run-time weight) run by
CudaExecutable against the reference, twice (the second call replays the CUDA graph), bit-exact
where the lowering is (scatters keep the update order; integer arithmetic); ONNX ConvInteger on
the cuda target exact against NumPy's int32 sums. Skips where there is no GPU (CI)."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from tilefuse.runtime.cuda_driver import cuda_available
from tilefuse.testing import assert_close

pytestmark = pytest.mark.skipif(not cuda_available(), reason="no CUDA device here")

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "cross"))
import test_gpu_coverage_more as more  # noqa: E402


@pytest.mark.parametrize("name", more.GRAPHS)
def test_kind_on_the_device(name: str) -> None:
    from tilefuse.graph.interpreter import interpret
    from tilefuse.runtime.gpu import HostGroup, build_cuda

    make, exact = more.GRAPHS[name]
    graph = make()
    executable = build_cuda(graph)
    assert not [s for s in executable.program.steps if isinstance(s, HostGroup)]
    for seed in (0, 1):
        arrays = more._inputs(graph, seed)
        want = interpret(graph, *arrays)
        for _ in range(2):
            for got, w in zip(executable(*arrays), want, strict=True):
                if exact:
                    np.testing.assert_array_equal(np.asarray(got), np.asarray(w), err_msg=name)
                else:
                    assert_close(np.asarray(got), np.asarray(w), reduction=True, msg=name)


def test_conv_integer_on_the_device() -> None:
    pytest.importorskip("onnx")
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "onnx"))
    import test_conv_integer as ci

    import tilefuse.onnx

    for case in range(len(ci.CASES)):
        x_dtype, cin, cout, k, pads, strides, dilations, xz, w_dtype, wz_kind = ci.CASES[case]
        w, wz = ci._weight(w_dtype, cout, cin, k, wz_kind)
        shape = (2, cin, 11, 9)
        model = ci.conv_integer(x_dtype, w, xz, wz, shape, pads=pads, strides=strides,
                                dilations=dilations)
        compiled = tilefuse.onnx.load(model, target="cuda")
        x = ci._codes(x_dtype, shape)
        want = ci.reference(x, w, xz or 0, 0 if wz is None else wz, pads, strides, dilations)
        np.testing.assert_array_equal(np.asarray(compiled(x)), want)
