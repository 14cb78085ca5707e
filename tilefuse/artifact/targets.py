"""CPU targets an artifact can be built for, and the check that this host can run one.

``"cpu"`` (or ``"host"``) is this machine. ``"x86-64-v2"``, ``"x86-64-v3"`` (AVX2, FMA) and
``"x86-64-v4"`` (AVX-512) are the x86-64 micro-architecture levels as :mod:`tilefuse.target`
defines them (LLVM's CPU of that name with the level's features), so that code built on an
AVX-512 host for v3 uses no AVX-512 instruction (no zmm register).
"""

from __future__ import annotations

import os

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


CPUINFO_NAMES = {
    "64bit": "lm", "avx512bf16": "avx512_bf16", "avx512bitalg": "avx512_bitalg",
    "avx512vbmi2": "avx512_vbmi2", "avx512vnni": "avx512_vnni",
    "avx512vp2intersect": "avx512_vp2intersect", "avx512vpopcntdq": "avx512_vpopcntdq",
    "avx512fp16": "avx512_fp16", "avxvnni": "avx_vnni", "bmi": "bmi1", "crc32": "sse4_2",
    "lzcnt": "abm", "pclmul": "pclmulqdq", "prfchw": "3dnowprefetch", "rdrnd": "rdrand",
    "sahf": "lahf_lm", "sha": "sha_ni", "sse3": "pni", "sse4.1": "sse4_1",
    "sse4.2": "sse4_2", "cx16": "cx16", "amx-tile": "amx_tile", "amx-int8": "amx_int8",
    "amx-bf16": "amx_bf16"}
"""LLVM's x86 feature names that Linux's /proc/cpuinfo spells otherwise (the rest agree)."""

NOT_GENERATED = frozenset({"rdseed", "rdrnd", "shstk", "rdpid", "clzero", "clflushopt", "clwb",
                           "invpcid", "fsgsbase", "sgx", "ptwrite", "waitpkg", "uintr",
                           "serialize", "wbnoinvd", "pconfig", "movdiri", "movdir64b",
                           "cldemote", "hreset", "enqcmd", "rtm", "xsaves", "xsavec",
                           "xsaveopt", "pku", "rdpru", "mwaitx", "tsxldtrk", "kl", "widekl"})
"""Features whose instructions LLVM emits only for intrinsics tilefuse never calls (hypervisors
often hide some of them, such as rdseed and shstk, from /proc/cpuinfo)."""


def runs_here_by_cpuinfo(target: CpuTarget) -> bool:
    """True when /proc/cpuinfo shows this host has every feature ``target``'s code may use,
    without loading LLVM; False when it cannot tell (no /proc/cpuinfo, a feature it does not
    list): the caller then asks LLVM (:func:`missing_features`), which names what is
    missing."""
    machine = os.uname().machine
    if target.triple.split("-")[0] not in (machine, "x86_64" if machine == "amd64" else machine):
        return False
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as file:
            text = file.read(1 << 16)
    except OSError:
        return False
    flags: set[str] = set()
    for line in text.splitlines():
        if line.startswith("flags") and ":" in line:
            flags = set(line.split(":", 1)[1].split())
            break
    wanted = {f[1:] for f in target.features.split(",") if f.startswith("+")}
    return bool(flags) and all(f in NOT_GENERATED or CPUINFO_NAMES.get(f, f) in flags
                               for f in wanted)
