"""The native CPU executable: compiled kernels, one arena, a launch list.

The CPU back end (:mod:`tilefuse.backend.cpu`) builds one from a kernel plan (lowering, code
generation, the memory plan, the launch sequence); an artifact (:mod:`tilefuse.artifact`) loads
one from a file. Either way it arrives here as :class:`ExecutableParts`: this module only
executes, and imports no compiler stage.

A call checks its inputs (count, dtype, shape, C order, alignment where a kernel needs it:
GuardError) before any native code runs, allocates the outputs (64-byte aligned), runs the
steps and returns the outputs: fresh arrays, never views of the arena, the inputs, the constants
or each other. Calls are serialised by a lock (the arena is shared).
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from tilefuse.codegen.abi import aligned_empty
from tilefuse.errors import GuardError, TilefuseError
from tilefuse.graph.ir import Graph, Node
from tilefuse.runtime.addresses import AddressCache
from tilefuse.runtime.cache_stats import KernelCacheStats
from tilefuse.runtime.launch import HostStep, NativeStep, Slot, Step
from tilefuse.runtime.memory import MemoryPlan

if TYPE_CHECKING:
    from tilefuse.backend.cpu_symbolic import SymbolicNativeExecutable
    from tilefuse.codegen.target import CpuTarget
    from tilefuse.kernel.fusion import KernelPlan
    from tilefuse.runtime.kernel_cache import KernelCache
    from tilefuse.runtime.schedules import ScheduleSource

@dataclass(frozen=True)
class ExecutableParts:
    """A built executable's parts: ``graph`` (its inputs and outputs give the call's
    signature), the memory plan and the arena it placed, the launch sequence (whose fixed slots
    are constants or views of ``arena``), input position -> alignment a kernel needs, and
    (output position, slot) for every output copied out after the steps."""

    graph: Graph
    memory_plan: MemoryPlan
    arena: np.ndarray
    steps: tuple[Step, ...]
    align: Mapping[int, int]
    copies: tuple[tuple[int, Slot], ...]


class NativeExecutable:
    """A graph compiled for this CPU (see the module docstring). ``executable(*arrays)``
    returns one fresh array per graph output.

    ``cache`` compiles the kernels (default: :meth:`KernelCache.from_env`, the disk cache the
    environment asks for); ``cache_stats`` says how many were loaded from disk (hits), compiled
    (misses) and stored. ``schedules`` picks each kernel's schedule (default: the tuning
    database, else the default rule; the fuzzer passes one that samples the search space)."""

    def __init__(self, graph: Graph, dump_dir: Path | str | None = None, *,
                 target: CpuTarget | None = None, cache: KernelCache | None = None,
                 schedules: ScheduleSource | None = None, plan: KernelPlan | None = None):
        """Builds ``graph`` through the CPU back end (:func:`tilefuse.backend.cpu.build_cpu`,
        imported here, on use: this module imports no compiler stage). The compile driver
        calls the back end itself; this constructor stays for callers that build one graph."""
        from tilefuse.backend.cpu import build_cpu

        built = build_cpu(graph, dump_dir, target=target, cache=cache, schedules=schedules,
                          plan=plan)
        self.__dict__.update(vars(built))
    def parts(self) -> ExecutableParts:
        """What :meth:`from_parts` rebuilds this executable from (for :mod:`tilefuse.artifact`,
        which writes them to a file)."""
        return ExecutableParts(self.graph, self.memory_plan, self._arena, self._steps,
                               dict(self._align), self._copies)

    @classmethod
    def from_parts(cls, parts: ExecutableParts, launcher: Callable[[Sequence[int]], None]
                   | None = None, *, cache_stats: KernelCacheStats | None = None,
                   kernel_plan: KernelPlan | None = None,
                   index_checks: Sequence[tuple[np.ndarray, Node]] = ()) -> NativeExecutable:
        """An executable of already compiled kernels, placed buffers and a launch sequence (the
        CPU back end's build, or an artifact being loaded): nothing is lowered or compiled
        here. ``launcher``, when given, runs the whole (all-native) sequence from the call's
        addresses; else each step is called in turn. ``cache_stats`` and ``kernel_plan`` say
        how it was built (None: loaded); ``index_checks`` are the gathers' bad-index records
        (:mod:`tilefuse.kernel.lower_gather`), checked after each call."""
        made = cls.__new__(cls)
        made.graph = parts.graph
        made.cache_stats = cache_stats or KernelCacheStats(0, 0, 0, None)
        """How many kernels were loaded from the disk cache, compiled, stored."""
        made.kernel_plan = kernel_plan
        """The kernel plan this executable was built from (None: loaded from an artifact)."""
        made.memory_plan, made._arena = parts.memory_plan, parts.arena
        made._steps, made._align = tuple(parts.steps), dict(parts.align)
        made._copies = tuple(parts.copies)
        made._finish(launcher)
        made._index_checks = tuple(index_checks)
        return made

    def _finish(self, launcher: Callable[[Sequence[int]], None] | None) -> None:
        """The call's tables, from the graph's signature and the steps."""
        graph = self.graph
        self._inputs = tuple((v.name or f"#{i}", tuple(v.shape), v.dtype.np)
                             for i, v in enumerate(graph.inputs))
        self._outputs = tuple((tuple(v.shape), v.dtype.np) for v in graph.outputs)
        self._addresses = AddressCache(len(graph.inputs))   # the inputs' last data addresses
        self._returned: list[np.ndarray | None] = [None] * len(self._outputs)
        self._returned_at: list[int] = [0] * len(self._outputs)   # their data addresses
        self._strides = tuple(_c_strides(shape, np.dtype(dtype).itemsize)
                              for _, shape, dtype in self._inputs)
        # Native steps take the call's buffers by address (computed once per call); host
        # fallbacks take the arrays.
        self._runners = tuple((step.run_addresses, True) if isinstance(step, NativeStep)
                              else (step.run, False) for step in self._steps)
        # With no host step, the whole sequence is one native entry (one Python→native call).
        self._launcher = launcher
        self._index_checks: tuple[tuple[np.ndarray, Node], ...] = ()
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        native = sum(isinstance(s, NativeStep) for s in self._steps)
        return (f"NativeExecutable(@{self.graph.name}: {native} native steps, "
                f"{len(self._steps) - native} host steps, arena {self.memory_plan.arena_bytes} "
                "bytes)")

    @property
    def single_entry(self) -> bool:
        """True when a call runs the whole launch sequence through one native entry."""
        return self._launcher is not None

    @property
    def steps(self) -> tuple[Step, ...]:
        """The launch sequence."""
        return self._steps

    @property
    def fallbacks(self) -> list[tuple[str, str]]:
        """(kernel name, reason) of every step that runs on the host."""
        return [(s.name, s.reason) for s in self._steps if isinstance(s, HostStep)]

    @property
    def arena(self) -> np.ndarray:
        """The intermediates' buffer (a read-only view, for tests and tools)."""
        view = self._arena.view()
        view.flags.writeable = False
        return view

    def __call__(self, *arrays: np.ndarray) -> list[np.ndarray]:
        self._check(arrays)
        return self._run(arrays)

    def run_trusted(self, arrays: Sequence[np.ndarray]) -> list[np.ndarray]:
        """The call for a caller whose own guard already proved count, dtypes, shapes and
        C-contiguity (``tilefuse.jit``: its cache key holds the shapes and dtypes, and it makes
        every argument contiguous); only alignment, which no key holds, is checked here."""
        addresses = self._addresses.addresses(arrays)
        for i, align in self._align.items():
            if addresses[i] % align:
                raise GuardError(f"input {self._inputs[i][0]} must be {align}-byte aligned")
        return self._run(arrays, addresses)

    def run_args(self, args: Sequence[object]) -> list[np.ndarray]:
        """The call for ``tilefuse.jit``'s fast path: its cache key proved count, dtypes and
        shapes of ``args`` (arrays, or what NumPy makes arrays of); contiguity (a copy where
        needed) and alignment are checked here, in the same pass that reads the addresses."""
        arrays, addresses = self._addresses.contiguous(args)
        if self._align:
            for i, align in self._align.items():
                if addresses[i] % align:
                    raise GuardError(f"input {self._inputs[i][0]} must be {align}-byte aligned")
        launcher = self._launcher
        if launcher is None or self._copies or self._index_checks:
            return self._run(arrays, addresses)
        with self._lock:   # _run's steps for one native entry and nothing after it
            count = len(self._outputs)
            outputs = [self._output(0)] if count == 1 else [self._output(j) for j in range(count)]
            launcher(addresses + self._returned_at)
            self._returned[:] = outputs
        return outputs

    def fast_call(self) -> Callable[..., np.ndarray] | None:
        """``run_args(args)[0]`` as one native builtin taking the arrays positionally
        (:mod:`tilefuse.runtime.fastcall`: ~0.3 µs where the Python step takes ~1.2), for a
        one-output executable run by one native entry, with small inputs and output (a
        gather's bad index: the Python step runs the call again and raises); None
        when it does not qualify (or ``TILEFUSE_FAST_CALL=0``)."""
        from tilefuse.runtime import fastcall

        entry = getattr(self._launcher, "_entry", None)
        size = sum(int(np.prod(shape)) * np.dtype(dtype).itemsize
                   for _, shape, dtype in self._inputs) + \
            sum(int(np.prod(shape)) * np.dtype(dtype).itemsize for shape, dtype in self._outputs)
        if entry is None or self._copies or len(self._outputs) != 1 \
                or size > fastcall.MAX_BYTES or not fastcall.enabled():
            return None
        import ctypes

        return fastcall.build_fast_call(
            [(shape, dtype) for _, shape, dtype in self._inputs], self._outputs[0],
            dict(self._align), self._returned, self._lock,
            ctypes.cast(entry, ctypes.c_void_p).value or 0,
            lambda *args: self.run_args(args)[0], keep=(self._launcher,),
            checks=[flags for flags, _ in self._index_checks])

    def run_into(self, arrays: Sequence[np.ndarray], into: Mapping[int, np.ndarray]
                 ) -> list[np.ndarray]:
        """A call whose output ``j`` is written into ``into[j]`` (a C-contiguous array of its
        shape and dtype) rather than a buffer of the executable's. ``into[j]`` may be an
        input's memory only where the caller proved that no kernel reads that input after
        (or at another element than) the write (:mod:`tilefuse.frontend.torch.inplace`: an
        optimizer step's state updated in place)."""
        self._check(arrays)
        for j, out in into.items():
            shape, dtype = self._outputs[j]
            if type(out) is not np.ndarray or out.dtype != dtype or out.shape != shape \
                    or not out.flags.c_contiguous or not out.flags.writeable:
                raise GuardError(f"@{self.graph.name}: output {j} must go to a writable "
                                 f"C-contiguous {np.dtype(dtype)}{list(shape)} array, got "
                                 f"{_describe(out)}")
        return self._run(arrays, into=into)

    def _run(self, arrays: Sequence[np.ndarray], given: list[int] | None = None,
             into: Mapping[int, np.ndarray] | None = None) -> list[np.ndarray]:
        """``given``: the arrays' addresses, when the caller has them already; ``into``: see
        :meth:`run_into`."""
        with self._lock:
            outputs = [self._output(j) if not into or j not in into else into[j]
                       for j in range(len(self._outputs))]
            table = [*arrays, *outputs]
            returned_at = self._returned_at if not into else \
                [into[j].ctypes.data if j in into else a for j, a in enumerate(self._returned_at)]
            addresses = (given if given is not None else self._addresses.addresses(arrays)) \
                + returned_at
            if self._launcher is not None:
                self._launcher(addresses)
            else:
                for run, native in self._runners:
                    run(addresses if native else table)
            for flags, node in self._index_checks:
                if flags[0]:  # an index out of range: clamped, so nothing was harmed
                    from tilefuse.kernel.lower_gather import index_error

                    bad = int(flags[1])
                    flags[:] = 0
                    raise index_error(node, bad)
            for j, slot in self._copies:
                outputs[j][...] = table[slot] if isinstance(slot, int) else slot  # type: ignore[index]
            self._returned[:] = outputs
            for j in into or ():
                self._returned[j] = None   # the caller's array: never reused as ours
        return outputs

    def forget_outputs(self) -> int:
        """Drops this executable's references to the buffers it returned last, so that each is
        freed once its caller releases it rather than kept for the next call; returns the bytes
        of those no one else held (freed now). A training step calls it after each half: an
        output the step released early (the logits once the loss's backward read them) would
        otherwise stay resident through the rest of the step."""
        freed = 0
        with self._lock:
            for j in range(len(self._returned)):
                last = self._returned[j]
                if last is not None and _released(last):
                    freed += last.nbytes
                self._returned[j] = None
        return freed

    def _output(self, j: int) -> np.ndarray:
        """Output ``j``'s buffer: the one returned last time when the caller has released it
        (nothing but this executable refers to it, not even a view), else a fresh one; its
        address goes to ``_returned_at[j]``.

        A fresh 64 MiB array costs ~15 ms of page faults here, far more than most kernels;
        reusing a released one costs nothing and is safe, since no one can observe it.
        """
        last = self._returned[j]
        if last is not None and _released(last):
            return last
        shape, dtype = self._outputs[j]
        try:
            fresh = aligned_empty(shape, dtype)
        except MemoryError:
            raise TilefuseError(f"@{self.graph.name}: out of memory allocating output {j} "
                                f"({np.dtype(dtype)}{list(shape)})") from None
        self._returned_at[j] = fresh.ctypes.data
        return fresh

    def _check(self, arrays: Sequence[np.ndarray]) -> None:
        """GuardError unless the arrays are exactly what the kernels were compiled for."""
        if len(arrays) != len(self._inputs):
            raise GuardError(f"@{self.graph.name} takes {len(self._inputs)} inputs, "
                             f"got {len(arrays)}")
        for i, (array, (name, shape, dtype), strides) in enumerate(
                zip(arrays, self._inputs, self._strides)):
            if type(array) is not np.ndarray or array.dtype != dtype or array.shape != shape \
                    or (array.strides != strides and not array.flags.c_contiguous):
                raise GuardError(f"input {name} must be a C-contiguous {dtype}{list(shape)} "
                                 f"array, got {_describe(array)}")
            align = self._align.get(i)
            if align and array.ctypes.data % align:
                raise GuardError(f"input {name} must be {align}-byte aligned")


def _c_strides(shape: tuple[int, ...], itemsize: int) -> tuple[int, ...]:
    """The strides NumPy gives a fresh C-ordered array of ``shape`` (the guard's fast path;
    other strides of a C-contiguous array, on size-1 or empty axes, take the slow check)."""
    return np.empty(shape, np.dtype(f"V{itemsize}")).strides


def _released(array: np.ndarray) -> bool:
    """True when nothing outside the caller's frames refers to ``array`` or its memory.

    The counts are: the executable's list slot (or ``.base`` of ``array``), the local name here,
    and getrefcount's own argument. A view of ``array`` anywhere refers to the same base (NumPy
    collapses base chains), which raises the base's count.
    """
    base = array.base
    return sys.getrefcount(array) == 4 and (base is None or sys.getrefcount(base) == 3)


def _describe(array: object) -> str:
    if not isinstance(array, np.ndarray):
        return type(array).__name__
    order = "" if array.flags.c_contiguous else " (not C-contiguous)"
    return f"{array.dtype}{list(array.shape)}{order}"


def build_native(graph: Graph, dump_dir: Path | str | None = None
                 ) -> NativeExecutable | SymbolicNativeExecutable:
    """The native CPU executable of ``graph`` through the compile driver (target "cpu"): with
    symbolic input dims, one :class:`~tilefuse.backend.cpu_symbolic.SymbolicNativeExecutable`
    serving every size."""
    from tilefuse.driver import CompileOptions, build

    return build(graph, "cpu", CompileOptions(dump_dir=dump_dir))  # type: ignore[return-value]
