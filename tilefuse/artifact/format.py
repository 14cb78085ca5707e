"""The artifact container: a versioned header, a table of named sections, checksums.

A ``.tilefuse`` file is mapped and validated before anything in it is used: the magic, the
format version, the header's counts and lengths against the file's real size, the section
table's CRC-32, every section's bounds and every section's CRC-32. Only then are the sections
handed out (as read-only views of the page-aligned mapping, so that weights are used in place,
never copied). Every failure is an :class:`ArtifactError` that names the file and what is wrong; no
input makes the reader raise anything else. Nothing is pickled: sections are bytes, and the
manifest section is JSON.

Layout (integers little-endian; every section starts on a 64-byte boundary, zero padded)::

    magic  b"TILEFUSE"                     8 bytes
    format version u32, section count u32
    file length u64
    CRC-32 of the section table u32, reserved u32 (0)
    section table: per section  name (32 bytes, ASCII, NUL padded), offset u64, length u64,
                                CRC-32 of the section u32, reserved u32 (0)
    sections

CRC-32 rather than sha256: it detects the corruption a file meets (truncation, flipped bits, a
partial copy) at 3x sha256's speed here (~20 ms for ResNet-50's 100 MB instead of ~60 ms, in a
load that aims at ~100 ms). It is no defence against a forger, who could as well forge a hash
in the same file; the structural checks (the ELF check of every kernel object, the bounds of
every slot) are what keep a malformed file from crashing the process.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import struct
import zlib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tilefuse.errors import TilefuseError

MAGIC = b"TILEFUSE"
FORMAT_VERSION = 1
ALIGN = 64
MAX_SECTIONS = 1 << 20
"""More sections than this is a hostile or corrupt count (a ResNet-50 artifact has ~300)."""
NAME_BYTES = 32

_HEADER = struct.Struct("<8sIIQII")
_ENTRY = struct.Struct(f"<{NAME_BYTES}sQQII")


class ArtifactError(TilefuseError):
    """A ``.tilefuse`` file that cannot be used: unreadable, corrupt, of another format version,
    or made for a CPU this host is not."""


@dataclass(frozen=True)
class Container:
    """A validated file's sections by name (read-only views of one aligned buffer)."""

    path: str
    version: int
    sections: Mapping[str, memoryview]

    def section(self, name: str) -> memoryview:
        """The section ``name``; ArtifactError when the file has none."""
        found = self.sections.get(name)
        if found is None:
            raise ArtifactError(f"{self.path}: the artifact has no section {name!r}")
        return found

    def array(self, name: str, dtype: np.dtype, shape: tuple[int, ...]) -> np.ndarray:
        """Section ``name`` as a read-only array of ``dtype`` and ``shape`` (no copy);
        ArtifactError unless its length is exactly that array's."""
        data = self.section(name)
        count = 1
        for d in shape:
            if type(d) is not int or d < 0:
                raise ArtifactError(f"{self.path}: section {name!r} has a bad shape {shape}")
            count *= d
        if count * dtype.itemsize != len(data):
            raise ArtifactError(f"{self.path}: section {name!r} holds {len(data)} bytes, not a "
                                f"{dtype}{list(shape)} array ({count * dtype.itemsize} bytes)")
        array = np.frombuffer(data, dtype, count).reshape(shape)
        array.flags.writeable = False
        return array


def _padding(length: int) -> int:
    return -length % ALIGN


def encode(sections: Mapping[str, bytes | memoryview]) -> bytes:
    """The file bytes holding ``sections`` (name -> bytes), in the given order."""
    names = list(sections)
    if len(names) > MAX_SECTIONS:
        raise ArtifactError(f"an artifact holds at most {MAX_SECTIONS} sections, "
                            f"got {len(names)}")
    table_end = _HEADER.size + _ENTRY.size * len(names)
    offset = table_end + _padding(table_end)
    entries, layout = [], []
    for name in names:
        raw = name.encode("ascii")
        if not raw or len(raw) > NAME_BYTES or b"\0" in raw:
            raise ArtifactError(f"bad section name {name!r} (1-{NAME_BYTES} ASCII characters)")
        length = len(sections[name])
        entries.append(_ENTRY.pack(raw, offset, length, zlib.crc32(sections[name]), 0))
        layout.append(offset)
        offset += length + _padding(length)
    total = offset
    table = b"".join(entries)
    body = bytearray(total)
    body[:_HEADER.size] = _HEADER.pack(MAGIC, FORMAT_VERSION, len(names), total,
                                       zlib.crc32(table), 0)
    body[_HEADER.size:table_end] = table
    for name, at in zip(names, layout):
        data = sections[name]
        body[at:at + len(data)] = data
    return bytes(body)


def write(path: str | Path, sections: Mapping[str, bytes | memoryview]) -> int:
    """Writes the artifact atomically (a temp file in the same directory, then a rename);
    returns its size in bytes."""
    data = encode(sections)
    path = Path(path)
    temp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with open(temp, "wb") as file:
            file.write(data)
        os.replace(temp, path)
    except OSError as err:
        with contextlib.suppress(OSError):
            os.unlink(temp)
        raise ArtifactError(f"cannot write artifact {path}: {err.strerror or err}") from None
    return len(data)


def read(path: str | Path) -> Container:
    """The validated container at ``path`` (see the module docstring); ArtifactError for a
    file that is missing, truncated, corrupt or of another format version.

    The file is mapped, not read: sections (weights included) are read-only views of the
    mapping, paged in as they are used, never copied. :func:`write` replaces a file by a rename,
    so a mapped artifact keeps its bytes while a new one is written in its place."""
    shown = str(path)
    try:
        with open(path, "rb") as file:
            size = os.fstat(file.fileno()).st_size
            parse_header(memoryview(file.read(_HEADER.size)), size, shown)  # before mapping
            mapped = mmap.mmap(file.fileno(), size, access=mmap.ACCESS_READ)
    except OSError as err:
        raise ArtifactError(f"cannot read artifact {shown}: {err.strerror or err}") from None
    except (ValueError, OverflowError) as err:  # mmap refuses the size
        raise ArtifactError(f"cannot map artifact {shown}: {err}") from None
    return parse(memoryview(mapped).toreadonly(), shown)


def parse_header(data: memoryview, size: int, shown: str) -> tuple[int, int]:
    """(section count, table CRC) from the header of a file of ``size`` bytes, after checking
    magic, version, length and count; ArtifactError otherwise."""
    if len(data) < _HEADER.size:
        raise ArtifactError(f"{shown}: truncated ({size} bytes, less than the {_HEADER.size}-byte "
                            "header of a tilefuse artifact)")
    magic, version, count, total, table_crc, _ = _HEADER.unpack_from(data)
    if magic != MAGIC:
        raise ArtifactError(f"{shown}: not a tilefuse artifact (it does not start with "
                            f"{MAGIC!r})")
    if version != FORMAT_VERSION:
        raise ArtifactError(f"{shown}: artifact format version {version}; this tilefuse reads "
                            f"version {FORMAT_VERSION} (compile the model again with this "
                            "tilefuse)")
    if total != size:
        what = "truncated" if size < total else "followed by extra bytes"
        raise ArtifactError(f"{shown}: {what} ({size} bytes, its header says {total})")
    if count > MAX_SECTIONS:
        raise ArtifactError(f"{shown}: the header claims {count} sections (at most "
                            f"{MAX_SECTIONS})")
    if _HEADER.size + _ENTRY.size * count > size:
        raise ArtifactError(f"{shown}: its section table ({count} entries) runs past the end of "
                            f"the file ({size} bytes)")
    return count, table_crc


def parse(data: memoryview, shown: str = "<artifact>") -> Container:
    """The validated container in ``data`` (the whole file)."""
    size = len(data)
    count, table_crc = parse_header(data, size, shown)
    table_end = _HEADER.size + _ENTRY.size * count
    if zlib.crc32(data[_HEADER.size:table_end]) != table_crc:
        raise ArtifactError(f"{shown}: checksum mismatch in the section table (the file is "
                            "corrupt)")
    sections: dict[str, memoryview] = {}
    for i in range(count):
        raw, offset, length, crc, _ = _ENTRY.unpack_from(data, _HEADER.size + i * _ENTRY.size)
        name = _section_name(raw, i, shown)
        if offset < table_end or offset > size or length > size - offset:
            raise ArtifactError(f"{shown}: section {name!r} (offset {offset}, {length} bytes) "
                                f"lies outside the file ({size} bytes)")
        if name in sections:
            raise ArtifactError(f"{shown}: section {name!r} appears twice")
        section = data[offset:offset + length]
        if zlib.crc32(section) != crc:
            raise ArtifactError(f"{shown}: checksum mismatch in section {name!r} (the file is "
                                "corrupt)")
        sections[name] = section
    return Container(shown, FORMAT_VERSION, sections)


def _section_name(raw: bytes, index: int, shown: str) -> str:
    name = raw.rstrip(b"\0")
    try:
        text = name.decode("ascii")
    except UnicodeDecodeError:
        text = ""
    if not text or b"\0" in name or not text.isprintable():
        raise ArtifactError(f"{shown}: section {index} has a malformed name {raw!r}")
    return text
