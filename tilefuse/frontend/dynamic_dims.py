"""Which argument dims of a jitted function are symbolic, and how they enter the cache key.

``tilefuse.jit(fn, dynamic=...)`` takes:

- ``None`` (the default): *automatic*. Every dim starts static. When a call misses the cache
  and the nearest cached entry differs from it only in the sizes of some array dims (a dim's
  second size), those dims become dynamic for good: each gets a symbol named after its
  argument and axis (``x_0``), dims that changed from the same size to the same size share one
  symbol (they are probably one size, such as the batch of ``x`` and of ``mask``), and the
  function is traced once more with them symbolic. A later call whose sizes break that sharing
  runs a static entry of its own (logged).
- ``False``: never; every new shape compiles anew (up to the recompile limit).
- ``True``: axis 0 of the first array argument is the symbol ``batch`` from the first call, and
  so is axis 0 of every other array argument of the same size in that call.
- A mapping from parameter name to ``{axis: "symbol name"}`` (or to a list of axes, each then
  named ``<param>_<axis>``): ``dynamic={"x": {0: "batch", 1: "seq"}, "mask": {0: "batch"}}``.
  Dims given one name must be one size in every call (a GuardError otherwise).

A dynamic dim's part of the key is its :class:`~tilefuse.graph.types.Sym` instead of its size,
so one entry serves every size; the executable binds the symbols from the arrays per call.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

from tilefuse.errors import TraceError
from tilefuse.frontend.arguments import ArgumentNames, KeyPart, is_array_part
from tilefuse.graph.types import Sym

DynamicSpec = bool | None | Mapping[str, Mapping[int, str] | Iterable[int]]
Slot = int | str  # a positional index or a keyword name
AxisSyms = tuple[tuple[int, Sym], ...]


class DynamicDims:
    """The dynamic dims of one jitted function (a mutable set that only grows in automatic
    mode), by argument position and by keyword name."""

    def __init__(self, spec: DynamicSpec, names: ArgumentNames):
        self._names = names
        self.automatic = spec is None
        self.explicit = spec is not None and spec is not False
        self._leading = spec is True      # resolved at the first call
        self._by_name: dict[str, dict[int, Sym]] = {}
        self.positions: dict[int, AxisSyms] = {}
        self.keywords: dict[str, AxisSyms] = {}
        self.refused: set[tuple[str, int]] = set()   # dims a symbolic trace could not take
        if isinstance(spec, Mapping):
            for name, axes in spec.items():
                self._by_name[str(name)] = _parse_axes(str(name), axes)
            self._index()
        elif spec not in (None, True, False):
            raise TraceError(f"dynamic must be None, True, False or a mapping from parameter "
                             f"name to axes, got {type(spec).__name__}")

    @property
    def any(self) -> bool:
        return bool(self.positions or self.keywords or self._leading)

    def symbols(self) -> set[Sym]:
        return {s for axes in self._by_name.values() for s in axes.values()}

    def _index(self) -> None:
        positional = self._names.positional
        self.positions = {positional.index(n): tuple(sorted(axes.items()))
                          for n, axes in self._by_name.items() if n in positional and axes}
        self.keywords = {n: tuple(sorted(axes.items())) for n, axes in self._by_name.items()
                         if axes}

    # ------------------------------------------------------------------ keys
    def shape(self, shape: tuple[int, ...], axes: AxisSyms) -> tuple[Any, ...]:
        """``shape`` with its dynamic axes replaced by their symbols."""
        out: list[Any] = list(shape)
        rank = len(shape)
        for axis, sym in axes:
            if -rank <= axis < rank:
                out[axis] = sym
        return tuple(out)

    def resolve_leading(self, args: tuple[Any, ...]) -> None:
        """``dynamic=True`` at the first call: axis 0 of the first array and of every array of
        the same leading size is ``batch``."""
        if not self._leading:
            return
        self._leading = False
        arrays = [(i, a) for i, a in enumerate(args) if type(a) is np.ndarray and a.ndim]
        if not arrays:
            return
        size = arrays[0][1].shape[0]
        for i, a in arrays:
            if a.shape[0] == size:
                self._by_name.setdefault(self._names.name(i), {})[0] = Sym("batch")
        self._index()

    # ------------------------------------------------------------------ automatic
    def mark(self, changes: list[tuple[Slot, int, int, int]]) -> list[str]:
        """Makes the dims that changed (slot, axis, old size, new size) dynamic, one symbol
        per (old, new) pair; returns one line per new symbol for the log."""
        groups: dict[tuple[int, int], list[tuple[str, int]]] = {}
        for slot, axis, old, new in changes:
            name = self._names.name(slot)
            if (name, axis) not in self.refused:
                groups.setdefault((old, new), []).append((name, axis))
        lines = []
        for (old, new), dims in groups.items():
            first_name, first_axis = dims[0]
            sym = Sym(_identifier(f"{first_name}_{first_axis}"))
            for name, axis in dims:
                self._by_name.setdefault(name, {})[axis] = sym
            shown = ", ".join(f"{n}[{a}]" for n, a in dims)
            lines.append(f"{shown} changed size {old} -> {new}: dynamic from now on, as "
                         f"symbol {sym}")
        self._index()
        return lines

    def refuse(self, syms: Iterable[Sym]) -> list[str]:
        """Makes the dims of ``syms`` static again (a symbolic trace failed on them)."""
        wanted = set(syms)
        dropped = []
        for name, axes in self._by_name.items():
            for axis, sym in list(axes.items()):
                if sym in wanted:
                    del axes[axis]
                    self.refused.add((name, axis))
                    dropped.append(f"{name}[{axis}]")
        self._index()
        return dropped

    def suggestion(self, dims: Iterable[tuple[str, int]]) -> str:
        """A ``dynamic=`` value naming ``dims`` (for error messages)."""
        spec: dict[str, dict[int, str]] = {}
        for name, axis in dims:
            spec.setdefault(name, {})[axis] = f"{name}_{axis}"
        return repr(spec)


def changed_dims(old: tuple[KeyPart, ...], new: tuple[KeyPart, ...]
                 ) -> list[tuple[int, int, int, int]] | None:
    """(position, axis, old size, new size) for every array dim that differs between two
    keys' parts, or None when they differ otherwise (count, a static value, dtype, rank)."""
    if len(old) != len(new):
        return None
    changes = []
    for i, (a, b) in enumerate(zip(old, new)):
        if a == b:
            continue
        if not (is_array_part(a) and is_array_part(b)) or a[1] != b[1] \
                or len(a[0]) != len(b[0]):
            return None
        for axis, (m, n) in enumerate(zip(a[0], b[0])):
            if m != n:
                if not (isinstance(m, int) and isinstance(n, int)):
                    return None
                changes.append((i, axis, m, n))
    return changes


def _parse_axes(name: str, axes: Any) -> dict[int, Sym]:
    if isinstance(axes, Mapping):
        items = list(axes.items())
    elif isinstance(axes, Iterable) and not isinstance(axes, (str, bytes)):
        items = [(a, f"{name}_{a}") for a in axes]
    else:
        raise TraceError(f"dynamic[{name!r}] must be a mapping from axis to symbol name or a "
                         f"list of axes, got {axes!r}")
    parsed: dict[int, Sym] = {}
    for axis, sym in items:
        if isinstance(axis, bool) or not isinstance(axis, int):
            raise TraceError(f"dynamic[{name!r}]: axis must be an int, got {axis!r}")
        if not isinstance(sym, str) or not sym.isidentifier():
            raise TraceError(f"dynamic[{name!r}][{axis}]: a symbol name must be an identifier, "
                             f"got {sym!r}")
        parsed[axis] = Sym(sym)
    return parsed


def _identifier(text: str) -> str:
    out = "".join(c if c.isalnum() or c == "_" else "_" for c in text)
    return out if out and not out[0].isdigit() else f"_{out}"


__all__ = ["DynamicDims", "DynamicSpec", "changed_dims"]
