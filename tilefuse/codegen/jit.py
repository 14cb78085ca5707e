"""JIT compilation: loop IR -> optimised LLVM IR -> machine code in this process (MCJIT).

:func:`compile_kernel` returns a :class:`CompiledKernel`, callable with NumPy arrays and ints in
the kernel's argument order. It keeps its execution engine alive, and can give back the optimised
LLVM IR, the assembly and the object code; :func:`load_kernel` turns object code back into a
kernel. :meth:`CompiledKernel.to_bytes` / :func:`kernel_from_bytes` wrap object code, signature
and target in one self-checking blob (a SHA-256 digest), which is what a disk cache should store:
a corrupt or foreign entry then raises CompileError (a miss) instead of crashing in LLVM.
"""

from __future__ import annotations

import hashlib
import json
import struct

import llvmlite.binding as llvm

from tilefuse.codegen.abi import (
    _MAGIC,
    CompiledKernel,
    KernelSignature,
    aligned_empty,
)
from tilefuse.codegen.elf_check import check_object
from tilefuse.codegen.llvm_cpu import lower_to_llvm
from tilefuse.codegen.pool import thread_pool
from tilefuse.codegen.target import CpuTarget, host_target, link_objects, target_machine
from tilefuse.errors import CompileError
from tilefuse.loop.ir import LoopFunction
from tilefuse.loop.simplify import simplify


def _parse(text: str, name: str) -> llvm.ModuleRef:
    try:
        module = llvm.parse_assembly(text)
        module.verify()
    except RuntimeError as exc:
        raise CompileError(f"LLVM rejected the IR of kernel {name}: {exc}") from exc
    return module


def optimise(module: llvm.ModuleRef, tm: llvm.TargetMachine) -> None:
    """Runs LLVM's O3 module pipeline on ``module`` in place."""
    options = llvm.create_pipeline_tuning_options(speed_level=3)
    options.loop_vectorization = True
    options.slp_vectorization = True
    builder = llvm.create_pass_builder(tm, options)
    builder.getModulePassManager().run(module, builder)


def llvm_ir_text(fn: LoopFunction, target: CpuTarget | None = None) -> str:
    """The unoptimised LLVM IR of ``fn`` (with the target's triple and data layout)."""
    target = target or host_target()
    tm = target_machine(target)
    module = lower_to_llvm(fn, target)
    module.triple = target.triple
    module.data_layout = str(tm.target_data)
    return str(module)


def compile_kernel(fn: LoopFunction, *, target: CpuTarget | None = None,
                   simplify_loops: bool = False) -> CompiledKernel:
    """Verifies, lowers, optimises (O3) and JIT-compiles ``fn`` for ``target`` (default: host).

    With ``simplify_loops`` the loop-IR simplifier runs first (LLVM hoists and folds too).
    """
    if simplify_loops:
        fn, _ = simplify(fn)
    target = target or host_target()
    tm = target_machine(target)
    module = _parse(llvm_ir_text(fn, target), fn.name)
    optimise(module, tm)
    text = str(module)
    signature = KernelSignature.of(fn)
    if signature.uses_threads:
        thread_pool()  # defines tilefuse_parallel, which the kernel's parallel loops call
    engine = llvm.create_mcjit_compiler(module, tm)
    # MCJIT hands the object file it generates to an object cache: keeping it spares a disk
    # cache's store a second code generation (object_code() would otherwise emit it again).
    objects: list[bytes] = []
    engine.set_object_cache(lambda _module, buffer: objects.append(bytes(buffer)))
    engine.finalize_object()
    made = objects[0] if len(objects) == 1 else None
    return CompiledKernel(signature, engine, target, text, made)


def load_kernel(obj: bytes, signature: KernelSignature, *, target: CpuTarget | None = None,
                ir_text: str | None = None) -> CompiledKernel:
    """A kernel from object code made by :meth:`CompiledKernel.object_code` on this target."""
    check_object(obj)
    target = target or host_target()
    if signature.uses_threads:
        thread_pool()  # defines tilefuse_parallel, which the kernel's parallel loops call
    try:
        engine = link_objects([obj], target)
    except RuntimeError as exc:
        raise CompileError(f"could not load object code of kernel {signature.name}: {exc}") \
            from exc
    return CompiledKernel(signature, engine, target, ir_text, obj)


def kernel_from_bytes(blob: bytes, *, target: CpuTarget | None = None) -> CompiledKernel:
    """The kernel in a :meth:`CompiledKernel.to_bytes` blob; CompileError if the blob is corrupt
    or was made for another target (its code might not run here)."""
    target = target or host_target()
    head = len(_MAGIC) + 32
    if len(blob) < head + 4 or not blob.startswith(_MAGIC):
        raise CompileError("not a tilefuse kernel blob")
    payload = blob[head:]
    if hashlib.sha256(payload).digest() != blob[len(_MAGIC):head]:
        raise CompileError("kernel blob is corrupt (digest mismatch)")
    (size,) = struct.unpack_from("<I", payload)
    try:
        header = json.loads(payload[4:4 + size])
        made_for = CpuTarget(*header["target"])
        signature = KernelSignature.from_json(header["signature"])
    except (ValueError, TypeError, KeyError) as exc:
        raise CompileError(f"kernel blob header is malformed: {exc!r}") from exc
    if made_for != target:
        raise CompileError(f"kernel {signature.name} was compiled for {made_for}, not {target}")
    return load_kernel(payload[4 + size:], signature, target=target)


__all__ = ["CompiledKernel", "KernelSignature", "aligned_empty", "compile_kernel",
           "kernel_from_bytes", "llvm_ir_text", "load_kernel", "optimise"]
