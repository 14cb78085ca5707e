"""An executable for a graph whose inputs have symbolic dims (``f32[batch,seq,768]``).

The graph is traced and optimised once, with its symbols. A call binds every symbol from the
input arrays' shapes, checks the binding (see *guards* below), and runs the static executable
specialised for those sizes. Specialisations are built lazily, the first time a size binding is
seen (``specialize`` substitutes the sizes, the graph pipeline runs again on the now static
graph, and the target builds it: for "cpu" the kernels come from the kernel cache when any
process has compiled them before), memoised per binding, and the oldest is dropped beyond
``max_sizes``. Each specialisation is logged on the ``recompiles`` topic with the binding.

**One build first.** Before any of that, ``build`` is tried once on the symbolic graph itself:
when the target builds it (the "cpu" target makes a
:class:`~tilefuse.backend.cpu_symbolic.SymbolicNativeExecutable`, whose kernels take the
symbols as runtime extents), every call runs that one build with the bound sizes and nothing is
re-run per size (the graph pipeline, the native build); only kernel kinds without runtime
extents yet are specialised per size inside it. When that build raises CompileError (another
target, say), the per-size path above serves the entry, logged with the reason.

**Guards** (before any native code): count, dtype, rank, every static dim exact, C order (on
``__call__``; ``run_trusted`` trusts its caller for those), one size per symbol across all
inputs (:class:`SymbolConflict`), and the graph's own constraints on the sizes, such as a symbol
broadcast against ``n > 1`` having to be 1 or ``n`` (:class:`SymbolGuardError`, found when the
specialised graph's types are inferred).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tilefuse.errors import CompileError, GuardError, TilefuseError
from tilefuse.graph.ir import Graph
from tilefuse.graph.types import Sym, TensorType, is_static
from tilefuse.log import get_logger
from tilefuse.passes.shape_infer import specialize

DEFAULT_MAX_SIZES = 64
"""Specialisations kept per executable before the oldest is dropped."""

Optimize = Callable[[Graph], Graph]


class SymbolConflict(GuardError):
    """One symbol met two sizes in one call (``batch`` is 4 in ``x`` and 5 in ``mask``)."""


class SymbolGuardError(GuardError):
    """The sizes bound in one call break a constraint of the graph (a symbol broadcast against
    ``n > 1`` that is neither 1 nor ``n``, a reshape whose element counts no longer agree)."""


def symbols_of(graph: Graph) -> tuple[Sym, ...]:
    """The symbols of the graph's input dims, in order of first appearance."""
    found: dict[Sym, None] = {}
    for v in graph.inputs:
        found.update((d, None) for d in v.shape if isinstance(d, Sym))
    return tuple(found)


def is_symbolic(graph: Graph) -> bool:
    return any(not is_static(v.shape) for v in graph.inputs)


@dataclass(frozen=True)
class SymbolBinder:
    """How a symbolic graph's inputs name its symbols: checks a call's arrays and reads each
    symbol's size from the first dim that names it (shared by the per-size and the one-build
    executables)."""

    name: str
    symbols: tuple[Sym, ...]
    inputs: tuple[tuple[str, TensorType], ...]
    binders: tuple[tuple[int, int, int], ...]   # (input, axis, symbol index) per symbolic dim

    @staticmethod
    def of(graph: Graph) -> SymbolBinder:
        symbols = symbols_of(graph)
        index = {s: k for k, s in enumerate(symbols)}
        binders = tuple((i, axis, index[d]) for i, v in enumerate(graph.inputs)
                        for axis, d in enumerate(v.shape) if isinstance(d, Sym))
        inputs = tuple((v.name or f"#{i}", v.type) for i, v in enumerate(graph.inputs))
        return SymbolBinder(graph.name, symbols, inputs, binders)

    def check(self, arrays: Sequence[np.ndarray]) -> None:
        """GuardError unless count, dtypes, ranks and static dims are the graph's."""
        if len(arrays) != len(self.inputs):
            raise GuardError(f"@{self.name} takes {len(self.inputs)} inputs, "
                             f"got {len(arrays)}")
        for array, (name, t) in zip(arrays, self.inputs):
            if not isinstance(array, np.ndarray) or array.dtype != t.dtype.np \
                    or array.ndim != t.rank or any(isinstance(d, int) and d != n
                                                   for d, n in zip(t.shape, array.shape)):
                got = f"{array.dtype}{list(array.shape)}" if isinstance(array, np.ndarray) \
                    else type(array).__name__
                raise GuardError(f"input {name} must be a {t} array, got {got}")

    def bind(self, arrays: Sequence[np.ndarray]) -> tuple[int, ...]:
        """Each symbol's size in this call; SymbolConflict when one symbol meets two sizes."""
        sizes: list[int | None] = [None] * len(self.symbols)
        for i, axis, k in self.binders:
            n = arrays[i].shape[axis]
            have = sizes[k]
            if have is None:
                sizes[k] = n
            elif have != n:
                seen = [f"{self.inputs[j][0]}[{a}] = {arrays[j].shape[a]}"
                        for j, a, m in self.binders if m == k]
                raise SymbolConflict(f"@{self.name}: symbol {self.symbols[k]} must be one "
                                     f"size in every dim it names, got {', '.join(seen)}")
        return tuple(sizes)  # type: ignore[arg-type]


class DynamicExecutable:
    """A symbolic graph served by per-size specialisations (see the module docstring).

    ``build(graph, dump_dir)`` makes the static executable of a specialised graph and
    ``optimize`` re-runs the graph pipeline on it (identity by default)."""

    def __init__(self, graph: Graph, build: Callable[[Graph, Path | None], object], *,
                 optimize: Optimize | None = None, dump_dir: Path | str | None = None,
                 max_sizes: int = DEFAULT_MAX_SIZES):
        self.graph = graph
        self.symbols = symbols_of(graph)
        unbound = {str(d) for n in graph.nodes for o in n.outputs for d in o.shape
                   if isinstance(d, Sym) and d not in self.symbols}
        if unbound:
            raise TilefuseError(f"@{graph.name}: dims {', '.join(sorted(unbound))} are "
                                "symbols that no input dim binds")
        self._build = build
        self._optimize = optimize or (lambda g: g)
        self._dump = None if dump_dir is None else Path(dump_dir)
        self._max_sizes = max(1, int(max_sizes))
        self._signature = SymbolBinder.of(graph)
        self._specialized: OrderedDict[tuple[int, ...], object] = OrderedDict()
        self._lock = threading.Lock()
        self._log = get_logger("recompiles")
        self.specializations = 0
        """How many per-size builds ran (evicted ones included); 0 with a symbolic build."""
        self.symbolic = self._build_symbolic()
        """The one build serving every size (None: specialised per size)."""

    def _build_symbolic(self) -> object | None:
        """The target's build of the symbolic graph itself, when it serves every size."""
        try:
            exe = self._build(self.graph, self._dump)
        except CompileError as err:
            self._log.info("@%s: no symbolic build (%s); each size is built on its own",
                           self.graph.name, err)
            return None
        if not hasattr(exe, "run_bound") or getattr(exe, "symbols", None) != self.symbols:
            self._log.info("@%s: the target's build does not bind symbols; each size is "
                           "built on its own", self.graph.name)
            return None
        self._log.debug("@%s: one build serves every size of %s", self.graph.name,
                        ", ".join(map(str, self.symbols)))
        return exe

    @property
    def kernel_specializations(self) -> int:
        """Kernels a symbolic build compiled for one size (kinds without runtime extents)."""
        return getattr(self.symbolic, "kernel_specializations", 0)

    def __repr__(self) -> str:
        return (f"DynamicExecutable(@{self.graph.name}: symbols "
                f"{', '.join(map(str, self.symbols))}; {len(self._specialized)} sizes built)")

    @property
    def sizes(self) -> list[dict[str, int]]:
        """The bindings with a specialisation (or, with the symbolic build, a prepared arena
        and launcher) now, oldest first."""
        keys = self._specialized if self.symbolic is None else \
            self.symbolic.bindings  # type: ignore[attr-defined]
        return [dict(zip((s.name for s in self.symbols), key)) for key in keys]

    def specialization(self, arrays: Sequence[np.ndarray]) -> object:
        """The static executable that a call with ``arrays`` runs (built if needed)."""
        sizes = self.bind(arrays)
        if self.symbolic is not None:
            return self.symbolic.for_sizes(sizes)  # type: ignore[attr-defined]
        found = self._specialized.get(sizes)
        return found if found is not None else self._specialize(sizes)

    def bind(self, arrays: Sequence[np.ndarray]) -> tuple[int, ...]:
        """Each symbol's size in this call; SymbolConflict when one symbol meets two sizes."""
        return self._signature.bind(arrays)

    def run_trusted(self, arrays: Sequence[np.ndarray]) -> list[np.ndarray]:
        """A call whose caller has checked count, dtypes, ranks, static dims and C order."""
        sizes = self.bind(arrays)
        if self.symbolic is not None:
            return self.symbolic.run_bound(arrays, sizes)  # type: ignore[attr-defined]
        exe = self._specialized.get(sizes)
        if exe is None:
            exe = self._specialize(sizes)
        return exe.run_trusted(arrays)  # type: ignore[attr-defined]

    def __call__(self, *arrays: np.ndarray) -> list[np.ndarray]:
        self.check(arrays)
        return self.run_trusted([np.ascontiguousarray(a) for a in arrays])

    def check(self, arrays: Sequence[np.ndarray]) -> None:
        """GuardError unless count, dtypes, ranks and static dims are the graph's."""
        self._signature.check(arrays)

    # ------------------------------------------------------------------ specialisation
    def _specialize(self, sizes: tuple[int, ...]) -> object:
        with self._lock:
            found = self._specialized.get(sizes)
            if found is not None:
                return found
            binding = dict(zip(self.symbols, sizes))
            shown = ", ".join(f"{s}={n}" for s, n in binding.items())
            types = [TensorType(tuple(binding.get(d, d) for d in t.shape), t.dtype)
                     for _, t in self._signature.inputs]
            try:
                static = specialize(self.graph, types)
            except TilefuseError as err:
                raise SymbolGuardError(f"@{self.graph.name}: the sizes {shown} break a "
                                       f"constraint of the graph: {err}") from None
            self._log.debug("@%s: building the specialisation for %s (%d built so far)",
                            self.graph.name, shown, self.specializations)
            where = None if self._dump is None else \
                self._dump / ("size-" + "-".join(map(str, sizes)))
            exe = self._build(self._optimize(static), where)
            self.specializations += 1
            self._specialized[sizes] = exe
            while len(self._specialized) > self._max_sizes:
                dropped, _ = self._specialized.popitem(last=False)
                self._log.debug("@%s: dropping the specialisation for %s (keeping %d)",
                                self.graph.name, dropped, self._max_sizes)
            return exe


__all__ = ["DEFAULT_MAX_SIZES", "DynamicExecutable", "SymbolBinder", "SymbolConflict",
           "SymbolGuardError", "is_symbolic", "symbols_of"]
