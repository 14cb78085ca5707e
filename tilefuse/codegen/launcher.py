"""One native entry for a whole launch sequence: ``launch(void **io)`` calls every kernel in
order, so that running a compiled graph is one Python→native call instead of one per kernel.

Each kernel call's buffer table is built on the launcher's stack: fixed buffers (constants, the
arena) are baked in as absolute addresses, the call's own buffers (inputs, outputs) are read from
``io``. The kernels stay compiled as they are (and cached on disk as they are); the launcher is a
few hundred bytes of code compiled per executable, never cached, since it embeds this process's
addresses.
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence

import llvmlite.binding as llvm
from llvmlite import ir

from tilefuse.codegen.abi import CompiledKernel, KernelCall
from tilefuse.codegen.jit import _parse
from tilefuse.codegen.llvm_types import I8, I32, I64, VOID
from tilefuse.codegen.target import CpuTarget, host_target, target_machine
from tilefuse.errors import CompileError

_I8P = I8.as_pointer()
_KERNEL = ir.FunctionType(VOID, [_I8P.as_pointer(), I64.as_pointer(), I32])
_ENTRY = ctypes.CFUNCTYPE(None, ctypes.c_void_p)


def _symbol(kernel: CompiledKernel) -> str:
    """The name the launcher calls ``kernel`` by: unique per loaded code (its address), and
    registered with LLVM's symbol resolver so that the launcher links against it."""
    return f"tilefuse.kernel.{kernel.address:x}"


def _declare(module: ir.Module, kernel: CompiledKernel) -> ir.Function:
    name = _symbol(kernel)
    existing = module.globals.get(name)
    return existing if isinstance(existing, ir.Function) else ir.Function(module, _KERNEL, name)


def _launcher_ir(calls: Sequence[KernelCall], name: str) -> ir.Module:
    module = ir.Module(name)
    fn = ir.Function(module, ir.FunctionType(VOID, [_I8P.as_pointer()]), name)
    builder = ir.IRBuilder(fn.append_basic_block("entry"))
    (io,) = fn.args
    no_scalars = builder.alloca(I64, name="no_scalars")
    builder.store(ir.Constant(I64, 0), no_scalars)
    tables = [builder.alloca(ir.ArrayType(_I8P, max(1, len(c.buffers)))) for c in calls]
    for call, table in zip(calls, tables):
        scalars = no_scalars
        if call.scalars:
            values = builder.alloca(ir.ArrayType(I64, len(call.scalars)))
            for j, value in enumerate(call.scalars):
                builder.store(ir.Constant(I64, value),
                              builder.gep(values, [ir.Constant(I32, 0), ir.Constant(I32, j)]))
            scalars = builder.bitcast(values, I64.as_pointer())
        for j, (kind, value) in enumerate(call.buffers):
            if kind == "io":
                pointer = builder.load(builder.gep(io, [ir.Constant(I32, value)]))
            else:
                pointer = ir.Constant(I64, value).inttoptr(_I8P)
            builder.store(pointer, builder.gep(table, [ir.Constant(I32, 0), ir.Constant(I32, j)]))
        builder.call(_declare(module, call.kernel), [builder.bitcast(table, _I8P.as_pointer()),
                                                     scalars, ir.Constant(I32, 0)])
    builder.ret_void()
    return module


class CompiledLauncher:
    """``launcher(addresses)`` runs the whole sequence; ``addresses[i]`` is io buffer i."""

    def __init__(self, calls: Sequence[KernelCall], io_count: int, *, name: str = "launch",
                 target: CpuTarget | None = None):
        for call in calls:
            if len(call.scalars) != len(call.kernel.signature.scalars):
                raise CompileError(f"kernel {call.kernel.name} takes "
                                   f"{len(call.kernel.signature.scalars)} scalars, "
                                   f"got {len(call.scalars)}")
            if len(call.buffers) != len(call.kernel.signature.buffers):
                raise CompileError(f"kernel {call.kernel.name} takes "
                                   f"{len(call.kernel.signature.buffers)} buffers, "
                                   f"got {len(call.buffers)}")
            if any(kind == "io" and not 0 <= v < io_count for kind, v in call.buffers):
                raise CompileError(f"kernel {call.kernel.name}: io index out of range")
        target = target or host_target()
        tm = target_machine(target)
        module = _parse(str(_launcher_ir(calls, name)), name)
        module.triple = target.triple
        module.data_layout = str(tm.target_data)
        self._kernels = tuple(c.kernel for c in calls)  # the code the launcher jumps into
        for kernel in self._kernels:
            llvm.add_symbol(_symbol(kernel), kernel.address)
        self._engine = llvm.create_mcjit_compiler(module, tm)
        self._engine.finalize_object()
        self._entry = _ENTRY(self._engine.get_function_address(name))
        self._io = (ctypes.c_void_p * max(1, io_count))()
        self._io_at = ctypes.addressof(self._io)
        self._count = io_count
        self._last: Sequence[int] = ()

    def __call__(self, addresses: Sequence[int]) -> None:
        """Runs every kernel. No checks: the addresses must be the buffers the kernels were
        built for (the executable's guard has checked the arrays behind them). The table is
        rewritten only when they changed (a quarter of a small call's native entry); the
        caller must not change ``addresses`` afterwards."""
        if addresses != self._last:
            self._io[:self._count] = addresses
            self._last = addresses
        self._entry(self._io_at)
