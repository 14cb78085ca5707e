"""Matrix products on the GPU through cuBLAS (``cublasGemmStridedBatchedEx``), called with ctypes.

The ``cuda`` target has no generated contraction kernel yet, so a contraction group becomes a
cuBLAS product followed by its epilogue as a generated elementwise kernel (the issue's "vendor
library call with the epilogue fused into the next kernel"); the choice is logged on the
``fallback`` topic. Row-major ``C[M,N] = A[M,K] · B[K,N]`` is column-major
``Cᵀ = Bᵀ · Aᵀ``, so the call passes B first. Accumulation is f32 for every input type
(``CUBLAS_COMPUTE_32F``: no TF32 for f32 inputs, which would break the f32 contract).

The library is found next to the CUDA driver's Python packages (``nvidia/*/lib``), then through
the loader; a machine without it gets a :class:`~tilefuse.runtime.cuda_driver.CudaError`.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import glob
import os
import sys
import threading
from dataclasses import dataclass
from functools import cache

from tilefuse.dtypes import DType
from tilefuse.runtime.cuda_driver import CudaContext, CudaError

_CUDA_TYPES = {DType.f32: 0, DType.f64: 1, DType.f16: 2, DType.bf16: 14}
CUBLAS_DTYPES = frozenset(_CUDA_TYPES)
"""The operand dtypes a product through cuBLAS takes."""
_COMPUTE_32F = 68
_COMPUTE_64F = 70
_OP_N = 0
_GEMM_DEFAULT = -1
WORKSPACE_BYTES = 32 << 20
"""The handle's own workspace (what torch gives cuBLAS on Hopper): some of the fastest
Hopper kernels need one."""


@dataclass(frozen=True)
class GemmShape:
    """``batch`` products ``[M,K] x [K,N]``; a stride of 0 shares one operand across the batch
    (elements between consecutive matrices)."""

    batch: int
    m: int
    n: int
    k: int
    stride_a: int
    stride_b: int
    dtype: DType


@cache
def _library() -> ctypes.CDLL:
    candidates = []
    for root in sys.path:
        candidates += sorted(glob.glob(os.path.join(root, "nvidia", "*", "lib", "libcublas.so*")))
        candidates += sorted(glob.glob(os.path.join(root, "nvidia", "cublas", "lib",
                                                    "libcublas.so*")))
    found = ctypes.util.find_library("cublas")
    if found:
        candidates.append(found)
    for path in candidates:
        if "Lt" in os.path.basename(path):
            continue
        try:
            return ctypes.CDLL(path)
        except OSError:
            continue
    raise CudaError("cuBLAS (libcublas.so) was not found: install the nvidia-cublas package "
                    "or the CUDA toolkit")


class Cublas:
    """One cuBLAS handle bound to ``context``, launching on the legacy default stream."""

    def __init__(self, context: CudaContext, workspace_bytes: int = WORKSPACE_BYTES):
        self.context = context
        self.lib = _library()
        self.handle = ctypes.c_void_p()
        self._lock = threading.Lock()
        self.workspace = context.alloc(workspace_bytes) if workspace_bytes else None
        with context:
            self._check("cublasCreate_v2", self.lib.cublasCreate_v2(ctypes.byref(self.handle)))
            self._check("cublasSetStream_v2",
                        self.lib.cublasSetStream_v2(self.handle, ctypes.c_void_p(0)))
            if self.workspace is not None:
                self._check("cublasSetWorkspace_v2", self.lib.cublasSetWorkspace_v2(
                    self.handle, ctypes.c_void_p(self.workspace.ptr),
                    ctypes.c_size_t(workspace_bytes)))

    @staticmethod
    def _check(call: str, status: int) -> None:
        if status != 0:
            raise CudaError(f"cuBLAS {call} failed with status {status}")

    def gemm(self, shape: GemmShape, a: int, b: int, c: int) -> None:
        """``C = A · B`` for row-major device buffers at ``a``, ``b``, ``c``."""
        if shape.dtype not in _CUDA_TYPES:
            raise CudaError(f"cuBLAS products of {shape.dtype} are not supported")
        kind = _CUDA_TYPES[shape.dtype]
        f64 = shape.dtype is DType.f64
        scalar = ctypes.c_double if f64 else ctypes.c_float
        alpha, beta = scalar(1.0), scalar(0.0)
        m, n, k = shape.m, shape.n, shape.k
        fn = self.lib.cublasGemmStridedBatchedEx
        fn.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int,
                       ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int,
                       ctypes.c_int, ctypes.c_longlong, ctypes.c_void_p, ctypes.c_int,
                       ctypes.c_int, ctypes.c_longlong, ctypes.c_void_p, ctypes.c_void_p,
                       ctypes.c_int, ctypes.c_int, ctypes.c_longlong, ctypes.c_int,
                       ctypes.c_int, ctypes.c_int]
        with self._lock, self.context:
            status = fn(self.handle, _OP_N, _OP_N, n, m, k, ctypes.byref(alpha),
                        ctypes.c_void_p(b), kind, n, shape.stride_b,
                        ctypes.c_void_p(a), kind, k, shape.stride_a,
                        ctypes.byref(beta), ctypes.c_void_p(c), kind, n, m * n,
                        shape.batch, _COMPUTE_64F if f64 else _COMPUTE_32F, _GEMM_DEFAULT)
        self._check("cublasGemmStridedBatchedEx", status)


__all__ = ["Cublas", "GemmShape"]
