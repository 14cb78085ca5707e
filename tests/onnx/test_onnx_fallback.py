"""The per-node fallback (tilefuse/onnx/fallback.py): an ONNX op without a converter runs in
onnx's reference implementation, between compiled nodes, with a logged reason; constant inputs
fold at import; an integer graph input that decides an output shape is compiled per value; a
node whose output shape depends on data is refused with a reason (tests/onnx/test_onnx_errors.py).
"""

from __future__ import annotations

import logging

import numpy as np
import pytest
from onnx import TensorProto, helper
from onnx.reference import ReferenceEvaluator
from onnxcheck import F32, I64, arr, init, make_model

import tilefuse.onnx
from tilefuse.dtypes import DType
from tilefuse.graph.parser import parse_graph
from tilefuse.graph.printer import print_graph
from tilefuse.graph.types import TensorType
from tilefuse.onnx.importer import import_graph
from tilefuse.onnx.model import check_model
from tilefuse.testing import assert_close

U8 = TensorProto.UINT8


def reference(model, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    return ReferenceEvaluator(model).run(None, feeds)


def grid_sample_between_native_ops(h: int = 7, w: int = 9):
    nodes = [helper.make_node("Relu", ["x"], ["r"], name="relu"),
             helper.make_node("GridSample", ["r", "g"], ["s"], name="gs", mode="linear"),
             helper.make_node("Mul", ["s", "k"], ["y"], name="scale")]
    return make_model(nodes, [("x", F32, [1, 3, h, w]), ("g", F32, [1, 5, 6, 2])], [("y", F32)],
                      initializers=[init("k", np.float32(1.5))], opset=20)


@pytest.mark.parametrize("h,w", [(7, 9), (1, 13), (33, 2)])
def test_op_without_converter_runs_in_onnx_reference(caplog, h, w):
    model = grid_sample_between_native_ops(h, w)
    x = arr([1, 3, h, w])
    g = arr([1, 5, 6, 2], low=-1.2, high=1.2)   # some samples fall outside: padding zeros
    with caplog.at_level(logging.INFO, logger="tilefuse.fallback"):
        compiled = tilefuse.onnx.load(model)
        got = compiled(x, g)
    want = reference(model, {"x": x, "g": g})
    assert_close(np.asarray(got[0] if isinstance(got, (list, tuple)) else got), want[0])
    said = " ".join(r.getMessage() for r in caplog.records)
    assert "GridSample node 'gs' (ai.onnx opset 20): no tilefuse converter" in said


def test_fallback_node_prints_and_parses_back():
    model = grid_sample_between_native_ops()
    graph = import_graph(check_model(model, None), [TensorType((1, 3, 7, 9), DType.f32),
                                             TensorType((1, 5, 6, 2), DType.f32)])
    text = print_graph(graph)
    assert "onnx_node(" in text
    assert print_graph(parse_graph(text)) == text


def test_constant_inputs_fold_at_import():
    """BitShift of two initializers (uint8) is computed while importing; the graph input only
    meets the folded result (a native add)."""
    a = np.array([[1, 2, 250], [7, 8, 9]], np.uint8)
    s = np.array([[1, 3, 1], [0, 2, 7]], np.uint8)
    nodes = [helper.make_node("BitShift", ["a", "s"], ["t"], direction="LEFT"),
             helper.make_node("Add", ["x", "t"], ["y"])]
    model = make_model(nodes, [("x", U8, [2, 3])], [("y", U8)],
                       initializers=[init("a", a), init("s", s)], opset=17)
    x = np.array([[3, 1, 4], [1, 5, 9]], np.uint8)
    compiled = tilefuse.onnx.load(model)
    got = compiled(x)
    np.testing.assert_array_equal(np.asarray(got[0] if isinstance(got, (list, tuple)) else got),
                                  reference(model, {"x": x})[0])
    graph = import_graph(check_model(model, None), [TensorType((2, 3), DType.u8)])
    assert "onnx_node" not in print_graph(graph)


def test_integer_input_that_decides_a_shape_is_compiled_per_value():
    """DFT's dft_length fed as a graph input: the output shape needs its value, so tilefuse
    compiles per value of it (as converters do for Reshape's shape)."""
    node = helper.make_node("DFT", ["x", "n"], ["y"], name="dft", onesided=1)
    model = make_model([node], [("x", F32, [1, 10, 1]), ("n", I64, [])], [("y", F32)], opset=20)
    compiled = tilefuse.onnx.load(model)
    x = arr([1, 10, 1])
    for n in (10, 6):
        length = np.array(n, np.int64)
        got = compiled(x, length)
        want = reference(model, {"x": x, "n": length})[0]
        got = np.asarray(got[0] if isinstance(got, (list, tuple)) else got)
        assert got.shape == want.shape
        assert_close(got, want, reduction=True)


def test_random_ops_get_no_fallback():
    """A random op folded at import would return one draw on every call: no fallback."""
    node = helper.make_node("Bernoulli", ["x"], ["y"], name="coin")
    model = make_model([node], [("x", F32, [4])], [("y", F32)], opset=15)
    with pytest.raises(tilefuse.onnx.OnnxError, match=r"unsupported ONNX op Bernoulli"):
        tilefuse.onnx.load(model)


def test_declared_output_type_is_used_where_inference_differs():
    """STFT without an onesided attribute (default 1): onnx's inference gives the two-sided
    frame count, its reference the one-sided one. The model's declared output type is what
    the reference computes and what tilefuse plans for."""
    signal = arr([1, 64, 1])
    step, length = np.array(8, np.int64), np.array(16, np.int64)
    nodes = [helper.make_node("STFT", ["x", "step", "", "len"], ["y"], name="stft")]
    model = make_model(nodes, [("x", F32, [1, 64, 1]), ("step", I64, []), ("len", I64, [])],
                       [("y", F32)], opset=17)
    feeds = {"x": signal, "step": step, "len": length}
    want = reference(model, feeds)[0]
    for d in want.shape:
        model.graph.output[0].type.tensor_type.shape.dim.add().dim_value = d
    got = tilefuse.onnx.load(model)(signal, step, length)
    got = np.asarray(got[0] if isinstance(got, (list, tuple)) else got)
    assert got.shape == want.shape == (1, 7, 9, 2)
    assert_close(got, want, reduction=True)


def test_attribute_values_a_converter_does_not_compile_run_in_onnx_reference(caplog):
    """MaxPool's Indices output and Pad's wrap mode: the converters raise NeedsReference, and
    the node runs in onnx's reference between compiled nodes, with the converter's reason."""
    nodes = [helper.make_node("Relu", ["x"], ["r"], name="relu"),
             helper.make_node("MaxPool", ["r"], ["p", "i"], name="pool", kernel_shape=[3, 3],
                              strides=[2, 2]),
             helper.make_node("Pad", ["p", "pads"], ["q"], name="wrap", mode="wrap"),
             helper.make_node("Mul", ["q", "k"], ["y"], name="scale")]
    model = make_model(nodes, [("x", F32, [1, 2, 9, 7])], [("y", F32), ("i", I64)],
                       initializers=[init("k", np.float32(1.5)),
                                     init("pads", np.array([0, 0, 1, 2, 0, 0, 1, 2]))],
                       opset=19)
    x = arr([1, 2, 9, 7])
    with caplog.at_level(logging.INFO, logger="tilefuse.fallback"):
        got = tilefuse.onnx.load(model)(x)
    want = reference(model, {"x": x})
    assert_close(got[0], want[0])
    np.testing.assert_array_equal(got[1], want[1])
    said = " ".join(r.getMessage() for r in caplog.records)
    assert "MaxPool node 'pool' (ai.onnx opset 19): the Indices output is not compiled" in said
    assert "Pad node 'wrap' (ai.onnx opset 19): mode 'wrap' is not compiled" in said


def test_a_dilated_average_pool_runs_in_onnx_reference():
    node = helper.make_node("AveragePool", ["x"], ["y"], name="avg", kernel_shape=[3, 2],
                            dilations=[2, 3], pads=[1, 0, 1, 2], count_include_pad=1)
    model = make_model([node], [("x", F32, [2, 3, 11, 10])], [("y", F32)], opset=19)
    x = arr([2, 3, 11, 10])
    assert_close(tilefuse.onnx.load(model)(x), reference(model, {"x": x})[0])
