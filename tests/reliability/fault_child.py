"""Child processes for the fault-injection tests (run as ``python fault_child.py MODE ...``).

- ``cache DIR``: stores cache entries forever, each payload derived from its key, so a reader
  can tell a right entry from a torn one; the parent kills it with SIGKILL mid-write.
- ``tunedb PATH``: records tuning measurements forever, one committed transaction each.
- ``compile DIR``: compiles one fixed graph with the disk cache in DIR, checks it against the
  reference and prints ``OK <hits> <misses>``.
"""

from __future__ import annotations

import hashlib
import itertools
import os
import sys

import numpy as np


def payload_for(index: int) -> bytes:
    """Entry ``index``'s payload: 64 KiB to 1 MiB whose bytes follow from the index."""
    size = (64 << 10) + (index * 7919) % (960 << 10)
    seed = hashlib.sha256(str(index).encode()).digest()
    return (seed * (size // len(seed) + 1))[:size]


def cache_key(index: int):
    from tilefuse.runtime.disk_cache import CacheKey
    return CacheKey({"function": f"k{index % 16}", "graph": str(index)})


def write_cache(directory: str) -> None:
    from tilefuse.runtime.disk_cache import CacheDir
    cache = CacheDir.open(directory)
    print("ready", flush=True)
    for index in itertools.count():
        cache.put(cache_key(index % 64), payload_for(index % 64), {"index": index % 64})


def write_tunedb(path: str) -> None:
    from tilefuse.kernel.fusion import KernelKind
    from tilefuse.kernel.schedule import Schedule
    from tilefuse.tune.database import SQLiteDatabase, TuneKey
    db = SQLiteDatabase(path)
    print("ready", flush=True)
    schedule = Schedule(KernelKind.ELEMENTWISE)
    for index in itertools.count():
        db.record(TuneKey(f"kernel{index % 8}", "x86-64"), schedule, 1e-3 + index * 1e-9)


def compile_graph(directory: str) -> None:
    os.environ["TILEFUSE_CACHE_DIR"] = directory
    from tilefuse.codegen.target import host_target
    from tilefuse.dtypes import DType
    from tilefuse.graph.builder import GraphBuilder
    from tilefuse.graph.interpreter import interpret
    from tilefuse.graph.types import TensorType
    from tilefuse.passes import GRAPH_PIPELINE, run_pipeline
    from tilefuse.runtime.kernel_cache import KernelCache
    from tilefuse.runtime.native import NativeExecutable
    from tilefuse.testing import assert_close, random_array

    b = GraphBuilder("shared")
    x = b.input(TensorType((7, 33), DType.f32), "x")
    w = b.input(TensorType((33, 17), DType.f32), "w")
    h = b.add1("matmul", [x, w])
    y = b.add1("softmax", [b.add1("tanh", [h])])
    graph, _ = run_pipeline(b.build([y, b.add1("sum", [h], {"axes": (0,)})]), GRAPH_PIPELINE)
    target = host_target()
    cache = KernelCache.from_env(target)
    executable = NativeExecutable(graph, target=target, cache=cache)
    rng = np.random.default_rng(1)
    inputs = [random_array(rng, (7, 33), DType.f32), random_array(rng, (33, 17), DType.f32)]
    for got, want in zip(executable(*inputs), interpret(graph, *inputs)):
        assert_close(got, want, reduction=True)
    stats = executable.cache_stats
    print("OK", stats.hits, stats.misses, flush=True)


if __name__ == "__main__":
    {"cache": write_cache, "tunedb": write_tunedb, "compile": compile_graph}[sys.argv[1]](
        sys.argv[2])
