"""Runtime: the executable interface that compiled graphs are run through.

The native executable and its disk cache of compiled kernels (``NativeExecutable``,
``KernelCache``, ``KernelCacheStats``) are imported on first use: they need LLVM, which the
reference target does not.
"""

from __future__ import annotations

import importlib
from typing import Any

from tilefuse.runtime.executable import (
    KNOWN_TARGETS,
    Executable,
    InterpreterExecutable,
    build_executable,
    check_target,
)

_LAZY = {"NativeExecutable": "tilefuse.runtime.native",
         "KernelCache": "tilefuse.runtime.kernel_cache",
         "KernelCacheStats": "tilefuse.runtime.kernel_cache"}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


__all__ = ["KNOWN_TARGETS", "Executable", "InterpreterExecutable", "KernelCache",
           "KernelCacheStats", "NativeExecutable", "build_executable", "check_target"]
