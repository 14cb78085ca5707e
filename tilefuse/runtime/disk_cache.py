"""The on-disk compilation cache: compiled object code plus JSON metadata, one file per key.

The directory is ``$TILEFUSE_CACHE_DIR`` (default ``~/.cache/tilefuse``), created 0700 and
refused when another user owns it, others may write to it, or it is a symbolic link. Entries are
named by the sha256 of their key and written atomically (a temp file in the same directory,
fsync, ``os.replace``), so a reader sees a whole entry or none. Every read is validated (magic,
format version, lengths, checksum, the stored key); a bad entry is a miss with one warning on
the ``tilefuse.cache`` logger, and its file is removed. Nothing is pickled.

Entry file layout (integers little-endian)::

    magic  b"TFCACHE\\0"       8 bytes
    format version  u32
    metadata length u64, payload length u64
    sha256 of the 28 bytes above + metadata + payload    32 bytes
    metadata: UTF-8 JSON {"key": {part: text}, "metadata": {...}}
    payload: the bytes given to put()
"""

from __future__ import annotations

import errno
import hashlib
import json
import logging
import os
import re
import shlex
import stat
import struct
import tempfile
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any

from tilefuse.errors import TilefuseError
from tilefuse.log import get_logger

ENV_VAR = "TILEFUSE_CACHE_DIR"
MAGIC = b"TFCACHE\x00"
FORMAT_VERSION = 1
ENTRY_SUFFIX = ".tfc"
TEMP_PREFIX = ".tmp-"
STALE_TEMP_SECONDS = 60.0
"""clear() leaves younger temp files alone: they may belong to a writer that is still busy."""

_HEADER = struct.Struct("<8sIQQ32s")
_PREFIX_SIZE = _HEADER.size - 32  # the part of the header the checksum covers
_MAX_METADATA = 64 << 20
_ENTRY_NAME = re.compile(r"[0-9a-f]{64}" + re.escape(ENTRY_SUFFIX))
_OPEN_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)

log = get_logger("cache")


class CacheError(TilefuseError):
    """An unusable cache directory, a bad key or metadata, or an entry that cannot be written."""


# --- keys -------------------------------------------------------------------------------------

class CacheKey:
    """What a compiled artifact depends on, as named text parts (graph text, shapes, dtypes,
    target cpu and features, schedule JSON, tilefuse version, ...). Equal parts, equal key."""

    __slots__ = ("_digest", "parts")

    def __init__(self, parts: Mapping[str, str]):
        if not isinstance(parts, Mapping):
            raise CacheError(f"cache key parts must be a mapping, got {type(parts).__name__}")
        for name, text in parts.items():
            if not isinstance(name, str) or not name:
                raise CacheError(f"cache key part names must be non-empty strings, got {name!r}")
            if not isinstance(text, str):
                raise CacheError(f"cache key part {name!r} must be a string, "
                                 f"got {type(text).__name__}")
        self.parts: Mapping[str, str] = MappingProxyType(dict(sorted(parts.items())))
        encoded = json.dumps(dict(self.parts), ensure_ascii=True, separators=(",", ":"))
        self._digest = hashlib.sha256(encoded.encode("ascii")).hexdigest()

    @property
    def digest(self) -> str:
        """The sha256 (hex) of the parts: the entry's file name."""
        return self._digest

    def __eq__(self, other: object) -> bool:
        return isinstance(other, CacheKey) and dict(self.parts) == dict(other.parts)

    def __hash__(self) -> int:
        return hash(self._digest)

    def __repr__(self) -> str:
        return f"CacheKey({', '.join(self.parts)}; {self._digest[:12]})"

    def label(self) -> str:
        """A short name for logs: the ``function`` part (if any) and the digest's start."""
        function = self.parts.get("function")
        return f"{function} {self._digest[:12]}" if function else self._digest[:12]

    def differing_parts(self, other: CacheKey) -> list[str]:
        """The names of the parts whose text differs or that only one key has, sorted."""
        names = set(self.parts) | set(other.parts)
        return sorted(n for n in names if self.parts.get(n) != other.parts.get(n))

    def describe_difference(self, other: CacheKey) -> str:
        """How this key differs from ``other``, part by part, as ``other's -> this key's``:
        e.g. ``shapes: 'f32[2,3]' -> 'f32[4,3]'; version: '0.1.0' -> '0.2.0'``. Long or
        multi-line texts show the line and an excerpt around their first difference."""
        changes = []
        for name in self.differing_parts(other):
            if name not in other.parts:
                changes.append(f"{name}: new part")
            elif name not in self.parts:
                changes.append(f"{name}: part gone")
            else:
                changes.append(f"{name}: {_describe_change(other.parts[name], self.parts[name])}")
        return "; ".join(changes) if changes else "no part differs"


def _describe_change(old: str, new: str) -> str:
    pos = next((i for i, (a, b) in enumerate(zip(old, new)) if a != b), min(len(old), len(new)))
    line = old.count("\n", 0, pos) + 1
    where = f"line {line}: " if "\n" in old + new else ""
    return f"{where}{_excerpt(old, pos)} -> {_excerpt(new, pos)}"


def _excerpt(text: str, pos: int, before: int = 20, after: int = 40) -> str:
    """The line of ``text`` around ``pos``, cut to a window, quoted (``…`` marks a cut)."""
    line_start = text.rfind("\n", 0, pos) + 1
    line_end = text.find("\n", pos)
    line_end = len(text) if line_end < 0 else line_end
    begin, end = max(line_start, pos - before), min(line_end, pos + after)
    shown = repr(text[begin:end])
    return ("…" if begin > line_start else "") + shown + ("…" if end < line_end else "")


# --- entries ----------------------------------------------------------------------------------

@dataclass(frozen=True)
class Entry:
    """A validated cache entry."""

    key: CacheKey
    payload: bytes
    metadata: Mapping[str, Any]
    path: Path


@dataclass(frozen=True)
class CacheInfo:
    """What :meth:`CacheDir.info` counts: entries, their bytes, leftover temp files."""

    directory: Path
    entries: int
    total_bytes: int
    temp_files: int


class _BadEntry(Exception):
    """An entry file that fails validation (internal: get() turns it into a miss)."""

    def __init__(self, reason: str, st: os.stat_result | None = None):
        super().__init__(reason)
        self.reason = reason
        self.st = st


def _encode_metadata(key: CacheKey, metadata: Mapping[str, Any] | None) -> bytes:
    metadata = {} if metadata is None else metadata
    if not isinstance(metadata, Mapping) or not all(isinstance(k, str) for k in metadata):
        raise CacheError("cache entry metadata must be a mapping with string keys")
    try:
        text = json.dumps({"key": dict(key.parts), "metadata": dict(metadata)},
                          ensure_ascii=True, allow_nan=False, sort_keys=True)
    except (TypeError, ValueError, RecursionError) as err:
        raise CacheError(f"cache entry metadata is not plain JSON: {err}") from None
    return text.encode("ascii")


def _parse_metadata(raw: bytes) -> tuple[dict[str, str], dict[str, Any]]:
    """The stored key parts and user metadata; _BadEntry when they are not what put() writes."""
    try:
        document = json.loads(raw.decode("utf-8"))
    except (ValueError, RecursionError):
        raise _BadEntry("its metadata is not valid JSON") from None
    if not isinstance(document, dict) or set(document) != {"key", "metadata"}:
        raise _BadEntry("its metadata has the wrong layout")
    parts, metadata = document["key"], document["metadata"]
    if (not isinstance(parts, dict) or not isinstance(metadata, dict)
            or not all(name and isinstance(text, str) for name, text in parts.items())):
        raise _BadEntry("its metadata has the wrong layout")
    return parts, metadata


def _open_entry(path: Path) -> tuple[int, os.stat_result]:
    """An fd of the entry file and its stat; _BadEntry for a link, a non-file or a file of
    another owner. FileNotFoundError and other OSErrors pass through."""
    try:
        fd = os.open(path, _OPEN_FLAGS)
    except OSError as err:
        if err.errno == errno.ELOOP:
            raise _BadEntry("it is a symbolic link") from None
        raise
    try:
        st = os.fstat(fd)
    except OSError:
        os.close(fd)
        raise
    problem = None
    if not stat.S_ISREG(st.st_mode):
        problem = "it is not a regular file"
    elif st.st_uid != os.geteuid():
        problem = f"it is owned by uid {st.st_uid}, not by this user"
    if problem:
        os.close(fd)
        raise _BadEntry(problem, st)
    return fd, st


def _read_entry(path: Path, key: CacheKey) -> Entry:
    """The validated entry at ``path`` for ``key``; _BadEntry, FileNotFoundError or OSError."""
    fd, st = _open_entry(path)
    with os.fdopen(fd, "rb") as file:
        data = file.read()
    if len(data) < _HEADER.size:
        raise _BadEntry(f"it is truncated ({len(data)} bytes, less than a header)", st)
    magic, version, meta_len, payload_len, checksum = _HEADER.unpack_from(data)
    if magic != MAGIC:
        raise _BadEntry("it does not start with the tilefuse cache magic", st)
    if version != FORMAT_VERSION:
        raise _BadEntry(f"it has format version {version}, expected {FORMAT_VERSION}", st)
    expected = _HEADER.size + meta_len + payload_len
    if len(data) != expected:
        what = "truncated" if len(data) < expected else "followed by extra bytes"
        raise _BadEntry(f"it is {what} ({len(data)} bytes, its header says {expected})", st)
    body = memoryview(data)
    digest = hashlib.sha256(body[:_PREFIX_SIZE])
    digest.update(body[_HEADER.size:])
    if digest.digest() != checksum:
        raise _BadEntry("its checksum does not match its contents", st)
    meta_end = _HEADER.size + meta_len
    parts, metadata = _parse_metadata(data[_HEADER.size:meta_end])
    if parts != dict(key.parts):
        stored = CacheKey(parts)
        raise _BadEntry(f"it holds another key ({key.describe_difference(stored)})", st)
    return Entry(key, data[meta_end:], MappingProxyType(metadata), path)


def _peek_parts(path: Path) -> dict[str, str] | None:
    """The key parts stored in an entry, reading only its header and metadata (no checksum:
    for diagnostics only); None when they cannot be read."""
    try:
        fd, _ = _open_entry(path)
        with os.fdopen(fd, "rb") as file:
            header = file.read(_HEADER.size)
            if len(header) < _HEADER.size:
                return None
            magic, version, meta_len, _, _ = _HEADER.unpack(header)
            if magic != MAGIC or version != FORMAT_VERSION or meta_len > _MAX_METADATA:
                return None
            parts, _ = _parse_metadata(file.read(meta_len))
            return parts
    except (OSError, _BadEntry):
        return None


def _remove_if_same(path: Path, st: os.stat_result | None) -> None:
    """Removes ``path`` unless it is no longer the file ``st`` describes (a writer may have
    replaced it with a good entry meanwhile)."""
    try:
        if st is not None:
            now = os.lstat(path)
            if (now.st_dev, now.st_ino) != (st.st_dev, st.st_ino):
                return
        os.unlink(path)
    except OSError:
        pass


def _remove_quietly(path: str | Path) -> bool:
    try:
        os.unlink(path)
        return True
    except OSError:
        return False


# --- the directory ----------------------------------------------------------------------------

def default_cache_path(env: Mapping[str, str] | None = None) -> Path:
    """``$TILEFUSE_CACHE_DIR`` if set and non-empty, else ``~/.cache/tilefuse`` (``~`` from
    ``$HOME``), made absolute."""
    env = os.environ if env is None else env
    value = env.get(ENV_VAR, "")
    if value:
        return Path(os.path.abspath(_expand_home(value, env)))
    return Path(os.path.abspath(os.path.join(_home(env), ".cache", "tilefuse")))


def _home(env: Mapping[str, str]) -> str:
    home = env.get("HOME", "")
    if home:
        return home
    try:
        return str(Path.home())
    except (RuntimeError, KeyError):
        raise CacheError(f"cannot find the home directory for the default cache directory; "
                         f"set {ENV_VAR} or HOME") from None


def _expand_home(path: str, env: Mapping[str, str]) -> str:
    if path == "~" or path.startswith("~/"):
        return _home(env) + path[1:]
    return os.path.expanduser(path)


def check_cache_directory(path: Path) -> None:
    """CacheError unless ``path`` is a real directory (not a link) that this user owns and that
    neither group nor others may write to. The message says how to fix it."""
    quoted = shlex.quote(str(path))
    try:
        st = os.lstat(path)
    except OSError as err:
        raise CacheError(f"cannot use cache directory {path}: {err.strerror}; "
                         f"set {ENV_VAR} to a directory you own") from None
    if stat.S_ISLNK(st.st_mode):
        raise CacheError(f"cache directory {path} is a symbolic link, which tilefuse refuses "
                         f"(whoever can change the link can redirect the cache); set {ENV_VAR} "
                         f"to the real directory or replace the link with a directory")
    if not stat.S_ISDIR(st.st_mode):
        raise CacheError(f"cache directory {path} exists but is not a directory; remove it or "
                         f"set {ENV_VAR} to another path")
    if st.st_uid != os.geteuid():
        raise CacheError(f"cache directory {path} is owned by uid {st.st_uid}, not by you "
                         f"(uid {os.geteuid()}); use a directory you own (set {ENV_VAR}) or "
                         f"take it over with `chown {os.geteuid()} {quoted}`")
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise CacheError(f"cache directory {path} is writable by group or others (mode "
                         f"{stat.S_IMODE(st.st_mode):04o}); fix it with `chmod 700 {quoted}`")


class CacheDir:
    """One cache directory. Get one with :meth:`CacheDir.open`; constructing one checks the
    directory too (without creating it)."""

    def __init__(self, path: str | Path):
        self.path = Path(os.path.abspath(path))
        check_cache_directory(self.path)

    @classmethod
    def open(cls, path: str | Path | None = None,
             env: Mapping[str, str] = os.environ) -> CacheDir:
        """The cache at ``path`` (default: :func:`default_cache_path` of ``env``), created with
        mode 0700 (parents as needed). CacheError when it cannot be created or is refused."""
        target = default_cache_path(env) if path is None else Path(os.path.abspath(path))
        try:
            os.lstat(target)
        except FileNotFoundError:
            create_private_directory(target)
        except OSError:
            pass  # check_cache_directory reports it
        return cls(target)

    def __repr__(self) -> str:
        return f"CacheDir({str(self.path)!r})"

    def entry_path(self, key: CacheKey) -> Path:
        """Where the entry of ``key`` lives."""
        return self.path / f"{_checked_key(key).digest}{ENTRY_SUFFIX}"

    def put(self, key: CacheKey, payload: bytes, metadata: Mapping[str, Any] | None = None
            ) -> Path:
        """Stores ``payload`` and JSON ``metadata`` under ``key`` atomically (mode 0600),
        replacing any entry of that key; returns its path. CacheError when it cannot."""
        if not isinstance(payload, bytes | bytearray | memoryview):
            raise CacheError(f"cache payload must be bytes, got {type(payload).__name__}")
        final = self.entry_path(key)
        meta = _encode_metadata(key, metadata)
        payload = bytes(payload)
        prefix = struct.pack("<8sIQQ", MAGIC, FORMAT_VERSION, len(meta), len(payload))
        checksum = hashlib.sha256(prefix)
        checksum.update(meta)
        checksum.update(payload)
        try:
            fd, temp = tempfile.mkstemp(prefix=f"{TEMP_PREFIX}{key.digest[:16]}-", dir=self.path)
        except OSError as err:
            raise CacheError(f"cannot write to cache directory {self.path}: "
                             f"{err.strerror}") from None
        try:
            with os.fdopen(fd, "wb") as file:
                for chunk in (prefix, checksum.digest(), meta, payload):
                    file.write(chunk)
                file.flush()
                os.fsync(file.fileno())
            os.replace(temp, final)
        except OSError as err:
            _remove_quietly(temp)
            raise CacheError(f"cannot write cache entry {final}: {err.strerror}") from None
        except BaseException:
            _remove_quietly(temp)
            raise
        self._sync_directory()
        log.debug("stored %s (%d bytes)", key.label(), len(payload))
        return final

    def get(self, key: CacheKey) -> Entry | None:
        """The entry of ``key``, or None. A corrupt, truncated or foreign entry is a miss with
        one warning on ``tilefuse.cache`` and its file is removed; never raises for what is on
        disk."""
        path = self.entry_path(key)
        try:
            entry = _read_entry(path, key)
        except FileNotFoundError:
            if log.isEnabledFor(logging.DEBUG):
                log.debug("miss %s: %s", key.label(), self.explain_miss(key))
            return None
        except _BadEntry as bad:
            log.warning("cache entry %s is unusable: %s; removed it (a miss)", path, bad.reason)
            _remove_if_same(path, bad.st)
            return None
        except OSError as err:
            log.warning("cannot read cache entry %s: %s; treating it as a miss", path,
                        err.strerror or err)
            return None
        log.debug("hit %s (%d bytes)", key.label(), len(entry.payload))
        return entry

    def nearest(self, key: CacheKey, same: str | None = "function") -> CacheKey | None:
        """The stored key with the fewest parts differing from ``key`` (newest on ties), among
        entries whose part ``same`` equals ``key``'s (all entries when ``same`` is None); None
        when there is none, or ``key`` has no part ``same``."""
        if same is not None and same not in key.parts:
            return None
        best: tuple[int, float, CacheKey] | None = None
        for path in self._entry_files():
            parts = _peek_parts(path)
            if parts is None or (same is not None and parts.get(same) != key.parts[same]):
                continue
            stored = CacheKey(parts)
            try:
                age = -os.lstat(path).st_mtime
            except OSError:
                continue
            rank = (len(key.differing_parts(stored)), age, stored)
            if best is None or rank[:2] < best[:2]:
                best = rank
        return None if best is None else best[2]

    def explain_miss(self, key: CacheKey, same: str | None = "function") -> str:
        """Why ``key`` may miss, for the ``cache`` log: the parts in which the nearest stored
        entry (see :meth:`nearest`) differs, or that there is none."""
        scope = f"{same} {key.parts[same]!r}" if same and same in key.parts else "this key"
        stored = self.nearest(key, same)
        if stored is None:
            return f"no cached entry for {scope}"
        if stored == key:
            return f"an entry for {scope} exists with the same parts"
        return f"nearest entry for {scope} differs in {key.describe_difference(stored)}"

    def info(self) -> CacheInfo:
        """How many entries there are, their total size in bytes, and leftover temp files."""
        count = total = 0
        for path in self._entry_files():
            try:
                total += os.lstat(path).st_size
                count += 1
            except OSError:
                continue
        temps = sum(1 for _ in self._temp_files())
        return CacheInfo(self.path, count, total, temps)

    def clear(self) -> int:
        """Removes every entry and every temp file older than :data:`STALE_TEMP_SECONDS` (a
        younger one may be a live writer's); returns how many entries it removed."""
        removed = sum(1 for path in self._entry_files() if _remove_quietly(path))
        cutoff = time.time() - STALE_TEMP_SECONDS
        for path in self._temp_files():
            try:
                if os.lstat(path).st_mtime < cutoff:
                    _remove_quietly(path)
            except OSError:
                continue
        return removed

    def _names(self) -> list[str]:
        try:
            return os.listdir(self.path)
        except OSError as err:
            log.warning("cannot list cache directory %s: %s", self.path, err.strerror)
            return []

    def _entry_files(self) -> Iterator[Path]:
        return (self.path / name for name in self._names() if _ENTRY_NAME.fullmatch(name))

    def _temp_files(self) -> Iterator[Path]:
        return (self.path / name for name in self._names() if name.startswith(TEMP_PREFIX))

    def _sync_directory(self) -> None:
        """Makes the rename durable; best effort (not every filesystem allows it)."""
        try:
            fd = os.open(self.path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
        except OSError:
            return
        try:
            os.fsync(fd)
        except OSError:
            pass
        finally:
            os.close(fd)


def create_private_directory(path: Path) -> None:
    """Creates ``path`` (and missing parents) with mode 0700; a racing creator is fine."""
    try:
        os.makedirs(path, mode=0o700)
        os.chmod(path, 0o700)  # makedirs' mode passes through the umask
    except FileExistsError:
        pass
    except OSError as err:
        raise CacheError(f"cannot create cache directory {path}: {err.strerror}; set "
                         f"{ENV_VAR} to a directory you can write") from None


def _checked_key(key: object) -> CacheKey:
    if not isinstance(key, CacheKey):
        raise CacheError(f"expected a CacheKey, got {type(key).__name__}")
    return key
