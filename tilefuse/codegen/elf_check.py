"""A structural check of ELF64 x86-64 relocatable objects, before LLVM sees them.

llvmlite hands object bytes to LLVM's runtime linker without checking for parse errors, and a
malformed object crashes the process. :func:`check_object` rejects (CompileError) anything that
is not a well-formed relocatable object for x86-64: header, section table, symbol tables and
relocation entries all within bounds and consistent. It cannot tell a valid object from a
tampered one: for that, :mod:`tilefuse.codegen.jit`'s container format carries a digest.
"""

from __future__ import annotations

import struct

from tilefuse.errors import CompileError

_HEADER = struct.Struct("<16sHHIQQQIHHHHHH")
_SECTION = struct.Struct("<IIQQQQIIQQ")
_SYMBOL = struct.Struct("<IBBHQQ")
_RELA = struct.Struct("<QQq")
_SHT_NULL, _SHT_SYMTAB, _SHT_STRTAB, _SHT_RELA, _SHT_NOBITS = 0, 2, 3, 4, 8
_SHN_LORESERVE = 0xFF00
_ET_REL, _EM_X86_64 = 1, 62
# relocation types LLVM's runtime linker implements for x86-64 (others abort the process):
# NONE, 64, PC32, PLT32, GOTPCREL, 32, 32S, PC64, GOTOFF64, GOTPC32, GOTPCRELX, REX_GOTPCRELX
_RELOCATION_TYPES = frozenset({0, 1, 2, 4, 9, 10, 11, 24, 25, 26, 41, 42})


def _fail(why: str) -> CompileError:
    return CompileError(f"not a usable x86-64 object file: {why}")


def check_object(data: bytes) -> None:
    """Raises CompileError unless ``data`` is a well-formed ELF64 x86-64 relocatable object."""
    if len(data) < _HEADER.size:
        raise _fail("too short")
    (ident, e_type, machine, _version, _entry, _phoff, shoff, _flags, ehsize, _phentsize,
     _phnum, shentsize, shnum, shstrndx) = _HEADER.unpack_from(data)
    if ident[:4] != b"\x7fELF" or ident[4] != 2 or ident[5] != 1:
        raise _fail("not a 64-bit little-endian ELF file")
    if e_type != _ET_REL or machine != _EM_X86_64 or ehsize != _HEADER.size:
        raise _fail(f"ELF type {e_type}, machine {machine}")
    if shentsize != _SECTION.size or shnum == 0 or shstrndx >= shnum:
        raise _fail("bad section table header")
    if shoff + shnum * shentsize > len(data):
        raise _fail("section table beyond the end of the file")
    sections = [_SECTION.unpack_from(data, shoff + i * shentsize) for i in range(shnum)]
    names = sections[shstrndx]
    if names[1] != _SHT_STRTAB:
        raise _fail("section names are not in a string table")
    for index, (name, kind, _fl, _addr, offset, size, link, info, align, entsize) in \
            enumerate(sections):
        if kind not in (_SHT_NULL, _SHT_NOBITS) and offset + size > len(data):
            raise _fail(f"section {index} beyond the end of the file")
        if name >= max(1, names[5]) or align & (align - 1):
            raise _fail(f"section {index} has a bad name or alignment")
        if link >= shnum:
            raise _fail(f"section {index} links to a missing section")
        if kind in (_SHT_SYMTAB, _SHT_RELA):
            want = _SYMBOL.size if kind == _SHT_SYMTAB else _RELA.size
            if entsize != want or size % want:
                raise _fail(f"section {index} has entries of {entsize} bytes")
        if kind == _SHT_SYMTAB:
            _check_symbols(data, sections, index)
        if kind == _SHT_RELA:
            _check_relocations(data, sections, index, info)


def _check_symbols(data: bytes, sections: list[tuple], index: int) -> None:
    _n, _k, _f, _a, offset, size, link, _i, _al, _e = sections[index]
    strtab = sections[link]
    if strtab[1] != _SHT_STRTAB:
        raise _fail(f"symbol table {index} names are not in a string table")
    for pos in range(offset, offset + size, _SYMBOL.size):
        name, _info, _other, shndx, _value, _size = _SYMBOL.unpack_from(data, pos)
        if name >= max(1, strtab[5]):
            raise _fail("a symbol name lies outside its string table")
        if shndx < _SHN_LORESERVE and shndx >= len(sections):
            raise _fail("a symbol refers to a missing section")


def _check_relocations(data: bytes, sections: list[tuple], index: int, target: int) -> None:
    _n, _k, _f, _a, offset, size, link, _i, _al, _e = sections[index]
    symtab = sections[link]
    if symtab[1] != _SHT_SYMTAB or target >= len(sections):
        raise _fail(f"relocation section {index} has no symbol table or target")
    symbols = symtab[5] // _SYMBOL.size
    target_size = sections[target][5]
    for pos in range(offset, offset + size, _RELA.size):
        where, info, _addend = _RELA.unpack_from(data, pos)
        if info >> 32 >= symbols or where >= target_size:
            raise _fail(f"relocation section {index} has an entry out of range")
        if info & 0xFFFF_FFFF not in _RELOCATION_TYPES:
            raise _fail(f"relocation type {info & 0xFFFF_FFFF} is not supported")
