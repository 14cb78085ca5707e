"""The NumPy frontend: tracers that record NumPy code into a graph, and :func:`jit`."""

from tilefuse.frontend.jit import CacheInfo, JitFunction, Lowered, jit
from tilefuse.frontend.tracer import TraceContext, Tracer

__all__ = ["CacheInfo", "JitFunction", "Lowered", "TraceContext", "Tracer", "jit"]
