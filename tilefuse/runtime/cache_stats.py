"""What a build's kernel cache did (:class:`KernelCacheStats`), apart from the cache itself
(:mod:`tilefuse.runtime.kernel_cache`, which needs LLVM): an executable loaded from an artifact
carries empty stats without importing the compiler."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class KernelCacheStats:
    """What one executable's kernels did: ``hits`` loaded from disk, ``misses`` compiled
    (absent, unusable, or no disk cache), ``stored`` written. ``directory`` is None when the
    disk cache was off or refused."""

    hits: int
    misses: int
    stored: int
    directory: Path | None
    shared: int = 0
    """Kernels of the build whose loop IR is another's but for the name: they run its code."""


__all__ = ["KernelCacheStats"]
