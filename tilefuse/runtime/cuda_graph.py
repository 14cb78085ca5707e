"""One CUDA graph per compiled specialisation: a call is a handful of driver calls.

A :class:`~tilefuse.runtime.gpu.CudaExecutable` launches ~200 steps for a transformer; from
Python each costs a few microseconds, so a call of a small model (or one decoding step) was
bound by the launches. After its first call (which runs step by step, so that lazy module
loading and cuBLAS's first-use work happen outside any capture), the executable records all
its steps once into a graph by stream capture (``cuStreamBeginCapture`` ... ``EndCapture`` on
a stream of its own, cuBLAS pointed at it) and instantiates it. From then on a call is:

1. wait for the previous replay (an event), so two calls on different streams never share
   the arena at once;
2. copy each input into the buffer the graph was captured with (host-to-device for NumPy,
   device-to-device for device arrays: the graph's kernels read fixed addresses);
3. ``cuGraphLaunch``;
4. copy each output out of the arena into a fresh array (the arena is reused by the next
   call), then record the event.

A caller that passes the same device buffers call after call (a benchmark loop, a decode loop
over static caches) skips step 2: once two consecutive calls name the same input pointers, a
second graph is captured reading them in place (``CudaExecutable.run_device``; at most
``MAX_BOUND_CAPTURES`` such captures per executable), replayed whenever those pointers come
again. The pointers are all that is compared: whatever data lives there at replay time is
read, as the copies would have read it.

All of it is asynchronous on the caller's stream except the NumPy path, which waits for its
results. A program with host steps is not captured (they need the host in the middle of the
call); it keeps the step-by-step launch path, logged on the ``fallback`` topic.
Set ``TILEFUSE_CUDA_GRAPHS=0`` to turn capture off (step-by-step launches, for debugging).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from tilefuse.runtime.cuda_driver import CudaContext, CudaError, DeviceBuffer, _call, _driver


def _raw_driver(driver: Any) -> Any:
    """The five calls of a device replay through ctypes on ``libcuda`` itself (about a
    microsecond each, several times cheaper than cuda-python's wrappers); None when the driver
    is not cuda-python's module (a test's fake) or libcuda does not load."""
    if type(driver).__name__ != "module":
        return None
    try:
        lib = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return None
    vp, u64 = ctypes.c_void_p, ctypes.c_uint64
    for name, args in (("cuCtxSetCurrent", [vp]),
                       ("cuStreamWaitEvent", [vp, vp, ctypes.c_uint]),
                       ("cuMemcpyDtoDAsync_v2", [u64, u64, ctypes.c_size_t, vp]),
                       ("cuGraphLaunch", [vp, vp]),
                       ("cuEventRecord", [vp, vp])):
        fn = getattr(lib, name)
        fn.argtypes, fn.restype = args, ctypes.c_int
    return lib


def _handle(value: Any) -> int:
    return int(value) if not isinstance(value, int) else value


def graphs_enabled() -> bool:
    """False when ``$TILEFUSE_CUDA_GRAPHS`` is ``0`` (step-by-step launches)."""
    return os.environ.get("TILEFUSE_CUDA_GRAPHS", "1") != "0"


class CudaGraph:
    """The launches ``record(stream)`` makes, captured once and instantiated; ``launch`` replays
    them all on any stream with one driver call."""

    def __init__(self, context: CudaContext, record: Callable[[Any], None]):
        driver = _driver()
        self.context = context
        self.stream = context.stream()
        mode = driver.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_THREAD_LOCAL
        with context:
            _call("cuStreamBeginCapture", self.stream, mode)
            try:
                record(self.stream)
            except BaseException:
                with contextlib.suppress(CudaError):
                    _call("cuStreamEndCapture", self.stream)
                raise
            graph = _call("cuStreamEndCapture", self.stream)
            try:
                self.nodes = int(_call("cuGraphGetNodes", graph, 0)[1])
                self.exec = _call("cuGraphInstantiate", graph, 0)
            finally:
                _call("cuGraphDestroy", graph)

    def __del__(self) -> None:
        try:
            with self.context:
                _call("cuGraphExecDestroy", self.exec)
                _call("cuStreamDestroy", self.stream)
        except Exception:  # interpreter shutdown, or capture failed before exec existed
            pass


class GraphReplay:
    """A captured program and the fixed buffers it reads and writes (the module docstring's
    per-call protocol). ``inputs`` and ``outputs`` are the device buffers of the graph's input
    and output values, in the graph's order."""

    def __init__(self, context: CudaContext, graph: CudaGraph,
                 inputs: Sequence[DeviceBuffer], outputs: Sequence[DeviceBuffer],
                 done: Any = None):
        driver = _driver()
        self.context = context
        self.graph = graph
        self._ins = [(b.ptr, b.nbytes) for b in inputs]
        self._outs = [(b.ptr, b.nbytes) for b in outputs]
        self._owns_done = done is None
        self._done = context.event() if done is None else done
        """Recorded after each replay and waited on before the next: replays sharing it (of
        one executable, over one arena) never overlap."""
        self._ok = driver.CUresult.CUDA_SUCCESS
        self._d = driver
        self._raw = _raw_driver(driver)
        if self._raw is not None:
            self._raw_handles = (_handle(context.context), _handle(self._done),
                                 _handle(graph.exec))

    def __del__(self) -> None:
        try:
            if self._owns_done:
                with self.context:
                    _call("cuEventDestroy", self._done)
        except Exception:  # interpreter shutdown: the driver may be gone already
            pass

    @property
    def done(self) -> Any:
        return self._done

    def _fail(self, name: str, result: Any) -> None:
        status = result[0] if isinstance(result, tuple) else result
        raise CudaError(f"CUDA {name} failed during a graph replay: "
                        f"{getattr(status, 'name', status)}")

    def run_device(self, inputs: Sequence[int], outputs: Sequence[int], stream: Any = 0
                   ) -> None:
        """One call on caller-owned device memory (pointers to C-contiguous buffers of the
        graph's types), queued on ``stream``; returns without waiting."""
        if self._raw is not None:
            self._run_raw(inputs, outputs, _handle(stream))
            return
        d, ok = self._d, self._ok
        r = d.cuCtxSetCurrent(self.context.context)
        if r[0] != ok:
            self._fail("cuCtxSetCurrent", r)
        r = d.cuStreamWaitEvent(stream, self._done, 0)
        if r[0] != ok:
            self._fail("cuStreamWaitEvent", r)
        for (dst, n), src in zip(self._ins, inputs):
            if n and src != dst:
                r = d.cuMemcpyDtoDAsync(dst, src, n, stream)
                if r[0] != ok:
                    self._fail("cuMemcpyDtoDAsync", r)
        r = d.cuGraphLaunch(self.graph.exec, stream)
        if r[0] != ok:
            self._fail("cuGraphLaunch", r)
        for (src, n), dst in zip(self._outs, outputs):
            if n:
                r = d.cuMemcpyDtoDAsync(dst, src, n, stream)
                if r[0] != ok:
                    self._fail("cuMemcpyDtoDAsync", r)
        r = d.cuEventRecord(self._done, stream)
        if r[0] != ok:
            self._fail("cuEventRecord", r)

    def _run_raw(self, inputs: Sequence[int], outputs: Sequence[int], stream: int) -> None:
        lib = self._raw
        ctx, done, exe = self._raw_handles
        status = lib.cuCtxSetCurrent(ctx) or lib.cuStreamWaitEvent(stream, done, 0)
        for (dst, n), src in zip(self._ins, inputs):
            if n and src != dst and not status:
                status = lib.cuMemcpyDtoDAsync_v2(dst, src, n, stream)
        status = status or lib.cuGraphLaunch(exe, stream)
        for (src, n), dst in zip(self._outs, outputs):
            if n and not status:
                status = lib.cuMemcpyDtoDAsync_v2(dst, src, n, stream)
        status = status or lib.cuEventRecord(done, stream)
        if status:
            self._fail("a replay call", status)

    def run_host(self, arrays: Sequence[np.ndarray], results: Sequence[np.ndarray]
                 ) -> None:
        """One call from C-contiguous NumPy ``arrays`` into C-contiguous ``results`` (the
        graph's output types) on the graph's own stream; waits for the results."""
        d, ok = self._d, self._ok
        stream = self.graph.stream
        with self.context:
            _call("cuStreamWaitEvent", stream, self._done, 0)
            for (dst, n), a in zip(self._ins, arrays):
                if n:
                    _call("cuMemcpyHtoDAsync", dst, a.ctypes.data, n, stream)
            r = d.cuGraphLaunch(self.graph.exec, stream)
            if r[0] != ok:
                self._fail("cuGraphLaunch", r)
            for (src, n), out in zip(self._outs, results):
                if n:
                    _call("cuMemcpyDtoHAsync", out.ctypes.data, src, n, stream)
            _call("cuEventRecord", self._done, stream)
            _call("cuStreamSynchronize", stream)


__all__ = ["CudaGraph", "GraphReplay", "graphs_enabled"]
