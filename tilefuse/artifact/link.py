"""Linking an artifact's kernels: relocatable object code into this process, in few images.

An artifact links all its kernels at once, without LLVM (:mod:`tilefuse.runtime.object_link`;
loading LLVM was most of a cold start): each object is checked
(:func:`~tilefuse.codegen.elf_check.check_object`) before anything is mapped, then the objects
are linked into as few images as their names allow (two kernels of one name, from two
specialisations, go to different images). Nothing is compiled. The thread pool that parallel
loops call is linked from the artifact's ``pool`` section too when this process has not
started one yet (it is otherwise compiled from LLVM IR on first use:
:mod:`tilefuse.codegen.pool`).
"""

from __future__ import annotations

from collections.abc import Sequence

from tilefuse.artifact.format import ArtifactError
from tilefuse.codegen.abi import CompiledKernel, KernelSignature
from tilefuse.codegen.elf_check import check_object
from tilefuse.codegen.pool import start_pool_from_object
from tilefuse.codegen.target import CpuTarget, registered_symbols
from tilefuse.errors import TilefuseError
from tilefuse.runtime.object_link import link


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
            engine = link([objects[i][0] for i in members], registered_symbols())
        except TilefuseError as err:
            raise ArtifactError(f"{path}: the kernels' object code does not link: "
                                f"{err}") from None
        for i in members:
            obj, signature = objects[i]
            try:
                made[i] = CompiledKernel(signature, engine, target, None, obj)
            except TilefuseError as err:
                raise ArtifactError(f"{path}: kernel {signature.name}: {err}") from None
    return [k for k in made if k is not None]
