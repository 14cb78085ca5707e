"""CPU targets an artifact can be built for, and the check that this host can run one.

``"cpu"`` (or ``"host"``) is this machine. ``"x86-64-v2"``, ``"x86-64-v3"`` (AVX2, FMA) and
``"x86-64-v4"`` (AVX-512) are the x86-64 micro-architecture levels as :mod:`tilefuse.target`
defines them (LLVM's CPU of that name with the level's features), so that code built on an
AVX-512 host for v3 uses no AVX-512 instruction (no zmm register).
"""

from __future__ import annotations

from tilefuse.codegen.target import CpuTarget, host_target
from tilefuse.target import X86_LEVELS, Target

NAMES = ("cpu", *X86_LEVELS)


def cpu_target(name: str) -> CpuTarget:
    """The LLVM description of the CPU target called ``name`` (``"host"`` is ``"cpu"``): the
    one :class:`~tilefuse.target.Target` defines, so an artifact's kernels are the ones
    ``tilefuse.jit(target=name)`` builds. TargetError (a TilefuseError) for another name."""
    return Target.parse("cpu" if name == "host" else name).llvm_cpu()


def target_name(target: CpuTarget) -> str:
    """``target``'s short name: its level, or ``cpu`` for this host's, else its CPU."""
    if target == host_target():
        return "cpu"
    return target.cpu


def missing_features(target: CpuTarget, host: CpuTarget | None = None) -> list[str]:
    """The features ``target``'s code may use that ``host`` (default: this machine) lacks."""
    host = host or host_target()
    has = {f[1:] for f in host.features.split(",") if f.startswith("+")}
    return sorted({f[1:] for f in target.features.split(",")
                   if f.startswith("+") and f[1:] not in has})
