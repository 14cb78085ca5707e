"""Device arrays of other libraries (torch CUDA tensors, CuPy arrays) at the ``cuda`` target's
call boundary, without copies.

An array is a *device array* when it is not a NumPy array and its ``__dlpack_device__()``
says CUDA (DLPack's device type 2). tilefuse reads its pointer in place and allocates the
results with the same library on the same device, so data never leaves the GPU; the work is
queued on that library's current stream. Only the libraries below are read (their own
pointer and allocation calls are cheaper per call than building DLPack capsules); another
DLPack library's CUDA array is refused with a message naming what to pass instead.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

import numpy as np

from tilefuse.errors import GuardError
from tilefuse.graph.ir import Graph, Value

DLPACK_CUDA = 2


_TORCH_TYPES: set[type] = set()


def is_device_array(value: Any) -> bool:
    """Whether ``value`` is a CUDA array of another library (DLPack's device says so; a torch
    tensor type seen once is asked ``is_cuda``, which is cheaper)."""
    if type(value) in _TORCH_TYPES:
        return bool(value.is_cuda)
    probe = getattr(value, "__dlpack_device__", None)
    if probe is None or type(value).__module__ == "numpy":
        return False
    if type(value).__module__.startswith("torch") and hasattr(value, "is_cuda"):
        _TORCH_TYPES.add(type(value))
        return bool(value.is_cuda)
    try:
        return int(probe()[0]) == DLPACK_CUDA
    except Exception:  # a torch CPU tensor says 1; anything odd is not a device array
        return False


class _Torch:
    name = "torch"

    def __init__(self) -> None:
        import torch

        from tilefuse.frontend.torch.convert import DTYPE_TO_TORCH
        self.torch = torch
        self.dtypes = DTYPE_TO_TORCH
        self.device = torch.device("cuda", 0)
        raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
        self.stream = (lambda: raw(0)) if raw is not None else \
            (lambda: torch.cuda.current_stream(0).cuda_stream)

    def check(self, a: Any, v: Value) -> str | None:
        if a.get_device() != 0:
            return f"lives on {a.device}, the cuda target runs on cuda:0"
        if self.dtypes.get(v.dtype) != a.dtype or a.shape != v.shape:
            return f"is {a.dtype}{list(a.shape)}, the compiled graph takes {v.type}"
        if not a.is_contiguous():
            return "is not contiguous (pass .contiguous())"
        return None

    def pointer(self, a: Any) -> int:
        return a.data_ptr()

    def empty(self, v: Value) -> Any:
        return self.torch.empty(v.shape, dtype=self.dtypes[v.dtype], device=self.device)


class _Cupy:
    name = "cupy"

    def __init__(self) -> None:
        import cupy
        self.cupy = cupy
        self.stream = lambda: cupy.cuda.get_current_stream().ptr

    def check(self, a: Any, v: Value) -> str | None:
        if a.device.id != 0:
            return f"lives on GPU {a.device.id}, the cuda target runs on GPU 0"
        if a.dtype != v.dtype.np or tuple(a.shape) != v.shape:
            return f"is {a.dtype}{list(a.shape)}, the compiled graph takes {v.type}"
        if not a.flags.c_contiguous:
            return "is not C-contiguous (pass cupy.ascontiguousarray(...))"
        return None

    def pointer(self, a: Any) -> int:
        return a.data.ptr

    def empty(self, v: Value) -> Any:
        return self.cupy.empty(v.shape, dtype=v.dtype.np)


_KINDS: dict[str, Any] = {}
_STANDINS: dict[tuple[Any, ...], np.ndarray] = {}


def _numpy_dtype(a: Any) -> np.dtype:
    dtype = a.dtype
    if isinstance(dtype, np.dtype):
        return dtype
    from tilefuse.frontend.torch.convert import DTYPE_TO_TORCH
    for ours, theirs in DTYPE_TO_TORCH.items():
        if theirs == dtype:
            return ours.np
    raise GuardError(f"a device array of dtype {dtype} has no tilefuse dtype")


def standin(a: Any) -> np.ndarray:
    """A read-only NumPy array of ``a``'s shape and dtype over one element (zero strides): what
    the jit keys and traces in place of a device array (tracing reads only shape and dtype)."""
    key = (type(a), tuple(a.shape), a.dtype)
    found = _STANDINS.get(key)
    if found is None:
        dtype = _numpy_dtype(a)
        found = np.lib.stride_tricks.as_strided(np.zeros(1, dtype), tuple(a.shape),
                                                (0,) * len(a.shape), writeable=False)
        _STANDINS[key] = found
    return found


def device_standins(args: tuple[Any, ...], kwargs: dict[str, Any]
                    ) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """``args`` and ``kwargs`` with each device array replaced by its :func:`standin` (the
    same objects back when there is none)."""
    if not any(is_device_array(a) for a in (*args, *kwargs.values())):
        return args, kwargs
    return (tuple(standin(a) if is_device_array(a) else a for a in args),
            {k: standin(v) if is_device_array(v) else v for k, v in kwargs.items()})


def _kind_of(a: Any) -> Any:
    module = type(a).__module__.split(".", 1)[0]
    kind = _KINDS.get(module)
    if kind is None:
        if module == "torch":
            kind = _Torch()
        elif module == "cupy":
            kind = _Cupy()
        else:
            raise GuardError(f"a CUDA array of {module} ({type(a).__name__}) is not read by the "
                             f"cuda target: pass a torch CUDA tensor or a CuPy array "
                             f"(torch.from_dlpack(x) wraps it without a copy)")
        _KINDS[module] = kind
    return kind


def device_kind(arrays: Sequence[Any], graph: Graph) -> Any:
    """The library of ``arrays`` (all one library, each matching ``graph``'s input), which
    reads their pointers, allocates results and names the current stream; GuardError naming
    the argument otherwise."""
    if len(arrays) != len(graph.inputs):
        raise GuardError(f"{graph.name} takes {len(graph.inputs)} arrays, got {len(arrays)}")
    kind = None
    for i, (a, v) in enumerate(zip(arrays, graph.inputs)):
        if not is_device_array(a):
            raise GuardError(f"{graph.name}: argument {i} is a {type(a).__name__}, not a CUDA "
                             f"array; pass all device arrays or all NumPy arrays")
        k = _kind_of(a)
        if kind is not None and k is not kind:
            raise GuardError(f"{graph.name}: argument {i} is a {k.name} array, argument 0 a "
                             f"{kind.name} one; pass arrays of one library")
        kind = k
        problem = k.check(a, v)
        if problem is not None:
            raise GuardError(f"{graph.name}: argument {i} ({v.name}) {problem}")
    if kind is None:  # a graph without inputs: results as torch when it is loaded
        kind = _kind_of(sys.modules["torch"].empty(0)) if "torch" in sys.modules else None
        if kind is None:
            raise GuardError(f"{graph.name} takes no arrays: call it with NumPy semantics")
    return kind


__all__ = ["device_kind", "device_standins", "is_device_array", "standin"]
