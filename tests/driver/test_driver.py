"""The compile driver: its stages, that every frontend builds through it, and that no other
module forms kernels or decomposes composites."""

from __future__ import annotations

import ast
from pathlib import Path

import numpy as np
import pytest

import tilefuse
from tilefuse import driver
from tilefuse.driver import STAGES, CompileOptions, compile, compile_graph, plan_kernels
from tilefuse.dtypes import DType
from tilefuse.graph.builder import GraphBuilder
from tilefuse.graph.interpreter import interpret
from tilefuse.graph.ir import Graph
from tilefuse.graph.types import Sym
from tilefuse.runtime.dynamic import DynamicExecutable
from tilefuse.runtime.executable import InterpreterExecutable
from tilefuse.testing import assert_close, random_array

PACKAGE = Path(tilefuse.__file__).parent


def softmax_ffn(m: int | Sym, k: int, n: int) -> Graph:
    """softmax(x @ w + b) with constant w, b: a contraction and a decomposed composite."""
    rng = np.random.default_rng(k)
    builder = GraphBuilder("ffn")
    x = builder.input(((m, k), DType.f32), "x")
    w = builder.add1("constant", [], {"value": rng.standard_normal((k, n)).astype(np.float32)})
    b = builder.add1("constant", [], {"value": rng.standard_normal(n).astype(np.float32)})
    y = builder.add1("add", [builder.add1("matmul", [x, w]), b])
    return builder.build([builder.add1("softmax", [y], {"axis": -1})])


@pytest.mark.parametrize("target", ["cpu", "reference"])
def test_compile_matches_the_reference(target: str) -> None:
    graph = softmax_ffn(13, 29, 7)
    x = random_array(np.random.default_rng(), (13, 29), DType.f32)
    compiled = compile_graph(graph, target)
    assert compiled.graph is graph and compiled.report is not None
    assert_close(compiled.executable(x)[0], interpret(graph, x)[0], reduction=True)
    assert isinstance(compiled.executable, InterpreterExecutable) is (target == "reference")


def test_symbolic_graph_gets_a_dynamic_executable() -> None:
    graph = softmax_ffn(Sym("m"), 16, 5)
    exe = compile(graph, "cpu")
    assert isinstance(exe, DynamicExecutable)
    rng = np.random.default_rng()
    for m in (3, 11):
        x = random_array(rng, (m, 16), DType.f32)
        assert_close(exe(x)[0], interpret(graph, x)[0], reduction=True)


def test_optimize_false_skips_the_pipeline(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_pipeline(*_a: object, **_k: object) -> None:
        raise AssertionError("the graph pipeline ran")

    monkeypatch.setattr(driver, "optimize", no_pipeline)
    compiled = compile_graph(softmax_ffn(4, 8, 3), "cpu", CompileOptions(optimize=False))
    assert compiled.report is None and compiled.optimized is compiled.graph


def test_kernel_plan_decomposes() -> None:
    plan = plan_kernels(softmax_ffn(4, 8, 3))
    ops = {n.op.name for g in plan.groups for n in g.nodes}
    assert "softmax" not in ops and "exp" in ops and "matmul" in ops
    assert [s.name for s in STAGES] == ["graph", "shard", "kernels", "schedules", "lowering",
                                        "codegen", "assembly"]


def test_frontends_build_through_the_driver(monkeypatch: pytest.MonkeyPatch) -> None:
    """jit and ONNX models reach the back ends only through driver.build."""
    calls: list[str] = []
    real = driver.build

    def counting(graph: Graph, target: object = "cpu", options: object = None) -> object:
        calls.append(str(target))
        return real(graph, target, options)  # type: ignore[arg-type]

    monkeypatch.setattr(driver, "build", counting)
    fn = tilefuse.jit(lambda x: np.exp(x) * 2.0, target="reference")
    x = random_array(np.random.default_rng(), (5, 3), DType.f32)
    assert_close(fn(x), np.exp(x) * 2.0)
    assert calls == ["reference"]
    pytest.importorskip("onnx")
    from onnx import TensorProto, helper

    from tilefuse.onnx import load

    node = helper.make_node("Relu", ["x"], ["y"])
    model = helper.make_model(helper.make_graph(
        [node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])]),
        opset_imports=[helper.make_opsetid("", 17)])
    out = load(model.SerializeToString(), target="reference")(x[:2])
    assert_close(np.asarray(out), np.maximum(x[:2], 0))
    assert calls == ["reference", "reference"]


ALLOWED = {
    "driver.py": "the driver's own kernel-formation stage",
    "passes/manager.py": "KernelFigures: kernel counts for the pass report, not a build",
}


def test_only_the_driver_forms_kernels() -> None:
    """No module but the driver calls form_kernels or decompose_composites (AST walk)."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).as_posix()
        if rel in ALLOWED:
            continue
        for node in ast.walk(ast.parse(path.read_text(), rel)):
            if isinstance(node, ast.Call):
                name = getattr(node.func, "id", None) or getattr(node.func, "attr", None)
                if name in ("form_kernels", "decompose_composites"):
                    found.append(f"{rel}:{node.lineno} calls {name}")
    assert not found, "\n".join(found)
