"""ONNX's Gradient operator (ai.onnx.preview.training): the gradient graph is built on graph
IR and compiled natively; compared with the analytic gradients on fresh random inputs, at the
tensors the node names and at other values, with initializers among xs; errors name the op."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from onnx import TensorProto, helper
from onnxcheck import F32, arr, init

import tilefuse.onnx
from tilefuse.onnx.tensors import OnnxError
from tilefuse.testing import assert_close

TRAINING = "ai.onnx.preview.training"


def _model(nodes, inputs, outputs, initializers=()):
    graph = helper.make_graph(
        nodes, "grad",
        [helper.make_tensor_value_info(n, F32, s) for n, s in inputs],
        [helper.make_tensor_value_info(n, F32, None) for n in outputs],
        initializer=list(initializers))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                    helper.make_opsetid(TRAINING, 1)])
    model.ir_version = 8
    return model


def _gradient(inputs, outputs, xs, y, zs=()):
    return helper.make_node("Gradient", inputs, outputs, domain=TRAINING, xs=list(xs), y=y,
                            **({"zs": list(zs)} if zs else {}))


@pytest.mark.parametrize("rows", [1, 7, 33])
def test_dense_layer_gradient_wrt_initializers(rows: int) -> None:
    w, b = arr([5, 3]), arr([3])
    nodes = [helper.make_node("MatMul", ["x", "w"], ["m"]),
             helper.make_node("Add", ["m", "b"], ["h"]),
             helper.make_node("Tanh", ["h"], ["t"]),
             helper.make_node("ReduceSum", ["t"], ["loss"], keepdims=0),
             _gradient(["w", "b", "x"], ["dw", "db"], xs=["w", "b"], zs=["x"], y="loss")]
    model = tilefuse.onnx.load(_model(nodes, [("x", [rows, 5])], ["loss", "dw", "db"],
                                      [init("w", w), init("b", b)]))
    x = arr([rows, 5])
    loss, dw, db = model(x)
    t = np.tanh(x @ w + b)
    assert_close(loss, np.asarray(t.sum(), dtype=np.float32), reduction=True)
    assert_close(dw, (x.T @ (1 - t * t)).astype(np.float32), reduction=True)
    assert_close(db, (1 - t * t).sum(axis=0).astype(np.float32), reduction=True)


def test_gradient_at_other_values() -> None:
    """Gradient(a1, b) with xs=[a]: d((a+b)·a)/da = 2a + b, taken at a = a1."""
    nodes = [helper.make_node("Add", ["a", "b"], ["c"]),
             helper.make_node("Mul", ["c", "a"], ["d"]),
             _gradient(["a1", "b"], ["dd_da"], xs=["a"], zs=["b"], y="d")]
    model = tilefuse.onnx.load(_model(nodes, [("a", [4, 3]), ("b", [3]), ("a1", [4, 3])],
                                      ["d", "dd_da"]))
    a, b, a1 = arr([4, 3]), arr([3]), arr([4, 3])
    d, grad = model(a, b, a1)
    assert_close(d, (a + b) * a)
    assert_close(grad, 2 * a1 + b)


def test_non_scalar_y_is_summed_and_broadcast_operand_reduced() -> None:
    nodes = [helper.make_node("Mul", ["x", "s"], ["y"]),
             _gradient(["x", "s"], ["dx", "ds"], xs=["x", "s"], y="y")]
    model = tilefuse.onnx.load(_model(nodes, [("x", [6, 5]), ("s", [1, 5])], ["dx", "ds"]))
    x, s = arr([6, 5]), arr([1, 5])
    dx, ds = model(x, s)
    assert_close(dx, np.broadcast_to(s, (6, 5)).copy())
    assert_close(ds, x.sum(axis=0, keepdims=True), reduction=True)


def test_op_without_gradient_rule_is_named() -> None:
    k = helper.make_tensor("k", TensorProto.INT64, [1], [2])
    nodes = [helper.make_node("Constant", [], ["k"], value=k),
             helper.make_node("TopK", ["x", "k"], ["p", "i"], axis=-1),
             helper.make_node("ReduceSum", ["p"], ["loss"], keepdims=0),
             _gradient(["x"], ["dx"], xs=["x"], y="loss")]
    with pytest.raises(OnnxError, match=r"Gradient.*topk: has no gradient rule"):
        tilefuse.onnx.load(_model(nodes, [("x", [2, 3])], ["dx"]))(arr([2, 3]))


def test_input_count_must_match_names() -> None:
    nodes = [helper.make_node("Exp", ["x"], ["y"]),
             _gradient(["x"], ["dx"], xs=["x"], zs=["z"], y="y")]
    with pytest.raises(OnnxError, match="one input per name"):
        tilefuse.onnx.load(_model(nodes, [("x", [2])], ["dx"]))(arr([2]))


def test_integer_target_is_refused() -> None:
    nodes = [helper.make_node("Cast", ["x"], ["i"], to=TensorProto.INT64),
             _gradient(["x"], ["dx"], xs=["x"], y="i")]
    with pytest.raises(OnnxError, match="floating-point"):
        tilefuse.onnx.load(_model(nodes, [("x", [2])], ["dx"]))(arr([2]))


def _optimizer_model(op: str, n_groups: int, per: int, shape: list[int], **attrs: Any):
    names = ["R", "T"] + [f"i{k}_{i}" for k in range(per) for i in range(n_groups)]
    outs = [f"o{k}_{i}" for k in range(per - 1) for i in range(n_groups)]
    node = helper.make_node(op, names, outs, domain=TRAINING, **attrs)
    inputs = [helper.make_tensor_value_info("R", F32, []),
              helper.make_tensor_value_info("T", TensorProto.INT64, [])]
    inputs += [helper.make_tensor_value_info(n, F32, shape) for n in names[2:]]
    graph = helper.make_graph([node], op, inputs,
                              [helper.make_tensor_value_info(o, F32, None) for o in outs])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid(TRAINING, 1)])
    model.ir_version = 8
    return model, names


@pytest.mark.parametrize(("op", "per", "attrs"), [
    ("Adagrad", 3, {"decay_factor": 0.1, "epsilon": 1e-6, "norm_coefficient": 0.01}),
    ("Adam", 4, {"alpha": 0.8, "beta": 0.95, "epsilon": 1e-7, "norm_coefficient": 0.02,
                 "norm_coefficient_post": 0.01}),
    ("Momentum", 3, {"alpha": 0.9, "beta": 0.5, "mode": "standard", "norm_coefficient": 0.1}),
    ("Momentum", 3, {"alpha": 0.9, "beta": 0.5, "mode": "nesterov", "norm_coefficient": 0.1})])
@pytest.mark.parametrize("step", [0, 3])
def test_optimizers_against_the_reference(op: str, per: int, attrs: dict, step: int) -> None:
    """A model importing only the training domain; two tensor groups of odd shapes."""
    from onnx.reference import ReferenceEvaluator

    model, names = _optimizer_model(op, 2, per, [3, 7], **attrs)
    feeds = {n: (np.abs(arr([3, 7])) if n.startswith(f"i{per - 1}_") else arr([3, 7]))
             for n in names[2:]}
    feeds = {"R": np.array(0.1, np.float32), "T": np.array(step, np.int64), **feeds}
    expected = ReferenceEvaluator(model).run(None, feeds)
    got = tilefuse.onnx.load(model).run(None, feeds)
    for g, e in zip(got, expected):
        assert_close(g, e.astype(np.float32))


def test_training_domain_alone_converts_no_default_op() -> None:
    node = helper.make_node("Add", ["x", "x"], ["y"])
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", F32, [2])],
                              [helper.make_tensor_value_info("y", F32, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid(TRAINING, 1)])
    model.ir_version = 8
    with pytest.raises(OnnxError, match="unsupported ONNX op Add"):
        tilefuse.onnx.load(model)(arr([2]))
