"""NaN and Inf propagate as in NumPy through the native kernels (max, min, relu, clip,
softmax with NaN, -inf masks in softmax), and results are bit-identical run to run (two
processes): threads split only independent outputs (rows, N panels, M blocks, elementwise
chunks), never a reduction, so no deterministic mode is needed for a fixed schedule."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from tilefuse.codegen.target import host_target
from tilefuse.dtypes import DType
from tilefuse.graph.builder import GraphBuilder
from tilefuse.graph.interpreter import interpret
from tilefuse.graph.types import TensorType
from tilefuse.passes import GRAPH_PIPELINE, run_pipeline
from tilefuse.runtime.kernel_cache import KernelCache
from tilefuse.runtime.native import NativeExecutable
from tilefuse.testing import assert_close

CASES = [("relu", {}, 1), ("maximum", {}, 2), ("minimum", {}, 2), ("max", {"axes": (-1,)}, 1),
         ("min", {"axes": (-1,)}, 1), ("max", {"axes": None}, 1), ("softmax", {}, 1),
         ("log_softmax", {}, 1), ("clip", {"min": -1.0, "max": 1.0}, 1),
         ("sum", {"axes": (-1,)}, 1), ("sign", {}, 1), ("gelu", {}, 1), ("tanh", {}, 1)]


def _native(op: str, attrs: dict, arity: int, shape: tuple[int, ...], dtype: DType):
    b = GraphBuilder("nan")
    xs = [b.input(TensorType(shape, dtype), f"x{i}") for i in range(arity)]
    graph, _ = run_pipeline(b.build([b.add1(op, xs, attrs)]), GRAPH_PIPELINE)
    target = host_target()
    return graph, NativeExecutable(graph, target=target, cache=KernelCache(None, target))


def _specials(x: np.ndarray, kind: str) -> None:
    if kind == "nan":
        x.flat[min(3, x.size - 1)] = np.nan
        x[-1, :] = np.nan
    else:   # -inf masks: a fully masked row, a row masked but for one, and +inf
        x[0, :] = -np.inf
        x[-1, 1:] = -np.inf
        x.flat[-1] = np.inf if x.shape[1] > 1 else x.flat[-1]


@pytest.mark.parametrize("dtype", [DType.f32, DType.f64])
@pytest.mark.parametrize("shape", [(5, 7), (3, 513), (1, 1)])
@pytest.mark.parametrize("kind", ["nan", "inf"])
def test_nan_inf_propagate_like_numpy(dtype: DType, shape: tuple[int, int], kind: str) -> None:
    rng = np.random.default_rng(7)
    for op, attrs, arity in CASES:
        graph, executable = _native(op, attrs, arity, shape, dtype)
        args = [rng.uniform(-2, 2, shape).astype(dtype.np) for _ in range(arity)]
        _specials(args[0], kind)
        with np.errstate(all="ignore"):
            expected = interpret(graph, *args)[0]
        assert_close(executable(*args)[0], expected, reduction=True, msg=f"{op} {kind}")


def test_nan_semantics_spelled_out() -> None:
    """The NumPy rules themselves, not just agreement with the reference."""
    _, ex = _native("maximum", {}, 2, (1, 4), DType.f32)
    a = np.array([[np.nan, 1.0, -np.inf, 2.0]], np.float32)
    b = np.array([[0.0, np.nan, 3.0, -1.0]], np.float32)
    assert np.array_equal(ex(a, b)[0], [[np.nan, np.nan, 3.0, 2.0]], equal_nan=True)
    _, relu = _native("relu", {}, 1, (1, 3), DType.f32)
    assert np.array_equal(relu(np.array([[np.nan, -1.0, 2.0]], np.float32))[0],
                          [[np.nan, 0.0, 2.0]], equal_nan=True)
    _, softmax = _native("softmax", {}, 1, (2, 3), DType.f32)
    out = softmax(np.array([[0.0, -np.inf, 0.0], [np.nan, 1.0, 2.0]], np.float32))[0]
    assert np.array_equal(out, [[0.5, 0.0, 0.5], [np.nan] * 3], equal_nan=True)


_DETERMINISM_CHILD = """
import hashlib, numpy as np
from tilefuse.codegen.target import host_target
from tilefuse.dtypes import DType
from tilefuse.graph.builder import GraphBuilder
from tilefuse.graph.types import TensorType
from tilefuse.passes import GRAPH_PIPELINE, run_pipeline
from tilefuse.runtime.kernel_cache import KernelCache
from tilefuse.runtime.native import NativeExecutable
b = GraphBuilder("det")
x = b.input(TensorType((257, 384), DType.f32), "x")
w = b.input(TensorType((384, 513), DType.f32), "w")
g = b.input(TensorType((513,), DType.f32), "g")
h = b.add1("matmul", [x, w])
outs = [b.add1("layer_norm", [h, g, g]), b.add1("softmax", [h]), b.add1("sum", [h]),
        b.add1("sum", [x], {"axes": (0,)})]
graph, _ = run_pipeline(b.build(outs), GRAPH_PIPELINE)
t = host_target()
ex = NativeExecutable(graph, target=t, cache=KernelCache(None, t))
rng = np.random.default_rng(0)
args = [rng.uniform(-1, 1, s).astype(np.float32) for s in ((257, 384), (384, 513), (513,))]
digest = hashlib.sha256()
for _ in range(3):
    for out in ex(*args):
        digest.update(out.tobytes())
print(digest.hexdigest())
"""


def test_bit_identical_across_processes() -> None:
    env_runs = [{"OMP_NUM_THREADS": "2"}, {"OMP_NUM_THREADS": "1"}, {}]
    digests = set()
    for extra in env_runs:
        import os
        env = {**os.environ, **extra, "TILEFUSE_CACHE": "0"}
        run = subprocess.run([sys.executable, "-c", _DETERMINISM_CHILD], capture_output=True,
                             text=True, timeout=300, env=env)
        assert run.returncode == 0, run.stderr[-2000:]
        digests.add(run.stdout.strip())
    assert len(digests) == 1, digests
