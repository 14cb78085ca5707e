"""Hostile ``.tilefuse`` files: every damaged, foreign or forged artifact is a TilefuseError
(ArtifactError) naming the problem, never a crash. The files are loaded (and, if they load,
called) in a child process, so that a crash shows as a signal instead of killing the suite."""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import tilefuse
from tilefuse.artifact import format as container

CHILD = r"""
import json, sys
import numpy as np
import tilefuse
from tilefuse.errors import TilefuseError
x = np.linspace(-1, 1, 9 * 11, dtype=np.float32).reshape(9, 11)
for path in sys.argv[1:]:
    try:
        model = tilefuse.load(path)
        model(x)
        outcome, message = "accepted", ""
    except TilefuseError as err:
        outcome, message = "rejected", f"{type(err).__name__}: {err}"
    except Exception as err:
        outcome, message = "other", f"{type(err).__name__}: {err}"
    print(json.dumps({"case": path.rsplit("/", 1)[-1], "outcome": outcome,
                      "message": message}), flush=True)
"""

Sections = dict[str, bytes]


def _env() -> dict[str, str]:
    """The child imports this tilefuse (the checkout under test)."""
    return dict(os.environ, PYTHONPATH=str(Path(tilefuse.__file__).parents[1]))

Mutation = Callable[[dict[str, Any], Sections], None]


@pytest.fixture(scope="module")
def good(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small artifact with native kernels, constants and a host step (and, from a second,
    all-native specialisation, the launcher section)."""
    w = np.random.default_rng(0).standard_normal((11, 7)).astype(np.float32)
    f = tilefuse.jit(lambda x: (np.tanh(x @ w), x.max(0) + 1) if x.shape[0] == 9
                     else np.tanh(x @ w))
    import tilefuse.backend.cpu as cpu_backend
    from tilefuse.errors import CompileError

    def failing(*args: Any, **kwargs: Any) -> None:
        raise CompileError("made to fail by the test")

    with pytest.MonkeyPatch.context() as m:  # reductions lower natively: make this one fail
        m.setattr(cpu_backend, "lower_reduce", failing)
        f(np.ones((9, 11), np.float32))
    f(np.ones((3, 11), np.float32))
    return tilefuse.save(f, tmp_path_factory.mktemp("good") / "good.tilefuse")


def _rebuilt(good: Path, mutate: Mutation) -> bytes:
    """``good`` with its manifest or sections changed, written again with valid checksums (a
    forged file: only the structural checks can catch it)."""
    c = container.read(good)
    sections = {name: bytes(data) for name, data in c.sections.items()}
    manifest = json.loads(sections.pop("manifest"))
    mutate(manifest, sections)
    return container.encode({"manifest": json.dumps(manifest).encode(), **sections})


def _patched(data: bytes, offset: int, fmt: str, *values: Any, fix_table: bool = False) -> bytes:
    out = bytearray(data)
    struct.pack_into(fmt, out, offset, *values)
    if fix_table:  # recompute the table's CRC so that the bad entry itself is what is seen
        count = struct.unpack_from("<I", out, 12)[0]
        table = bytes(out[32:32 + 56 * count])
        struct.pack_into("<I", out, 24, zlib.crc32(table))
    return bytes(out)


def _first(manifest: dict[str, Any]) -> dict[str, Any]:
    return manifest["entries"][0]["program"]


def _native_launch(manifest: dict[str, Any]) -> dict[str, Any]:
    return next(s for s in _first(manifest)["steps"] if "native" in s)["launches"][0]


def _section_of(data: bytes, prefix: str) -> tuple[int, int]:
    """(offset, length) of the first section whose name starts with ``prefix``."""
    count = struct.unpack_from("<I", data, 12)[0]
    for i in range(count):
        name, offset, length, _, _ = struct.unpack_from("<32sQQII", data, 32 + 56 * i)
        if name.rstrip(b"\0").decode().startswith(prefix):
            return offset, length
    raise AssertionError(prefix)


def _flip(data: bytes, at: int) -> bytes:
    out = bytearray(data)
    out[at] ^= 0x40
    return bytes(out)


def _arena_slot(manifest: dict[str, Any]) -> list[Any]:
    for step in _first(manifest)["steps"]:
        for launch in step.get("launches", []):
            for arg in launch["args"]:
                if arg[0] == "arena":
                    return arg
    raise AssertionError("no arena slot")


def _cases(good: Path) -> dict[str, tuple[bytes, str]]:
    """name -> (file bytes, a word the error message must contain)."""
    data = good.read_bytes()
    kernel_at, kernel_len = _section_of(data, "k")
    const_at, _ = _section_of(data, "c")
    manifest_at, _ = _section_of(data, "manifest")

    def forged(mutate: Mutation) -> bytes:
        return _rebuilt(good, mutate)

    def set_in(get: Callable[[dict[str, Any]], Any], key: Any, value: Any) -> Mutation:
        return lambda m, s: get(m).__setitem__(key, value)

    return {
        "empty": (b"", "truncated"),
        "not_an_artifact": (b"PK\x03\x04" + bytes(200), "not a tilefuse artifact"),
        "truncated_header": (data[:20], "truncated"),
        "truncated_table": (data[:40], "truncated"),
        "truncated_half": (data[:len(data) // 2], "truncated"),
        "truncated_last_byte": (data[:-1], "truncated"),
        "extra_bytes": (data + b"\0", "extra bytes"),
        "format_version_2": (_patched(data, 8, "<I", 2), "format version 2"),
        "format_version_0": (_patched(data, 8, "<I", 0), "format version 0"),
        "huge_section_count": (_patched(data, 12, "<I", 0xFFFFFFFF), "sections"),
        "table_past_end": (_patched(data, 12, "<I", 100000), "past the end"),
        "bad_table_checksum": (_flip(data, 33), "checksum"),
        "corrupt_kernel": (_flip(data, kernel_at + kernel_len // 2), "checksum"),
        "corrupt_constant": (_flip(data, const_at + 3), "checksum"),
        "corrupt_manifest": (_flip(data, manifest_at + 5), "checksum"),
        "length_past_end": (_patched(data, 32 + 40, "<Q", 1 << 62, fix_table=True),
                            "outside the file"),
        "offset_in_header": (_patched(data, 32 + 32, "<Q", 0, fix_table=True),
                             "outside the file"),
        "duplicate_section": (_patched(data, 32 + 56, "<32s", b"manifest", fix_table=True),
                              "twice"),
        "foreign_cpu": (forged(lambda m, s: m["target"].__setitem__(
            "features", m["target"]["features"] + ",+amx-tile,+amx-int8")), "amx-tile"),
        "foreign_arch": (forged(set_in(lambda m: m["target"], "triple",
                                       "aarch64-unknown-linux-gnu")), "aarch64"),
        "manifest_not_json": (container.encode({"manifest": b"{not json", "k0": b"x"}),
                              "not JSON"),
        "deep_json": (container.encode({"manifest": b"[" * 100000 + b"]" * 100000}), "JSON"),
        "manifest_format_99": (forged(set_in(lambda m: m, "format", 99)), "format"),
        "unknown_kind": (forged(set_in(lambda m: m, "kind", "pickle")), "kind"),
        "garbage_kernel": (forged(lambda m, s: s.__setitem__(
            m["kernels"][0]["section"], bytes(range(256)) * 8)), "object"),
        "elf_header_only_kernel": (forged(lambda m, s: s.__setitem__(
            m["kernels"][0]["section"], s[m["kernels"][0]["section"]][:64])), "object"),
        "missing_section": (forged(set_in(lambda m: m["kernels"][0], "section", "k999")),
                            "no section"),
        "kernel_index_huge": (forged(set_in(_native_launch, "kernel", 10**12)), "range"),
        "kernel_index_negative": (forged(set_in(_native_launch, "kernel", -1)), "range"),
        "wrong_buffer_count": (forged(lambda m, s: _native_launch(m)["args"].pop()),
                               "do not match"),
        "io_index_out_of_range": (forged(lambda m, s: _native_launch(m)["args"].__setitem__(
            0, ["io", 77])), "range"),
        "arena_view_past_end": (forged(lambda m, s: _arena_slot(m).__setitem__(
            1, _first(m)["arena_bytes"])), "outside"),
        "huge_arena": (forged(set_in(_first, "arena_bytes", 1 << 62)), "arena"),
        "huge_shape": (forged(lambda m, s: _first(m)["inputs"][0].__setitem__(
            2, [1 << 40, 1 << 40])), "too large"),
        "negative_dim": (forged(lambda m, s: _first(m)["inputs"][0].__setitem__(2, [-9, 11])),
                         "in range"),
        "unknown_dtype": (forged(set_in(lambda m: m["constants"][0], "dtype", "q7")), "dtype"),
        "constant_wrong_size": (forged(set_in(lambda m: m["constants"][0], "shape",
                                              [1 << 20])), "bytes"),
        "bad_signature": (forged(set_in(lambda m: m["kernels"][0], "signature", {"x": 1})),
                          "signature"),
        "pack_out_of_range": (forged(lambda m, s: m["entries"][0].__setitem__(
            "pack", {"out": 99})), "structure"),
        "host_graph_garbage": (forged(lambda m, s: s.__setitem__(
            next(st for st in _first(m)["steps"] if "host" in st)["graph"], b"junk(")),
            "host graph"),
        "no_entries": (forged(set_in(lambda m: m, "entries", [])), "no compiled entry"),
        "garbage_launcher": (forged(lambda m, s: s.__setitem__("launcher", b"\x7fELF" * 40)),
                             "launcher"),
    }


def test_hostile_artifacts_are_rejected_cleanly(good: Path, tmp_path: Path) -> None:
    cases = _cases(good)
    paths = []
    for name, (data, _) in cases.items():
        path = tmp_path / name
        path.write_bytes(data)
        paths.append(str(path))
    paths.append(str(tmp_path / "no_such_file"))
    paths.append(str(tmp_path))  # a directory
    huge = tmp_path / "huge_foreign_file"  # 64 GiB, sparse: refused from its header, unread
    with open(huge, "wb") as file:
        file.truncate(64 << 30)
    paths.append(str(huge))
    child = subprocess.run([sys.executable, "-c", CHILD, str(good), *paths],
                           capture_output=True, text=True, timeout=600, env=_env())
    assert child.returncode == 0, child.stderr[-3000:]  # a crash would be a signal
    results = {r["case"]: r for r in map(json.loads, child.stdout.splitlines())}
    assert results["good.tilefuse"]["outcome"] == "accepted", results["good.tilefuse"]
    for name, (_, word) in cases.items():
        result = results[name]
        assert result["outcome"] == "rejected", (name, result)
        assert result["message"].startswith("ArtifactError"), (name, result)
        assert word.lower() in result["message"].lower(), (name, word, result["message"])
    for name in ("no_such_file", tmp_path.name):
        assert results[name]["outcome"] == "rejected", results[name]
    assert "not a tilefuse artifact" in results["huge_foreign_file"]["message"]


def test_foreign_cpu_is_refused_before_any_code_is_linked(good: Path, tmp_path: Path) -> None:
    """The feature check comes first: a file for another CPU whose kernel is garbage still
    reports the CPU, so nothing from it reached LLVM."""
    def mutate(m: dict[str, Any], s: Sections) -> None:
        m["target"]["features"] += ",+amx-tile"
        s[m["kernels"][0]["section"]] = b"\xff" * 100

    path = tmp_path / "foreign.tilefuse"
    path.write_bytes(_rebuilt(good, mutate))
    with pytest.raises(container.ArtifactError, match="lacks: amx-tile"):
        tilefuse.load(path)


def test_a_bad_thread_pool_section_is_refused(tmp_path: Path) -> None:
    """An artifact with parallel kernels carries the thread pool's object code; garbage there,
    or no pool section at all, is an ArtifactError in a fresh process (whose pool would start
    from it), never a crash."""
    rng = np.random.default_rng(3)
    w = rng.standard_normal((300, 200)).astype(np.float32)
    f = tilefuse.jit(lambda x: np.tanh(x @ w))
    f(np.ones((96, 300), np.float32))
    good = tilefuse.save(f, tmp_path / "parallel.tilefuse")
    assert "pool" in container.read(good).sections
    cases = {"garbage_pool": _rebuilt(good, lambda m, s: s.__setitem__("pool", b"\x7fELF" * 64)),
             "no_pool": _rebuilt(good, lambda m, s: s.pop("pool"))}
    code = CHILD.replace("(9, 11)", "(96, 300)").replace("9 * 11", "96 * 300")
    for name, data in cases.items():
        (tmp_path / name).write_bytes(data)
        child = subprocess.run([sys.executable, "-c", code, str(tmp_path / name)],
                               capture_output=True, text=True, timeout=600, env=_env())
        assert child.returncode == 0, child.stderr[-3000:]
        result = json.loads(child.stdout.splitlines()[-1])
        assert result["outcome"] == "rejected", result
        assert "thread pool" in result["message"], result
