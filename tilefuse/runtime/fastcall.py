"""A native executable's call as one CPython builtin: ``fast(*arrays) -> array``.

``tilefuse.jit``'s call of a small function was ~1.7 µs against NumPy's ~1.1 µs for the sum
of 1k floats, and ~1.2 µs of it was the executable's Python step (``run_args``: the arguments'
addresses and contiguity, the lock, the pooled output, the ctypes entry). This module compiles
that step, per executable, into a ``METH_FASTCALL`` builtin (LLVM IR through llvmlite, linked
against this process's CPython) that:

* checks each argument exactly as the Python step would accept it: an ``ndarray`` (not a
  subclass) whose dtype is the compiled one (the same descriptor object: NumPy's builtin
  descriptors are singletons), of the compiled rank and dims, C-contiguous, aligned where a
  kernel needs it — reading the ``PyArrayObject`` fields (NumPy's ABI: data, nd, dimensions,
  strides, base, descr, flags);
* reuses the output the executable returned last time when the caller has released it
  (the array is referenced only by the executable's list, its base only by the array: the
  Python step's rule, :func:`tilefuse.runtime.native._released`);
* takes the executable's lock without waiting (a Python-step call in another thread holds it
  while its kernels run with the GIL released), runs the launch sequence through its native
  entry with its own address table, releases the lock and returns the output.

Anything else — another type, dtype, shape or layout, a misaligned array, an output still
held, the lock taken — goes to ``fallback(*arrays)`` (the Python step: it copies, allocates or
raises the GuardError as before), so the builtin has no semantics of its own. It runs holding
the GIL, so it is built only for executables whose inputs and outputs are small
(:data:`MAX_BYTES`): there the call's overhead is what matters, and the kernels are short.
Layouts read here: ``PyObject`` (refcount at 0, type at 8), ``PyListObject.ob_item`` at 24,
``PyArrayObject`` as above, ``_thread.lock``'s ``PyThread_type_lock`` at 16 (CPython 3.8-3.12,
64-bit). :func:`supported` says whether this process matches them.
"""

from __future__ import annotations

import ctypes
import functools
import os
import sys
import threading
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

MAX_BYTES = 1 << 20
"""Inputs plus outputs up to this many bytes take the builtin (it holds the GIL while the
kernels run)."""

METH_FASTCALL = 0x0080
_NPY_C_CONTIGUOUS = 0x0001

# field offsets (64-bit CPython 3.8-3.12, NumPy 1.x/2.x PyArrayObject_fields)
_REFCNT, _TYPE = 0, 8
_LIST_ITEMS = 24
_DATA, _ND, _DIMS, _BASE, _DESCR, _FLAGS = 16, 24, 32, 48, 56, 64
_LOCK = 16


class _MethodDef(ctypes.Structure):
    _fields_ = [("ml_name", ctypes.c_char_p), ("ml_meth", ctypes.c_void_p),
                ("ml_flags", ctypes.c_int), ("ml_doc", ctypes.c_char_p)]


ENABLE_VAR = "TILEFUSE_FAST_CALL"
"""``0``/``off``: every call takes the Python step (for comparisons and as a way out)."""


def enabled() -> bool:
    """Whether executables get the builtin: this interpreter has the layouts it reads and
    :data:`ENABLE_VAR` does not turn it off."""
    return os.environ.get(ENABLE_VAR, "1").strip().lower() not in ("0", "off", "no", "false") \
        and supported()


@functools.cache
def supported() -> bool:
    """Whether this interpreter has the layouts the builtin reads (64-bit CPython 3.8-3.12,
    reference counts in a plain field), checked on a live array, list and lock."""
    if not (sys.implementation.name == "cpython" and (3, 8) <= sys.version_info[:2] <= (3, 12)
            and ctypes.sizeof(ctypes.c_void_p) == 8 and not hasattr(sys, "getobjects")):
        return False
    a = np.zeros((3, 5), np.float32)[1:]
    items = [a]
    at = id(a)

    def word(address: int, offset: int, ctype: Any = ctypes.c_int64) -> int:
        return int(ctype.from_address(address + offset).value or 0)

    count = sys.getrefcount(a) - 1   # getrefcount's own argument
    lock = threading.Lock()
    return (word(at, _REFCNT) == count and word(at, _TYPE) == id(np.ndarray)
            and word(at, _DATA) == a.ctypes.data and word(at, _ND, ctypes.c_int32) == 2
            and word(word(at, _DIMS), 8) == 5 and word(at, _BASE) == id(a.base)
            and word(at, _DESCR) == id(a.dtype) and word(at, _FLAGS, ctypes.c_int32) & 1
            and word(word(id(items), _LIST_ITEMS), 0) == at and word(id(lock), _LOCK) != 0)


def build_fast_call(inputs: Sequence[tuple[tuple[int, ...], Any]],
                    output: tuple[tuple[int, ...], Any], align: dict[int, int],
                    returned: list[Any], lock: Any, entry: int,
                    fallback: Callable[..., Any], keep: Sequence[object] = (),
                    checks: Sequence[np.ndarray] = ()) -> Callable[..., Any]:
    """The builtin for an executable whose inputs are ``inputs`` ((shape, dtype) each) and
    whose one output is ``output``, aligned as ``align`` (input position -> bytes) says;
    ``returned`` is the executable's list of returned outputs (slot 0 read on every call),
    ``lock`` its ``threading.Lock``, ``entry`` the address of its launch sequence
    ``void entry(void **io)``; ``keep``: objects the builtin must keep alive (the launcher).
    ``checks``: the gathers' bad-index flags (i64 arrays, element 0 set by a kernel that met
    an index out of range): when one is set after the run, the call goes to ``fallback``,
    which runs it again, raises the reference's error and clears the flag."""
    import llvmlite.binding as llvm
    from llvmlite import ir

    from tilefuse.codegen.jit import _parse
    from tilefuse.codegen.target import host_target, target_machine

    i8, i32, i64 = ir.IntType(8), ir.IntType(32), ir.IntType(64)
    ptr = i8.as_pointer()
    io = (ctypes.c_void_p * (len(inputs) + 1))()
    descrs = [np.dtype(dtype) for _, dtype in inputs]
    api = ctypes.pythonapi
    symbols = {name: ctypes.cast(getattr(api, name), ctypes.c_void_p).value
               for name in ("PyObject_Vectorcall", "PyThread_acquire_lock",
                            "PyThread_release_lock")}
    entry_name = f"tilefuse.fastcall.entry.{entry:x}"
    symbols[entry_name] = entry
    for name, address in symbols.items():
        llvm.add_symbol(name, address)

    module = ir.Module("tilefuse_fastcall")
    fn_type = ir.FunctionType(ptr, [ptr, ptr.as_pointer(), i64])
    fn = ir.Function(module, fn_type, "tilefuse_fast_call")
    vectorcall = ir.Function(module, ir.FunctionType(ptr, [ptr, ptr.as_pointer(), i64, ptr]),
                             "PyObject_Vectorcall")
    acquire = ir.Function(module, ir.FunctionType(i32, [ptr, i32]), "PyThread_acquire_lock")
    release = ir.Function(module, ir.FunctionType(ir.VoidType(), [ptr]),
                          "PyThread_release_lock")
    launch = ir.FunctionType(ir.VoidType(), [ptr.as_pointer()])
    _, args, nargs = fn.args
    entry_bb = fn.append_basic_block("entry")
    fail = fn.append_basic_block("fallback")
    b = ir.IRBuilder(entry_bb)

    def const(value: int) -> ir.Constant:
        return ir.Constant(i64, value)

    def field(obj: ir.Value, offset: int, typ: ir.Type = i64) -> ir.Value:
        at = b.gep(obj, [ir.Constant(i64, offset)])
        return b.load(b.bitcast(at, typ.as_pointer()))

    def check(cond: ir.Value) -> None:
        ok = fn.append_basic_block("ok")
        b.cbranch(cond, ok, fail)
        b.position_at_end(ok)

    check(b.icmp_signed("==", nargs, const(len(inputs))))
    table = const(ctypes.addressof(io)).inttoptr(ptr.as_pointer())
    for i, ((shape, _), descr) in enumerate(zip(inputs, descrs)):
        a = b.load(b.gep(args, [ir.Constant(i64, i)]))
        check(b.icmp_unsigned("==", field(a, _TYPE), const(id(np.ndarray))))
        check(b.icmp_unsigned("==", field(a, _DESCR), const(id(descr))))
        check(b.icmp_signed("==", field(a, _ND, i32), ir.Constant(i32, len(shape))))
        if shape:
            dims = field(a, _DIMS, ptr)
            for d, extent in enumerate(shape):
                check(b.icmp_signed("==", field(dims, 8 * d), const(extent)))
        flags = field(a, _FLAGS, i32)
        check(b.icmp_unsigned("!=", b.and_(flags, ir.Constant(i32, _NPY_C_CONTIGUOUS)),
                              ir.Constant(i32, 0)))
        data = field(a, _DATA, ptr)
        if align.get(i, 1) > 1:
            low = b.and_(b.ptrtoint(data, i64), const(align[i] - 1))
            check(b.icmp_unsigned("==", low, const(0)))
        b.store(data, b.gep(table, [ir.Constant(i64, i)]))
    items = field(const(id(returned)).inttoptr(ptr), _LIST_ITEMS, ptr.as_pointer())
    out = b.load(items)
    check(b.icmp_unsigned("==", field(out, _TYPE), const(id(np.ndarray))))
    check(b.icmp_signed("==", field(out, _REFCNT), const(1)))
    base = field(out, _BASE, ptr)
    no_base = b.icmp_unsigned("==", base, ir.Constant(ptr, None))
    with b.if_then(b.not_(no_base)):
        check(b.icmp_signed("==", field(base, _REFCNT), const(1)))
    b.store(field(out, _DATA, ptr), b.gep(table, [ir.Constant(i64, len(inputs))]))
    lock_ptr = field(const(id(lock)).inttoptr(ptr), _LOCK, ptr)
    check(b.icmp_signed("!=", b.call(acquire, [lock_ptr, ir.Constant(i32, 0)]),
                        ir.Constant(i32, 0)))
    b.call(ir.Function(module, launch, entry_name), [table])
    b.call(release, [lock_ptr])
    for flags in checks:
        word = b.load(const(flags.ctypes.data).inttoptr(i64.as_pointer()))
        check(b.icmp_signed("==", word, const(0)))
    count = b.bitcast(out, i64.as_pointer())
    b.store(b.add(b.load(count), const(1)), count)
    b.ret(out)
    b.position_at_end(fail)
    target = const(id(fallback)).inttoptr(ptr)
    b.ret(b.call(vectorcall, [target, args, nargs, ir.Constant(ptr, None)]))

    tm = target_machine(host_target())
    parsed = _parse(str(module), "tilefuse_fast_call")
    parsed.triple = tm.triple
    parsed.data_layout = str(tm.target_data)
    engine = llvm.create_mcjit_compiler(parsed, tm)
    engine.finalize_object()
    address = engine.get_function_address("tilefuse_fast_call")
    method = _MethodDef(b"tilefuse_fast_call", address, METH_FASTCALL, None)
    new = api.PyCFunction_NewEx
    new.restype = ctypes.py_object
    new.argtypes = [ctypes.POINTER(_MethodDef), ctypes.py_object, ctypes.py_object]
    owner = (method, engine, io, descrs, returned, lock, fallback, tuple(keep), tuple(checks))
    return new(ctypes.byref(method), owner, None)  # type: ignore[no-any-return]


__all__ = ["MAX_BYTES", "build_fast_call", "supported"]
