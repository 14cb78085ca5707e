"""``tilefuse.tune.tune``: a function's kernels tuned into a database that later builds use."""

from __future__ import annotations

import math
import os
import stat

import numpy as np
import pytest
from helpers_tune import small_probe

import tilefuse
from tilefuse.testing import assert_close
from tilefuse.tune import InProcessRunner, MeasureOptions, MemoryDatabase, TuneError, tune
from tilefuse.tune.api import default_db_path, graph_of, open_database, tune_graph
from tilefuse.tune.roofline import MeasuredRoofline, Peaks
from tilefuse.tune.task import named_tasks

OPTIONS = MeasureOptions(warmup=1, repeats=3, min_repeat_seconds=1e-4, timeout=30.0)
WEIGHT = np.random.default_rng(3).standard_normal((48, 96)).astype(np.float32)


def two_kernels(x):
    """A matmul+relu kernel, then a softmax kernel."""
    h = np.maximum(x @ WEIGHT, 0)
    e = np.exp(h - h.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def _far_roofline() -> MeasuredRoofline:
    return MeasuredRoofline(MemoryDatabase(), "t", lambda: Peaks(1e15, 1e15),  # never reached
                            probe=small_probe)


def _x() -> np.ndarray:
    return np.random.default_rng(4).standard_normal((40, 48)).astype(np.float32)


def test_tune_reports_both_kernels_and_builds_use_the_tuned_schedules(tmp_path, monkeypatch):
    db = tmp_path / "tune.sqlite"
    report = tune(two_kernels, _x(), trials=8, time_budget=120, db=db,
                  runner=InProcessRunner(OPTIONS), roofline=_far_roofline(), min_share=0.0,
                  per_round=2, progress=False)
    kinds = sorted(k.label.split()[1] for k in report.kernels)
    assert kinds == ["contraction", "row_reduction"]
    for k in report.kernels:
        assert k.tuned and k.trials >= 3
        assert math.isfinite(k.default_seconds) and math.isfinite(k.best_seconds)
        assert k.best_seconds > 0 and k.bound_seconds > 0
    assert report.trials == sum(k.trials for k in report.kernels) <= 8
    assert abs(sum(k.share for k in report.kernels) - 1.0) < 1e-9
    text = str(report)
    assert "contraction" in text and "row_reduction" in text and str(db) in text

    monkeypatch.setenv("TILEFUSE_TUNE_DB", str(db))
    dump = tmp_path / "dump"
    fresh = tilefuse.jit(two_kernels, dump=dump)
    got = fresh(_x())
    plan = (dump / "kernels.plan").read_text()
    assert plan.count("tuned,") == 2, plan
    assert_close(got, two_kernels(_x()), reduction=True)


def test_kernels_under_the_minimum_share_keep_their_default(tmp_path):
    def with_tiny(x, v):
        return two_kernels(x), np.tanh(v) * 2

    v = np.ones(4, np.float32)
    report = tune(with_tiny, _x(), v, trials=9, time_budget=120, db=tmp_path / "t.sqlite",
                  runner=InProcessRunner(OPTIONS), roofline=_far_roofline(), min_share=0.2,
                  per_round=2, progress=False)
    assert len(report.kernels) == 3
    shares = [k.share for k in report.kernels]
    assert shares == sorted(shares, reverse=True)  # hottest first; one has >= 1/3
    assert report.kernels[0].tuned
    for k in report.kernels:
        assert k.tuned == (k.share >= 0.2)
        if not k.tuned:
            assert k.best_seconds == k.default_seconds and "default kept" in k.note


def test_graph_of_accepts_jitted_and_plain_functions_and_graphs():
    plain = graph_of(two_kernels, (_x(),))
    jitted = graph_of(tilefuse.jit(two_kernels), (_x(),))
    again = graph_of(plain, ())  # a graph goes through the pipeline: nothing left to change
    assert [n.op.name for n in again.nodes] == [n.op.name for n in plain.nodes]
    assert [n.op.name for n in plain.nodes] == [n.op.name for n in jitted.nodes]
    assert len(named_tasks(plain)) == 2
    with pytest.raises(TuneError, match="cannot tune"):
        graph_of(42, ())


def test_default_db_path_follows_the_environment(tmp_path):
    env = {"HOME": str(tmp_path)}
    assert default_db_path(env) == tmp_path / ".cache" / "tilefuse" / "tune.sqlite"
    env["TILEFUSE_CACHE_DIR"] = str(tmp_path / "cache")
    assert default_db_path(env) == tmp_path / "cache" / "tune.sqlite"
    env["TILEFUSE_TUNE_DB"] = str(tmp_path / "elsewhere.db")
    assert default_db_path(env) == tmp_path / "elsewhere.db"


def test_open_database_creates_a_private_directory_and_file(tmp_path):
    path = tmp_path / "new" / "dir" / "tune.sqlite"
    db = open_database(path)
    assert db.integrity() == "ok"
    assert stat.S_IMODE(os.stat(path.parent).st_mode) == 0o700
    assert stat.S_IMODE(os.stat(path).st_mode) & 0o077 == 0
    db.close()


def test_the_default_database_directory_must_be_private(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("TILEFUSE_TUNE_DB", raising=False)
    monkeypatch.delenv("TILEFUSE_CACHE_DIR", raising=False)
    open_database().close()
    directory = tmp_path / ".cache" / "tilefuse"
    assert (directory / "tune.sqlite").exists()
    directory.chmod(0o777)
    with pytest.raises(TuneError, match="TILEFUSE_TUNE_DB"):
        open_database()


def test_an_onnx_model_path_is_tuned(tmp_path):
    onnx = pytest.importorskip("onnx")
    from onnx import TensorProto, helper, numpy_helper

    w = numpy_helper.from_array(WEIGHT, "w")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Relu", ["h"], ["y"])],
        "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [40, 48])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [40, 96])], [w])
    path = tmp_path / "tiny.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    report = tune(str(path), _x(), trials=3, time_budget=60, db=tmp_path / "t.sqlite",
                  runner=InProcessRunner(OPTIONS), roofline=_far_roofline(), progress=False)
    [kernel] = report.kernels
    assert kernel.label.startswith("k0 contraction matmul") and kernel.trials == 3


def _tiny_onnx():
    from onnx import TensorProto, helper, numpy_helper

    w = numpy_helper.from_array(WEIGHT, "w")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Relu", ["h"], ["y"])],
        "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [40, 48])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [40, 96])], [w])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_an_onnx_model_proto_and_bytes_give_the_loaded_models_graph():
    pytest.importorskip("onnx")
    proto = _tiny_onnx()
    from_proto = graph_of(proto, (_x(),))
    from_bytes = graph_of(proto.SerializeToString(), (_x(),))
    for g in (from_proto, from_bytes):
        [(_, task)] = named_tasks(g)
        assert task.kind.value == "contraction"
    assert named_tasks(from_proto)[0][1].fingerprint() == \
        named_tasks(from_bytes)[0][1].fingerprint()


def test_a_torch_module_is_tuned_and_its_build_uses_the_result(tmp_path, monkeypatch):
    torch = pytest.importorskip("torch")
    from tilefuse.codegen.target import host_target
    from tilefuse.runtime.native import NativeExecutable
    from tilefuse.runtime.schedules import ScheduleSource

    torch.manual_seed(0)
    module = torch.nn.Sequential(torch.nn.Linear(48, 64), torch.nn.GELU()).eval()
    x = _x()
    db = tmp_path / "t.sqlite"
    report = tune(module, torch.from_numpy(x), trials=3, time_budget=60, db=db,
                  runner=InProcessRunner(OPTIONS), roofline=_far_roofline(), progress=False)
    assert [k.label.split()[1] for k in report.kernels] == ["contraction"]
    assert report.kernels[0].trials == 3
    monkeypatch.setenv("TILEFUSE_TUNE_DB", str(db))
    source = ScheduleSource(host_target())
    exe = NativeExecutable(graph_of(module, (x,)), schedules=source)
    assert len(source.tuned) == 1
    with torch.no_grad():
        want = module(torch.from_numpy(x)).numpy()
    assert_close(exe(x)[0], want, reduction=True)


def test_tune_graph_checks_the_example_inputs(tmp_path):
    graph = graph_of(two_kernels, (_x(),))
    with pytest.raises(TuneError, match="example input 0"):
        tune_graph(graph, [np.ones((40, 47), np.float32)], trials=1, db=tmp_path / "t.sqlite")
    with pytest.raises(TuneError, match="takes 1 inputs"):
        tune_graph(graph, [], trials=1, db=tmp_path / "t.sqlite")


def test_tune_is_reachable_from_the_package():
    import tilefuse.tune as package
    from tilefuse.tune import api

    assert package.tune is api.tune and package.tune_graph is api.tune_graph
    assert tilefuse.autotune is api.tune
