"""Relocatable x86-64 object code linked into this process without LLVM.

An artifact's kernels, its thread pool and its launcher are ELF64 relocatable objects that
tilefuse's code generator made (large code model: absolute 64-bit addresses). Loading them
through LLVM's MCJIT means loading LLVM itself (``llvmlite.binding``: most of a cold start's
import time); this module does the little linking they need, in Python:

1. each object is parsed (it has passed :func:`tilefuse.codegen.elf_check.check_object`, whose
   bounds checks this module relies on; what is used here is checked again);
2. the sections a program loads (``SHF_ALLOC``; unwind tables are left out: no exception
   crosses generated code) are laid out in one anonymous mapping: code and read-only data in
   pages that become read + execute, writable data and zero-filled sections in pages that stay
   read + write (never both writable and executable);
3. symbols are resolved: the objects' own globals, then the names given (``tilefuse_parallel``,
   the thread pool's entry), then the C library's (``pthread_create``, ``syscall``...);
4. relocations are applied (``R_X86_64_64``, ``PC64``, ``PC32``, ``PLT32``, ``32``, ``32S``;
   any other, or a value out of the field's range, is a :class:`LinkError`), then the code
   pages are made executable (``mprotect``).

:func:`link` returns a :class:`LinkedImage`, whose :meth:`~LinkedImage.get_function_address`
is the one thing callers ask of an MCJIT engine; the mapping lives as long as the image.
"""

from __future__ import annotations

import ctypes
import mmap
import struct
from collections.abc import Mapping, Sequence

from tilefuse.errors import CompileError

_HEADER = struct.Struct("<16sHHIQQQIHHHHHH")
_SECTION = struct.Struct("<IIQQQQIIQQ")
_SYMBOL = struct.Struct("<IBBHQQ")
_RELA = struct.Struct("<QQq")
_SHT_SYMTAB, _SHT_RELA, _SHT_NOBITS = 2, 4, 8
_SHF_WRITE, _SHF_ALLOC = 0x1, 0x2
_SHT_X86_64_UNWIND = 0x70000001
_SHN_UNDEF, _SHN_LORESERVE, _SHN_ABS = 0, 0xFF00, 0xFFF1
_STB_LOCAL = 0
_STT_SECTION = 3
_PAGE = mmap.PAGESIZE
_R_64, _R_PC32, _R_PLT32, _R_32, _R_32S, _R_PC64 = 1, 2, 4, 10, 11, 24
_FIELDS = {_R_64: ("<Q", 0, 1 << 64, False), _R_PC64: ("<q", -(1 << 63), 1 << 63, True),
           _R_PC32: ("<i", -(1 << 31), 1 << 31, True), _R_PLT32: ("<i", -(1 << 31), 1 << 31, True),
           _R_32: ("<I", 0, 1 << 32, False), _R_32S: ("<i", -(1 << 31), 1 << 31, False)}
"""Relocation type -> (field format, range of the value, PC-relative)."""

_LIBC = ctypes.CDLL(None, use_errno=True)
_mprotect = _LIBC.mprotect
_mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
_mprotect.restype = ctypes.c_int


class LinkError(CompileError):
    """Object code this linker cannot link (an unsupported relocation, a missing symbol)."""


class LinkedImage:
    """Linked code and data in one mapping; ``get_function_address(name)`` as MCJIT's."""

    def __init__(self, memory: mmap.mmap, anchor: ctypes.c_char, symbols: dict[str, int]):
        self._memory = memory  # the mapping: freed with the image
        self._anchor = anchor  # the buffer export that gave the mapping's address
        self.symbols = symbols

    def get_function_address(self, name: str) -> int:
        """The address of global ``name`` (0 when no object defines it)."""
        return self.symbols.get(name, 0)


def _libc_symbol(name: str) -> int:
    try:
        return ctypes.cast(getattr(_LIBC, name), ctypes.c_void_p).value or 0
    except AttributeError:
        return 0


class _Object:
    """One parsed object: its sections, symbols (name, bind, type, section, value)."""

    def __init__(self, data: bytes, index: int):
        self.data = data
        self.index = index
        head = _HEADER.unpack_from(data)
        shoff, shnum, shstrndx = head[6], head[12], head[13]
        self.sections = [_SECTION.unpack_from(data, shoff + i * _SECTION.size)
                         for i in range(shnum)]
        names = self.sections[shstrndx]
        self.names = [self._string(names, s[0]) for s in self.sections]
        self.symbols: list[tuple[str, int, int, int, int]] = []
        for sec in self.sections:
            if sec[1] == _SHT_SYMTAB:
                strtab = self.sections[sec[6]]
                for pos in range(sec[4], sec[4] + sec[5], _SYMBOL.size):
                    name, info, _other, shndx, value, _size = _SYMBOL.unpack_from(data, pos)
                    self.symbols.append((self._string(strtab, name), info >> 4, info & 0xF,
                                         shndx, value))
                break

    def _string(self, table: tuple, offset: int) -> str:
        start = table[4] + offset
        end = self.data.find(b"\0", start, table[4] + table[5])
        if end < 0:
            raise LinkError(f"object {self.index}: a name runs past its string table")
        return self.data[start:end].decode("ascii", "replace")

    def loaded(self, i: int) -> bool:
        """Whether section ``i`` is part of the running program."""
        _n, kind, flags, *_ = self.sections[i]
        return bool(flags & _SHF_ALLOC) and kind != _SHT_X86_64_UNWIND \
            and self.names[i] != ".eh_frame"


def link(objects: Sequence[bytes], externals: Mapping[str, int] | None = None) -> LinkedImage:
    """``objects`` linked together into this process (see the module docstring).
    ``externals``: addresses of symbols defined outside them (before the C library's)."""
    parsed = [_Object(obj, i) for i, obj in enumerate(objects)]
    # 1. layout: (object, section) -> offset; code and read-only data first, then writable
    offsets: dict[tuple[int, int], int] = {}
    size = code_end = 0
    for writable in (False, True):
        for o in parsed:
            for i, sec in enumerate(o.sections):
                if o.loaded(i) and bool(sec[2] & _SHF_WRITE) == writable:
                    align = max(1, sec[8])
                    size = -(-size // align) * align
                    offsets[(o.index, i)] = size
                    size += sec[5]
        if not writable:
            size = code_end = -(-size // _PAGE) * _PAGE
    total = max(_PAGE, -(-size // _PAGE) * _PAGE)
    memory = mmap.mmap(-1, total, prot=mmap.PROT_READ | mmap.PROT_WRITE)
    anchor = ctypes.c_char.from_buffer(memory)
    base = ctypes.addressof(anchor)
    for o in parsed:
        for i, sec in enumerate(o.sections):
            at = offsets.get((o.index, i))
            if at is not None and sec[1] != _SHT_NOBITS and sec[5]:
                memory[at:at + sec[5]] = o.data[sec[4]:sec[4] + sec[5]]
    # 2. symbols
    globals_: dict[str, int] = {}

    def address(o: _Object, symbol: tuple[str, int, int, int, int]) -> int | None:
        name, _bind, _kind, shndx, value = symbol
        if shndx == _SHN_ABS:
            return value
        if shndx == _SHN_UNDEF or shndx >= _SHN_LORESERVE:
            return None
        at = offsets.get((o.index, shndx))
        if at is None:
            raise LinkError(f"object {o.index}: symbol {name!r} lies in section "
                            f"{o.names[shndx]!r}, which is not loaded")
        return base + at + value

    for o in parsed:
        for symbol in o.symbols:
            if symbol[1] != _STB_LOCAL and symbol[0]:
                found = address(o, symbol)
                if found is not None:
                    if symbol[0] in globals_:
                        raise LinkError(f"symbol {symbol[0]!r} is defined twice")
                    globals_[symbol[0]] = found
    known = dict(externals or {})

    def resolve(o: _Object, index: int) -> int:
        if index >= len(o.symbols):
            raise LinkError(f"object {o.index}: a relocation names symbol {index} of "
                            f"{len(o.symbols)}")
        if index == 0:
            return 0
        symbol = o.symbols[index]
        if symbol[2] == _STT_SECTION:
            at = offsets.get((o.index, symbol[3]))
            if at is None:
                raise LinkError(f"object {o.index}: a relocation against an unloaded section")
            return base + at
        found = address(o, symbol)
        if found is not None:
            return found
        name = symbol[0]
        found = globals_.get(name) or known.get(name) or _libc_symbol(name)
        if not found:
            raise LinkError(f"object {o.index}: undefined symbol {name!r}")
        return found

    # 3. relocations
    for o in parsed:
        for sec in o.sections:
            if sec[1] != _SHT_RELA or sec[7] >= len(o.sections) or not o.loaded(sec[7]):
                continue
            target = offsets[(o.index, sec[7])]
            limit = o.sections[sec[7]][5]
            for pos in range(sec[4], sec[4] + sec[5], _RELA.size):
                r_offset, r_info, addend = _RELA.unpack_from(o.data, pos)
                kind = r_info & 0xFFFF_FFFF
                if kind == 0:
                    continue
                field = _FIELDS.get(kind)
                if field is None:
                    raise LinkError(f"object {o.index}: relocation type {kind} is not supported")
                fmt, low, high, relative = field
                if r_offset + struct.calcsize(fmt) > limit:
                    raise LinkError(f"object {o.index}: a relocation lies outside its section")
                value = resolve(o, r_info >> 32) + addend
                if relative:
                    value -= base + target + r_offset
                if not low <= value < high:
                    raise LinkError(f"object {o.index}: relocation type {kind} overflows "
                                    f"({value:#x})")
                struct.pack_into(fmt, memory, target + r_offset, value)
    # 4. code pages: read + execute
    if code_end and _mprotect(base, code_end, mmap.PROT_READ | mmap.PROT_EXEC) != 0:
        raise LinkError(f"mprotect refused to make {code_end} bytes of code executable "
                        f"(errno {ctypes.get_errno()})")
    return LinkedImage(memory, anchor, globals_)


__all__ = ["LinkError", "LinkedImage", "link"]
