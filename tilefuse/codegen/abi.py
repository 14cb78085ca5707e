"""The calling convention compiled kernels share with the runtime: a kernel's signature, the
handle of its machine code (:class:`CompiledKernel`), the buffers it takes.

Every compiled kernel is ``void name(void **buffers, int64_t *scalars, int32_t threads)``. This
module holds what calling one needs and nothing that makes one (:mod:`tilefuse.codegen.jit`
compiles), so that running an artifact's kernels imports no compiler stage.
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from tilefuse.codegen.target import CpuTarget
from tilefuse.dtypes import DType, parse_dtype
from tilefuse.errors import CompileError, GuardError, TilefuseError

if TYPE_CHECKING:
    import llvmlite.binding as llvm

    from tilefuse.loop.ir import LoopFunction

Array = np.ndarray

_ENTRY = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int32)
_MAGIC = b"TFKERN01"


@dataclass(frozen=True)
class ArgSpec:
    """One array argument of compiled code as a caller sees it: the loop IR's ``BufferParam``
    without the IR, so that calling compiled code (a loaded artifact) needs no loop IR."""

    name: str
    dtype: DType
    readonly: bool = False
    align: int = 0


@dataclass(frozen=True)
class KernelSignature:
    """What a caller needs to know to call compiled code: the name and the arguments (given as
    ``BufferParam``s or ``ArgSpec``s, kept as ``ArgSpec``s)."""

    name: str
    buffers: tuple[ArgSpec, ...]
    scalars: tuple[str, ...]
    uses_threads: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "buffers", tuple(
            b if type(b) is ArgSpec else ArgSpec(b.name, b.dtype, b.readonly, b.align)
            for b in self.buffers))

    @staticmethod
    def of(fn: LoopFunction) -> KernelSignature:
        from tilefuse.codegen.llvm_cpu import uses_threads

        return KernelSignature(fn.name, fn.buffers, fn.scalars, uses_threads(fn))

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "scalars": list(self.scalars), "threads": self.uses_threads,
                "buffers": [{"name": b.name, "dtype": b.dtype.value, "readonly": b.readonly,
                             "align": b.align} for b in self.buffers]}

    @staticmethod
    def from_json(data: dict[str, Any]) -> KernelSignature:
        """The signature written by :meth:`to_json`; CompileError if it is malformed."""
        try:
            buffers = tuple(ArgSpec(str(b["name"]), parse_dtype(b["dtype"]),
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
        from tilefuse.codegen.jit import _parse

        return _parse(self.llvm_ir(), self.name)

    def assembly(self) -> str:
        """The x86-64 assembly of the optimised module."""
        from tilefuse.codegen.target import target_machine

        return target_machine(self.target).emit_assembly(self._module())

    def object_code(self) -> bytes:
        """The object file (for a disk cache; see :func:`load_kernel`): the one MCJIT made when
        :func:`compile_kernel` built the kernel, else emitted again from the optimised IR."""
        if self._object_code is None:
            from tilefuse.codegen.target import target_machine

            self._object_code = target_machine(self.target).emit_object(self._module())
        return self._object_code

    def to_bytes(self) -> bytes:
        """Object code, signature and target in one blob that :func:`kernel_from_bytes` checks."""
        header = json.dumps({"signature": self.signature.to_json(),
                             "target": [self.target.triple, self.target.cpu,
                                        self.target.features]}).encode()
        payload = struct.pack("<I", len(header)) + header + self.object_code()
        return _MAGIC + hashlib.sha256(payload).digest() + payload



def aligned_empty(shape: int | tuple[int, ...], dtype: Any, align: int = 64) -> np.ndarray:
    """An uninitialised array whose data starts on an ``align``-byte boundary (for buffers
    declared aligned)."""
    dt = np.dtype(dtype)
    count = int(np.prod(shape))
    raw = np.empty(count * dt.itemsize + align, np.uint8)
    offset = (-raw.ctypes.data) % align
    return raw[offset:offset + count * dt.itemsize].view(dt).reshape(shape)


def check_arguments(name: str, buffers: Sequence[ArgSpec], scalars: Sequence[str],
                    args: Sequence[object]) -> tuple[list[Array], list[int]]:
    """Splits a kernel call's ``args`` into arrays and scalars, checking each (GuardError).

    Arrays must have the buffer's dtype, be C-contiguous, writable unless the buffer is readonly,
    aligned as declared, and no written buffer may overlap another argument.
    """
    nb = len(buffers)
    if len(args) != nb + len(scalars):
        raise GuardError(f"{name} takes {nb} arrays and {len(scalars)} scalars, "
                         f"got {len(args)} arguments")
    arrays: list[Array] = []
    for b, a in zip(buffers, args[:nb]):
        if not isinstance(a, np.ndarray) or a.dtype != b.dtype.np:
            got = a.dtype if isinstance(a, np.ndarray) else type(a).__name__
            raise GuardError(f"{name}: argument {b.name} must be a {b.dtype} array, got {got}")
        if not a.flags.c_contiguous:
            raise GuardError(f"{name}: argument {b.name} must be C-contiguous")
        if not b.readonly and not a.flags.writeable:
            raise GuardError(f"{name}: argument {b.name} is written but the array is readonly")
        if b.align and a.ctypes.data % b.align:
            raise GuardError(f"{name}: argument {b.name} must be {b.align}-byte aligned")
        arrays.append(a)
    _check_overlap(name, buffers, arrays)
    values: list[int] = []
    for s, v in zip(scalars, args[nb:]):
        if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, np.integer)):
            raise GuardError(f"{name}: scalar {s} must be an int, got {type(v).__name__}")
        if not -(2 ** 63) <= int(v) < 2 ** 63:
            raise GuardError(f"{name}: scalar {s}={v} does not fit i64")
        values.append(int(v))
    return arrays, values


def _check_overlap(name: str, buffers: Sequence[ArgSpec], arrays: Sequence[Array]) -> None:
    for i in range(len(arrays)):
        for j in range(i + 1, len(arrays)):
            if buffers[i].readonly and buffers[j].readonly:
                continue
            if arrays[i].size and arrays[j].size and np.may_share_memory(arrays[i], arrays[j]):
                raise GuardError(f"{name}: arguments {buffers[i].name} and {buffers[j].name} "
                                 "overlap, and one of them is written")


@dataclass(frozen=True)
class KernelCall:
    """One kernel in a launch sequence: its buffers, each ``("io", index)`` (the call's
    ``io[index]``) or ``("fixed", address)``, and its ``i64`` scalar arguments (a symbolic
    kernel's runtime extents, baked in: a launcher serves one size binding)."""

    kernel: CompiledKernel
    buffers: tuple[tuple[str, int], ...]
    scalars: tuple[int, ...] = ()


__all__ = ["CompiledKernel", "KernelCall", "KernelSignature", "aligned_empty", "check_arguments"]
