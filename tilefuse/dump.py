"""Dump files: one text file per compilation stage, under one directory.

The directory is the explicit ``dump=`` argument of an entry point or, failing that, the
``TILEFUSE_DUMP`` environment variable. :class:`DumpWriter` keeps every file inside it.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path, PurePath

from tilefuse.errors import TilefuseError

ENV_VAR = "TILEFUSE_DUMP"


def resolve_dump_dir(explicit: str | Path | None,
                     env: Mapping[str, str] | None = None) -> Path | None:
    """The dump directory: ``explicit`` if given, else ``$TILEFUSE_DUMP`` if set and non-empty,
    else None (no dumps)."""
    if explicit is not None:
        return Path(explicit)
    value = (os.environ if env is None else env).get(ENV_VAR, "")
    return Path(value) if value else None


class DumpWriter:
    """Writes text files under one directory, created (with subdirectories) on first write."""

    def __init__(self, directory: str | Path):
        self.directory = Path(directory)

    def path_for(self, relative_name: str) -> Path:
        """Where ``relative_name`` lands; TilefuseError if it is empty, absolute or leaves the
        directory (``..``, or a link inside it that points out)."""
        rel = PurePath(relative_name)
        if not relative_name or rel.is_absolute() or rel.anchor or ".." in rel.parts:
            raise TilefuseError(f"dump file name {relative_name!r} must be a relative path "
                                f"inside {self.directory}")
        path = self.directory / rel
        root = self.directory.resolve()
        if not path.resolve().is_relative_to(root) or path.resolve() == root:
            raise TilefuseError(f"dump file name {relative_name!r} escapes {self.directory}")
        return path

    def write(self, relative_name: str, text: str) -> Path:
        """Writes ``text`` (UTF-8) to ``relative_name`` under the directory; returns the path."""
        path = self.path_for(relative_name)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text, encoding="utf-8")
        except OSError as err:
            raise TilefuseError(f"cannot write dump file {path}: {err}") from None
        return path
