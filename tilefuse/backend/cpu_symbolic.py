"""The native CPU executable of a graph with symbolic dims: one build for every size.

The build (:class:`SymbolicNativeExecutable`) runs once on the symbolic graph: it takes the
driver's kernel plan, folds constant groups, and lowers every group whose kind takes runtime
extents (:data:`~tilefuse.backend.cpu.SYMBOLIC_KINDS`) with each symbol as an ``i64`` scalar
parameter ``dim_<symbol>`` of the kernel; those kernels are compiled once.

A call binds each symbol from the input shapes (:class:`SymbolConflict` when one symbol meets
two sizes) and looks the binding up. The first call with a binding (memoised, the oldest of
``max_sizes`` dropped):

1. specialises the graph's types to the sizes (the graph's own constraints, such as a symbol
   broadcast against ``n > 1`` being 1 or ``n``: :class:`SymbolGuardError`);
2. lowers and compiles, for those sizes, the groups whose kind has no runtime-extent lowering
   yet (a *kernel specialisation*, logged on ``recompiles``; the disk kernel cache serves sizes
   any process compiled before);
3. plans the arena for the sizes (placement only, no code generation) and compiles the small
   whole-sequence launcher, which passes the sizes to the kernels as their scalars.

All of this happens before any native code runs with the new sizes, so generated code never
sees a shape it was not built for. (It lives with the back end, not in ``runtime/``, because a
new size binding lowers and compiles.)
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from tilefuse.backend.cpu import BuiltKernel, CpuBuild, PendingGroup, assemble, bound_shape
from tilefuse.codegen.target import CpuTarget, host_target
from tilefuse.errors import CompileError, TilefuseError
from tilefuse.graph.ir import Graph, Node, Value
from tilefuse.graph.types import Sym, TensorType
from tilefuse.kernel.fusion import KernelGroup, KernelPlan
from tilefuse.log import get_logger
from tilefuse.passes.shape_infer import specialize
from tilefuse.runtime.dynamic import SymbolBinder, SymbolGuardError, symbols_of
from tilefuse.runtime.kernel_cache import KernelCache, KernelCacheStats
from tilefuse.runtime.native import NativeExecutable
from tilefuse.runtime.schedules import ScheduleSource

DEFAULT_MAX_SIZES = 64
"""Size bindings whose arena, launcher and per-size kernels are kept."""


class SymbolicNativeExecutable:
    """A graph with symbolic input dims compiled once for this CPU (see the module docstring).

    ``executable(*arrays)`` checks and runs; ``run_bound(arrays, sizes)`` is the call for a
    caller that has already bound the symbols (``sizes`` in the order of :attr:`symbols`) and
    checked dtypes, ranks, static dims and C order. ``kernel_specializations`` counts the
    per-size kernel builds, ``sizes_built`` the bindings prepared."""

    def __init__(self, graph: Graph, dump_dir: Path | str | None = None, *,
                 target: CpuTarget | None = None, cache: KernelCache | None = None,
                 max_sizes: int = DEFAULT_MAX_SIZES, schedules: ScheduleSource | None = None,
                 plan: KernelPlan | None = None):
        target = target or host_target()
        self.graph = graph
        self.symbols: tuple[Sym, ...] = symbols_of(graph)
        self._builder = CpuBuild(graph, target, cache or KernelCache.from_env(target),
                                 schedules, symbolic=True, plan=plan)
        self._signature = SymbolBinder.of(graph)
        self._sized: OrderedDict[tuple[int, ...], NativeExecutable] = OrderedDict()
        self._max_sizes = max(1, int(max_sizes))
        self._lock = threading.Lock()
        self._log = get_logger("recompiles")
        self.kernel_specializations = 0
        """Kernels lowered and compiled for one size binding (kinds without runtime extents)."""
        self.sizes_built = 0
        """Size bindings prepared (arena planned, launcher made), evicted ones included."""
        if dump_dir is not None:
            self._dump(Path(dump_dir))

    def __repr__(self) -> str:
        return (f"SymbolicNativeExecutable(@{self.graph.name}: symbols "
                f"{', '.join(map(str, self.symbols))}; {len(self.runtime_extent_kernels)} "
                f"kernels with runtime extents, {len(self.per_size_groups)} groups per size)")

    @property
    def cache_stats(self) -> KernelCacheStats:
        """How many kernels were loaded from the disk cache, compiled (LLVM ran), stored, by
        this build so far (per-size kernels included)."""
        return self._builder.cache.stats

    @property
    def runtime_extent_kernels(self) -> list[str]:
        """Names of the kernels built once, with the symbols as runtime scalars."""
        return [k.fn.name for p in self._builder.pending if p.per_size is None
                for k in p.kernels if k.fn.scalars]

    @property
    def bindings(self) -> list[tuple[int, ...]]:
        """The size bindings prepared now (sizes in the order of :attr:`symbols`), oldest
        first."""
        return list(self._sized)

    @property
    def per_size_groups(self) -> list[tuple[str, str]]:
        """(group, reason) for every group whose kernels are built per size binding."""
        return [(p.group.name, p.per_size) for p in self._builder.pending if p.per_size]

    # ------------------------------------------------------------------ calls
    def __call__(self, *arrays: np.ndarray) -> list[np.ndarray]:
        self.check(arrays)
        arrays = tuple(np.ascontiguousarray(a) for a in arrays)
        return self.run_bound(arrays, self.bind(arrays))

    def run_trusted(self, arrays: Sequence[np.ndarray]) -> list[np.ndarray]:
        return self.run_bound(arrays, self.bind(arrays))

    def run_bound(self, arrays: Sequence[np.ndarray], sizes: tuple[int, ...]
                  ) -> list[np.ndarray]:
        exe = self._sized.get(sizes)
        if exe is None:
            exe = self.for_sizes(sizes)
        return exe.run_trusted(arrays)

    def bind(self, arrays: Sequence[np.ndarray]) -> tuple[int, ...]:
        """Each symbol's size in this call; SymbolConflict when one symbol meets two sizes."""
        return self._signature.bind(arrays)

    def check(self, arrays: Sequence[np.ndarray]) -> None:
        """GuardError unless count, dtypes, ranks and static dims are the graph's."""
        self._signature.check(arrays)

    # ------------------------------------------------------------------ per size binding
    def for_sizes(self, sizes: tuple[int, ...]) -> NativeExecutable:
        """The executable of one size binding (prepared on first sight, then memoised)."""
        with self._lock:
            found = self._sized.get(sizes)
            if found is not None:
                return found
            binding = dict(zip(self.symbols, sizes))
            if any(n < 0 for n in sizes):
                raise SymbolGuardError(f"@{self.graph.name}: negative size in {binding}")
            shown = ", ".join(f"{s}={n}" for s, n in binding.items())
            static = self._specialize(self.graph, binding, shown)
            pendings = self._pendings(binding, shown)
            exe = assemble(static, self._builder, pendings, binding)
            self.sizes_built += 1
            self._sized[sizes] = exe
            while len(self._sized) > self._max_sizes:
                self._sized.popitem(last=False)
            return exe

    def _specialize(self, graph: Graph, binding: Mapping[Sym, int], shown: str) -> Graph:
        types = [TensorType(bound_shape(v, binding), v.dtype) for v in graph.inputs]
        try:
            return specialize(graph, types)
        except TilefuseError as err:
            raise SymbolGuardError(f"@{self.graph.name}: the sizes {shown} break a constraint "
                                   f"of the graph: {err}") from None

    def _pendings(self, binding: Mapping[Sym, int], shown: str) -> list[PendingGroup]:
        """The build's groups for one binding: per-size groups lowered for it now."""
        build = self._builder
        if not self.per_size_groups:
            return build.pending
        static = self._specialize(build.graph, binding, shown)
        values, nodes = _correspondence(build.graph, static)
        for v, array in list(build.constants.items()):
            if v in values:
                build.constants.setdefault(values[v], array)
        made = []
        for pending in build.pending:
            if pending.per_size is None:
                made.append(pending)
                continue
            group = _specialize_group(pending.group, values, nodes, binding)
            lowered = build.lower(group)
            back = {new: old for old, new in values.items()}
            kernels = [BuiltKernel(k.fn, k.artifact, {name: back.get(b, b) if isinstance(b, Value)
                                                  else b for name, b in k.bindings.items()})
                       for k in lowered.kernels]
            self.kernel_specializations += len(kernels)
            self._log.info("@%s: kernel %s (%s) specialised for %s: %s", self.graph.name,
                           pending.group.name, pending.group.kind.value, shown,
                           pending.per_size)
            made.append(PendingGroup(pending.group, lowered.schedule, kernels, lowered.reason,
                                 pending.per_size, group))
        return made

    def _dump(self, directory: Path) -> None:
        from tilefuse.dump import DumpWriter

        writer = DumpWriter(directory)
        lines = [f"symbolic build of @{self.graph.name}: symbols "
                 + ", ".join(map(str, self.symbols)), ""]
        for pending in self._builder.pending:
            if pending.per_size:
                lines.append(f"  {pending.group.name}: per size ({pending.per_size})")
            else:
                names = ", ".join(k.fn.name for k in pending.kernels)
                lines.append(f"  {pending.group.name}: built once: {names}")
                for k in pending.kernels:
                    writer.write(f"kernels/{k.fn.name}.loop", str(k.fn))
        writer.write("kernels.plan", "\n".join(lines) + "\n")


def _correspondence(graph: Graph, static: Graph) -> tuple[dict[Value, Value], dict[Node, Node]]:
    """Values and nodes of ``graph`` → those of its specialisation (same nodes, same order)."""
    if len(graph.nodes) != len(static.nodes) or any(
            a.op is not b.op for a, b in zip(graph.nodes, static.nodes)):
        raise CompileError(f"@{graph.name}: its specialisation does not keep its nodes")
    values = dict(zip(graph.inputs, static.inputs))
    for a, b in zip(graph.nodes, static.nodes):
        values.update(zip(a.outputs, b.outputs))
    return values, dict(zip(graph.nodes, static.nodes))


def _specialize_group(group: KernelGroup, values: Mapping[Value, Value],
                      nodes: Mapping[Node, Node], binding: Mapping[Sym, int]) -> KernelGroup:
    return KernelGroup(group.name, group.kind, tuple(nodes[n] for n in group.nodes),
                       tuple(values[v] for v in group.inputs),
                       tuple(values[v] for v in group.outputs),
                       None if group.anchor is None else nodes[group.anchor],
                       tuple(binding.get(d, d) if isinstance(d, Sym) else d
                             for d in group.domain), group.roles)


__all__ = ["DEFAULT_MAX_SIZES", "SymbolicNativeExecutable"]
