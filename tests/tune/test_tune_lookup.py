"""A build that finds its schedules in the tuning database: one connection, one query per
kernel, no schema work (what keeps a warm hit cheap)."""

from __future__ import annotations

import sqlite3

import numpy as np

from tilefuse.codegen.target import host_target
from tilefuse.dtypes import DType
from tilefuse.graph.builder import GraphBuilder
from tilefuse.graph.interpreter import interpret
from tilefuse.runtime.native import NativeExecutable
from tilefuse.runtime.schedules import ScheduleSource
from tilefuse.testing import assert_close, random_array
from tilefuse.tune.database import SQLiteDatabase, TuneKey
from tilefuse.tune.fingerprint import target_string
from tilefuse.tune.space import space_for
from tilefuse.tune.task import named_tasks


def _graph(rng: np.random.Generator):
    """matmul + relu, softmax, matmul + bias: three tunable kernels."""
    b = GraphBuilder("lookup")
    x = b.input(((19, 32), DType.f32), "x")
    w1 = b.add1("constant", [], {"value": random_array(rng, (32, 48), DType.f32)})
    w2 = b.add1("constant", [], {"value": random_array(rng, (48, 24), DType.f32)})
    bias = b.add1("constant", [], {"value": random_array(rng, (24,), DType.f32)})
    h = b.add1("softmax", [b.add1("relu", [b.add1("matmul", [x, w1])])], {"axis": -1})
    return b.build([b.add1("add", [b.add1("matmul", [h, w2]), bias])])


def _count_sqlite(monkeypatch) -> tuple[list[str], list[str]]:
    """Every database opened and every statement run, from now on."""
    opened: list[str] = []
    statements: list[str] = []
    real = sqlite3.connect

    def connect(path, *args, **kwargs):
        opened.append(str(path))
        conn = real(path, *args, **kwargs)
        conn.set_trace_callback(statements.append)
        return conn

    monkeypatch.setattr(sqlite3, "connect", connect)
    return opened, statements


def test_a_warm_build_opens_the_database_once_and_queries_once_per_kernel(tmp_path,
                                                                           monkeypatch):
    rng = np.random.default_rng(8)
    graph = _graph(rng)
    path = tmp_path / "tune.sqlite"
    db = SQLiteDatabase(path)
    target = host_target()
    tuned = {}
    for name, task in named_tasks(graph):
        space = space_for(task.group, target)
        schedule = space.sample(np.random.default_rng(len(tuned)))
        db.record(TuneKey(task.fingerprint(), target_string(target)), space.default(), 2e-3)
        db.record(TuneKey(task.fingerprint(), target_string(target)), schedule, 1e-3)
        tuned[name] = schedule
    db.close()
    assert len(tuned) == 3

    monkeypatch.setenv("TILEFUSE_TUNE_DB", str(path))
    opened, statements = _count_sqlite(monkeypatch)
    source = ScheduleSource(target)
    exe = NativeExecutable(graph, target=target, schedules=source)
    assert opened == [str(path)]
    assert sorted(source.tuned) == sorted(tuned) and set(source.tuned.values()) == {1e-3}
    queries = [s for s in statements if "FROM measurements" in s]
    assert len(queries) == 3, statements
    assert not [s for s in statements if s.lstrip().upper().startswith(("CREATE", "INSERT"))]
    x = random_array(rng, (19, 32), DType.f32)
    assert_close(exe(x)[0], interpret(graph, x)[0], reduction=True)


def test_a_build_without_a_database_file_opens_nothing(tmp_path, monkeypatch):
    monkeypatch.delenv("TILEFUSE_TUNE_DB", raising=False)
    monkeypatch.setenv("TILEFUSE_CACHE_DIR", str(tmp_path / "cache"))
    opened, _ = _count_sqlite(monkeypatch)
    NativeExecutable(_graph(np.random.default_rng(9)), schedules=ScheduleSource(host_target()))
    assert opened == []


def test_a_tuned_attention_schedule_is_what_the_build_runs(tmp_path, monkeypatch):
    """Attention kernels are tuned like the others: the build takes the database's blocking."""
    from helpers_tune import attention_graph

    graph = attention_graph((2, 3), 45, 83, 24, 40)
    target = host_target()
    [(name, task)] = named_tasks(graph)
    space = space_for(task.group, target)
    tuned = next(s for s in (space.sample(np.random.default_rng(i)) for i in range(50))
                 if s != space.default())
    path = tmp_path / "tune.sqlite"
    db = SQLiteDatabase(path)
    db.record(TuneKey(task.fingerprint(), target_string(target)), tuned, 1e-3)
    db.close()
    monkeypatch.setenv("TILEFUSE_TUNE_DB", str(path))
    source = ScheduleSource(target)
    exe = NativeExecutable(graph, tmp_path / "dump", target=target, schedules=source)
    assert source.tuned == {name: 1e-3}
    assert f"[{tuned}]" in (tmp_path / "dump" / "kernels.plan").read_text()
    rng = np.random.default_rng(10)
    arrays = [random_array(rng, tuple(v.shape), v.dtype) for v in graph.inputs]
    assert_close(exe(*arrays)[0], interpret(graph, *arrays)[0], reduction=True)
