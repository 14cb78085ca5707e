"""JIT compilation: loop IR -> optimised LLVM IR -> machine code in this process (MCJIT).

:func:`compile_kernel` returns a :class:`CompiledKernel`, callable with NumPy arrays and ints in
the kernel's argument order. It keeps its execution engine alive, and can give back the optimised
LLVM IR, the assembly and the object code; :func:`load_kernel` turns object code back into a
kernel. :meth:`CompiledKernel.to_bytes` / :func:`kernel_from_bytes` wrap object code, signature
and target in one self-checking blob (a SHA-256 digest), which is what a disk cache should store:
a corrupt or foreign entry then raises CompileError (a miss) instead of crashing in LLVM.
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import struct
from dataclasses import dataclass
from typing import Any

import llvmlite.binding as llvm
import numpy as np

from tilefuse.codegen.elf_check import check_object
from tilefuse.codegen.llvm_cpu import lower_to_llvm, uses_threads
from tilefuse.codegen.pool import thread_pool
from tilefuse.codegen.target import CpuTarget, host_target, link_objects, target_machine
from tilefuse.dtypes import parse_dtype
from tilefuse.errors import CompileError, GuardError, TilefuseError
from tilefuse.loop.interp import check_arguments
from tilefuse.loop.ir import BufferParam, LoopFunction
from tilefuse.loop.simplify import simplify

_ENTRY = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int32)
_MAGIC = b"TFKERN01"


@dataclass(frozen=True)
class KernelSignature:
    """What a caller needs to know to call compiled code: the name and the arguments."""

    name: str
    buffers: tuple[BufferParam, ...]
    scalars: tuple[str, ...]
    uses_threads: bool = False

    @staticmethod
    def of(fn: LoopFunction) -> KernelSignature:
        return KernelSignature(fn.name, fn.buffers, fn.scalars, uses_threads(fn))

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "scalars": list(self.scalars), "threads": self.uses_threads,
                "buffers": [{"name": b.name, "dtype": b.dtype.value, "readonly": b.readonly,
                             "align": b.align} for b in self.buffers]}

    @staticmethod
    def from_json(data: dict[str, Any]) -> KernelSignature:
        """The signature written by :meth:`to_json`; CompileError if it is malformed."""
        try:
            buffers = tuple(BufferParam(str(b["name"]), parse_dtype(b["dtype"]),
                                        bool(b["readonly"]), int(b["align"]))
                            for b in data["buffers"])
            return KernelSignature(str(data["name"]), buffers,
                                   tuple(str(s) for s in data["scalars"]), bool(data["threads"]))
        except (KeyError, TypeError, ValueError, TilefuseError) as exc:
            raise CompileError(f"malformed kernel signature: {exc!r}") from exc


class CompiledKernel:
    """A kernel in machine code. Call it as ``kernel(*arrays, *scalars, num_threads=0)``."""

    def __init__(self, signature: KernelSignature, engine: llvm.ExecutionEngine,
                 target: CpuTarget, ir_text: str | None, object_code: bytes | None = None):
        self.signature = signature
        self.target = target
        self._engine = engine  # owns the machine code: keep it alive as long as the kernel
        self._ir_text = ir_text
        self._object_code = object_code  # what MCJIT made, when it was captured
        address = engine.get_function_address(signature.name)
        if not address:
            raise CompileError(f"compiled code has no function {signature.name!r}")
        self.address = address  # void name(void **buffers, int64_t *scalars, int32_t threads)
        self._entry = _ENTRY(address)
        self._buffer_array = ctypes.c_void_p * max(1, len(signature.buffers))
        self._scalar_array = ctypes.c_int64 * max(1, len(signature.scalars))

    @property
    def name(self) -> str:
        return self.signature.name

    def __repr__(self) -> str:
        return f"<CompiledKernel {self.name} for {self.target}>"

    def __call__(self, *args: object, num_threads: int = 0) -> None:
        """Runs the kernel; arrays are checked like the interpreter checks them (GuardError)."""
        sig = self.signature
        arrays, values = check_arguments(sig.name, sig.buffers, sig.scalars, args)
        if not 0 <= num_threads < 2 ** 31:
            raise GuardError(f"{sig.name}: num_threads must be >= 0 (0: the whole thread pool), "
                             f"got {num_threads}")
        self.call_unchecked([a.ctypes.data for a in arrays], values, num_threads)

    def raw_entry(self) -> tuple[ctypes._CFuncPtr, type, type]:
        """The ctypes entry ``f(buffers_address, scalars_address, num_threads)`` and the ctypes
        array types of its buffer-pointer and scalar tables: for a runtime that keeps those tables
        alive across calls and rewrites only the addresses that change. No checks at all."""
        return self._entry, self._buffer_array, self._scalar_array

    def call_unchecked(self, pointers: list[int], scalars: list[int],
                       num_threads: int = 0) -> None:
        """Runs the kernel on raw buffer addresses, without any check: for a runtime that has
        validated its arguments once. Wrong addresses or sizes corrupt memory."""
        buffers = self._buffer_array(*pointers)
        values = self._scalar_array(*scalars)
        self._entry(ctypes.addressof(buffers), ctypes.addressof(values), num_threads)

    def llvm_ir(self) -> str:
        """The optimised LLVM IR (for dumps)."""
        if self._ir_text is None:
            raise CompileError(f"kernel {self.name} was loaded from object code without IR")
        return self._ir_text

    def _module(self) -> llvm.ModuleRef:
        return _parse(self.llvm_ir(), self.name)

    def assembly(self) -> str:
        """The x86-64 assembly of the optimised module."""
        return target_machine(self.target).emit_assembly(self._module())

    def object_code(self) -> bytes:
        """The object file (for a disk cache; see :func:`load_kernel`): the one MCJIT made when
        :func:`compile_kernel` built the kernel, else emitted again from the optimised IR."""
        if self._object_code is None:
            self._object_code = target_machine(self.target).emit_object(self._module())
        return self._object_code

    def to_bytes(self) -> bytes:
        """Object code, signature and target in one blob that :func:`kernel_from_bytes` checks."""
        header = json.dumps({"signature": self.signature.to_json(),
                             "target": [self.target.triple, self.target.cpu,
                                        self.target.features]}).encode()
        payload = struct.pack("<I", len(header)) + header + self.object_code()
        return _MAGIC + hashlib.sha256(payload).digest() + payload


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


def aligned_empty(shape: int | tuple[int, ...], dtype: Any, align: int = 64) -> np.ndarray:
    """An uninitialised array whose data starts on an ``align``-byte boundary (for buffers
    declared aligned)."""
    dt = np.dtype(dtype)
    count = int(np.prod(shape))
    raw = np.empty(count * dt.itemsize + align, np.uint8)
    offset = (-raw.ctypes.data) % align
    return raw[offset:offset + count * dt.itemsize].view(dt).reshape(shape)
