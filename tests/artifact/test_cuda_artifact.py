"""Cuda artifacts: built and saved with no GPU (PTX inside), refused with a clear error on a
machine without one, loaded and run where a device answers (here the fake CUDA driver, whose
kernels run through the loop-IR interpreter), and hostile cuda programs refused before any
code is loaded."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import tilefuse
from tilefuse.artifact import ArtifactError
from tilefuse.artifact import format as container
from tilefuse.artifact.saver import write_cuda_artifact
from tilefuse.driver import build_gpu_program, optimize
from tilefuse.dtypes import DType
from tilefuse.graph.builder import GraphBuilder
from tilefuse.graph.interpreter import interpret
from tilefuse.graph.ir import Graph
from tilefuse.runtime import cuda_driver, cuda_graph
from tilefuse.testing import assert_close

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "gpu"))
from fake_driver import FakeDriver

F32 = DType.f32


def two_kernels(m: int, n: int) -> Graph:
    """Row sums of exp(tanh(x) * y), and x + 1 (generated kernels only: the fake driver does
    not model cuBLAS)."""
    b = GraphBuilder("two")
    x = b.input(((m, n), F32), "x")
    y = b.input(((m, n), F32), "y")
    t = b.add1("mul", [b.add1("tanh", [x]), y])
    lse = b.add1("sum", [b.add1("exp", [t])], {"axes": [1]})
    one = b.add1("constant", [], {"value": np.array(1, np.float32)})
    return b.build([lse, b.add1("add", [x, one])])


def mlp(m: int) -> Graph:
    b = GraphBuilder("mlp")
    x = b.input(((m, 64), F32), "x")
    w = b.add1("constant", [], {"value": np.random.default_rng(1).standard_normal(
        (64, 32)).astype(np.float32)})
    return b.build([b.add1("relu", [b.add1("matmul", [x, w])])])


def _save(graph: Graph, path: Path, target: str = "cuda:sm_90") -> Path:
    program = build_gpu_program(optimize(graph)[0], target)
    return write_cuda_artifact(path, "executable", {"name": graph.name}, [program])


@pytest.fixture
def no_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cuda_driver, "cuda_available", lambda: False)


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> FakeDriver:
    import tilefuse.artifact.cuda as cuda_artifact

    driver = FakeDriver()
    monkeypatch.setattr(cuda_driver, "_driver", lambda: driver)
    monkeypatch.setattr(cuda_graph, "_driver", lambda: driver)
    monkeypatch.setattr(cuda_driver, "cuda_available", lambda: True)
    real = cuda_artifact.decode_cuda

    def registering(decoder: Any, program: Any) -> Any:
        made = real(decoder, program)
        for step in made.steps:  # the fake device runs a kernel by its loop IR
            if hasattr(step, "fn"):
                driver.kernels[step.fn.name] = step
        return made

    monkeypatch.setattr(cuda_artifact, "decode_cuda", registering)
    monkeypatch.delenv("TILEFUSE_CUDA_GRAPHS", raising=False)
    return driver


def test_saved_without_a_gpu_and_refused_without_one(tmp_path: Path, no_gpu: None) -> None:
    path = _save(mlp(8), tmp_path / "mlp.tilefuse")
    read = container.read(path)
    manifest = json.loads(bytes(read.section("manifest")))
    assert manifest["target"] == {"cuda": "sm_90"}
    ptx = [bytes(d).decode() for n, d in read.sections.items() if n.startswith("p")]
    assert ptx and all(".target sm_90" in p for p in ptx)  # PTX inside
    assert any("gemm" in s for s in manifest["entries"][0]["program"]["steps"])
    with pytest.raises(ArtifactError, match=r"cuda:sm_90 .*no usable CUDA GPU"):
        tilefuse.load(path)


def test_loaded_on_a_device_runs_as_the_graph(tmp_path: Path, fake: FakeDriver) -> None:
    graph = two_kernels(5, 37)
    loaded = tilefuse.load(_save(graph, tmp_path / "two.tilefuse"))
    rng = np.random.default_rng(3)
    for _ in range(2):
        arrays = [rng.standard_normal(v.shape).astype(np.float32) for v in graph.inputs]
        got = loaded(*arrays)
        for g, w in zip(got, interpret(graph, *arrays), strict=True):
            assert_close(g, w, reduction=True)


def test_cli_compiles_for_cuda_without_a_gpu(tmp_path: Path, no_gpu: None,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("onnx")
    from onnx import TensorProto, helper, numpy_helper

    from tilefuse.cli import main

    w = numpy_helper.from_array(np.ones((16, 8), np.float32), "w")
    model = helper.make_model(helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["t"]), helper.make_node("Relu", ["t"], ["y"])],
        "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 8])], [w]),
        opset_imports=[helper.make_opsetid("", 17)])
    onnx_path = tmp_path / "m.onnx"
    onnx_path.write_bytes(model.SerializeToString())
    out = tmp_path / "m.tilefuse"
    assert main(["compile", str(onnx_path), "-o", str(out), "--target", "cuda:sm_90"]) == 0
    assert "cuda:sm_90" in capsys.readouterr().out
    with pytest.raises(ArtifactError, match="no usable CUDA GPU"):
        tilefuse.load(out)


def _forge(path: Path, change: Any) -> Path:
    read = container.read(path)
    manifest = json.loads(bytes(read.section("manifest")))
    change(manifest["entries"][0]["program"], manifest)
    sections = {name: bytes(data) for name, data in read.sections.items()}
    sections["manifest"] = json.dumps(manifest).encode("ascii")
    out = path.with_name("forged.tilefuse")
    container.write(out, sections)
    return out


def _kernel(program: dict[str, Any]) -> dict[str, Any]:
    return next(s for s in program["steps"] if "kernel" in s)


@pytest.mark.parametrize(("change", "match"), [
    (lambda p, m: _kernel(p)["bindings"].append(0), "do not match"),
    (lambda p, m: _kernel(p).__setitem__("bindings", [999]), "not an index"),
    (lambda p, m: _kernel(p).__setitem__("kernel", "other"), "do not match"),
    (lambda p, m: _kernel(p).__setitem__("loop", "nope"), "no section"),
    (lambda p, m: _kernel(p).__setitem__("block", 1 << 20), "not an index"),
    (lambda p, m: p["values"].__setitem__(0, ["f99", [5, 37]]), "unknown dtype"),
    (lambda p, m: p["cuda"].__setitem__("arch", "x86"), "bad target"),
    (lambda p, m: p["cuda"].pop("block_threads"), "bad target"),
    (lambda p, m: p.__setitem__("steps", [{"mystery": 1}]), "neither"),
    (lambda p, m: p["steps"].pop(0), "nothing writes"),
])
def test_hostile_cuda_programs_are_refused_before_the_gpu(tmp_path: Path, fake: FakeDriver,
                                                          change: Any, match: str) -> None:
    path = _forge(_save(two_kernels(5, 37), tmp_path / "two.tilefuse"), change)
    with pytest.raises(ArtifactError, match=match):
        tilefuse.load(path)
    assert not fake.kernels  # the program never validated: nothing went near the device
