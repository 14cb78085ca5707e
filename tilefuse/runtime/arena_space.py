"""One arena for several CPU executables that never run at the same time.

A :class:`~tilefuse.runtime.native.NativeExecutable` holds its own arena of intermediates for
its whole life. A training step runs several of them one after another (each compiled region
of the forward, then of the backward), and what one leaves in its arena is dead once its call
returns (outputs are copied out or written to the call's own buffers). Holding one arena each
makes a step's memory the *sum* of the arenas; one shared arena makes it their *largest*.

An :class:`ArenaSpace` reserves one range of virtual addresses (an anonymous ``MAP_NORESERVE``
mapping as large as the machine's memory: no page is resident, or counted against the
system's commit limit, until a kernel writes it), and every executable built while the space
is active (:func:`active`, set by :func:`using`) places its arena at the start of that range.
The pages resident are those of the largest arena that ran. The launchers bake the arena's
addresses in, which is why the range must exist before the first build and never move.

Executables that share the bytes must not run concurrently: each takes the space's
:attr:`~ArenaSpace.lock` instead of a lock of its own (set by the CPU back end's ``assemble``).
An arena larger than the reservation (or a machine that refuses the mapping) gets an arena of
its own, logged at DEBUG on ``fallback``.
"""

from __future__ import annotations

import contextlib
import contextvars
import mmap
import os
import threading
from collections.abc import Iterator

import numpy as np

from tilefuse.log import get_logger

MAP_NORESERVE = getattr(mmap, "MAP_NORESERVE", 0x4000)
"""Linux's flag (Python's mmap module exports it only from 3.12 on)."""

_active: contextvars.ContextVar[ArenaSpace | None] = contextvars.ContextVar(
    "tilefuse_arena_space", default=None)


def _physical_memory() -> int:
    try:
        return int(os.sysconf("SC_PAGE_SIZE")) * int(os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return 16 << 30


class ArenaSpace:
    """The shared arena of a group of executables run one at a time (module docstring).

    ``name`` names the group in logs; ``reserve`` is the bytes of address space reserved on
    first use (default: the machine's physical memory). ``peak`` is the largest arena handed
    out: the bytes of intermediates the group keeps resident."""

    def __init__(self, name: str, reserve: int | None = None):
        self.name = name
        self.lock = threading.Lock()
        """The lock every executable of the space takes for a call (one runs at a time)."""
        self.peak = 0
        self.arenas = 0
        """How many executables were placed in the space."""
        self._reserve = int(reserve if reserve is not None else _physical_memory())
        self._map: mmap.mmap | None = None
        self._bytes: np.ndarray | None = None
        self._failed = False
        self._guard = threading.Lock()

    def arena(self, nbytes: int) -> np.ndarray | None:
        """``nbytes`` (at least 1) at the start of the space, as uint8; None when the space
        cannot hold them (the caller allocates an arena of its own)."""
        nbytes = max(int(nbytes), 1)
        with self._guard:
            if self._bytes is None and not self._failed:
                self._reserve_range()
            if self._bytes is None or nbytes > self._bytes.size:
                get_logger("fallback").debug(
                    "arena space %s: an arena of %d bytes gets its own memory (%s)", self.name,
                    nbytes, "the reservation failed" if self._failed else
                    f"over the {self._reserve}-byte reservation")
                return None
            self.peak = max(self.peak, nbytes)
            self.arenas += 1
            return self._bytes[:nbytes]

    def owns(self, arena: np.ndarray) -> bool:
        """Whether ``arena`` is this space's (placed by :meth:`arena`)."""
        return self._bytes is not None and arena.size > 0 and \
            arena.ctypes.data == self._bytes.ctypes.data

    def _reserve_range(self) -> None:
        try:
            self._map = mmap.mmap(-1, self._reserve, flags=mmap.MAP_PRIVATE
                                  | mmap.MAP_ANONYMOUS | MAP_NORESERVE)
        except (OSError, ValueError, OverflowError) as err:
            self._failed = True
            get_logger("fallback").debug("arena space %s: reserving %d bytes failed: %s",
                                       self.name, self._reserve, err)
            return
        self._bytes = np.frombuffer(self._map, np.uint8)

    def __repr__(self) -> str:
        return f"ArenaSpace({self.name!r}: {self.arenas} arenas, peak {self.peak} bytes)"


def active() -> ArenaSpace | None:
    """The space executables built now place their arenas in (None: each its own)."""
    return _active.get()


@contextlib.contextmanager
def using(space: ArenaSpace | None) -> Iterator[None]:
    """Executables built inside the block place their arenas in ``space``."""
    token = _active.set(space)
    try:
        yield
    finally:
        _active.reset(token)


__all__ = ["ArenaSpace", "active", "using"]
