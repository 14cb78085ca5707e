"""What code is built for: one :class:`Target` from the user's string to every cache key.

``Target.parse`` takes the spellings users write and ``str`` gives them back (``str(
Target.parse(s)) == s`` for every canonical ``s``)::

    cpu           the machine this process runs on (its LLVM CPU name and features)
    x86-64-v3     any x86-64 CPU with AVX2 and FMA (no AVX-512: the code has no zmm registers)
    x86-64-v4     any x86-64 CPU with AVX-512 (F, BW, CD, DQ, VL)
    cuda          the NVIDIA GPU found when the executable is built (its compute capability)
    cuda:sm_90    Hopper (H100, H200); cuda:sm_80: Ampere (A100)
    reference     the reference interpreter (no code generated)

A Target is frozen and hashable, so it is part of cache keys as it is. The code generators'
own descriptions are derived from it on demand (:meth:`Target.llvm_cpu`,
:meth:`Target.schedule_cpu`, :meth:`Target.gpu`); this module imports neither LLVM nor NumPy,
so parsing a target costs nothing at import time.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from tilefuse.errors import CompileError

if TYPE_CHECKING:
    from tilefuse.codegen.llvm_nvptx import GpuTarget
    from tilefuse.codegen.target import CpuTarget
    from tilefuse.kernel.schedule import CpuTarget as ScheduleCpu


class TargetError(CompileError):
    """A target string tilefuse does not know (the message names it and the known ones)."""


_BASELINE = ("cmov", "cx8", "fxsr", "mmx", "sse", "sse2", "64bit")
_V2 = (*_BASELINE, "cx16", "sahf", "popcnt", "sse3", "sse4.1", "sse4.2", "ssse3")
_V3 = (*_V2, "avx", "avx2", "bmi", "bmi2", "f16c", "fma", "lzcnt", "movbe", "xsave")
_V4 = (*_V3, "avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl")

X86_LEVELS: dict[str, tuple[str, ...]] = {"x86-64-v2": _V2, "x86-64-v3": _V3, "x86-64-v4": _V4}
"""The x86-64 micro-architecture levels (the psABI's), as LLVM feature names."""

CUDA_ARCHS = ("sm_80", "sm_90")
"""The compute capabilities the PTX back end is built and tested for."""

_CUDA = re.compile(r"cuda(?::(sm_\d+))?")
_KNOWN = ("cpu", *X86_LEVELS, "cuda", *(f"cuda:{a}" for a in CUDA_ARCHS), "reference")


@dataclass(frozen=True)
class Target:
    """A build target: ``kind`` is "cpu", "cuda" or "reference"; ``name`` is the CPU level
    ("host" for this machine) or the GPU's compute capability ("" for the device found at
    build time, and for the reference)."""

    kind: str
    name: str = ""

    @classmethod
    def parse(cls, text: str | Target) -> Target:
        """The target ``text`` names (a Target is returned as it is); TargetError, naming
        ``text`` and the known spellings, for anything else."""
        if isinstance(text, Target):
            return text
        if not isinstance(text, str):
            raise TargetError(f"a target is a string such as 'cpu' or 'cuda:sm_90', got "
                              f"{type(text).__name__} {text!r}")
        spelled = text.strip().lower()
        if spelled == "cpu":
            return cls("cpu", "host")
        if spelled in X86_LEVELS:
            return cls("cpu", spelled)
        if spelled == "reference":
            return cls("reference")
        match = _CUDA.fullmatch(spelled)
        if match is not None and (match[1] is None or match[1] in CUDA_ARCHS):
            return cls("cuda", match[1] or "")
        raise TargetError(f"unknown target {text!r}; known targets: " + ", ".join(_KNOWN))

    def __str__(self) -> str:
        if self.kind == "cpu":
            return "cpu" if self.name == "host" else self.name
        if self.kind == "cuda":
            return f"cuda:{self.name}" if self.name else "cuda"
        return self.kind

    def __repr__(self) -> str:
        return f"Target({str(self)!r})"

    # ---- what it is ------------------------------------------------------------------------
    @property
    def is_cpu(self) -> bool:
        return self.kind == "cpu"

    @property
    def is_cuda(self) -> bool:
        return self.kind == "cuda"

    @property
    def is_host(self) -> bool:
        """The CPU this process runs on (code may use every feature it has)."""
        return self.kind == "cpu" and self.name == "host"

    def features(self) -> frozenset[str]:
        """The CPU features code built for this target may use (LLVM names, such as
        ``avx512f``); the host's are asked of LLVM. Empty for the other kinds."""
        if not self.is_cpu:
            return frozenset()
        if self.is_host:
            flags = self.llvm_cpu().features.split(",")
            return frozenset(f[1:] for f in flags if f.startswith("+"))
        return frozenset(X86_LEVELS[self.name])

    def missing_features(self, host: Target | None = None) -> list[str]:
        """The features this target's code may use that ``host`` (default: this machine)
        lacks, sorted; empty when its code runs there."""
        have = (host or Target("cpu", "host")).features()
        return sorted(self.features() - have)

    # ---- the code generators' descriptions ------------------------------------------------
    def llvm_cpu(self) -> CpuTarget:
        """The LLVM triple, CPU and feature string (``codegen.target.CpuTarget``) of a CPU
        target; imports LLVM."""
        from tilefuse.codegen.target import CpuTarget, host_target

        self._expect("cpu")
        host = host_target()
        if self.is_host:
            return host
        if not host.triple.startswith("x86_64"):
            raise TargetError(f"target {self} is x86-64; cross-building from {host.triple} "
                              "is not supported")
        return CpuTarget(host.triple, self.name, ",".join(f"+{f}" for f in X86_LEVELS[self.name]))

    def schedule_cpu(self, cores: int | None = None) -> ScheduleCpu:
        """The default schedule rule's view of a CPU target: vector width and threads."""
        from tilefuse.kernel.schedule import CpuTarget as ScheduleCpu

        self._expect("cpu")
        bits = self.llvm_cpu().vector_bits
        return ScheduleCpu(bits, cores) if cores is not None else ScheduleCpu(bits)

    def gpu(self, arch: str | None = None) -> GpuTarget:
        """The PTX back end's ``GpuTarget`` of a cuda target; ``arch`` is the device's compute
        capability, used when the target names none ("cuda")."""
        from tilefuse.codegen.llvm_nvptx import GpuTarget

        self._expect("cuda")
        return GpuTarget(arch=self.name or arch or "sm_90")

    def _expect(self, kind: str) -> None:
        if self.kind != kind:
            raise TargetError(f"target {self} is not a {kind} target")


HOST = Target("cpu", "host")
"""``Target.parse("cpu")``: the machine this process runs on."""


def as_target(target: Any) -> Target:
    """``target`` (a string or a Target) as a Target; TargetError naming it when unknown."""
    return Target.parse(target)


__all__ = ["CUDA_ARCHS", "HOST", "X86_LEVELS", "Target", "TargetError", "as_target"]
