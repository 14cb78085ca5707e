"""Linking an artifact's kernels: relocatable object code into this process, in few engines.

:func:`tilefuse.codegen.jit.load_kernel` makes one MCJIT engine (and target machine) per kernel,
~4 ms each; an artifact links all its kernels at once instead: each object is checked
(:func:`~tilefuse.codegen.elf_check.check_object`) before LLVM sees any, then the objects are
added to as few engines as their names allow (two kernels of one name, from two
specialisations, go to different engines) and each engine is finalised once. Nothing is
compiled: MCJIT's own module is empty. The thread pool that parallel loops call is linked from
the artifact's ``pool`` section too when this process has not started one yet (it is otherwise
compiled from LLVM IR on first use: :mod:`tilefuse.codegen.pool`).
"""

from __future__ import annotations

from collections.abc import Sequence

from tilefuse.artifact.format import ArtifactError
from tilefuse.codegen.abi import CompiledKernel, KernelSignature
from tilefuse.codegen.elf_check import check_object
from tilefuse.codegen.pool import start_pool_from_object
from tilefuse.codegen.target import CpuTarget, link_objects
from tilefuse.errors import TilefuseError


def link_kernels(objects: Sequence[tuple[bytes, KernelSignature]], target: CpuTarget,
                 path: str, pool: bytes | None = None) -> list[CompiledKernel]:
    """The kernels of ``objects`` (object code, signature), linked for ``target``; ``pool`` is
    the thread pool's object code, which parallel kernels need (it starts the process's pool
    when none runs yet). ArtifactError when an object is malformed or does not define its
    kernel."""
    for obj, signature in objects:
        try:
            check_object(obj)
        except TilefuseError as err:
            raise ArtifactError(f"{path}: kernel {signature.name}: {err}") from None
    if any(signature.uses_threads for _, signature in objects):
        if pool is None:
            raise ArtifactError(f"{path}: its kernels run parallel loops but it carries no "
                                "thread pool section")
        try:
            check_object(pool)
            start_pool_from_object(pool, target)  # defines tilefuse_parallel
        except TilefuseError as err:
            raise ArtifactError(f"{path}: the thread pool: {err}") from None
    batches: list[tuple[set[str], list[int]]] = []
    for i, (_, signature) in enumerate(objects):
        batch = next((b for b in batches if signature.name not in b[0]), None)
        if batch is None:
            batch = (set(), [])
            batches.append(batch)
        batch[0].add(signature.name)
        batch[1].append(i)
    made: list[CompiledKernel | None] = [None] * len(objects)
    for _, members in batches:
        try:
            engine = link_objects([objects[i][0] for i in members], target)
        except RuntimeError as err:
            raise ArtifactError(f"{path}: LLVM could not link the kernels' object code: "
                                f"{err}") from None
        for i in members:
            obj, signature = objects[i]
            try:
                made[i] = CompiledKernel(signature, engine, target, None, obj)
            except TilefuseError as err:
                raise ArtifactError(f"{path}: kernel {signature.name}: {err}") from None
    return [k for k in made if k is not None]
