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
from tilefuse.kernel.fusion import KernelGroup, KernelKind
from tilefuse.kernel.schedule import Schedule, default_schedule
from tilefuse.log import get_logger

_LOG = get_logger("tune")

TUNED_KINDS = frozenset({KernelKind.CONTRACTION, KernelKind.ELEMENTWISE,
                         KernelKind.ROW_REDUCTION, KernelKind.ATTENTION})
"""The kernel kinds the tuner has a search space for (the others never hit the database)."""


def tune_db_path(env: Mapping[str, str] | None = None) -> Path:
    """``$TILEFUSE_TUNE_DB`` if set, else ``tune.sqlite`` in the kernel cache directory."""
    env = os.environ if env is None else env
    if env.get("TILEFUSE_TUNE_DB"):
        return Path(os.path.abspath(os.path.expanduser(env["TILEFUSE_TUNE_DB"])))
    cache = env.get("TILEFUSE_CACHE_DIR")
    base = Path(cache) if cache else Path(env.get("HOME") or Path.home(), ".cache", "tilefuse")
    return Path(os.path.abspath(os.path.expanduser(base))) / "tune.sqlite"


class ScheduleSource:
    """Schedules for one build. ``tuned`` maps each kernel that got a tuned schedule to its
    measured seconds (for ``kernels.plan``).

    The database is opened once per build, on the first tunable kernel, with one connection;
    each kernel costs one indexed query (the fastest finite row of its key). The key is computed
    from the group alone (:func:`tilefuse.schedules.fingerprint.group_fingerprint`: no graph is
    rebuilt and no constant's bytes are hashed), so a warm hit adds well under a millisecond
    per kernel once the database module is imported."""

    def __init__(self, target: CpuTarget, env: Mapping[str, str] | None = None):
        self.target = target
        env = os.environ if env is None else env
        path = tune_db_path(env)
        self.path = str(path) if env.get("TILEFUSE_TUNE_DB") or path.is_file() else None
        self._db: object | None = None
        self._target_string: str | None = None
        self._failed = False
        self.tuned: dict[str, float] = {}   # kernel name -> measured seconds, for the dump

    def schedule(self, group: KernelGroup, constants: Mapping[Value, np.ndarray]) -> Schedule:
        """The tuned schedule of ``group`` if the database has one, else the default."""
        found = None
        if self.path and not self._failed and group.kind in TUNED_KINDS:
            found = self._lookup(group, constants)
        if found is None:
            return default_schedule(group, self.target)
        schedule, seconds = found
        self.tuned[group.name] = seconds
        _LOG.debug("kernel %s: tuned schedule from %s (%.3f ms measured): %s", group.name,
                   self.path, seconds * 1e3, schedule)
        return schedule

    def _lookup(self, group: KernelGroup, constants: Mapping[Value, np.ndarray]
                ) -> tuple[Schedule, float] | None:
        from tilefuse.schedules.database import SQLiteDatabase, TuneKey
        from tilefuse.schedules.fingerprint import group_fingerprint, target_string

        try:
            if self._db is None:
                self._db = SQLiteDatabase(self.path)
                self._target_string = target_string(self.target)
            key = TuneKey(group_fingerprint(group, constants), self._target_string or "")
            return self._db.best(key)  # type: ignore[attr-defined]
        except (TilefuseError, sqlite3.Error, OSError) as err:
            _LOG.warning("tuning database %s not used: %s", self.path, err)
            self._failed = True
            return None

    def close(self) -> None:
        """Closes the database connection, if one was opened."""
        if self._db is not None:
            self._db.close()  # type: ignore[attr-defined]
            self._db = None


class ForcedSchedules(ScheduleSource):
    """The kernels named in ``schedules`` get theirs, every other the default rule; no
    database. The tuner builds candidates, and a model with its verdicts, with this."""

    def __init__(self, target: CpuTarget, schedules: Mapping[str, Schedule]):
        super().__init__(target, env={})
        self.path = None
        self.forced = dict(schedules)

    def schedule(self, group: KernelGroup, constants: Mapping[Value, np.ndarray]) -> Schedule:
        forced = self.forced.get(group.name)
        return forced if forced is not None else default_schedule(group, self.target)


__all__ = ["TUNED_KINDS", "ForcedSchedules", "ScheduleSource", "tune_db_path"]
