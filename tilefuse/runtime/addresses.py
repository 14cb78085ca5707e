"""Data addresses of a call's input arrays, remembered per argument slot.

``ndarray.ctypes.data`` builds a ctypes helper object on every access: 0.4-1.8 µs each on the
hosts here, so a 7-argument call spent more on reading its arguments' addresses (and again for
their alignment check) than on W5's three kernels. Callers pass the same arrays again and again
(weights, a reused input buffer), so each slot remembers the last array seen there (a weak
reference: the cache keeps no array alive, and a dead one is never mistaken for a new one with
the same ``id``) and its address.

The one way a live array's buffer moves is an in-place ``ndarray.resize`` to another size (the
weak reference does not stop its reference check); the slot also remembers the size, so such a
resize is seen as a new array.
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence

import numpy as np


class AddressCache:
    """``addresses(arrays)``: each array's data address, looked up once per array object."""

    __slots__ = ("_seen",)

    def __init__(self, slots: int):
        self._seen: list[tuple[weakref.ref[np.ndarray], int, int] | None] = [None] * slots

    def addresses(self, arrays: Sequence[np.ndarray]) -> list[int]:
        seen = self._seen
        if len(arrays) != len(seen):
            return [a.ctypes.data for a in arrays]
        out = []
        for i, a in enumerate(arrays):
            hit = seen[i]
            if hit is not None and hit[0]() is a and hit[2] == a.size:
                out.append(hit[1])
                continue
            address = a.ctypes.data
            try:
                seen[i] = (weakref.ref(a), address, a.size)
            except TypeError:   # not weak-referenceable (a subclass with __slots__)
                seen[i] = None
            out.append(address)
        return out


__all__ = ["AddressCache"]
