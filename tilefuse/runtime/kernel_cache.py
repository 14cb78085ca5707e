"""Compiled kernels kept on disk: what the native executable looks up before it runs LLVM.

:class:`KernelCache` wraps one :class:`~tilefuse.runtime.disk_cache.CacheDir` (or none, when
the disk cache is off or its directory is refused). :meth:`KernelCache.compile` keys a kernel
by named parts, so that a miss can say which part changed:

- ``function``: ``<graph>/<kernel>``, a label (and what :meth:`CacheDir.explain_miss` groups by);
- ``loop_ir``: the kernel's loop IR text, which determines the code (it embeds the group's
  nodes, shapes, dtypes and the schedule's tiling);
- ``schedule``: the schedule's JSON;
- ``target_triple``, ``target_cpu``, ``target_features``: what the code was made for;
- ``tilefuse_version``; ``llvm_version`` (llvmlite's and LLVM's);
- ``codegen``: the sha256 of the :mod:`tilefuse.codegen` sources, which turn loop IR into LLVM
  IR and optimise it: the version number alone does not change while they are edited.

Within one build, a kernel whose loop IR is another's but for its name runs the other's code
(:attr:`KernelArtifact.shared_with`): nothing is compiled or looked up for it. A hit loads the
stored object code (:func:`~tilefuse.codegen.jit.kernel_from_bytes`: checked
digest, target and ELF) and runs no LLVM optimisation or code generation. A miss compiles
(:func:`~tilefuse.codegen.jit.compile_kernel`) and stores the kernel. Anything wrong on disk (a
corrupt entry, one made for another target, a signature that does not match) is a miss with a
warning on the ``cache`` topic, and the entry is overwritten; a refused directory is one warning
and no disk cache; a failed write is one warning and no more writes. Nothing here raises for
what is on disk.

Entry payload: the kernel blob (:meth:`CompiledKernel.to_bytes`) followed by the zlib-compressed
optimised LLVM IR it was made from (so that dumps of a loaded kernel show its real IR); the
entry's JSON metadata gives the blob's length. No pickle.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import struct
import zlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

import llvmlite
import llvmlite.binding as llvm

import tilefuse
from tilefuse.codegen.jit import (
    CompiledKernel,
    KernelSignature,
    compile_kernel,
    kernel_from_bytes,
)
from tilefuse.codegen.target import CpuTarget, target_machine
from tilefuse.errors import CompileError, TilefuseError
from tilefuse.kernel.schedule import Schedule
from tilefuse.log import get_logger
from tilefuse.loop.ir import LoopFunction
from tilefuse.runtime.cache_stats import KernelCacheStats
from tilefuse.runtime.disk_cache import CacheDir, CacheError, CacheKey, Entry

ENABLE_VAR = "TILEFUSE_CACHE"
"""``0``, ``off``, ``false`` or ``no`` turns the disk cache off (``1``/``on`` or unset: on)."""
_OFF = frozenset({"0", "off", "false", "no"})
_ON = frozenset({"", "1", "on", "true", "yes"})
_PAYLOAD_KIND = "tilefuse kernel blob + zlib llvm ir"
_CODEGEN_DIR = Path(__file__).resolve().parent.parent / "codegen"

_UNUSABLE = (TilefuseError, ValueError, TypeError, LookupError, struct.error)
"""What decoding a stored kernel may raise (CompileError, mostly): a miss, never a crash."""

log = get_logger("cache")


@dataclass(frozen=True)
class KernelArtifact:
    """A kernel ready to run, the optimised LLVM IR its machine code was made from, and
    ``entry``: the cache file it was loaded from (None: compiled in this process)."""

    kernel: CompiledKernel
    llvm_ir: str
    entry: Path | None = None
    shared_with: str | None = None
    """The kernel of this build whose machine code this one runs (same loop IR but the name)."""

    def assembly(self) -> str:
        """The assembly of :attr:`llvm_ir` (re-emitted by LLVM; for dumps)."""
        if self.entry is None:
            return self.kernel.assembly()
        try:
            module = llvm.parse_assembly(self.llvm_ir)
            return target_machine(self.kernel.target).emit_assembly(module)
        except RuntimeError as err:
            return f"# could not re-emit assembly from the stored IR: {err}\n"


def cache_enabled(env: Mapping[str, str]) -> bool:
    """False when ``$TILEFUSE_CACHE`` turns the disk cache off; an unknown value warns and
    leaves it on."""
    value = env.get(ENABLE_VAR, "").strip().lower()
    if value in _OFF:
        return False
    if value not in _ON:
        log.warning("%s=%r is not understood (use 0/off or 1/on); the disk cache stays on",
                    ENABLE_VAR, env.get(ENABLE_VAR))
    return True


def codegen_fingerprint(directory: Path = _CODEGEN_DIR) -> str:
    """sha256 of the code generator's sources (file names and contents), or ``unknown``."""
    digest = hashlib.sha256()
    try:
        sources = sorted(directory.glob("*.py"))
        for path in sources:
            digest.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    except OSError:
        return "unknown"
    return digest.hexdigest() if sources else "unknown"


class KernelCache:
    """Compiles kernels through the disk cache (see the module docstring). One per executable
    build: it counts that build's hits and misses."""

    def __init__(self, directory: CacheDir | None, target: CpuTarget):
        self.directory = directory
        self.target = target
        self._hits = self._misses = self._stored = self._shared = 0
        self._built: dict[str, tuple[str, KernelArtifact]] = {}  # body text -> (name, code)
        self._writable = directory is not None
        self._fixed: dict[str, str] = {}
        if directory is not None:
            llvm_version = ".".join(map(str, llvm.llvm_version_info))
            self._fixed = {
                "target_triple": target.triple, "target_cpu": target.cpu,
                "target_features": target.features,
                "tilefuse_version": tilefuse.__version__,
                "llvm_version": f"llvmlite {llvmlite.__version__}, LLVM {llvm_version}",
                "codegen": codegen_fingerprint()}

    @classmethod
    def from_env(cls, target: CpuTarget, env: Mapping[str, str] = os.environ) -> KernelCache:
        """The cache ``$TILEFUSE_CACHE`` and ``$TILEFUSE_CACHE_DIR`` ask for; a directory that
        is refused gives one warning naming the reason, and no disk cache."""
        if not cache_enabled(env):
            log.debug("disk cache off (%s=%s)", ENABLE_VAR, env.get(ENABLE_VAR))
            return cls(None, target)
        try:
            directory = CacheDir.open(env=env)
        except CacheError as err:
            log.warning("disk cache off: %s; compiling without it", err)
            return cls(None, target)
        return cls(directory, target)

    @property
    def stats(self) -> KernelCacheStats:
        path = None if self.directory is None else self.directory.path
        return KernelCacheStats(self._hits, self._misses, self._stored, path, self._shared)

    def key(self, fn: LoopFunction, schedule: Schedule | None, function: str,
            loop_ir: str | None = None) -> CacheKey:
        """The key of ``fn`` compiled for this cache's target (parts: module docstring);
        ``loop_ir`` is ``str(fn)`` when the caller has printed it already."""
        return CacheKey({"function": function, "loop_ir": str(fn) if loop_ir is None else loop_ir,
                         "schedule": "" if schedule is None else schedule.to_json(),
                         **self._fixed})

    def compile(self, fn: LoopFunction, schedule: Schedule | None,
                function: str) -> KernelArtifact:
        """``fn`` as machine code: the code of a kernel of this build with the same loop IR
        but the name (a ResNet's repeated blocks, a transformer's projections), else loaded
        from the disk cache, else compiled (and stored). CompileError only from compiling."""
        text = str(fn)
        header = f"kernel {fn.name}("
        body = text.replace(header, "kernel (", 1) if text.startswith(header) else text
        if body in self._built:
            name, first = self._built[body]
            self._shared += 1
            return dataclasses.replace(first, shared_with=name)
        artifact = self._cached_or_compiled(fn, schedule, function, text)
        self._built[body] = (fn.name, artifact)
        return artifact

    def _cached_or_compiled(self, fn: LoopFunction, schedule: Schedule | None,
                            function: str, loop_ir: str) -> KernelArtifact:
        directory = self.directory
        if directory is None:
            self._misses += 1
            return self._compile(fn)
        key = self.key(fn, schedule, function, loop_ir)
        loaded = self._load(directory, key, fn)
        if loaded is not None:
            self._hits += 1
            return loaded
        self._misses += 1
        artifact = self._compile(fn)
        if self._writable:
            self._store(directory, key, artifact)
        return artifact

    def compile_ir(self, text: str, signature: KernelSignature, function: str,
                   make: Callable[[], CompiledKernel]) -> KernelArtifact:
        """A kernel written in LLVM IR directly (the quantized kernels of
        :mod:`tilefuse.kernel.lower_qmatmul`): looked up by its IR ``text`` (the ``loop_ir``
        part of the key holds it) and loaded, else ``make()`` compiles it and it is stored."""
        directory = self.directory
        if directory is None:
            self._misses += 1
            kernel = make()
            return KernelArtifact(kernel, kernel.llvm_ir())
        key = CacheKey({"function": function, "loop_ir": text, "schedule": "", **self._fixed})
        entry = directory.get(key)
        if entry is not None:
            try:
                artifact = _decode(entry, self.target)
                if artifact.kernel.signature == signature:
                    self._hits += 1
                    return artifact
            except _UNUSABLE as err:
                log.warning("cache entry %s (kernel %s) is unusable: %s; compiling it again "
                            "(a miss)", entry.path, key.label(), err)
        self._misses += 1
        kernel = make()
        artifact = KernelArtifact(kernel, kernel.llvm_ir())
        if self._writable:
            self._store(directory, key, artifact)
        return artifact

    def _compile(self, fn: LoopFunction) -> KernelArtifact:
        kernel = compile_kernel(fn, target=self.target)
        return KernelArtifact(kernel, kernel.llvm_ir())

    def _load(self, directory: CacheDir, key: CacheKey, fn: LoopFunction
              ) -> KernelArtifact | None:
        entry = directory.get(key)
        if entry is None:
            return None
        try:
            artifact = _decode(entry, self.target)
        except _UNUSABLE as err:
            log.warning("cache entry %s (kernel %s) is unusable: %s; compiling it again "
                        "(a miss)", entry.path, key.label(), err)
            return None
        if artifact.kernel.signature != KernelSignature.of(fn):
            log.warning("cache entry %s (kernel %s) holds a kernel of another signature; "
                        "compiling it again (a miss)", entry.path, key.label())
            return None
        log.debug("kernel %s loaded from %s", key.label(), entry.path)
        return artifact

    def _store(self, directory: CacheDir, key: CacheKey, artifact: KernelArtifact) -> None:
        """Best effort: the first failure is one warning and turns writes off."""
        try:
            blob = artifact.kernel.to_bytes()
            ir = zlib.compress(artifact.llvm_ir.encode("utf-8"), 1)
            directory.put(key, blob + ir, {"payload": _PAYLOAD_KIND, "blob_bytes": len(blob)})
        except (CacheError, CompileError) as err:
            self._writable = False
            log.warning("cannot store kernel %s in the disk cache: %s; not storing more "
                        "kernels of this build", key.label(), err)
            return
        self._stored += 1


def _decode(entry: Entry, target: CpuTarget) -> KernelArtifact:
    """The kernel and IR in a stored payload; CompileError when they do not check."""
    size = entry.metadata.get("blob_bytes")
    if entry.metadata.get("payload") != _PAYLOAD_KIND or type(size) is not int \
            or not 0 < size <= len(entry.payload):
        raise CompileError("its metadata does not describe a kernel payload")
    try:
        ir = zlib.decompress(entry.payload[size:]).decode("utf-8")
    except (zlib.error, UnicodeDecodeError) as err:
        raise CompileError(f"its stored LLVM IR does not decompress: {err}") from None
    return KernelArtifact(kernel_from_bytes(entry.payload[:size], target=target), ir,
                          entry.path)
