"""On-disk compilation cache: round trips, validation, directory checks, atomicity, concurrency."""

from __future__ import annotations

import json
import logging
import os
import re
import signal
import stat
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

import tilefuse
from tilefuse.errors import TilefuseError
from tilefuse.runtime.disk_cache import (
    ENV_VAR,
    FORMAT_VERSION,
    MAGIC,
    CacheDir,
    CacheError,
    CacheKey,
    default_cache_path,
)

REPO = Path(tilefuse.__file__).resolve().parent.parent
NOBODY = 65534


def _key(**changes: str) -> CacheKey:
    parts = {"function": "mlp", "graph": "graph @mlp(%x: f32[2,3]) {\n  %0 = neg(%x)\n}\n",
             "shapes": "f32[2,3]", "dtypes": "f32", "target": "x86_64 znver4 +avx512f",
             "schedule": '{"tile": [8, 16]}', "version": "0.1.0"}
    parts.update(changes)
    return CacheKey(parts)


@pytest.fixture
def cache(tmp_path: Path) -> CacheDir:
    return CacheDir.open(tmp_path / "cache")


def _python(code: str, *args: str,
            wait: bool = True) -> subprocess.Popen | subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    command = [sys.executable, "-c", textwrap.dedent(code), *args]
    if wait:
        return subprocess.run(command, env=env, capture_output=True, text=True, timeout=60)
    return subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)


def _cache_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.name == "tilefuse.cache" and r.levelno == logging.WARNING]


# --- round trips ------------------------------------------------------------------------------

def test_put_get_round_trip(cache: CacheDir):
    key = _key()
    payload = bytes(range(256)) * 40
    assert cache.get(key) is None
    path = cache.put(key, payload, {"symbols": ["mlp_kernel0"], "arena_bytes": 4096})
    entry = cache.get(key)
    assert entry is not None
    assert entry.payload == payload and entry.key == key and entry.path == path
    assert entry.metadata == {"symbols": ["mlp_kernel0"], "arena_bytes": 4096}
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(cache.path).st_mode) == 0o700
    assert path.name == f"{key.digest}.tfc" and path.read_bytes().startswith(MAGIC)
    # a second put of the same key replaces the entry; an empty payload is fine
    cache.put(key, b"")
    assert cache.get(key).payload == b""
    assert cache.get(_key(shapes="f32[4,3]")) is None


def test_keys_hash_their_parts_only():
    assert _key() == _key() and hash(_key()) == hash(_key())
    assert _key().digest == CacheKey(dict(reversed(list(_key().parts.items())))).digest
    assert _key().digest != _key(version="0.2.0").digest
    assert len(_key().digest) == 64
    assert CacheKey({}).digest != CacheKey({"a": ""}).digest


def test_a_second_process_reads_what_the_first_wrote(cache: CacheDir):
    key = _key()
    cache.put(key, b"\x00object code\xff", {"n": 3})
    done = _python("""
        import sys
        from tilefuse.runtime.disk_cache import CacheDir, CacheKey
        import json
        cache = CacheDir.open(sys.argv[1])
        entry = cache.get(CacheKey(json.loads(sys.argv[2])))
        print(entry.payload.hex(), entry.metadata["n"])
        cache.put(CacheKey({"function": "from-child"}), b"child")
    """, str(cache.path), json.dumps(dict(key.parts)))
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == [b"\x00object code\xff".hex(), "3"]
    assert cache.get(CacheKey({"function": "from-child"})).payload == b"child"


# --- bad entries ------------------------------------------------------------------------------

def _flip(data: bytes, index: int) -> bytes:
    return data[:index] + bytes([data[index] ^ 0x40]) + data[index + 1:]


CORRUPTIONS = {
    "truncated": lambda data: data[: len(data) // 2],
    "truncated header": lambda data: data[:10],
    "empty": lambda data: b"",
    "flipped payload byte": lambda data: _flip(data, len(data) - 3),
    "flipped metadata byte": lambda data: _flip(data, 70),
    "flipped length": lambda data: _flip(data, 12),
    "wrong magic": lambda data: b"NOTTFC\x00\x00" + data[8:],
    "other version": lambda data: data[:8] + (FORMAT_VERSION + 1).to_bytes(4, "little")
    + data[12:],
    "extra bytes": lambda data: data + b"junk",
    "garbage": lambda data: os.urandom(500),
}


@pytest.mark.parametrize("corruption", sorted(CORRUPTIONS))
def test_corrupt_entries_are_a_miss_with_one_warning(cache, caplog, corruption):
    key = _key()
    path = cache.put(key, b"payload bytes " * 20, {"a": 1})
    path.write_bytes(CORRUPTIONS[corruption](path.read_bytes()))
    caplog.set_level(logging.WARNING, logger="tilefuse.cache")
    assert cache.get(key) is None
    warnings = _cache_warnings(caplog)
    assert len(warnings) == 1 and str(path) in warnings[0] and "removed" in warnings[0]
    assert not path.exists()
    caplog.clear()
    assert cache.get(key) is None and _cache_warnings(caplog) == []
    cache.put(key, b"fresh")
    assert cache.get(key).payload == b"fresh"


def test_warning_says_what_is_wrong(cache, caplog):
    key = _key()
    path = cache.put(key, b"x" * 100)
    path.write_bytes(path.read_bytes()[:-1])
    caplog.set_level(logging.WARNING, logger="tilefuse.cache")
    cache.get(key)
    assert "truncated" in _cache_warnings(caplog)[0]


def test_an_entry_holding_another_key_is_a_miss(cache, caplog):
    mine, other = _key(), _key(shapes="f32[9,9]")
    other_path = cache.put(other, b"other code")
    os.link(other_path, cache.entry_path(mine))
    caplog.set_level(logging.WARNING, logger="tilefuse.cache")
    assert cache.get(mine) is None
    [warning] = _cache_warnings(caplog)
    assert "holds another key" in warning and "shapes" in warning
    assert not cache.entry_path(mine).exists()
    assert cache.get(other).payload == b"other code"


def test_links_fifos_and_directories_at_entry_paths_are_misses(cache, caplog, tmp_path):
    key = _key()
    target = tmp_path / "elsewhere"
    target.write_bytes(b"secret")
    cache.entry_path(key).symlink_to(target)
    caplog.set_level(logging.WARNING, logger="tilefuse.cache")
    assert cache.get(key) is None
    assert "symbolic link" in _cache_warnings(caplog)[0]
    assert not cache.entry_path(key).is_symlink() and target.read_bytes() == b"secret"

    os.mkfifo(cache.entry_path(key))  # must not block
    assert cache.get(key) is None and not cache.entry_path(key).exists()

    cache.entry_path(key).mkdir()
    caplog.clear()
    assert cache.get(key) is None
    assert len(_cache_warnings(caplog)) == 1


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a file to another user needs root")
def test_an_entry_owned_by_another_user_is_a_miss(cache, caplog):
    key = _key()
    path = cache.put(key, b"code")
    os.chown(path, NOBODY, NOBODY)
    caplog.set_level(logging.WARNING, logger="tilefuse.cache")
    assert cache.get(key) is None
    assert "owned by uid 65534" in _cache_warnings(caplog)[0]


# --- describing what changed ------------------------------------------------------------------

def test_describe_difference_names_the_changed_parts():
    old = _key()
    assert _key().describe_difference(old) == "no part differs"
    assert (_key(shapes="f32[4,3]").describe_difference(old)
            == "shapes: 'f32[2,3]' -> 'f32[4,3]'")
    new = CacheKey({**old.parts, "extra": "1", "version": "0.2.0"})
    del_dtypes = CacheKey({n: t for n, t in new.parts.items() if n != "dtypes"})
    assert del_dtypes.differing_parts(old) == ["dtypes", "extra", "version"]
    assert del_dtypes.describe_difference(old) == (
        "dtypes: part gone; extra: new part; version: '0.1.0' -> '0.2.0'")


def test_describe_difference_points_into_long_texts():
    graph = "graph @f(%x: f32[8]) {\n  %0 = neg(%x)\n  %1 = exp(%0)\n}\n"
    old = CacheKey({"graph": graph, "target": "+avx2," * 40 + "+sse4.2"})
    new = CacheKey({"graph": graph.replace("exp", "tanh"),
                    "target": "+avx2," * 40 + "+avx512f"})
    text = new.describe_difference(old)
    assert "graph: line 3: '  %1 = exp(%0)' -> '  %1 = tanh(%0)'" in text
    assert "target: …'" in text and "sse4.2'" in text and "avx512f'" in text


def test_a_miss_can_say_which_part_changed(cache, caplog):
    cache.put(_key(), b"a")
    cache.put(_key(shapes="f32[4,3]", version="0.0.9"), b"b")
    cache.put(_key(function="other", shapes="f32[8,8]"), b"c")
    wanted = _key(shapes="f32[8,8]")
    assert cache.nearest(wanted) == _key()
    assert cache.nearest(wanted, same=None) == _key(function="other", shapes="f32[8,8]")
    assert cache.nearest(_key(function="unknown")) is None
    assert cache.nearest(CacheKey({"shapes": "f32[8,8]"})) is None
    assert cache.explain_miss(wanted) == (
        "nearest entry for function 'mlp' differs in shapes: 'f32[2,3]' -> 'f32[8,8]'")
    assert cache.explain_miss(_key(function="new")) == "no cached entry for function 'new'"
    caplog.set_level(logging.DEBUG, logger="tilefuse.cache")
    assert cache.get(wanted) is None
    assert any("miss mlp" in m and "differs in shapes" in m
               for m in (r.getMessage() for r in caplog.records))


# --- the directory ----------------------------------------------------------------------------

def test_open_creates_the_directory_0700_with_parents(tmp_path):
    path = tmp_path / "a" / "b" / "cache"
    cache = CacheDir.open(path)
    assert cache.path == path and path.is_dir()
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o700
    assert CacheDir.open(path).path == path  # opening again is fine


def test_default_directory_from_env_and_home(tmp_path):
    assert default_cache_path({"HOME": str(tmp_path)}) == tmp_path / ".cache" / "tilefuse"
    assert default_cache_path({"HOME": "/h", ENV_VAR: ""}) == Path("/h/.cache/tilefuse")
    assert default_cache_path({"HOME": "/h", ENV_VAR: "~/tf"}) == Path("/h/tf")
    cache = CacheDir.open(env={ENV_VAR: str(tmp_path / "env-cache"), "HOME": "/nonexistent"})
    assert cache.path == tmp_path / "env-cache" and cache.path.is_dir()
    cache = CacheDir.open(env={"HOME": str(tmp_path)})
    assert cache.path == tmp_path / ".cache" / "tilefuse"


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a directory to another user needs root")
def test_a_directory_owned_by_another_user_is_refused(tmp_path):
    path = tmp_path / "theirs"
    path.mkdir(mode=0o700)
    os.chown(path, NOBODY, NOBODY)
    with pytest.raises(CacheError, match=r"owned by uid 65534, not by you .*chown") as info:
        CacheDir.open(path)
    assert isinstance(info.value, TilefuseError)
    with pytest.raises(CacheError, match="owned by uid 65534"):
        CacheDir.open(env={ENV_VAR: str(path)})


@pytest.mark.parametrize("mode", [0o770, 0o702, 0o777])
def test_a_directory_others_can_write_is_refused(tmp_path, mode):
    path = tmp_path / "open"
    path.mkdir()
    os.chmod(path, mode)
    expected = f"writable by group or others (mode 0{mode:o}); fix it with `chmod 700 {path}`"
    with pytest.raises(CacheError, match=re.escape(expected)):
        CacheDir.open(path)
    os.chmod(path, 0o750)  # readable by the group is fine
    CacheDir.open(path)


def test_a_symlinked_directory_is_refused(tmp_path):
    real = tmp_path / "real"
    real.mkdir(mode=0o700)
    link = tmp_path / "link"
    link.symlink_to(real)
    with pytest.raises(CacheError, match="is a symbolic link"):
        CacheDir.open(link)
    dangling = tmp_path / "dangling"
    dangling.symlink_to(tmp_path / "missing")
    with pytest.raises(CacheError, match="is a symbolic link"):
        CacheDir.open(dangling)
    assert not (tmp_path / "missing").exists()


def test_a_file_in_the_way_is_refused(tmp_path):
    (tmp_path / "file").write_text("x")
    with pytest.raises(CacheError, match="not a directory"):
        CacheDir.open(tmp_path / "file")
    with pytest.raises(CacheError, match=r"cache directory .*below: Not a directory"):
        CacheDir.open(tmp_path / "file" / "below")


def test_bad_keys_metadata_and_payloads_are_refused(cache):
    with pytest.raises(CacheError, match="must be a string"):
        CacheKey({"shapes": (2, 3)})  # type: ignore[dict-item]
    with pytest.raises(CacheError, match="non-empty strings"):
        CacheKey({"": "x"})
    with pytest.raises(CacheError, match="must be a mapping"):
        CacheKey("function=f")  # type: ignore[arg-type]
    with pytest.raises(CacheError, match="not plain JSON"):
        cache.put(_key(), b"x", {"nan": float("nan")})
    with pytest.raises(CacheError, match="not plain JSON"):
        cache.put(_key(), b"x", {"obj": object()})
    with pytest.raises(CacheError, match="payload must be bytes"):
        cache.put(_key(), "text")  # type: ignore[arg-type]
    with pytest.raises(CacheError, match="expected a CacheKey"):
        cache.get("key")  # type: ignore[arg-type]
    assert list(cache.path.iterdir()) == []


def test_put_into_a_vanished_directory_raises_cache_error(tmp_path):
    cache = CacheDir.open(tmp_path / "gone")
    os.rmdir(cache.path)
    with pytest.raises(CacheError, match="cannot write to cache directory"):
        cache.put(_key(), b"x")
    assert cache.get(_key()) is None and cache.info().entries == 0


def test_info_and_clear(cache):
    paths = [cache.put(_key(shapes=f"f32[{i}]"), b"x" * (100 * i)) for i in range(1, 4)]
    (cache.path / "tuning.db").write_bytes(b"not ours")
    info = cache.info()
    assert (info.entries, info.total_bytes, info.temp_files) == (
        3, sum(p.stat().st_size for p in paths), 0)
    assert cache.clear() == 3
    assert cache.info().entries == 0 and cache.get(_key(shapes="f32[1]")) is None
    assert (cache.path / "tuning.db").read_bytes() == b"not ours"


# --- atomicity and concurrency ----------------------------------------------------------------

_SLOW_WRITER = """
    import os, sys, time
    from tilefuse.runtime.disk_cache import CacheDir, CacheKey
    cache = CacheDir.open(sys.argv[1])
    def stalled_fsync(fd):
        os.ftruncate(fd, os.fstat(fd).st_size // 2)  # as if killed halfway through writing
        print("writing", flush=True)
        time.sleep(60)
    os.fsync = stalled_fsync
    cache.put(CacheKey({"function": "f"}), b"new" * 100_000)
"""


def test_a_writer_killed_mid_write_never_yields_a_torn_entry(cache, caplog):
    key = CacheKey({"function": "f"})
    cache.put(key, b"old")
    writer = _python(_SLOW_WRITER, str(cache.path), wait=False)
    try:
        assert writer.stdout.readline() == "writing\n", writer.stderr.read()
        [temp] = [p for p in cache.path.iterdir() if p.name.startswith(".tmp-")]
        assert 0 < temp.stat().st_size < 300_000
        assert cache.get(key).payload == b"old"
    finally:
        writer.send_signal(signal.SIGKILL)
        writer.wait(timeout=30)
        writer.stdout.close()
        writer.stderr.close()
    assert writer.returncode == -signal.SIGKILL
    caplog.set_level(logging.WARNING, logger="tilefuse.cache")
    assert cache.get(key).payload == b"old"
    assert cache.info().entries == 1 and cache.info().temp_files == 1
    assert cache.clear() == 1 and temp.exists()  # a young temp file may be a live writer's
    old = time.time() - 3600
    os.utime(temp, (old, old))
    cache.clear()
    assert not temp.exists()
    cache.put(key, b"newer")
    assert cache.get(key).payload == b"newer"
    assert _cache_warnings(caplog) == []


def test_stray_temp_files_are_never_read(cache, caplog):
    key = _key()
    (cache.path / f".tmp-{key.digest[:16]}-abc").write_bytes(b"half an entry")
    caplog.set_level(logging.WARNING, logger="tilefuse.cache")
    assert cache.get(key) is None
    assert cache.info().entries == 0 and cache.info().temp_files == 1
    assert _cache_warnings(caplog) == []


_CONCURRENT_WRITER = """
    import sys
    from tilefuse.runtime.disk_cache import CacheDir, CacheKey
    cache = CacheDir.open(sys.argv[1])
    me = int(sys.argv[2])
    for round in range(12):
        cache.put(CacheKey({"function": "shared"}), bytes([me]) * 200_000, {"writer": me})
"""


def test_concurrent_writers_of_one_key_all_succeed(cache, caplog):
    key = CacheKey({"function": "shared"})
    writers = [_python(_CONCURRENT_WRITER, str(cache.path), str(i), wait=False)
               for i in range(4)]
    caplog.set_level(logging.WARNING, logger="tilefuse.cache")
    seen = set()
    while any(w.poll() is None for w in writers):
        entry = cache.get(key)
        if entry is not None:
            me = entry.metadata["writer"]
            assert entry.payload == bytes([me]) * 200_000
            seen.add(me)
    for writer in writers:
        _, err = writer.communicate(timeout=30)
        assert writer.returncode == 0, err
    entry = cache.get(key)
    assert entry is not None and entry.payload == bytes([entry.metadata["writer"]]) * 200_000
    assert _cache_warnings(caplog) == []
    assert cache.info().entries == 1 and cache.info().temp_files == 0
