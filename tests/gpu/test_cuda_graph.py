"""CUDA graph replay and device arrays at the call boundary, on a fake driver (no GPU needed):
kernels really run (loop-IR interpreter) on host memory standing in for device memory, so the
captured graph's buffers, the copies into them and the fresh outputs are checked by value.
The same paths on a real GPU: tests/gpu/test_graph_device.py."""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import tilefuse
from tilefuse.backend import cuda as cuda_backend
from tilefuse.dtypes import DType
from tilefuse.errors import GuardError
from tilefuse.graph.builder import GraphBuilder
from tilefuse.graph.interpreter import interpret
from tilefuse.graph.ir import Graph, Value
from tilefuse.runtime import cuda_driver, cuda_graph, device_arrays, gpu
from tilefuse.testing import assert_close

sys.path.insert(0, str(Path(__file__).resolve().parent))
from fake_driver import FakeDriver

F32 = DType.f32


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> FakeDriver:
    driver = FakeDriver()
    monkeypatch.setattr(cuda_driver, "_driver", lambda: driver)
    monkeypatch.setattr(cuda_graph, "_driver", lambda: driver)
    monkeypatch.setattr(cuda_driver, "cuda_available", lambda: True)
    real = cuda_backend.compile_group

    def registering(group: Any, target: Any) -> Any:
        step = real(group, target)
        driver.kernels[step.fn.name] = step
        return step

    monkeypatch.setattr(cuda_backend, "compile_group", registering)
    monkeypatch.delenv("TILEFUSE_CUDA_GRAPHS", raising=False)
    return driver


def two_kernels(m: int, n: int) -> Graph:
    """Row sums of exp(tanh(x) * y) (a reduction after an elementwise op), and x + 1."""
    b = GraphBuilder("two")
    x = b.input(((m, n), F32), "x")
    y = b.input(((m, n), F32), "y")
    t = b.add1("mul", [b.add1("tanh", [x]), y])
    lse = b.add1("sum", [b.add1("exp", [t])], {"axes": [1]})
    one = b.add1("constant", [], {"value": np.array(1, np.float32)})
    return b.build([lse, b.add1("add", [x, one])])


def _inputs(graph: Graph, seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(v.shape).astype(v.dtype.np) for v in graph.inputs]


def test_numpy_calls_replay_one_graph(fake: FakeDriver) -> None:
    graph = two_kernels(5, 37)
    ex = gpu.build_cuda(graph)
    launches = sum(isinstance(s, gpu.GpuKernel) for s in ex.program.steps)
    assert launches >= 2
    results = []
    for seed in range(3):   # call 1 step by step (then captured), calls 2 and 3 replayed
        arrays = _inputs(graph, seed)
        got = ex(*arrays)
        for g, w in zip(got, interpret(graph, *arrays), strict=True):
            assert_close(g, np.asarray(w), reduction=True, msg=f"call {seed}")
        results.append(got)
    assert ex.graph_nodes == launches
    assert fake.calls["cuGraphLaunch"] == 2
    assert fake.calls["cuLaunchKernel"] == 2 * launches   # first call + the capture
    assert results[1][0] is not results[2][0]             # fresh outputs each call
    assert not np.array_equal(results[1][0], results[2][0])


def test_device_pointers_replay(fake: FakeDriver) -> None:
    graph = two_kernels(3, 130)
    ex = gpu.build_cuda(graph)
    for seed in range(3):
        arrays = _inputs(graph, seed)
        outs = [np.full(v.shape, np.nan, v.dtype.np) for v in graph.outputs]   # poisoned
        ex.run_device([a.ctypes.data for a in arrays], [o.ctypes.data for o in outs])
        for g, w in zip(outs, interpret(graph, *arrays), strict=True):
            assert_close(g, np.asarray(w), reduction=True, msg=f"call {seed}")
    assert fake.calls["cuGraphLaunch"] == 2
    assert fake.calls["cuMemcpyDtoDAsync"] == 2 * (2 + 2)   # 2 inputs in, 2 outputs out


def test_capture_can_be_turned_off(fake: FakeDriver, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TILEFUSE_CUDA_GRAPHS", "0")
    graph = two_kernels(4, 9)
    ex = gpu.build_cuda(graph)
    for seed in range(2):
        arrays = _inputs(graph, seed)
        assert_close(ex(*arrays)[0], np.asarray(interpret(graph, *arrays)[0]), reduction=True)
    assert ex.graph_nodes is None and fake.calls["cuGraphLaunch"] == 0


class FakeDeviceArray:
    """A "CUDA" array of a library tilefuse reads through a registered kind (host memory)."""

    def __init__(self, array: np.ndarray):
        self.array = array
        self.shape = array.shape
        self.dtype = array.dtype

    def __dlpack_device__(self) -> tuple[int, int]:
        return (2, 0)


class FakeKind:
    name = "fake"

    def __init__(self) -> None:
        self.streams = 0

    def check(self, a: FakeDeviceArray, v: Value) -> str | None:
        if a.shape != v.shape or a.dtype != v.dtype.np:
            return f"is {a.dtype}{list(a.shape)}, the compiled graph takes {v.type}"
        return None

    def pointer(self, a: FakeDeviceArray) -> int:
        return a.array.ctypes.data

    def empty(self, v: Value) -> FakeDeviceArray:
        return FakeDeviceArray(np.full(v.shape, np.nan, v.dtype.np))

    def stream(self) -> int:
        self.streams += 1
        return 0


@pytest.fixture
def fake_kind(monkeypatch: pytest.MonkeyPatch) -> FakeKind:
    kind = FakeKind()
    monkeypatch.setitem(device_arrays._KINDS, FakeDeviceArray.__module__.split(".")[0], kind)
    return kind


def test_jit_device_arrays_stay_on_the_device(fake: FakeDriver, fake_kind: FakeKind) -> None:
    def f(x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return np.log(np.exp(x) + y * y), (x * 2.0).sum(axis=0)

    jitted = tilefuse.jit(f, target="cuda")
    rng = np.random.default_rng(1)
    for call in range(3):
        x, y = (rng.standard_normal((7, 33)).astype(np.float32) for _ in range(2))
        got = jitted(FakeDeviceArray(x), FakeDeviceArray(y))
        assert all(isinstance(g, FakeDeviceArray) for g in got), call
        for g, w in zip(got, f(x, y), strict=True):
            assert_close(g.array, w, reduction=True, msg=f"call {call}")
    by_name = jitted(FakeDeviceArray(x), y=FakeDeviceArray(y))   # a keyword argument
    assert_close(by_name[0].array, f(x, y)[0], reduction=True)
    host = jitted(x, y)   # NumPy in, NumPy out: the same compiled entry
    assert all(type(h) is np.ndarray for h in host)
    assert_close(host[0], f(x, y)[0])
    # replays: calls 2 and 3 and the NumPy call (the keyword entry ran its first call only)
    assert fake_kind.streams == 4 and fake.calls["cuGraphLaunch"] == 3
    assert len(jitted._cache) == 2   # positional and keyword y are two keys; NumPy shares one


def test_device_array_errors(fake: FakeDriver, fake_kind: FakeKind) -> None:
    jitted = tilefuse.jit(lambda x, y: x + y, target="cuda")
    a = FakeDeviceArray(np.ones((4, 4), np.float32))
    with pytest.raises(GuardError, match="all device arrays or all NumPy"):
        jitted(a, np.ones((4, 4), np.float32))
    ex = gpu.build_cuda(two_kernels(2, 3))
    with pytest.raises(GuardError, match="takes f32"):
        ex.run_arrays([FakeDeviceArray(np.ones((2, 4), np.float32))] * 2)


class OtherCudaArray(FakeDeviceArray):
    pass


def test_unknown_library_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    OtherCudaArray.__module__ = "jaxlike.core"
    with pytest.raises(GuardError, match=r"torch\.from_dlpack"):
        device_arrays._kind_of(OtherCudaArray(np.ones(2, np.float32)))


def test_numpy_and_cpu_tensors_are_not_device_arrays() -> None:
    assert not device_arrays.is_device_array(np.ones(3))
    torch = pytest.importorskip("torch")
    assert not device_arrays.is_device_array(torch.ones(3))
    assert device_arrays.is_device_array(FakeDeviceArray(np.ones(3)))


def test_host_steps_are_not_captured(fake: FakeDriver, caplog: pytest.LogCaptureFixture,
                                     monkeypatch: pytest.MonkeyPatch) -> None:
    graph = two_kernels(3, 5)
    program = cuda_backend.build_gpu_program(graph)
    first = program.steps[0]
    program.steps[0] = gpu.HostGroup(first.group, "forced by the test")
    with caplog.at_level(logging.WARNING, logger="tilefuse.fallback"):
        ex = gpu.CudaExecutable(program)
    assert any("not replayed as a CUDA graph" in r.getMessage() for r in caplog.records)
    for seed in range(2):
        arrays = _inputs(graph, seed)
        for g, w in zip(ex(*arrays), interpret(graph, *arrays), strict=True):
            assert_close(g, np.asarray(w), reduction=True)
    assert fake.calls["cuGraphLaunch"] == 0


def test_the_same_buffers_replay_without_copies(fake: FakeDriver) -> None:
    """Calls naming the same input pointers twice in a row get a graph reading them in place
    (no copies in); new data in those buffers is read, other buffers go through the copying
    replay, and the in-place graph is taken again when its pointers come back."""
    graph = two_kernels(3, 70)
    ex = gpu.build_cuda(graph)
    fixed = _inputs(graph, 0)

    def call(arrays: list[np.ndarray], msg: str) -> None:
        outs = [np.full(v.shape, np.nan, v.dtype.np) for v in graph.outputs]   # poisoned
        ex.run_device([a.ctypes.data for a in arrays], [o.ctypes.data for o in outs])
        for g, w in zip(outs, interpret(graph, *arrays), strict=True):
            assert_close(g, np.asarray(w), reduction=True, msg=msg)

    call(fixed, "step by step")        # then captured with its own buffers
    call(fixed, "copying replay")      # the same pointers twice: captured in place now
    copies = fake.calls["cuMemcpyDtoDAsync"]
    assert copies == 2 + 2   # 2 inputs in and 2 outputs out, once
    for seed in (1, 2):   # new data in the same buffers
        for a, b in zip(fixed, _inputs(graph, seed), strict=True):
            a[...] = b
        call(fixed, f"in place {seed}")
    assert fake.calls["cuMemcpyDtoDAsync"] == copies + 2 * 2   # outputs out only
    other = _inputs(graph, 3)
    call(other, "other buffers")
    assert fake.calls["cuMemcpyDtoDAsync"] == copies + 2 * 2 + 4
    call(fixed, "back in place")
    assert fake.calls["cuMemcpyDtoDAsync"] == copies + 2 * 2 + 4 + 2
