"""Code generation: loop IR -> LLVM IR (llvmlite) -> x86-64 machine code.

Entry points: :func:`compile_kernel` (JIT; returns a callable :class:`CompiledKernel`),
:func:`load_kernel` (from cached object code), :func:`lower_to_llvm` (the ``llvmlite.ir``
module), :func:`host_target`. Names are imported lazily so that importing the loop IR (whose
interpreter uses :mod:`tilefuse.codegen.scalar_ops`) does not load LLVM.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "CompiledKernel": "jit", "KernelSignature": "jit", "compile_kernel": "jit",
    "load_kernel": "jit", "kernel_from_bytes": "jit", "llvm_ir_text": "jit", "aligned_empty": "jit",
    "lower_to_llvm": "llvm_cpu", "CpuTarget": "target", "host_target": "target",
    "ScalarOps": "scalar_ops", "MathLib": "math_lib",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'tilefuse.codegen' has no attribute {name!r}")
    return getattr(importlib.import_module(f"tilefuse.codegen.{module}"), name)
