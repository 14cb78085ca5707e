"""Tuning databases: measured schedules per kernel, and the machine's measured peaks.

A key is (kernel fingerprint, target string, tilefuse version): a schedule measured on one
machine, or by another compiler version, is not reused elsewhere. A row is (schedule JSON,
median seconds, date). :meth:`TuningDatabase.best` gives the schedule of a key with the least
median over its rows (a schedule measured again, as the tuner confirms its best ones against
the default, is judged by all its measurements, so one lucky measurement on a noisy machine
does not decide which schedule builds use); schedules whose median is inf never win. A key may
also hold the tuner's *verdict* (:meth:`TuningDatabase.decide`): the schedule its last
confirmation chose by paired comparison with the default, which ``best`` then gives.

- :class:`MemoryDatabase` (trivial): a dict in this process.
- :class:`SQLiteDatabase`: one SQLite file in WAL mode, shared by the processes of one host.
  Every write is one ``BEGIN IMMEDIATE`` transaction (writers queue on the lock for up to
  ``timeout`` seconds rather than fail; ``busy_timeout`` covers readers meeting a checkpoint),
  so concurrent writers are safe and a writer killed mid-transaction (even by ``kill -9``)
  leaves the file consistent: SQLite rolls the partial transaction back from the WAL on the next
  open. A measurement is an INSERT, never an UPDATE, so a new candidate cannot invalidate
  another. Each process opens its own connection (a connection is never shared across a fork).
  The schema is created once: ``PRAGMA user_version`` records its version, so opening an
  up-to-date file is a read, not a write (builds open the database on every compile).
"""

from __future__ import annotations

import abc
import datetime
import math
import os
import sqlite3
import statistics
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from tilefuse import __version__
from tilefuse.kernel.schedule import Schedule


@dataclass(frozen=True)
class TuneKey:
    """Which kernel, on which machine, by which compiler version."""

    fingerprint: str
    target: str
    version: str = __version__


@dataclass(frozen=True)
class Record:
    schedule: Schedule
    seconds: float
    date: str


MEASURED_AGAIN = 2
"""Rows a schedule needs to decide a build once some schedule of its key has that many: a
search measures most candidates once and then measures its fastest few and the default again
(:func:`tilefuse.tune.tuner.tune_task`), and a candidate measured once in a fast spell of
the host must not beat those (W1 tuned: a single 10.25 ms row won against a default whose
re-measurements alternated with it, and the build was 0.97x of the default's)."""


def best_by_median(rows: Iterable[tuple[str, float]]) -> tuple[Schedule, float] | None:
    """Of (schedule JSON, seconds) rows, the schedule with the least median seconds and that
    median, among those with at least :data:`MEASURED_AGAIN` rows when there are any; None
    when no median is finite. Ties go to the schedule seen first."""
    times: dict[str, list[float]] = {}
    for text, seconds in rows:
        times.setdefault(text, []).append(seconds)
    medians = {text: statistics.median(ts) for text, ts in times.items()}
    finite = [(m, text) for text, m in medians.items() if math.isfinite(m)]
    again = [(m, text) for m, text in finite if len(times[text]) >= MEASURED_AGAIN]
    finite = again or finite
    if not finite:
        return None
    seconds, text = min(finite, key=lambda pair: pair[0])
    return Schedule.from_json(text), seconds


def best_with_verdict(rows: list[tuple[str, float]],
                      verdict: tuple[Schedule, float] | None) -> tuple[Schedule, float] | None:
    """:meth:`TuningDatabase.best` over (schedule JSON, seconds) rows and a verdict."""
    if verdict is not None:
        text = verdict[0].to_json()
        times = [t for s, t in rows if s == text and math.isfinite(t)]
        if times:
            return verdict[0], statistics.median(times)
    return best_by_median(rows)


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")


class TuningDatabase(abc.ABC):
    """Where measurements and peaks are kept."""

    @abc.abstractmethod
    def record(self, key: TuneKey, schedule: Schedule, seconds: float) -> None:
        """Stores one measurement (inf for a failed candidate)."""

    @abc.abstractmethod
    def records(self, key: TuneKey) -> list[Record]:
        """Every measurement of ``key``, fastest first."""

    @abc.abstractmethod
    def decide(self, key: TuneKey, schedule: Schedule, gain: float) -> None:
        """Stores the tuner's verdict for ``key`` (replacing an earlier one): ``schedule``,
        which was ``gain`` times as fast as the default in paired re-measurements."""

    @abc.abstractmethod
    def verdict(self, key: TuneKey) -> tuple[Schedule, float] | None:
        """The stored verdict of ``key``: (schedule, gain), or None."""

    def best(self, key: TuneKey) -> tuple[Schedule, float] | None:
        """The verdict's schedule when ``key`` has one with a finite median, else the schedule
        with the least median seconds over its rows (None when no schedule's median is
        finite); with that median."""
        rows = [(r.schedule.to_json(), r.seconds) for r in self.records(key)]
        return best_with_verdict(rows, self.verdict(key))

    @abc.abstractmethod
    def keys(self) -> list[TuneKey]:
        """Every key with at least one measurement."""

    @abc.abstractmethod
    def peak(self, target: str, name: str) -> float | None:
        """A measured peak of the machine (``flops``, ``bytes``), or None."""

    @abc.abstractmethod
    def set_peak(self, target: str, name: str, value: float) -> None:
        """Stores a measured peak."""

    def close(self) -> None:  # noqa: B027 - optional hook
        """Releases the connection, if any."""


class MemoryDatabase(TuningDatabase):
    """The trivial database: a dict, gone with the process."""

    def __init__(self) -> None:
        self._rows: dict[TuneKey, list[Record]] = {}
        self._peaks: dict[tuple[str, str], float] = {}
        self._verdicts: dict[TuneKey, tuple[Schedule, float]] = {}

    def record(self, key: TuneKey, schedule: Schedule, seconds: float) -> None:
        self._rows.setdefault(key, []).append(Record(schedule, float(seconds), _now()))

    def records(self, key: TuneKey) -> list[Record]:
        return sorted(self._rows.get(key, []), key=lambda r: r.seconds)

    def keys(self) -> list[TuneKey]:
        return list(self._rows)

    def peak(self, target: str, name: str) -> float | None:
        return self._peaks.get((target, name))

    def set_peak(self, target: str, name: str, value: float) -> None:
        self._peaks[(target, name)] = float(value)

    def decide(self, key: TuneKey, schedule: Schedule, gain: float) -> None:
        self._verdicts[key] = (schedule, float(gain))

    def verdict(self, key: TuneKey) -> tuple[Schedule, float] | None:
        return self._verdicts.get(key)


_SCHEMA = (
    """CREATE TABLE IF NOT EXISTS measurements (
        fingerprint TEXT NOT NULL, target TEXT NOT NULL, version TEXT NOT NULL,
        schedule TEXT NOT NULL, seconds REAL NOT NULL, date TEXT NOT NULL)""",
    """CREATE INDEX IF NOT EXISTS measurements_key
        ON measurements (fingerprint, target, version, seconds)""",
    """CREATE TABLE IF NOT EXISTS peaks (
        target TEXT NOT NULL, name TEXT NOT NULL, value REAL NOT NULL, date TEXT NOT NULL,
        PRIMARY KEY (target, name))""",
    """CREATE TABLE IF NOT EXISTS verdicts (
        fingerprint TEXT NOT NULL, target TEXT NOT NULL, version TEXT NOT NULL,
        schedule TEXT NOT NULL, gain REAL NOT NULL, date TEXT NOT NULL,
        PRIMARY KEY (fingerprint, target, version))""",
)
SCHEMA_VERSION = 2
"""``PRAGMA user_version`` of a file whose schema is complete (1: before verdicts; such a
file gets the verdicts table when opened)."""

INF_SECONDS = 1e300
"""How inf is stored (SQLite REAL holds inf, but a plain large number sorts and reads back
the same everywhere)."""


class SQLiteDatabase(TuningDatabase):
    """Measurements in one SQLite file in WAL mode (see the module docstring)."""

    def __init__(self, path: Path | str, timeout: float = 60.0):
        self.path = Path(path)
        self.timeout = timeout
        self._conn: sqlite3.Connection | None = None
        self._pid = -1
        self.connection()

    def connection(self) -> sqlite3.Connection:
        """This process's connection (opened on first use, again after a fork)."""
        if self._conn is None or self._pid != os.getpid():
            conn = sqlite3.connect(self.path, timeout=self.timeout, isolation_level=None)
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=NORMAL")
            conn.execute(f"PRAGMA busy_timeout={int(self.timeout * 1000)}")
            _ensure_schema(conn)
            self._conn, self._pid = conn, os.getpid()
        return self._conn

    def _write(self) -> _Transaction:
        return _Transaction(self.connection())

    def record(self, key: TuneKey, schedule: Schedule, seconds: float) -> None:
        value = float(seconds) if math.isfinite(seconds) else INF_SECONDS
        with self._write() as conn:
            conn.execute("INSERT INTO measurements VALUES (?, ?, ?, ?, ?, ?)",
                         (key.fingerprint, key.target, key.version, schedule.to_json(), value,
                          _now()))

    def records(self, key: TuneKey) -> list[Record]:
        rows = self.connection().execute(
            "SELECT schedule, seconds, date FROM measurements WHERE fingerprint = ? AND "
            "target = ? AND version = ? ORDER BY seconds", (key.fingerprint, key.target,
                                                            key.version)).fetchall()
        return [Record(Schedule.from_json(s), math.inf if t >= INF_SECONDS else t, d)
                for s, t, d in rows]

    def best(self, key: TuneKey) -> tuple[Schedule, float] | None:
        """Two indexed queries (what a build asks per kernel): the key's verdict and rows,
        then :func:`best_with_verdict`."""
        rows = self.connection().execute(
            "SELECT schedule, seconds FROM measurements WHERE fingerprint = ? AND target = ? "
            "AND version = ?", (key.fingerprint, key.target, key.version)).fetchall()
        return best_with_verdict([(s, math.inf if t >= INF_SECONDS else float(t))
                                  for s, t in rows], self.verdict(key))

    def decide(self, key: TuneKey, schedule: Schedule, gain: float) -> None:
        with self._write() as conn:
            conn.execute("INSERT OR REPLACE INTO verdicts VALUES (?, ?, ?, ?, ?, ?)",
                         (key.fingerprint, key.target, key.version, schedule.to_json(),
                          float(gain) if math.isfinite(gain) else INF_SECONDS, _now()))

    def verdict(self, key: TuneKey) -> tuple[Schedule, float] | None:
        row = self.connection().execute(
            "SELECT schedule, gain FROM verdicts WHERE fingerprint = ? AND target = ? AND "
            "version = ?", (key.fingerprint, key.target, key.version)).fetchone()
        if row is None:
            return None
        return Schedule.from_json(row[0]), math.inf if row[1] >= INF_SECONDS else float(row[1])

    def keys(self) -> list[TuneKey]:
        """Every key with at least one measurement."""
        rows = self.connection().execute(
            "SELECT DISTINCT fingerprint, target, version FROM measurements").fetchall()
        return [TuneKey(*row) for row in rows]

    def peak(self, target: str, name: str) -> float | None:
        row = self.connection().execute("SELECT value FROM peaks WHERE target = ? AND name = ?",
                                        (target, name)).fetchone()
        return None if row is None else float(row[0])

    def set_peak(self, target: str, name: str, value: float) -> None:
        with self._write() as conn:
            conn.execute("INSERT OR REPLACE INTO peaks VALUES (?, ?, ?, ?)",
                         (target, name, float(value), _now()))

    def integrity(self) -> str:
        """``PRAGMA integrity_check``: "ok" for a sound file."""
        return str(self.connection().execute("PRAGMA integrity_check").fetchone()[0])

    def close(self) -> None:
        if self._conn is not None and self._pid == os.getpid():
            self._conn.close()
        self._conn = None


def _ensure_schema(conn: sqlite3.Connection) -> None:
    """Creates the tables unless ``user_version`` says they exist (one read when they do)."""
    if conn.execute("PRAGMA user_version").fetchone()[0] >= SCHEMA_VERSION:
        return
    with _Transaction(conn):
        for statement in _SCHEMA:
            conn.execute(statement)
        conn.execute(f"PRAGMA user_version={SCHEMA_VERSION}")


class _Transaction:
    """``BEGIN IMMEDIATE`` ... ``COMMIT`` (``ROLLBACK`` on an exception)."""

    def __init__(self, conn: sqlite3.Connection):
        self.conn = conn

    def __enter__(self) -> sqlite3.Connection:
        self.conn.execute("BEGIN IMMEDIATE")
        return self.conn

    def __exit__(self, kind: object, *rest: object) -> None:
        self.conn.execute("COMMIT" if kind is None else "ROLLBACK")


__all__ = [
    "INF_SECONDS",
    "MEASURED_AGAIN",
    "SCHEMA_VERSION",
    "MemoryDatabase",
    "Record",
    "SQLiteDatabase",
    "TuneKey",
    "TuningDatabase",
    "best_by_median",
    "best_with_verdict",
]
