"""The whole-sequence launcher: kernels run in order through one native entry."""

from __future__ import annotations

import numpy as np
import pytest

from tilefuse.codegen.jit import compile_kernel
from tilefuse.codegen.launcher import CompiledLauncher, KernelCall
from tilefuse.dtypes import DType
from tilefuse.errors import CompileError
from tilefuse.loop.ir import BufferParam, LoopFunction, loop, var
from tilefuse.testing import assert_close, random_array


def _scale_kernel(name: str, factor: float) -> LoopFunction:
    src, dst = BufferParam("src", DType.f32, True, 0), BufferParam("dst", DType.f32, False, 0)
    i = var("i")
    body = loop("i", 0, 513, dst.store(i, src.load(i) * factor))
    return LoopFunction(name, (src, dst), (), body)


def test_launcher_runs_kernels_in_order_with_fixed_and_call_buffers():
    double, triple = compile_kernel(_scale_kernel("double", 2.0)), compile_kernel(
        _scale_kernel("triple", 3.0))
    middle = np.empty(513, np.float32)  # a fixed buffer, like the arena
    launcher = CompiledLauncher([KernelCall(double, (("io", 0), ("fixed", middle.ctypes.data))),
                                 KernelCall(triple, (("fixed", middle.ctypes.data), ("io", 1)))],
                                io_count=2)
    x = random_array(np.random.default_rng(3), (513,), DType.f32)
    out = np.empty_like(x)
    launcher([x.ctypes.data, out.ctypes.data])
    assert_close(out, x * np.float32(2.0) * np.float32(3.0))


def test_launcher_rejects_bad_calls():
    double = compile_kernel(_scale_kernel("double2", 2.0))
    with pytest.raises(CompileError, match="io index"):
        CompiledLauncher([KernelCall(double, (("io", 0), ("io", 5)))], io_count=2)
    with pytest.raises(CompileError, match="buffers"):
        CompiledLauncher([KernelCall(double, (("io", 0),))], io_count=2)
