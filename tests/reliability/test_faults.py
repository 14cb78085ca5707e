"""Faults: SIGKILL during cache writes and tuning-database commits never leaves a torn entry
that a reader accepts, and SQLite's integrity check passes; several processes compiling one
model into one cache directory all get right results; a cache directory that another user owns,
or that group or others may write, is refused.

Trial counts: ``TILEFUSE_KILL_TRIALS`` (default 8 per kind, well under a second each); set it
to 200 for a long run.
"""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from tilefuse.runtime.disk_cache import CacheDir, CacheError
from tilefuse.runtime.kernel_cache import KernelCache

sys.path.insert(0, str(Path(__file__).parent))
import fault_child

CHILD = str(Path(__file__).parent / "fault_child.py")
TRIALS = int(os.environ.get("TILEFUSE_KILL_TRIALS", "8"))


def _start(mode: str, arg: str) -> subprocess.Popen:
    child = subprocess.Popen([sys.executable, CHILD, mode, arg], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    assert child.stdout is not None
    line = child.stdout.readline()
    assert line.strip() == "ready", child.stderr.read() if child.stderr else line
    return child


def _kill_after(child: subprocess.Popen, seconds: float) -> None:
    time.sleep(seconds)
    child.kill()   # SIGKILL: no handler, no cleanup
    child.wait(timeout=30)
    assert child.returncode == -9


def test_kill_during_cache_writes_never_yields_a_torn_entry(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    directory = tmp_path / "cache"
    verified = 0
    for _ in range(TRIALS):
        _kill_after(_start("cache", str(directory)), float(rng.uniform(0.05, 0.4)))
        cache = CacheDir.open(directory)
        for index in range(64):
            entry = cache.get(fault_child.cache_key(index))
            if entry is not None:
                assert entry.payload == fault_child.payload_for(index), f"torn entry {index}"
                verified += 1
        assert cache.info().entries <= 64
    assert verified > 0, "no entry was ever completed: the trials tested nothing"
    cache.clear()


def test_kill_during_tuning_commits_keeps_the_database_whole(tmp_path: Path) -> None:
    from tilefuse.tune.database import SQLiteDatabase, TuneKey

    rng = np.random.default_rng(1)
    path = tmp_path / "tune.sqlite"
    counts = []
    for _ in range(TRIALS):
        _kill_after(_start("tunedb", str(path)), float(rng.uniform(0.05, 0.4)))
        with sqlite3.connect(path) as conn:
            assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        db = SQLiteDatabase(path)
        assert db.integrity() == "ok"
        records = [r for i in range(8) for r in db.records(TuneKey(f"kernel{i}", "x86-64"))]
        assert all(np.isfinite(r.seconds) and r.seconds > 0 for r in records)
        counts.append(len(records))
        db.close()
    assert counts == sorted(counts) and counts[-1] > 0, counts  # commits survive, in order


def test_processes_compiling_one_model_into_one_cache(tmp_path: Path) -> None:
    directory = str(tmp_path / "shared-cache")
    children = [subprocess.Popen([sys.executable, CHILD, "compile", directory],
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                for _ in range(3)]
    results = [child.communicate(timeout=300) for child in children]
    for child, (out, err) in zip(children, results):
        assert child.returncode == 0 and out.startswith("OK"), err[-2000:]
    again = subprocess.run([sys.executable, CHILD, "compile", directory], capture_output=True,
                           text=True, timeout=300)
    _, hits, misses = again.stdout.split()
    assert int(hits) > 0 and int(misses) == 0, again.stdout + again.stderr[-2000:]


@pytest.mark.parametrize("mode", [0o777, 0o770, 0o702, 0o720])
def test_group_or_other_writable_cache_is_refused(tmp_path: Path, mode: int) -> None:
    directory = tmp_path / "shared"
    directory.mkdir()
    directory.chmod(mode)
    with pytest.raises(CacheError, match="writable by group or others"):
        CacheDir.open(directory)
    env = {"TILEFUSE_CACHE_DIR": str(directory)}
    from tilefuse.codegen.target import host_target
    assert KernelCache.from_env(host_target(), env).stats.directory is None


def test_cache_owned_by_another_user_is_refused(tmp_path: Path) -> None:
    if os.geteuid() == 0:
        directory = tmp_path / "theirs"
        directory.mkdir(mode=0o700)
        os.chown(directory, 4242, 4242)
    else:
        directory = Path("/")  # owned by root and not writable by others
    with pytest.raises(CacheError, match="owned by uid"):
        CacheDir.open(directory)


def test_symlinked_cache_is_refused(tmp_path: Path) -> None:
    (tmp_path / "real").mkdir(mode=0o700)
    os.symlink(tmp_path / "real", tmp_path / "link")
    with pytest.raises(CacheError, match="symbolic link"):
        CacheDir.open(tmp_path / "link")
