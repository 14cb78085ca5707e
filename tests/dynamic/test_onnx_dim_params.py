"""ONNX dim_params stay symbolic: ``tilefuse.onnx.load`` builds once (a DynamicExecutable whose
one native build serves every size), shape computations on a symbolic dim fold into Reshape
targets with symbols, and what cannot fold compiles per shape with a logged reason. Checked
against onnxruntime on fresh random inputs of sizes 1, 7 and 513."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).parents[1] / "onnx"))
from onnx import helper
from onnxcheck import F32, arr, init, make_model, ort_run

import tilefuse.onnx
from tilefuse.errors import GuardError
from tilefuse.runtime.dynamic import DynamicExecutable
from tilefuse.testing import assert_close

SIZES = (1, 7, 513, 2)


def mlp_with_shape_reshape() -> object:
    """x[N,4,6] -> Reshape(x, Concat(Unsqueeze(Gather(Shape(x), 0)), [24])) -> MatMul -> Add
    -> Relu -> MatMul -> Tanh; plus z[N,1] broadcast against it, another input naming N."""
    nodes = [
        helper.make_node("Shape", ["x"], ["xs"]),
        helper.make_node("Gather", ["xs", "zero"], ["n"], axis=0),
        helper.make_node("Unsqueeze", ["n", "ax0"], ["n1"]),
        helper.make_node("Concat", ["n1", "width"], ["flat"], axis=0),
        helper.make_node("Reshape", ["x", "flat"], ["xf"]),
        helper.make_node("MatMul", ["xf", "w1"], ["h"]),
        helper.make_node("Add", ["h", "b1"], ["hb"]),
        helper.make_node("Relu", ["hb"], ["hr"]),
        helper.make_node("MatMul", ["hr", "w2"], ["o"]),
        helper.make_node("Mul", ["o", "z"], ["oz"]),
        helper.make_node("Tanh", ["oz"], ["y"]),
    ]
    inits = [init("zero", np.array(0, np.int64)), init("ax0", np.array([0], np.int64)),
             init("width", np.array([24], np.int64)), init("w1", arr([24, 40])),
             init("b1", arr([40])), init("w2", arr([40, 12]))]
    return make_model(nodes, [("x", F32, ["N", 4, 6]), ("z", F32, ["N", 1])], [("y", F32)],
                      initializers=inits)


def test_dim_param_model_is_one_symbolic_build() -> None:
    proto = mlp_with_shape_reshape()
    model = tilefuse.onnx.load(proto)
    assert model.symbolic is not None, "the model was not built symbolically"
    exe = model.symbolic.executable
    assert isinstance(exe, DynamicExecutable) and exe.symbolic is not None
    text = str(model.symbolic.captured)
    assert "N" in text and "take(" not in text and "concat(" not in text, text
    for n in SIZES:
        x, z = arr([n, 4, 6]), arr([n, 1])
        assert_close(model(x, z), ort_run(proto, {"x": x, "z": z})[0], reduction=True,
                     msg=f"N={n}")
    assert exe.specializations == 0 and exe.kernel_specializations == 0
    assert repr(model).endswith("0 compiled signatures)>")
    assert sorted(s["N"] for s in exe.sizes) == sorted(SIZES)


def test_guards_run_before_native_code() -> None:
    model = tilefuse.onnx.load(mlp_with_shape_reshape())
    with pytest.raises(GuardError, match=r"dim 0 \(N\) is 3"):
        model(arr([2, 4, 6]), arr([3, 1]))
    with pytest.raises(GuardError, match="expects dim 1 = 4"):
        model(arr([2, 5, 6]), arr([2, 1]))
    with pytest.raises(GuardError, match="element type f32"):
        model(arr([2, 4, 6]).astype(np.float64), arr([2, 1]))
    assert model.symbolic is not None and model.symbolic.executable.sizes == []


def arithmetic_on_shape() -> object:
    """Reshape(x[N,6], Concat(Gather(Shape)·2, [3])): the product N·2 has no graph-IR form."""
    nodes = [
        helper.make_node("Shape", ["x"], ["xs"]),
        helper.make_node("Slice", ["xs", "s0", "s1"], ["n"]),
        helper.make_node("Mul", ["n", "two"], ["n2"]),
        helper.make_node("Concat", ["n2", "three"], ["shape"], axis=0),
        helper.make_node("Reshape", ["x", "shape"], ["r"]),
        helper.make_node("Sigmoid", ["r"], ["y"]),
    ]
    inits = [init("s0", np.array([0], np.int64)), init("s1", np.array([1], np.int64)),
             init("two", np.array([2], np.int64)), init("three", np.array([3], np.int64))]
    return make_model(nodes, [("x", F32, ["batch_size", 6])], [("y", F32)],
                      initializers=inits)


def test_shape_arithmetic_falls_back_per_shape_with_a_logged_reason(caplog) -> None:
    caplog.set_level(logging.INFO, logger="tilefuse.recompiles")
    proto = arithmetic_on_shape()
    model = tilefuse.onnx.load(proto)
    assert model.symbolic is None
    logged = [r.getMessage() for r in caplog.records if r.name == "tilefuse.recompiles"]
    assert any("batch_size stay per shape" in m and "mul" in m for m in logged), logged
    for n in (1, 7):
        x = arr([n, 6])
        assert_close(model(x), ort_run(proto, {"x": x})[0])
    assert repr(model).endswith("2 compiled signatures)>")


def test_dim_param_names_that_are_not_identifiers() -> None:
    nodes = [helper.make_node("Add", ["a", "b"], ["s"]), helper.make_node("Exp", ["s"], ["y"])]
    proto = make_model(nodes, [("a", F32, ["batch size", "seq:0"]),
                               ("b", F32, ["batch size", "seq:0"])], [("y", F32)])
    model = tilefuse.onnx.load(proto)
    assert model.symbolic is not None
    for n, m in ((1, 7), (7, 513)):
        a, b = arr([n, m]), arr([n, m])
        assert_close(model(a, b), ort_run(proto, {"a": a, "b": b})[0])
