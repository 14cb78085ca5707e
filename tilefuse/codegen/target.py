"""The CPU target: LLVM initialisation (once), the host's triple, CPU and features, and
target machines at opt level 3."""

from __future__ import annotations

import functools
import os
from collections.abc import MutableMapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from tilefuse.errors import CompileError

if TYPE_CHECKING:
    import llvmlite.binding as llvm

_SYMBOLS: dict[str, int] = {}
"""Symbols defined by code linked outside LLVM (the thread pool's entry, linked from an
artifact by :mod:`tilefuse.runtime.object_link`), for code that LLVM links later."""


def register_symbol(name: str, address: int) -> None:
    """Makes ``name`` resolve to ``address`` for object code linked from now on, by LLVM
    (now if LLVM is loaded, else when it is) or by :mod:`tilefuse.runtime.object_link`."""
    _SYMBOLS[name] = address
    if initialise_llvm.cache_info().currsize:
        import llvmlite.binding as llvm

        llvm.add_symbol(name, address)


def registered_symbols() -> dict[str, int]:
    """The symbols :func:`register_symbol` has defined."""
    return dict(_SYMBOLS)


@functools.cache
def initialise_llvm() -> None:
    """Initialises LLVM's native target and asm printer (once per process; LLVM is imported
    here, on first use) and gives it the symbols :func:`register_symbol` defined."""
    import llvmlite.binding as llvm

    llvm.initialize_native_target()
    llvm.initialize_native_asmprinter()
    llvm.initialize_native_asmparser()
    for name, address in _SYMBOLS.items():
        llvm.add_symbol(name, address)


SPIN_COUNT = 3000
"""``GOMP_SPINCOUNT`` for the OpenMP runtimes of other libraries in a tilefuse process (torch's
libgomp, in benchmarks and ``tilefuse bench``), set when the user has set neither it nor
``OMP_WAIT_POLICY``: libgomp's default spin (about a millisecond) keeps a core busy after every
torch call, which slows whatever runs next on a small machine. tilefuse's own kernels run on
:mod:`tilefuse.codegen.pool`, which does not read it."""


def usable_cpus() -> int:
    """The CPUs this process may run on (its affinity mask; the CPU count where there is
    none)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def quiet_openmp_waits(env: MutableMapping[str, str] | None = None) -> None:
    """Sets ``GOMP_SPINCOUNT`` to :data:`SPIN_COUNT` in ``env`` (the process environment) unless
    the user chose a wait policy; it takes effect for a libgomp loaded after this call."""
    env = os.environ if env is None else env
    if "GOMP_SPINCOUNT" not in env and "OMP_WAIT_POLICY" not in env:
        env["GOMP_SPINCOUNT"] = str(SPIN_COUNT)


@dataclass(frozen=True)
class CpuTarget:
    """What code is generated for: an LLVM triple, CPU name and feature string."""

    triple: str
    cpu: str
    features: str

    def has(self, feature: str) -> bool:
        """Whether the target has ``feature`` (``"avx512f"``, ``"fma"``, ...)."""
        return f"+{feature}" in self.features.split(",")

    @property
    def vector_bits(self) -> int:
        """The widest vector registers: 512 with AVX-512, 256 with AVX, else 128."""
        if self.has("avx512f"):
            return 512
        return 256 if self.has("avx") else 128

    def vector_lanes(self, itemsize: int) -> int:
        """How many elements of ``itemsize`` bytes fill one vector register."""
        return max(1, self.vector_bits // (8 * itemsize))

    def __str__(self) -> str:
        return f"{self.triple}/{self.cpu}"


def host_target() -> CpuTarget:
    """The machine this process runs on."""
    import llvmlite.binding as llvm

    initialise_llvm()
    return CpuTarget(llvm.get_process_triple(), llvm.get_host_cpu_name(),
                     llvm.get_host_cpu_features().flatten())


def target_machine(target: CpuTarget) -> llvm.TargetMachine:
    """An LLVM target machine for ``target`` at opt level 3 (JIT code model)."""
    import llvmlite.binding as llvm

    initialise_llvm()
    try:
        return llvm.Target.from_triple(target.triple).create_target_machine(
            cpu=target.cpu, features=target.features, opt=3, jit=True)
    except RuntimeError as exc:
        raise CompileError(f"no LLVM target machine for {target}: {exc}") from exc


def link_objects(objects: Sequence[bytes], target: CpuTarget) -> llvm.ExecutionEngine:
    """An MCJIT engine holding ``objects`` (relocatable object code for ``target``) linked
    together. Each engine gets a target machine of its own: an engine owns and frees it, and
    two engines sharing one crashed when freed. RuntimeError from LLVM when they do not link;
    callers name what was being linked."""
    import llvmlite.binding as llvm

    empty = llvm.parse_assembly("")
    empty.triple = target.triple
    engine = llvm.create_mcjit_compiler(empty, target_machine(target))
    for obj in objects:
        engine.add_object_file(llvm.ObjectFileRef.from_data(obj))
    engine.finalize_object()
    return engine
