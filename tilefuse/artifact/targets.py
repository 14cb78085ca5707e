"""CPU targets an artifact can be built for, and the check that this host can run one.

``"cpu"`` (or ``"host"``) is this machine. ``"x86-64-v2"``, ``"x86-64-v3"`` (AVX2, FMA) and
``"x86-64-v4"`` (AVX-512) are the x86-64 micro-architecture levels: LLVM's CPU of that name
with exactly the level's features enabled and every other feature LLVM knows disabled, so that
code built on an AVX-512 host for v3 uses no AVX-512 instruction (no zmm register).
"""

from __future__ import annotations

from tilefuse.codegen.target import CpuTarget, host_target
from tilefuse.errors import TilefuseError

_V1 = ("64bit", "cmov", "cx8", "fxsr", "mmx", "sse", "sse2")
_V2 = (*_V1, "cx16", "sahf", "popcnt", "sse3", "sse4.1", "sse4.2", "ssse3", "crc32")
_V3 = (*_V2, "avx", "avx2", "bmi", "bmi2", "f16c", "fma", "lzcnt", "movbe", "xsave")
_V4 = (*_V3, "avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl")
LEVELS = {"x86-64-v2": _V2, "x86-64-v3": _V3, "x86-64-v4": _V4}
NAMES = ("cpu", *LEVELS)


def cpu_target(name: str) -> CpuTarget:
    """The :class:`CpuTarget` called ``name`` (see the module docstring); TilefuseError for
    another name."""
    host = host_target()
    if name in ("cpu", "host"):
        return host
    level = LEVELS.get(name)
    if level is None:
        raise TilefuseError(f"unknown artifact target {name!r}; known: {', '.join(NAMES)}")
    if not host.triple.startswith("x86_64"):
        raise TilefuseError(f"target {name} needs an x86-64 host to build on, not {host.triple}")
    known = [f[1:] for f in host.features.split(",") if f[:1] in "+-" and len(f) > 1]
    wanted = set(level)
    features = [f"+{f}" for f in level] + [f"-{f}" for f in known if f not in wanted]
    return CpuTarget(host.triple, name, ",".join(features))


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
