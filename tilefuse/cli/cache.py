"""``tilefuse cache info|clear``: the disk cache of compiled kernels and the tuning database.

``clear`` removes the cache's own files only (kernel entries, leftover temp files and, with
``--tune``, the tuning database) and refuses a directory holding anything else: a mistyped
``TILEFUSE_CACHE_DIR`` pointing at a real folder must not lose its content.
"""

from __future__ import annotations

import argparse
import os
import re
from pathlib import Path
from typing import Any

from tilefuse.cli.common import subparser
from tilefuse.cli.models import CliError
from tilefuse.runtime.disk_cache import (
    ENTRY_SUFFIX,
    TEMP_PREFIX,
    CacheDir,
    check_cache_directory,
    default_cache_path,
)
from tilefuse.runtime.kernel_cache import cache_enabled
from tilefuse.runtime.schedules import tune_db_path

EXAMPLE = """  tilefuse cache info
  tilefuse cache clear              # compiled kernels only
  tilefuse cache clear --tune       # and the tuning database in it
  TILEFUSE_CACHE_DIR=/tmp/tf tilefuse cache info"""

TUNE_DB = "tune.sqlite"
_ENTRY = re.compile(r"[0-9a-f]{64}" + re.escape(ENTRY_SUFFIX))
_TUNE_FILES = {TUNE_DB, f"{TUNE_DB}-wal", f"{TUNE_DB}-shm", f"{TUNE_DB}-journal"}


def add_parser(sub: Any) -> None:
    parser = subparser(sub, "cache", "show or clear the kernel cache and tuning database",
                       EXAMPLE, __doc__.split("\n\n")[1])
    parser.add_argument("action", choices=("info", "clear"))
    parser.add_argument("--dir", type=Path, default=None,
                        help="the cache directory (default $TILEFUSE_CACHE_DIR, "
                        "~/.cache/tilefuse)")
    parser.add_argument("--tune", action="store_true",
                        help="clear: also remove the tuning database (tune.sqlite) in it")
    parser.set_defaults(func=run)


def _size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


def foreign_files(directory: Path) -> list[str]:
    """Names in ``directory`` that no tilefuse cache writes."""
    return sorted(name for name in os.listdir(directory)
                  if not (_ENTRY.fullmatch(name) or name.startswith(TEMP_PREFIX)
                          or name in _TUNE_FILES))


def _tune_db(directory: Path, explicit_dir: bool) -> Path:
    """``$TILEFUSE_TUNE_DB``, else ``tune.sqlite`` in the cache directory shown."""
    return directory / TUNE_DB if explicit_dir and not os.environ.get("TILEFUSE_TUNE_DB") \
        else tune_db_path()


def info(directory: Path, db: Path) -> int:
    print(f"cache directory: {directory}")
    if not cache_enabled(os.environ):
        print("disk cache: off (TILEFUSE_CACHE=0)")
    if not directory.exists():
        print("  (does not exist yet: nothing compiled with the disk cache on)")
    else:
        stats = CacheDir(directory).info()
        print(f"kernels: {stats.entries} entries, {_size(stats.total_bytes)}"
              + (f", {stats.temp_files} leftover temp files" if stats.temp_files else ""))
    if db.exists():
        print(f"tuning database: {db}, {_size(db.stat().st_size)}")
    else:
        print(f"tuning database: {db} (none yet)")
    return 0


def clear(directory: Path, with_tune: bool) -> int:
    if not directory.exists():
        print(f"nothing to clear: {directory} does not exist")
        return 0
    check_cache_directory(directory)
    foreign = foreign_files(directory)
    if foreign:
        shown = ", ".join(foreign[:5]) + (" ..." if len(foreign) > 5 else "")
        raise CliError(f"{directory} does not look like a tilefuse cache (it holds {shown}); "
                       f"nothing removed")
    removed = CacheDir(directory).clear()
    print(f"removed {removed} kernel entries from {directory}")
    if with_tune:
        gone = 0
        for name in sorted(_TUNE_FILES):
            try:
                os.unlink(directory / name)
                gone += 1
            except FileNotFoundError:
                continue
            except OSError as err:
                raise CliError(f"cannot remove {directory / name}: {err.strerror}") from None
        print(f"removed the tuning database ({gone} files)" if gone
              else "no tuning database to remove")
    return 0


def run(args: argparse.Namespace) -> int:
    directory = Path(os.path.abspath(args.dir)) if args.dir else default_cache_path()
    if args.action == "info":
        return info(directory, _tune_db(directory, args.dir is not None))
    return clear(directory, args.tune)
