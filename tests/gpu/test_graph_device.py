"""On a GPU: CUDA graph replay and device arrays through ``tilefuse.jit(fn, target="cuda")``
(torch CUDA tensors and CuPy arrays in and out, NumPy in and out), against NumPy on fresh
inputs each call, poisoned outputs never seen. Skips where there is no GPU (CI); the same
paths on a fake driver: tests/gpu/test_cuda_graph.py."""

from __future__ import annotations

import numpy as np
import pytest

import tilefuse
from tilefuse.runtime.cuda_driver import cuda_available
from tilefuse.testing import assert_close

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.skipif(not (torch.cuda.is_available() and cuda_available()),
                                reason="no CUDA device here")


def lse_scaled(x: np.ndarray, w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    m = np.max(x, axis=-1, keepdims=True)
    lse = np.log(np.sum(np.exp(x - m), axis=-1)) + m[..., 0]
    return lse, np.tanh(x @ w)


@pytest.mark.parametrize("graphs", ["1", "0"])
def test_torch_tensors_stay_on_the_device(graphs: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TILEFUSE_CUDA_GRAPHS", graphs)
    jitted = tilefuse.jit(lse_scaled, target="cuda")
    rng = np.random.default_rng(0)
    for call in range(4):
        x = rng.standard_normal((33, 257)).astype(np.float32)
        w = rng.standard_normal((257, 65)).astype(np.float32)
        got = jitted(torch.from_numpy(x).cuda(), torch.from_numpy(w).cuda())
        assert all(isinstance(g, torch.Tensor) and g.is_cuda for g in got)
        for g, want in zip(got, lse_scaled(x, w), strict=True):
            assert_close(g.cpu().numpy(), want, reduction=True, msg=f"call {call}")
    host = jitted(x, w)
    assert all(type(h) is np.ndarray for h in host)
    assert_close(host[0], lse_scaled(x, w)[0], reduction=True)
    entry = next(iter(jitted._cache.values()))
    assert (entry.executable.graph_nodes is not None) == (graphs == "1")


def test_cupy_arrays_stay_on_the_device() -> None:
    cupy = pytest.importorskip("cupy")
    jitted = tilefuse.jit(lambda a, b: np.exp(a) * b + 1.0, target="cuda")
    rng = np.random.default_rng(1)
    for call in range(3):
        a, b = (rng.standard_normal((5, 1000)).astype(np.float32) for _ in range(2))
        got = jitted(cupy.asarray(a), cupy.asarray(b))
        assert isinstance(got, cupy.ndarray)
        assert_close(cupy.asnumpy(got), np.exp(a) * b + 1.0, msg=f"call {call}")


def test_half_precision_and_side_stream() -> None:
    jitted = tilefuse.jit(lambda a, b: (a * b).sum(axis=1), target="cuda")
    rng = np.random.default_rng(2)
    stream = torch.cuda.Stream()
    for call in range(3):
        a, b = (rng.standard_normal((64, 300)).astype(np.float16) for _ in range(2))
        with torch.cuda.stream(stream):
            ta, tb = torch.from_numpy(a).cuda(), torch.from_numpy(b).cuda()
            got = jitted(ta, tb)
        stream.synchronize()
        want = (a.astype(np.float32) * b.astype(np.float32)).sum(axis=1).astype(np.float16)
        assert got.dtype == torch.float16
        assert_close(got.cpu().numpy(), want, reduction=True, msg=f"call {call}")
