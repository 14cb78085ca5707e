"""A thin, typed layer over the CUDA driver API (cuda-python's ``cuda.bindings.driver``).

Only what the GPU executable needs: the primary context of one device, PTX modules, device
memory, kernel launches and events. Every driver status other than success becomes a
:class:`CudaError` naming the call and the status. cuda-python is optional (``pip install
tilefuse[cuda]``); :func:`cuda_available` says whether a driver and a device are there, so the
tests and the ``cuda`` target skip or refuse cleanly on machines without one.
"""

from __future__ import annotations

import ctypes
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from typing import Any

import numpy as np

from tilefuse.errors import TilefuseError


class CudaError(TilefuseError):
    """A CUDA driver call failed, or no CUDA device is usable."""


@cache
def _driver() -> Any:
    try:
        from cuda.bindings import driver
    except ImportError:
        try:
            from cuda import cuda as driver  # cuda-python before 12.6
        except ImportError as exc:
            raise CudaError("the cuda target needs cuda-python (pip install "
                            "'tilefuse[cuda]')") from exc
    return driver


def _call(name: str, *args: Any) -> Any:
    driver = _driver()
    result = getattr(driver, name)(*args)
    status, rest = (result[0], result[1:]) if isinstance(result, tuple) else (result, ())
    if status != driver.CUresult.CUDA_SUCCESS:
        _, text = driver.cuGetErrorString(status)
        detail = text.decode() if isinstance(text, bytes) else status
        raise CudaError(f"CUDA {name} failed: {getattr(status, 'name', status)} ({detail})")
    if not rest:
        return None
    return rest[0] if len(rest) == 1 else rest


@cache
def cuda_available() -> bool:
    """Whether cuda-python imports, the driver initialises and a device exists."""
    try:
        _call("cuInit", 0)
        return _call("cuDeviceGetCount") > 0
    except (CudaError, OSError, RuntimeError):
        return False


@dataclass(frozen=True)
class DeviceInfo:
    name: str
    compute_capability: tuple[int, int]
    multiprocessors: int

    @property
    def arch(self) -> str:
        return f"sm_{self.compute_capability[0]}{self.compute_capability[1]}"


class CudaContext:
    """The primary context of device ``ordinal``, made current on the calling thread for each
    operation (so any thread may use it)."""

    def __init__(self, ordinal: int = 0):
        if not cuda_available():
            raise CudaError("no usable CUDA device (cuda-python, a driver and a GPU are needed)")
        driver = _driver()
        self.device = _call("cuDeviceGet", ordinal)
        self.context = _call("cuDevicePrimaryCtxRetain", self.device)
        self._lock = threading.RLock()
        attr = driver.CUdevice_attribute
        with self:
            major = _call("cuDeviceGetAttribute",
                          attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, self.device)
            minor = _call("cuDeviceGetAttribute",
                          attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, self.device)
            sms = _call("cuDeviceGetAttribute", attr.CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT,
                        self.device)
            raw = _call("cuDeviceGetName", 256, self.device)
        self.info = DeviceInfo(raw.split(b"\0", 1)[0].decode(), (major, minor), sms)

    def __enter__(self) -> CudaContext:
        self._lock.acquire()
        _call("cuCtxSetCurrent", self.context)
        return self

    def __exit__(self, *exc: object) -> None:
        self._lock.release()

    # ---------------------------------------------------------------- memory
    def alloc(self, nbytes: int) -> DeviceBuffer:
        with self:
            ptr = _call("cuMemAlloc", max(int(nbytes), 1))
        return DeviceBuffer(self, int(ptr), int(nbytes))

    def upload(self, array: np.ndarray) -> DeviceBuffer:
        buf = self.alloc(array.nbytes)
        buf.copy_from(array)
        return buf

    def copy_device(self, dst: int, src: int, nbytes: int) -> None:
        with self:
            _call("cuMemcpyDtoD", dst, src, nbytes)

    def copy_to_host(self, array: np.ndarray, src: int) -> np.ndarray:
        if not array.flags.c_contiguous:
            raise CudaError("copy to a non-contiguous host array")
        with self:
            _call("cuMemcpyDtoH", array.ctypes.data, src, array.nbytes)
        return array

    def synchronize(self) -> None:
        with self:
            _call("cuCtxSynchronize")

    # ---------------------------------------------------------------- streams and events
    def stream(self) -> Any:
        """A new non-blocking stream (not ordered with the legacy default stream): CUDA graphs
        are captured on one (:mod:`tilefuse.runtime.cuda_graph`)."""
        driver = _driver()
        with self:
            return _call("cuStreamCreate", driver.CUstream_flags.CU_STREAM_NON_BLOCKING)

    def event(self) -> Any:
        """A new event without timing (cheap to record and wait on)."""
        driver = _driver()
        with self:
            return _call("cuEventCreate", driver.CUevent_flags.CU_EVENT_DISABLE_TIMING)

    # ---------------------------------------------------------------- code
    def load_ptx(self, ptx: str) -> CudaModule:
        with self:
            module = _call("cuModuleLoadData", ptx.encode() + b"\0")
        return CudaModule(self, module)

    def launch(self, function: Any, grid: int, block: int, args: Sequence[int],
               scalars: Sequence[int] = (), stream: Any = 0) -> None:
        """Launches ``function`` on a 1-D grid; ``args`` are device pointers, ``scalars``
        i64 values (in the kernel's parameter order: buffers, then scalars); ``stream`` 0 is
        the legacy default stream."""
        values = [ctypes.c_void_p(a) for a in args] + [ctypes.c_int64(s) for s in scalars]
        params = (ctypes.c_void_p * len(values))(
            *[ctypes.cast(ctypes.pointer(v), ctypes.c_void_p) for v in values])
        with self:
            _call("cuLaunchKernel", function, grid, 1, 1, block, 1, 1, 0, stream,
                  ctypes.addressof(params), 0)

    def resident_blocks(self, function: Any, block: int) -> int:
        """How many blocks of ``block`` threads of ``function`` the whole device holds at
        once (the driver's occupancy for its registers and shared memory, times the SMs)."""
        with self:
            per_sm = _call("cuOccupancyMaxActiveBlocksPerMultiprocessor", function, block, 0)
        return max(1, int(per_sm)) * self.info.multiprocessors

    def time_ms(self, run: Any, repeats: int = 1) -> float:
        """Milliseconds per call of ``run()`` between two CUDA events (device time)."""
        with self:
            start, stop = _call("cuEventCreate", 0), _call("cuEventCreate", 0)
            _call("cuEventRecord", start, 0)
        for _ in range(repeats):
            run()
        with self:
            _call("cuEventRecord", stop, 0)
            _call("cuEventSynchronize", stop)
            ms = _call("cuEventElapsedTime", start, stop)
            _call("cuEventDestroy", start)
            _call("cuEventDestroy", stop)
        return float(ms) / repeats


class CudaModule:
    def __init__(self, context: CudaContext, handle: Any):
        self.context = context
        self.handle = handle

    def function(self, name: str) -> Any:
        with self.context:
            return _call("cuModuleGetFunction", self.handle, name.encode())


class DeviceBuffer:
    """``nbytes`` of device memory, freed when the object goes (unless it is a view of
    another buffer, which it keeps alive)."""

    def __init__(self, context: CudaContext, ptr: int, nbytes: int,
                 owner: DeviceBuffer | None = None):
        self.context = context
        self.ptr = ptr
        self.nbytes = nbytes
        self.owner = owner

    def view(self, offset: int, nbytes: int) -> DeviceBuffer:
        """``nbytes`` at ``offset`` of this buffer (an arena slot)."""
        if offset < 0 or offset + nbytes > self.nbytes:
            raise CudaError(f"view of {nbytes} bytes at {offset} outside a {self.nbytes}-byte "
                            f"buffer")
        return DeviceBuffer(self.context, self.ptr + offset, nbytes, owner=self)

    def copy_from(self, array: np.ndarray) -> None:
        array = np.ascontiguousarray(array)
        if array.nbytes != self.nbytes:
            raise CudaError(f"copy of {array.nbytes} bytes into a {self.nbytes}-byte buffer")
        with self.context:
            _call("cuMemcpyHtoD", self.ptr, array.ctypes.data, array.nbytes)

    def copy_to(self, array: np.ndarray) -> np.ndarray:
        if not array.flags.c_contiguous or array.nbytes != self.nbytes:
            raise CudaError(f"copy of a {self.nbytes}-byte buffer into {array.nbytes} bytes")
        with self.context:
            _call("cuMemcpyDtoH", array.ctypes.data, self.ptr, self.nbytes)
        return array

    def __del__(self) -> None:
        if self.owner is not None:
            return
        try:
            with self.context:
                _call("cuMemFree", self.ptr)
        except Exception:  # interpreter shutdown: the driver may be gone already
            pass


__all__ = ["CudaContext", "CudaError", "CudaModule", "DeviceBuffer", "DeviceInfo",
           "cuda_available"]
