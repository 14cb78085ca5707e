"""The disk cache of compiled kernels, through the native executable: a second process loads
every kernel without running LLVM; corrupt, foreign-target and unsafe caches are logged misses
with correct results; TILEFUSE_CACHE=0 writes nothing; a changed shape or schedule is a miss
that names the changed part; dumps of loaded kernels say where they came from."""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

import tilefuse
from tilefuse.codegen.target import CpuTarget, host_target
from tilefuse.dtypes import DType
from tilefuse.graph.builder import GraphBuilder
from tilefuse.graph.interpreter import interpret
from tilefuse.graph.ir import Graph
from tilefuse.kernel.fusion import KernelGroup, KernelKind
from tilefuse.kernel.schedule import Schedule
from tilefuse.runtime import schedules
from tilefuse.runtime.disk_cache import CacheDir, CacheError, CacheKey
from tilefuse.runtime.kernel_cache import KernelCache
from tilefuse.runtime.native import NativeExecutable
from tilefuse.testing import assert_close, random_array

F32 = DType.f32
REPO = Path(tilefuse.__file__).resolve().parent.parent


@pytest.fixture(autouse=True)
def cache_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Every test compiles into its own cache directory, never into ~/.cache."""
    path = tmp_path / "cache"
    monkeypatch.setenv("TILEFUSE_CACHE_DIR", str(path))
    monkeypatch.delenv("TILEFUSE_CACHE", raising=False)
    return path


def ffn_softmax(m: int = 13, k: int = 35, n: int = 17) -> Graph:
    """softmax(gelu(x @ w + b)), w and b constants: a matmul kernel and a row kernel."""
    rng = np.random.default_rng(k)
    builder = GraphBuilder("ffn")
    x = builder.input(((m, k), F32), "x")
    w = builder.add1("constant", [], {"value": random_array(rng, (k, n), F32, -0.5, 0.5)})
    b = builder.add1("constant", [], {"value": random_array(rng, (n,), F32)})
    y = builder.add1("add", [builder.add1("matmul", [x, w]), b])
    return builder.build([builder.add1("softmax", [builder.add1("gelu", [y])])])


def chain(rows: int = 7, cols: int = 513) -> Graph:
    """sigmoid(tanh(x * y) - x): one elementwise kernel."""
    builder = GraphBuilder("chain")
    x = builder.input(((rows, cols), F32), "x")
    y = builder.input(((cols,), F32), "y")
    t = builder.add1("tanh", [builder.add1("mul", [x, y])])
    return builder.build([builder.add1("sigmoid", [builder.add1("sub", [t, x])])])


def check(exe: NativeExecutable, seed: int = 0) -> NativeExecutable:
    """Runs ``exe`` and the interpreter on fresh random inputs and compares."""
    rng = np.random.default_rng(seed)
    arrays = [random_array(rng, tuple(v.shape), v.dtype) for v in exe.graph.inputs]
    for got, expected in zip(exe(*arrays), interpret(exe.graph, *arrays), strict=True):
        assert_close(got, expected, reduction=True)
    return exe


def kernel_count(exe: NativeExecutable) -> int:
    return exe.cache_stats.hits + exe.cache_stats.misses


def entries(directory: Path) -> list[Path]:
    return sorted(directory.glob("*.tfc"))


def cache_records(caplog: pytest.LogCaptureFixture, level: int) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.name == "tilefuse.cache" and r.levelno == level]


# --- across processes -------------------------------------------------------------------------

CHILD = """
    import json, math, sys
    import numpy as np
    import scipy.special
    import tilefuse
    import tilefuse.codegen.jit as codegen
    from tilefuse.dtypes import DType
    from tilefuse.graph.interpreter import interpret
    from tilefuse.testing import assert_close, random_array

    if sys.argv[1] == "warm":  # any LLVM IR generation or optimisation fails the child
        def no_llvm(*args, **kwargs):
            raise AssertionError("LLVM ran although every kernel is cached")
        codegen.optimise = codegen.lower_to_llvm = no_llvm

    rng = np.random.default_rng(1)
    w = random_array(rng, (35, 17), DType.f32, -0.5, 0.5)
    b = random_array(rng, (17,), DType.f32)

    @tilefuse.jit
    def model(x, v):
        y = x @ w + b
        y = 0.5 * y * (1.0 + scipy.special.erf(y / math.sqrt(2.0)))
        e = np.exp(y - y.max(axis=-1, keepdims=True))
        return e / e.sum(axis=-1, keepdims=True) @ v   # v: packed at run time

    fresh = np.random.default_rng(int(sys.argv[2]))
    x = random_array(fresh, (13, 35), DType.f32)
    v = random_array(fresh, (17, 9), DType.f32)
    out = model(x, v)
    lowered = model.lower(x, v)
    assert_close(out, interpret(lowered.captured, x, v)[0], reduction=True)
    stats = lowered.executable.cache_stats
    print(json.dumps({"hits": stats.hits, "misses": stats.misses, "stored": stats.stored,
                      "fallbacks": len(lowered.executable.fallbacks)}))
"""


def run_child(mode: str, seed: int) -> dict[str, int]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(CHILD), mode, str(seed)],
                          env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_second_process_loads_every_kernel_from_disk(cache_dir: Path):
    cold = run_child("cold", seed=2)
    assert cold["hits"] == 0 and cold["misses"] >= 3 and cold["stored"] == cold["misses"]
    assert cold["fallbacks"] == 0
    assert len(entries(cache_dir)) == cold["stored"]
    warm = run_child("warm", seed=3)  # fresh inputs; LLVM disabled in the child
    assert warm == {"hits": cold["misses"], "misses": 0, "stored": 0, "fallbacks": 0}


def test_same_graph_again_in_process_is_all_hits(cache_dir: Path):
    first = check(NativeExecutable(ffn_softmax()))
    assert first.cache_stats.hits == 0 and first.cache_stats.stored == kernel_count(first) >= 2
    assert first.cache_stats.directory == cache_dir
    second = check(NativeExecutable(ffn_softmax()), seed=1)
    assert second.cache_stats.hits == kernel_count(first) and second.cache_stats.misses == 0


# --- bad entries ------------------------------------------------------------------------------

def test_corrupted_entries_are_logged_misses_and_are_rewritten(cache_dir: Path, caplog):
    count = kernel_count(check(NativeExecutable(ffn_softmax())))
    for path in entries(cache_dir):
        data = bytearray(path.read_bytes())
        middle = len(data) // 2
        data[middle:middle + 8] = bytes(b ^ 0xFF for b in data[middle:middle + 8])
        path.write_bytes(bytes(data))
    with caplog.at_level(logging.WARNING, logger="tilefuse.cache"):
        again = check(NativeExecutable(ffn_softmax()), seed=1)
    assert again.cache_stats.hits == 0 and again.cache_stats.misses == count
    assert again.cache_stats.stored == count
    warnings = cache_records(caplog, logging.WARNING)
    assert len(warnings) == count and all("checksum" in w for w in warnings)
    third = check(NativeExecutable(ffn_softmax()), seed=2)
    assert third.cache_stats.hits == count  # the rewritten entries are good


def test_an_entry_made_for_another_cpu_is_a_logged_miss(monkeypatch, caplog):
    keys: list[CacheKey] = []
    original = KernelCache.key

    def recording(self: KernelCache, *args: object) -> CacheKey:
        keys.append(original(self, *args))
        return keys[-1]

    monkeypatch.setattr(KernelCache, "key", recording)
    host = host_target()
    check(NativeExecutable(chain()))
    check(NativeExecutable(chain(), target=CpuTarget(host.triple, "x86-64", "")))
    host_key, other_key = keys
    assert host_key.differing_parts(other_key)[-2:] == ["target_cpu", "target_features"]
    cache = CacheDir.open()
    foreign = cache.get(other_key)
    cache.put(host_key, foreign.payload, foreign.metadata)  # a well-formed entry, wrong cpu
    with caplog.at_level(logging.WARNING, logger="tilefuse.cache"):
        exe = check(NativeExecutable(chain()), seed=1)
    assert exe.cache_stats.hits == 0 and exe.cache_stats.stored == 1
    [warning] = cache_records(caplog, logging.WARNING)
    assert "compiled for" in warning and "x86-64" in warning and "a miss" in warning
    assert check(NativeExecutable(chain()), seed=2).cache_stats.hits == 1


# --- directories and options ------------------------------------------------------------------

@pytest.mark.parametrize("unsafe", ["world-writable", "foreign-owned"])
def test_an_unsafe_cache_directory_warns_and_compiles_without_it(cache_dir: Path, caplog,
                                                                  unsafe: str):
    cache_dir.mkdir(mode=0o700)
    if unsafe == "world-writable":
        cache_dir.chmod(0o777)
        reason = "writable by group or others"
    else:
        if os.geteuid() != 0:
            pytest.skip("chown to another user needs root")
        os.chown(cache_dir, 65534, 65534)
        reason = "owned by uid 65534"
    with caplog.at_level(logging.WARNING, logger="tilefuse.cache"):
        exe = check(NativeExecutable(ffn_softmax()))
    [warning] = cache_records(caplog, logging.WARNING)
    assert reason in warning and str(cache_dir) in warning
    assert exe.cache_stats.directory is None and exe.cache_stats.hits == 0
    assert exe.cache_stats.misses >= 2 and exe.cache_stats.stored == 0
    assert list(cache_dir.iterdir()) == []


@pytest.mark.parametrize("value", ["0", "off", "OFF"])
def test_cache_off_writes_nothing(cache_dir: Path, monkeypatch, caplog, value: str):
    monkeypatch.setenv("TILEFUSE_CACHE", value)
    with caplog.at_level(logging.DEBUG, logger="tilefuse.cache"):
        exe = check(NativeExecutable(ffn_softmax()))
        check(NativeExecutable(ffn_softmax()), seed=1)
    assert not cache_dir.exists()
    assert exe.cache_stats.directory is None and exe.cache_stats.stored == 0
    assert exe.cache_stats.misses == kernel_count(exe) >= 2
    assert cache_records(caplog, logging.WARNING) == []


def test_an_unknown_cache_setting_warns_and_keeps_the_cache_on(cache_dir: Path, monkeypatch,
                                                                caplog):
    monkeypatch.setenv("TILEFUSE_CACHE", "maybe")
    with caplog.at_level(logging.WARNING, logger="tilefuse.cache"):
        exe = check(NativeExecutable(chain()))
    [warning] = cache_records(caplog, logging.WARNING)
    assert "TILEFUSE_CACHE='maybe'" in warning
    assert exe.cache_stats.stored == 1 and len(entries(cache_dir)) == 1


def test_a_failed_write_warns_once_and_compiles_on(monkeypatch, caplog):
    def full(*args: object, **kwargs: object) -> None:
        raise CacheError("cannot write cache entry: No space left on device")

    monkeypatch.setattr(CacheDir, "put", full)
    with caplog.at_level(logging.WARNING, logger="tilefuse.cache"):
        exe = check(NativeExecutable(ffn_softmax()))
    [warning] = cache_records(caplog, logging.WARNING)
    assert "No space left" in warning
    assert exe.cache_stats.stored == 0 and exe.cache_stats.misses >= 2


# --- misses say why ---------------------------------------------------------------------------

def miss_reasons(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [m for m in cache_records(caplog, logging.DEBUG) if m.startswith("miss ")]


def test_a_changed_shape_is_a_miss_naming_the_loop_ir(caplog):
    check(NativeExecutable(chain(7, 513)))
    caplog.clear()
    with caplog.at_level(logging.DEBUG, logger="tilefuse.cache"):
        exe = check(NativeExecutable(chain(9, 513)))
    assert exe.cache_stats.misses == 1
    [reason] = miss_reasons(caplog)
    assert "chain/" in reason and "differs in loop_ir:" in reason
    assert "schedule:" not in reason and "target" not in reason


def test_a_changed_schedule_is_a_miss_naming_the_schedule(monkeypatch, caplog):
    check(NativeExecutable(chain()))
    default = schedules.default_schedule

    def narrower(group: KernelGroup, target: object) -> Schedule:
        schedule = default(group, target)
        assert schedule.kind is KernelKind.ELEMENTWISE and schedule.vector_width > 4
        return dataclasses.replace(schedule, vector_width=4)

    monkeypatch.setattr(schedules, "default_schedule", narrower)
    caplog.clear()
    with caplog.at_level(logging.DEBUG, logger="tilefuse.cache"):
        exe = check(NativeExecutable(chain()))
    assert exe.cache_stats.misses == 1
    [reason] = miss_reasons(caplog)
    assert "schedule:" in reason and '"vector_width": 4' in reason


# --- dumps ------------------------------------------------------------------------------------

def test_dumps_of_a_loaded_kernel_are_its_stored_ir_and_say_so(tmp_path: Path):
    cold, warm = tmp_path / "cold", tmp_path / "warm"
    NativeExecutable(ffn_softmax(), cold)
    exe = NativeExecutable(ffn_softmax(), warm)
    assert exe.cache_stats.misses == 0
    assert "(from the disk cache)" in (warm / "kernels.plan").read_text()
    assert "(from the disk cache)" not in (cold / "kernels.plan").read_text()
    for ll in sorted((cold / "kernels").glob("*.ll")):
        loaded = (warm / "kernels" / ll.name).read_text()
        note, _, rest = loaded.partition("\n")
        assert note.startswith("; tilefuse: this kernel's machine code was loaded from the "
                               "disk cache entry ") and "optimised LLVM IR" in note
        assert rest == ll.read_text()  # the IR the cached code was made from
        asm = (warm / "kernels" / ll.name).with_suffix(".s").read_text()
        assert asm.startswith("# tilefuse:") and "assembly" in asm.partition("\n")[0]
        assert asm.partition("\n")[2] == ll.with_suffix(".s").read_text()
    assert any("vfmadd" in p.read_text() for p in (warm / "kernels").glob("*.s"))


def repeated_layers(layers: int = 3, width: int = 24, rows: int = 7) -> Graph:
    """``layers`` times tanh(x @ w_i + b_i) of one shape, each with its own constants, then a
    last layer of another width: the repeated blocks of a ResNet or a transformer."""
    rng = np.random.default_rng(layers)
    builder = GraphBuilder("layers")
    x = builder.input(((rows, width), F32), "x")
    for n in [width] * layers + [width + 8]:
        w = builder.add1("constant", [], {"value": random_array(rng, (width, n), F32, -0.5, 0.5)})
        b = builder.add1("constant", [], {"value": random_array(rng, (n,), F32)})
        x = builder.add1("tanh", [builder.add1("add", [builder.add1("matmul", [x, w]), b])])
    return builder.build([x])


@pytest.mark.parametrize("cache", ["on", "off"])
def test_kernels_with_the_same_loop_ir_are_compiled_once_per_build(cache: str, monkeypatch,
                                                                   tmp_path: Path):
    """Layers 2-4 of one shape are one compiled kernel (each with its own weights); the first
    (its input buffer is the graph's ``x``) and the last (another width) are their own; with
    the disk cache off as well; the results are each layer's own."""
    if cache == "off":
        monkeypatch.setenv("TILEFUSE_CACHE", "0")
    exe = check(NativeExecutable(repeated_layers(4), tmp_path / "dump"))
    stats = exe.cache_stats
    assert (stats.misses, stats.shared) == (3, 2)
    plan = (tmp_path / "dump" / "kernels.plan").read_text()
    assert plan.count("(the code of k1)") == 2 and "k0 native: k0  [" in plan
    note = (tmp_path / "dump" / "kernels" / "k2.ll").read_text().partition("\n")[0]
    assert note.startswith("; tilefuse: this kernel's loop IR is k1's")
