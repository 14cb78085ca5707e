"""A CUDA driver stand-in for machines without a GPU (CI): enough of ``cuda.bindings.driver``
for :class:`~tilefuse.runtime.gpu.CudaExecutable`, CUDA graph capture and replay, and the
device-array call path, with host memory as "device" memory (a pointer is a host address).

Generated kernels really run, through the loop-IR interpreter, on the buffers their launch
parameters point at; stream capture records launches and copies instead of running them and
``cuGraphLaunch`` replays the record. So a wrong binding, a missing copy into the captured
buffers or a stale output shows up as a wrong number. cuBLAS and fused attention are not
modelled: tests give it graphs of generated kernels only.
"""

from __future__ import annotations

import ctypes
import enum
from collections import Counter
from types import SimpleNamespace
from typing import Any

import numpy as np

from tilefuse.loop import interp as loop_interp


class CUresult(enum.IntEnum):
    CUDA_SUCCESS = 0
    CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED = 900


class FakeDriver:
    """The driver module's functions used by tilefuse (each returns ``(status, *values)``)."""

    CUresult = CUresult
    CUdevice_attribute = SimpleNamespace(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR=75,
                                         CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR=76,
                                         CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT=16)
    CUstream_flags = SimpleNamespace(CU_STREAM_NON_BLOCKING=1)
    CUevent_flags = SimpleNamespace(CU_EVENT_DISABLE_TIMING=2)
    CUstreamCaptureMode = SimpleNamespace(CU_STREAM_CAPTURE_MODE_THREAD_LOCAL=1)

    def __init__(self) -> None:
        self.memory: dict[int, np.ndarray] = {}
        self.kernels: dict[str, Any] = {}     # function name -> GpuKernel (registered by tests)
        self.calls: Counter[str] = Counter()
        self.capturing: int | None = None
        self.record: list[tuple[Any, ...]] = []
        self.graphs: dict[int, list[tuple[Any, ...]]] = {}
        self._next = 100

    def _handle(self) -> int:
        self._next += 1
        return self._next

    def __getattr__(self, name: str) -> Any:
        raise AttributeError(f"the fake CUDA driver has no {name}")

    # -- device, context
    def cuGetErrorString(self, status: Any) -> tuple[int, bytes]:
        return 0, b"fake error"

    def cuInit(self, flags: int) -> tuple[int]:
        return (0,)

    def cuDeviceGetCount(self) -> tuple[int, int]:
        return 0, 1

    def cuDeviceGet(self, ordinal: int) -> tuple[int, int]:
        return 0, ordinal

    def cuDevicePrimaryCtxRetain(self, device: int) -> tuple[int, int]:
        return 0, 1

    def cuDeviceGetAttribute(self, attr: int, device: int) -> tuple[int, int]:
        return 0, {75: 9, 76: 0, 16: 132}[attr]

    def cuDeviceGetName(self, n: int, device: int) -> tuple[int, bytes]:
        return 0, b"Fake H200\0"

    def cuCtxSetCurrent(self, ctx: Any) -> tuple[int]:
        self.calls["cuCtxSetCurrent"] += 1
        return (0,)

    def cuCtxSynchronize(self) -> tuple[int]:
        return (0,)

    # -- memory
    def cuMemAlloc(self, n: int) -> tuple[int, int]:
        buf = np.zeros(n, np.uint8)
        ptr = buf.ctypes.data
        self.memory[ptr] = buf
        return 0, ptr

    def cuMemFree(self, ptr: int) -> tuple[int]:
        self.memory.pop(int(ptr), None)
        return (0,)

    def _copy(self, name: str, dst: int, src: int, n: int, stream: Any = None) -> tuple[int]:
        self.calls[name] += 1
        if self.capturing is not None and stream == self.capturing:
            self.record.append(("copy", int(dst), int(src), int(n)))
        else:
            ctypes.memmove(int(dst), int(src), int(n))
        return (0,)

    def cuMemcpyHtoD(self, dst: int, src: int, n: int) -> tuple[int]:
        return self._copy("cuMemcpyHtoD", dst, src, n)

    def cuMemcpyDtoH(self, dst: int, src: int, n: int) -> tuple[int]:
        return self._copy("cuMemcpyDtoH", dst, src, n)

    def cuMemcpyDtoD(self, dst: int, src: int, n: int) -> tuple[int]:
        return self._copy("cuMemcpyDtoD", dst, src, n)

    def cuMemcpyHtoDAsync(self, dst: int, src: int, n: int, stream: Any) -> tuple[int]:
        return self._copy("cuMemcpyHtoDAsync", dst, src, n, stream)

    def cuMemcpyDtoHAsync(self, dst: int, src: int, n: int, stream: Any) -> tuple[int]:
        return self._copy("cuMemcpyDtoHAsync", dst, src, n, stream)

    def cuMemcpyDtoDAsync(self, dst: int, src: int, n: int, stream: Any) -> tuple[int]:
        return self._copy("cuMemcpyDtoDAsync", dst, src, n, stream)

    # -- code
    def cuModuleLoadData(self, image: bytes) -> tuple[int, int]:
        return 0, self._handle()

    def cuModuleGetFunction(self, module: int, name: bytes) -> tuple[int, str]:
        return 0, name.decode()

    def cuOccupancyMaxActiveBlocksPerMultiprocessor(self, f: Any, block: int, smem: int
                                                    ) -> tuple[int, int]:
        return 0, 4

    def cuLaunchKernel(self, function: str, gx: int, gy: int, gz: int, bx: int, by: int,
                       bz: int, smem: int, stream: Any, params: int, extra: Any) -> tuple[int]:
        self.calls["cuLaunchKernel"] += 1
        step = self.kernels[function]
        slots = (ctypes.c_void_p * len(step.bindings)).from_address(params)
        ptrs = [ctypes.c_void_p.from_address(s).value for s in slots]
        launch = ("kernel", step, ptrs)
        if self.capturing is not None and stream == self.capturing:
            self.record.append(launch)
        else:
            self._run(launch)
        return (0,)

    def _run(self, item: tuple[Any, ...]) -> None:
        if item[0] == "copy":
            ctypes.memmove(item[1], item[2], item[3])
            return
        _, step, ptrs = item
        arrays = []
        for v, ptr in zip(step.bindings, ptrs):
            n = int(np.prod(v.shape, dtype=np.int64)) * v.dtype.itemsize
            raw = (ctypes.c_char * max(n, 1)).from_address(ptr)
            arrays.append(np.frombuffer(raw, v.dtype.np, count=n // v.dtype.itemsize))
        loop_interp.interpret(step.fn, *arrays)

    # -- streams, events, graphs
    def cuStreamCreate(self, flags: int) -> tuple[int, int]:
        return 0, self._handle()

    def cuStreamDestroy(self, stream: int) -> tuple[int]:
        return (0,)

    def cuStreamSynchronize(self, stream: Any) -> tuple[int]:
        return (0,)

    def cuEventCreate(self, flags: int) -> tuple[int, int]:
        return 0, self._handle()

    def cuEventDestroy(self, event: Any) -> tuple[int]:
        return (0,)

    def cuEventRecord(self, event: Any, stream: Any) -> tuple[int]:
        return (0,)

    def cuStreamWaitEvent(self, stream: Any, event: Any, flags: int) -> tuple[int]:
        self.calls["cuStreamWaitEvent"] += 1
        return (0,)

    def cuStreamBeginCapture(self, stream: int, mode: int) -> tuple[int]:
        self.capturing, self.record = stream, []
        return (0,)

    def cuStreamEndCapture(self, stream: int) -> tuple[int, int]:
        handle = self._handle()
        self.graphs[handle] = self.record
        self.capturing, self.record = None, []
        return 0, handle

    def cuGraphGetNodes(self, graph: int, n: int) -> tuple[int, list[Any], int]:
        return 0, [], len(self.graphs[graph])

    def cuGraphInstantiate(self, graph: int, flags: int) -> tuple[int, int]:
        return 0, graph

    def cuGraphDestroy(self, graph: int) -> tuple[int]:
        return (0,)

    def cuGraphExecDestroy(self, graph: int) -> tuple[int]:
        return (0,)

    def cuGraphLaunch(self, graph: int, stream: Any) -> tuple[int]:
        self.calls["cuGraphLaunch"] += 1
        for item in self.graphs[graph]:
            self._run(item)
        return (0,)
