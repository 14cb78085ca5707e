"""The SQLite tuning database: concurrent writers, a writer killed mid-transaction."""

from __future__ import annotations

import math
import multiprocessing as mp
import os
import signal
import sqlite3
import statistics

from tilefuse.kernel.fusion import KernelKind
from tilefuse.kernel.schedule import Schedule
from tilefuse.tune.database import MemoryDatabase, SQLiteDatabase, TuneKey
from tilefuse.tune.roofline import MeasuredRoofline, NoRoofline, Peaks

KEY = TuneKey("f" * 64, "x86_64/test/cores=2")
ROWS = 40


def schedule(width: int) -> Schedule:
    return Schedule(KernelKind.ELEMENTWISE, order=("i",), vector_axis="i", vector_width=width)


def write_rows(path: str, worker: int) -> None:
    db = SQLiteDatabase(path)
    for i in range(ROWS):
        db.record(KEY, schedule(4 << (i % 3)), 1.0 + worker + i / 1000)
    db.close()


def die_mid_transaction(path: str) -> None:
    conn = sqlite3.connect(path, isolation_level=None, timeout=30)
    conn.execute("BEGIN IMMEDIATE")
    for i in range(500):
        conn.execute("INSERT INTO measurements VALUES (?, ?, ?, ?, ?, ?)",
                     (KEY.fingerprint, KEY.target, KEY.version, schedule(8).to_json(),
                      0.001 + i, "killed"))
    os.kill(os.getpid(), signal.SIGKILL)


def test_four_processes_write_at_once(tmp_path):
    path = str(tmp_path / "tune.db")
    SQLiteDatabase(path).close()
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=write_rows, args=(path, w)) for w in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
        assert p.exitcode == 0
    db = SQLiteDatabase(path)
    assert len(db.records(KEY)) == 4 * ROWS
    medians = {}
    for r in db.records(KEY):
        medians.setdefault(r.schedule, []).append(r.seconds)
    fastest = min(medians, key=lambda s: statistics.median(medians[s]))
    assert db.best(KEY) == (fastest, statistics.median(medians[fastest]))
    assert db.integrity() == "ok"
    assert db.connection().execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_writer_killed_mid_transaction_leaves_the_file_sound(tmp_path):
    path = str(tmp_path / "tune.db")
    db = SQLiteDatabase(path)
    db.record(KEY, schedule(4), 2.0)
    child = mp.get_context("spawn").Process(target=die_mid_transaction, args=(path,))
    child.start()
    child.join(120)
    assert child.exitcode == -signal.SIGKILL
    again = SQLiteDatabase(path)
    assert again.integrity() == "ok"
    assert [r.seconds for r in again.records(KEY)] == [2.0]  # the killed rows never landed
    again.record(KEY, schedule(16), 1.5)  # the lock was released
    assert again.best(KEY) == (schedule(16), 1.5)


def test_failures_are_kept_but_never_best(tmp_path):
    for db in (MemoryDatabase(), SQLiteDatabase(tmp_path / "t.db")):
        db.record(KEY, schedule(4), math.inf)
        assert db.best(KEY) is None
        db.record(KEY, schedule(8), 3.0)
        assert db.best(KEY) == (schedule(8), 3.0)
        assert db.records(KEY)[-1].seconds == math.inf
        assert db.best(TuneKey(KEY.fingerprint, KEY.target, "0.0.0")) is None


def test_roofline_peaks_are_measured_once_and_stored(tmp_path):
    calls = []

    def fake() -> Peaks:
        calls.append(1)
        return Peaks(100e9, 20e9)

    db = SQLiteDatabase(tmp_path / "t.db")
    first = MeasuredRoofline(db, "t", fake)
    second = MeasuredRoofline(SQLiteDatabase(tmp_path / "t.db"), "t", fake)
    assert len(calls) == 1 and second.peaks == first.peaks
    # compute bound: 1 GFLOP over 1 MB; memory bound: 1 MFLOP over 1 GB
    assert first.bound_seconds(1e9, 1e6) == 1e9 / 100e9
    assert first.bound_seconds(1e6, 1e9) == 1e9 / 20e9
    assert first.attainable_flops(1e6, 1e9) == 20e9 * 1e-3
    assert NoRoofline().bound_seconds(1e9, 1e9) == 0.0


def test_a_schedule_measured_once_does_not_beat_those_measured_again(tmp_path):
    """After a search re-measures its fastest few and the default, a candidate that has its
    one search row only is not a build's choice, however fast that row was."""
    for db in (MemoryDatabase(), SQLiteDatabase(tmp_path / "again.db")):
        db.record(KEY, schedule(4), 1.0)        # one lucky row, never measured again
        db.record(KEY, schedule(8), 2.0)
        db.record(KEY, schedule(16), 2.4)
        assert db.best(KEY) == (schedule(4), 1.0)   # nothing measured again yet: all count
        db.record(KEY, schedule(8), 2.2)
        db.record(KEY, schedule(16), 2.3)
        assert db.best(KEY) == (schedule(8), 2.1)
        db.record(KEY, schedule(4), 1.1)        # measured again, it decides again
        assert db.best(KEY) == (schedule(4), 1.05)


def test_best_is_the_least_median_so_one_lucky_row_does_not_win(tmp_path):
    for db in (MemoryDatabase(), SQLiteDatabase(tmp_path / "m.db")):
        db.record(KEY, schedule(4), 1.0)       # lucky once ...
        db.record(KEY, schedule(8), 2.0)
        assert db.best(KEY) == (schedule(4), 1.0)
        db.record(KEY, schedule(4), 3.0)       # ... and slow when measured again
        db.record(KEY, schedule(4), 3.1)
        db.record(KEY, schedule(8), 2.1)
        assert db.best(KEY) == (schedule(8), 2.05)
        db.record(KEY, schedule(16), math.inf)  # a failure is never best, whatever its count
        db.record(KEY, schedule(16), math.inf)
        assert db.best(KEY)[0] == schedule(8)


def test_a_verdict_decides_the_build_and_survives_reopening(tmp_path):
    for make in (MemoryDatabase, lambda: SQLiteDatabase(tmp_path / "v.db")):
        db = make()
        db.record(KEY, schedule(4), 1.0)
        db.record(KEY, schedule(4), 1.2)
        db.record(KEY, schedule(8), 1.5)
        db.record(KEY, schedule(8), 1.7)
        assert db.verdict(KEY) is None and db.best(KEY) == (schedule(4), 1.1)
        db.decide(KEY, schedule(8), 1.0)     # the confirmation kept the default
        assert db.verdict(KEY) == (schedule(8), 1.0)
        assert db.best(KEY) == (schedule(8), 1.6)
        db.decide(KEY, schedule(4), 1.05)    # a later run replaces it
        assert db.best(KEY) == (schedule(4), 1.1)
    again = SQLiteDatabase(tmp_path / "v.db")
    assert again.verdict(KEY) == (schedule(4), 1.05)
    again.decide(KEY, schedule(16), math.inf)   # a verdict with no finite row: least median
    assert again.verdict(KEY) == (schedule(16), math.inf)
    assert again.best(KEY) == (schedule(4), 1.1)


def test_a_file_of_the_first_schema_gets_the_verdicts_table(tmp_path):
    path = tmp_path / "v1.db"
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("CREATE TABLE measurements (fingerprint TEXT NOT NULL, target TEXT NOT NULL, "
                 "version TEXT NOT NULL, schedule TEXT NOT NULL, seconds REAL NOT NULL, "
                 "date TEXT NOT NULL)")
    conn.execute("INSERT INTO measurements VALUES (?, ?, ?, ?, ?, ?)",
                 (KEY.fingerprint, KEY.target, KEY.version, schedule(8).to_json(), 2.0, "old"))
    conn.execute("PRAGMA user_version=1")
    conn.close()
    db = SQLiteDatabase(path)
    assert db.best(KEY) == (schedule(8), 2.0) and db.verdict(KEY) is None
    db.decide(KEY, schedule(8), 1.0)
    assert db.connection().execute("PRAGMA user_version").fetchone()[0] == 2
