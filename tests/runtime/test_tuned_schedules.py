"""Builds take a kernel's schedule from the tuning database named by TILEFUSE_TUNE_DB."""

from __future__ import annotations

import dataclasses

import numpy as np

from tilefuse.codegen.target import host_target
from tilefuse.dtypes import DType
from tilefuse.graph.builder import GraphBuilder
from tilefuse.graph.interpreter import interpret
from tilefuse.kernel.fusion import form_kernels
from tilefuse.kernel.schedule import default_schedule
from tilefuse.runtime.native import build_native
from tilefuse.testing import assert_close, random_array
from tilefuse.tune.database import SQLiteDatabase, TuneKey
from tilefuse.tune.task import TuneTask
from tilefuse.tune.tuner import target_string


def _graph(weight: np.ndarray):
    b = GraphBuilder("tuned")
    x = b.input(((37, 64), DType.f32), "x")
    w = b.add1("constant", [], {"value": weight})
    y = b.add1("relu", [b.add1("matmul", [x, w])])
    return b.build([y])


def test_a_recorded_schedule_is_used_and_computes_the_same(tmp_path, monkeypatch):
    rng = np.random.default_rng(5)
    weight = random_array(rng, (64, 96), DType.f32)
    graph = _graph(weight)
    (group,) = [g for g in form_kernels(graph).groups if g.kind.value == "contraction"]
    target = host_target()
    default = default_schedule(group, target)
    tuned = dataclasses.replace(default, micro_tile=(4, default.micro_tile[1]),
                                unroll=(("k", 2),))
    db = SQLiteDatabase(tmp_path / "tune.sqlite")
    constants = {v: weight for v in group.inputs if v.type.shape == (64, 96)}
    key = TuneKey(TuneTask.of_group(group, constants).fingerprint(), target_string(target))
    db.record(key, tuned, 1e-4)
    monkeypatch.setenv("TILEFUSE_TUNE_DB", str(tmp_path / "tune.sqlite"))
    dump = tmp_path / "dump"
    exe = build_native(graph, dump)
    plan = (dump / "kernels.plan").read_text()
    assert "micro(4x" in plan and "tuned, 0.100 ms measured" in plan
    x = random_array(rng, (37, 64), DType.f32)
    assert_close(exe(x)[0], interpret(graph, x)[0], reduction=True)


def test_an_unreadable_database_warns_and_uses_the_default(tmp_path, monkeypatch, caplog):
    bad = tmp_path / "not-a-db.sqlite"
    bad.write_bytes(b"this is not sqlite" * 100)
    monkeypatch.setenv("TILEFUSE_TUNE_DB", str(bad))
    rng = np.random.default_rng(6)
    graph = _graph(random_array(rng, (64, 96), DType.f32))
    with caplog.at_level("WARNING", logger="tilefuse.tune"):
        exe = build_native(graph)
    assert any("not used" in r.getMessage() for r in caplog.records)
    x = random_array(rng, (37, 64), DType.f32)
    assert_close(exe(x)[0], interpret(graph, x)[0], reduction=True)


def test_the_default_database_in_the_cache_directory_is_used_when_present(tmp_path, monkeypatch):
    from tilefuse.runtime.schedules import ScheduleSource

    monkeypatch.delenv("TILEFUSE_TUNE_DB", raising=False)
    env = {"TILEFUSE_CACHE_DIR": str(tmp_path)}
    assert ScheduleSource(host_target(), env).path is None        # no file: nothing to read
    SQLiteDatabase(tmp_path / "tune.sqlite").close()
    assert ScheduleSource(host_target(), env).path == str(tmp_path / "tune.sqlite")
