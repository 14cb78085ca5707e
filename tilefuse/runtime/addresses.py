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

    def contiguous(self, arrays: Sequence[object]) -> tuple[Sequence[np.ndarray], list[int]]:
        """``arrays`` made C-contiguous ndarrays (copies only where they are not) and their
        addresses, in one pass: an array seen in its slot last time (same object, same size)
        was contiguous then and is now (NumPy 2.4 deprecated setting ``strides``; an in-place
        ``shape`` change keeps a contiguous array contiguous). ``arrays`` themselves are
        returned when no copy was made. The caller has checked the count."""
        seen = self._seen
        out = []
        made: list[np.ndarray] | None = None
        for i, a in enumerate(arrays):
            hit = seen[i]
            if hit is not None and hit[0]() is a and hit[2] == a.size:  # type: ignore[union-attr]
                out.append(hit[1])
                continue
            array = a if type(a) is np.ndarray else np.asarray(a)
            if not array.flags.c_contiguous:
                array = np.ascontiguousarray(array)
            address = array.ctypes.data
            if array is a:
                try:
                    seen[i] = (weakref.ref(array), address, array.size)
                except TypeError:
                    seen[i] = None
            else:   # a copy (dies after the call) or a conversion: not remembered
                if made is None:
                    made = list(arrays)  # type: ignore[arg-type]
                made[i] = array
            out.append(address)
        return (arrays if made is None else made), out  # type: ignore[return-value]


__all__ = ["AddressCache"]
