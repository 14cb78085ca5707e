"""runtime/object_link.py: object code linked without LLVM runs as MCJIT's link of it does,
and object code it cannot link is a clear error, never a crash."""

from __future__ import annotations

import struct

import numpy as np
import pytest

from tilefuse.codegen.abi import CompiledKernel
from tilefuse.codegen.jit import compile_kernel
from tilefuse.codegen.target import registered_symbols
from tilefuse.dtypes import DType
from tilefuse.loop import LoopKind, loop, var
from tilefuse.loop.ir import BufferParam, LoopFunction, XOp, unary
from tilefuse.runtime.object_link import LinkError, link


def _kernel(parallel: bool) -> CompiledKernel:
    x, y = BufferParam("X", DType.f32, readonly=True), BufferParam("Y", DType.f32)
    body = [y.store(var("i"), unary(XOp.EXP, x.load(var("i"))) * 2.0)]
    fn = LoopFunction("expx2", (x, y), ("n",),
                      loop("i", 0, var("n"), body,
                           kind=LoopKind.PARALLEL if parallel else LoopKind.SERIAL))
    return compile_kernel(fn)


@pytest.mark.parametrize("parallel", [False, True])
def test_linked_code_computes_what_mcjit_linked_code_does(parallel: bool) -> None:
    compiled = _kernel(parallel)
    obj = compiled.object_code()
    image = link([obj], registered_symbols())
    linked = CompiledKernel(compiled.signature, image, compiled.target, None, obj)
    assert linked.address != compiled.address
    x = np.random.default_rng(0).standard_normal(100_003).astype(np.float32)
    want, got = np.empty_like(x), np.full_like(x, np.nan)
    compiled(x, want, x.size)
    linked(x, got, x.size)
    assert np.array_equal(got, want)


def _relocation_types(obj: bytes) -> list[tuple[int, int]]:
    """(file offset of r_info, type) of every relocation in ``obj``."""
    header = struct.unpack_from("<16sHHIQQQIHHHHHH", obj)
    shoff, shnum = header[6], header[12]
    found = []
    for i in range(shnum):
        sec = struct.unpack_from("<IIQQQQIIQQ", obj, shoff + i * 64)
        if sec[1] == 4:  # RELA
            for pos in range(sec[4], sec[4] + sec[5], 24):
                found.append((pos + 8, struct.unpack_from("<Q", obj, pos + 8)[0] & 0xFFFFFFFF))
    return found


def test_unsupported_relocations_and_missing_symbols_are_errors() -> None:
    obj = bytearray(_kernel(True).object_code())
    relocations = _relocation_types(bytes(obj))
    assert relocations
    at, _ = relocations[0]
    info = struct.unpack_from("<Q", obj, at)[0]
    bad = bytearray(obj)
    struct.pack_into("<Q", bad, at, (info & ~0xFFFFFFFF) | 9)  # GOTPCREL: not supported
    with pytest.raises(LinkError, match="relocation type 9"):
        link([bytes(bad)], registered_symbols())
    with pytest.raises(LinkError, match="undefined symbol 'tilefuse_parallel'"):
        link([bytes(obj)], {})  # the pool's entry is not the C library's
