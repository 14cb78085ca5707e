"""Reading tensors kept in external files, from inside the model's folder only.

An external location must be a plain relative path: absolute paths, drive letters, ``..`` parts
and anything that resolves (through symlinks, checked with :func:`os.path.realpath`) outside the
model's folder are rejected, as are offsets and lengths that do not fit the file. The bytes are
read into the tensor's ``raw_data``; :func:`tilefuse.onnx.tensors.tensor_to_array` then checks
the size against the dims.
"""

from __future__ import annotations

import os
import stat
from pathlib import PurePosixPath, PureWindowsPath

from onnx import TensorProto

from tilefuse.onnx.tensors import OnnxError, check_dims, to_dtype

_KEYS = frozenset({"location", "offset", "length", "checksum", "basepath"})


def _fields(t: TensorProto, what: str) -> dict[str, str]:
    fields: dict[str, str] = {}
    for entry in t.external_data:
        if entry.key not in _KEYS:
            raise OnnxError(f"{what}: unknown external data key {entry.key!r}")
        fields[entry.key] = entry.value
    if "location" not in fields:
        raise OnnxError(f"{what}: external data without a location")
    return fields


def _int_field(fields: dict[str, str], key: str, what: str) -> int | None:
    if key not in fields:
        return None
    try:
        value = int(fields[key])
    except ValueError:
        raise OnnxError(f"{what}: external data {key} {fields[key]!r} is not an integer") from None
    if value < 0:
        raise OnnxError(f"{what}: external data {key} {value} is negative")
    return value


def safe_location(base_dir: str, location: str, what: str) -> str:
    """The real path of ``location`` under ``base_dir``; OnnxError if it could leave it."""
    posix, windows = PurePosixPath(location), PureWindowsPath(location)
    if (not location or "\x00" in location or posix.is_absolute() or windows.is_absolute()
            or windows.drive or windows.root):
        raise OnnxError(f"{what}: external data location {location!r} must be a relative path "
                        "inside the model's folder")
    if ".." in posix.parts or ".." in windows.parts:
        raise OnnxError(f"{what}: external data location {location!r} contains '..'")
    root = os.path.realpath(base_dir)
    real = os.path.realpath(os.path.join(root, location))
    if os.path.commonpath([root, real]) != root or real == root:
        raise OnnxError(f"{what}: external data location {location!r} resolves to {real}, "
                        f"outside the model's folder {root}")
    return real


def load_external(t: TensorProto, base_dir: str | None, what: str) -> None:
    """Reads the external bytes of ``t`` into its raw_data (in place) and clears the
    external-data fields; every check happens before a byte is read."""
    fields = _fields(t, what)
    if base_dir is None:
        raise OnnxError(f"{what}: the tensor's data is in external file {fields['location']!r} "
                        "but the model was not loaded from a path (pass base_dir=)")
    path = safe_location(base_dir, fields["location"], what)
    offset = _int_field(fields, "offset", what) or 0
    length = _int_field(fields, "length", what)
    dims = check_dims(t.dims, what)
    need = to_dtype(t.data_type, what).itemsize
    for d in dims:
        need *= d
    if length is not None and length != need:
        raise OnnxError(f"{what}: external data length {length} does not match "
                        f"{list(dims)} elements ({need} bytes)")
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    except OSError as err:
        raise OnnxError(f"{what}: cannot open external data {fields['location']!r}: "
                        f"{err.strerror}") from None
    with os.fdopen(fd, "rb") as f:
        info = os.fstat(f.fileno())
        if not stat.S_ISREG(info.st_mode):
            raise OnnxError(f"{what}: external data {fields['location']!r} is not a regular file")
        if offset + need > info.st_size:
            raise OnnxError(f"{what}: external data {fields['location']!r} holds "
                            f"{info.st_size} bytes; offset {offset} + {need} bytes does not fit")
        f.seek(offset)
        data = f.read(need)
    if len(data) != need:
        raise OnnxError(f"{what}: external data {fields['location']!r} ended early")
    t.raw_data = data
    del t.external_data[:]
    t.data_location = TensorProto.DEFAULT
