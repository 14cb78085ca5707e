"""Where a kernel's schedule comes from when an executable is built: the tuning database when one
is named and holds a measurement for this kernel on this machine, else the default rule.

The database is ``$TILEFUSE_TUNE_DB`` when set, else ``tune.sqlite`` in the kernel cache
directory (``$TILEFUSE_CACHE_DIR``, default ``~/.cache/tilefuse``) when that file exists: what
``tilefuse.tune.tune`` writes by default, so compiling uses tuning results with no setting.
The key is the kernel's fingerprint (its computation, shapes and dtypes, not its weights'
values), the target and the tilefuse version, so a schedule tuned in one model serves the same
kernel in another. A database that cannot be read is a warning on the
``tune`` topic, never an error: the default rule always works.
"""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Mapping
from pathlib import Path

import numpy as np

from tilefuse.codegen.target import CpuTarget
from tilefuse.errors import TilefuseError
from tilefuse.graph.ir import Value
from tilefuse.kernel.fusion import KernelGroup
from tilefuse.kernel.schedule import Schedule, default_schedule
from tilefuse.log import get_logger

_LOG = get_logger("tune")


def tune_db_path(env: Mapping[str, str] | None = None) -> Path:
    """``$TILEFUSE_TUNE_DB`` if set, else ``tune.sqlite`` in the kernel cache directory."""
    env = os.environ if env is None else env
    if env.get("TILEFUSE_TUNE_DB"):
        return Path(os.path.abspath(os.path.expanduser(env["TILEFUSE_TUNE_DB"])))
    cache = env.get("TILEFUSE_CACHE_DIR")
    base = Path(cache) if cache else Path(env.get("HOME") or Path.home(), ".cache", "tilefuse")
    return Path(os.path.abspath(os.path.expanduser(base))) / "tune.sqlite"


class ScheduleSource:
    """Schedules for one build. ``origin(group)`` says where the last one came from."""

    def __init__(self, target: CpuTarget, env: Mapping[str, str] | None = None):
        self.target = target
        env = os.environ if env is None else env
        path = tune_db_path(env)
        self.path = str(path) if env.get("TILEFUSE_TUNE_DB") or path.is_file() else None
        self._db: object | None = None
        self._failed = False
        self.tuned: dict[str, float] = {}   # kernel name -> measured seconds, for the dump

    def schedule(self, group: KernelGroup, constants: Mapping[Value, np.ndarray]) -> Schedule:
        """The tuned schedule of ``group`` if the database has one, else the default."""
        found = self._lookup(group, constants) if self.path and not self._failed else None
        if found is None:
            return default_schedule(group, self.target)
        schedule, seconds = found
        self.tuned[group.name] = seconds
        _LOG.debug("kernel %s: tuned schedule from %s (%.3f ms measured): %s", group.name,
                   self.path, seconds * 1e3, schedule)
        return schedule

    def _lookup(self, group: KernelGroup, constants: Mapping[Value, np.ndarray]
                ) -> tuple[Schedule, float] | None:
        from tilefuse.tune.database import SQLiteDatabase, TuneKey
        from tilefuse.tune.task import TuneTask
        from tilefuse.tune.tuner import target_string

        try:
            if self._db is None:
                self._db = SQLiteDatabase(self.path)
            known = {v: constants[v] for v in group.inputs if v in constants}
            key = TuneKey(TuneTask.of_group(group, known).fingerprint(),
                          target_string(self.target))
            return self._db.best(key)  # type: ignore[attr-defined]
        except (TilefuseError, sqlite3.Error, OSError) as err:
            if not isinstance(err, TilefuseError) or "not tuned" not in str(err):
                _LOG.warning("tuning database %s not used: %s", self.path, err)
                self._failed = True
            return None
