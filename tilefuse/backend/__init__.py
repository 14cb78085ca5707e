"""The back ends: a kernel plan lowered, compiled and assembled into something ``runtime/``
executes. The compile driver (:mod:`tilefuse.driver`) picks one by target:

- :mod:`tilefuse.backend.cpu` (x86-64 targets): loop IR -> LLVM -> machine code, the arena,
  the launch sequence -> :class:`~tilefuse.runtime.native.NativeExecutable`;
  :mod:`tilefuse.backend.cpu_symbolic` for graphs with symbolic dims;
- :mod:`tilefuse.backend.cuda` (cuda targets): GPU lowerings -> PTX, cuBLAS products, fused
  attention -> :class:`~tilefuse.runtime.gpu.GpuProgram`, loaded by
  :class:`~tilefuse.runtime.gpu.CudaExecutable`.

Nothing here is imported by ``import tilefuse`` or by loading an artifact.
"""
