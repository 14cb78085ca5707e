"""One native entry for a loaded launch sequence, from code compiled when the artifact was saved.

An in-process build generates a launcher per executable with its addresses baked in
(:mod:`tilefuse.codegen.launcher`); a loaded artifact may not generate code, so the artifact
carries instead one small *generic* launcher, compiled at save time for the artifact's target::

    void tilefuse_run_all(i64 *context)   // calls, entries, tables, scalars, patches, patch, io

(``void **entries``, ``void ***tables``, ``i64 **scalars``, ``i64 *patch``, ``void **io``) which
first writes each call's own buffers into the kernels' buffer tables (``patch`` holds
(call, position, io index) triples) and then calls ``entries[c](tables[c], scalars[c], 0)`` in
order. Everything it reads is data built here, in Python, from the launch sequence that the
loader has already validated (kernel addresses from the linker, fixed buffers checked by
:class:`~tilefuse.runtime.launch.KernelLaunch`), so a call of a loaded executable is one
Python→native transition, as in process.
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence

from tilefuse.artifact.format import ArtifactError
from tilefuse.codegen.elf_check import check_object
from tilefuse.codegen.target import CpuTarget, target_machine
from tilefuse.errors import TilefuseError
from tilefuse.runtime.launch import NativeStep, Step

SYMBOL = "tilefuse_run_all"
_ENTRY = ctypes.CFUNCTYPE(None, ctypes.c_void_p)


def _ir() -> str:
    from llvmlite import ir  # only when saving: a load links the carried object code

    i8p = ir.IntType(8).as_pointer()
    i64, i32 = ir.IntType(64), ir.IntType(32)
    kernel = ir.FunctionType(ir.VoidType(), [i8p.as_pointer(), i64.as_pointer(), i32])
    module = ir.Module("tilefuse_run_all")
    fn = ir.Function(module, ir.FunctionType(ir.VoidType(), [i64.as_pointer()]), SYMBOL)
    (context,) = fn.args
    entry = fn.append_basic_block("entry")
    b = ir.IRBuilder(entry)
    fields = [b.load(b.gep(context, [ir.Constant(i64, k)])) for k in range(7)]
    calls, patches = fields[0], fields[4]
    entries, tables, scalars, patch, io = (
        b.inttoptr(fields[k], t) for k, t in
        ((1, i8p.as_pointer()), (2, i8p.as_pointer().as_pointer()),
         (3, i64.as_pointer().as_pointer()), (5, i64.as_pointer()), (6, i8p.as_pointer())))

    def loop(count: ir.Value, name: str, body: object) -> None:
        head = fn.append_basic_block(f"{name}.head")
        step = fn.append_basic_block(f"{name}.body")
        done = fn.append_basic_block(f"{name}.done")
        before = b.block
        b.branch(head)
        b.position_at_end(head)
        i = b.phi(i64, name)
        i.add_incoming(ir.Constant(i64, 0), before)
        b.cbranch(b.icmp_signed("<", i, count), step, done)
        b.position_at_end(step)
        body(i)  # type: ignore[operator]
        i.add_incoming(b.add(i, ir.Constant(i64, 1)), b.block)
        b.branch(head)
        b.position_at_end(done)

    def write(p: ir.Value) -> None:
        base = b.mul(p, ir.Constant(i64, 3))
        call = b.load(b.gep(patch, [base]))
        pos = b.load(b.gep(patch, [b.add(base, ir.Constant(i64, 1))]))
        index = b.load(b.gep(patch, [b.add(base, ir.Constant(i64, 2))]))
        table = b.load(b.gep(tables, [call]))
        b.store(b.load(b.gep(io, [index])), b.gep(table, [pos]))

    def run(c: ir.Value) -> None:
        target = b.bitcast(b.load(b.gep(entries, [c])), kernel.as_pointer())
        b.call(target, [b.load(b.gep(tables, [c])), b.load(b.gep(scalars, [c])),
                        ir.Constant(i32, 0)])

    loop(patches, "p", write)
    loop(calls, "c", run)
    b.ret_void()
    return str(module)


def launcher_object(target: CpuTarget) -> bytes:
    """The generic launcher as relocatable object code for ``target`` (at save time)."""
    import llvmlite.binding as llvm

    tm = target_machine(target)
    module = llvm.parse_assembly(_ir())
    module.triple = target.triple
    module.data_layout = str(tm.target_data)
    module.verify()
    return tm.emit_object(module)


def link_launcher(obj: bytes, target: CpuTarget, path: str) -> tuple[int, object]:
    """(address of the generic launcher, the engine that owns its code)."""
    try:
        check_object(obj)
    except TilefuseError as err:
        raise ArtifactError(f"{path}: the launcher: {err}") from None
    from tilefuse.runtime.object_link import link

    try:
        engine = link([obj])
    except TilefuseError as err:
        raise ArtifactError(f"{path}: the launcher does not link: {err}") from None
    address = engine.get_function_address(SYMBOL)
    if not address:
        raise ArtifactError(f"{path}: the launcher section defines no {SYMBOL}")
    return address, engine


class SequenceLauncher:
    """``launcher(addresses)`` runs an all-native launch sequence through the generic launcher
    (``addresses[i]``: the call's io buffer i)."""

    def __init__(self, address: int, engine: object, steps: Sequence[Step], io_count: int):
        launches = [launch for step in steps if isinstance(step, NativeStep)
                    for launch in step.launches]
        self._engine = engine  # owns the launcher's code
        self._tables = []
        patches: list[int] = []
        scalar_tables = []
        for c, launch in enumerate(launches):
            pointers = [0 if isinstance(a, int) else a.ctypes.data for a in launch.args]
            self._tables.append((ctypes.c_void_p * max(1, len(pointers)))(*pointers))
            scalar_tables.append((ctypes.c_int64 * max(1, len(launch.scalars)))(
                *launch.scalars))
            for pos, a in enumerate(launch.args):
                if isinstance(a, int):
                    if not 0 <= a < io_count:
                        raise ArtifactError(f"launch {c}: io index {a} out of range")
                    patches += [c, pos, a]
        self._scalars = scalar_tables
        self._launches = launches  # keep kernels and fixed arrays alive
        n = max(1, len(launches))
        self._entries = (ctypes.c_void_p * n)(*[launch.kernel.address for launch in launches])
        self._table_ptrs = (ctypes.c_void_p * n)(*[ctypes.addressof(t) for t in self._tables])
        self._scalar_ptrs = (ctypes.c_void_p * n)(*[ctypes.addressof(t) for t in scalar_tables])
        self._patch = (ctypes.c_int64 * max(1, len(patches)))(*patches)
        self._io = (ctypes.c_void_p * max(1, io_count))()
        self._count = io_count
        self._context = (ctypes.c_int64 * 7)(
            len(launches), ctypes.addressof(self._entries), ctypes.addressof(self._table_ptrs),
            ctypes.addressof(self._scalar_ptrs), len(patches) // 3,
            ctypes.addressof(self._patch), ctypes.addressof(self._io))
        self._entry = _ENTRY(address)
        self._context_at = ctypes.addressof(self._context)

    def __call__(self, addresses: Sequence[int]) -> None:
        self._io[:self._count] = addresses
        self._entry(self._context_at)
