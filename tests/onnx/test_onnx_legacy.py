"""Opsets 1-6 (converters_legacy.py), LRN, InstanceNormalization, ConvTranspose and 3-D
convolution and pooling, each in a one-node model against onnxruntime on random inputs (the
old-opset broadcasting against NumPy, which onnxruntime no longer loads below opset 7)."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper
from onnxcheck import F32, arr, init, make_model, single

import tilefuse.onnx
from tilefuse.onnx import OnnxError
from tilefuse.testing import assert_close


def _legacy(op: str, a: np.ndarray, b: np.ndarray, **attrs) -> np.ndarray:
    node = helper.make_node(op, ["a", "b"], ["y"], name="n", **attrs)
    model = make_model([node], [("a", F32, list(a.shape)), ("b", F32, list(b.shape))],
                       [("y", F32)], opset=6)
    return tilefuse.onnx.load(model)(a, b)


@pytest.mark.parametrize("op,fn", [("Add", np.add), ("Sub", np.subtract), ("Mul", np.multiply),
                                   ("Div", np.divide)])
def test_opset6_broadcast_axis(op, fn) -> None:
    a, b = arr([2, 7, 5]), arr([7], low=0.5, high=2.0)
    assert_close(_legacy(op, a, b, broadcast=1, axis=1), fn(a, b[:, None]))
    tail = arr([7, 5], low=0.5, high=2.0)
    assert_close(_legacy(op, a, tail, broadcast=1), fn(a, tail))  # suffix rule by default


def test_opset6_unequal_shapes_need_broadcast() -> None:
    with pytest.raises(OnnxError, match="broadcast=0"):
        _legacy("Add", arr([2, 3]), arr([3]))
    with pytest.raises(OnnxError, match="does not broadcast"):
        _legacy("Add", arr([2, 3]), arr([2]), broadcast=1)


def test_opset6_prelu_per_channel_and_batchnorm_test_mode() -> None:
    x, slope = arr([2, 3, 5]), arr([3])
    node = helper.make_node("PRelu", ["x", "s"], ["y"], name="p")
    model = make_model([node], [("x", F32, [2, 3, 5])], [("y", F32)],
                       initializers=[init("s", slope)], opset=6)
    got = tilefuse.onnx.load(model)(x)
    assert_close(got, np.where(x < 0, x * slope[:, None], x))
    bn = helper.make_node("BatchNormalization", ["x", "g", "b", "m", "v"], ["y"], name="bn")
    consts = [init(n, arr([3], low=0.5, high=1.5)) for n in "gbmv"]
    model = make_model([bn], [("x", F32, [2, 3, 5])], [("y", F32)], initializers=consts,
                       opset=6)
    with pytest.raises(OnnxError, match="is_test=0"):
        tilefuse.onnx.load(model)


def test_opset1_reshape_attribute_and_concat_default_axis() -> None:
    x = arr([2, 3, 4])
    nodes = [helper.make_node("Reshape", ["x"], ["r"], shape=[0, -1], name="r"),
             helper.make_node("Concat", ["r", "r"], ["y"], name="c")]
    model = make_model(nodes, [("x", F32, [2, 3, 4])], [("y", F32)], opset=1)
    got = tilefuse.onnx.load(model)(x)
    flat = x.reshape(2, 12)
    np.testing.assert_array_equal(got, np.concatenate([flat, flat], axis=1))


@pytest.mark.parametrize("size", [1, 3, 5])
def test_lrn(size: int) -> None:
    single("LRN", {"x": arr([2, 7, 5, 3])}, size=size, alpha=0.3, beta=0.75, bias=2.0)


def test_lrn_even_size_against_the_spec() -> None:
    """onnxruntime takes odd sizes only (and onnx's reference loops over the batch axis where
    the spec says channels), so an even size is checked against the spec's formula."""
    size, alpha, beta, bias = 4, 0.3, 0.75, 2.0
    node = helper.make_node("LRN", ["x"], ["y"], name="lrn", size=size, alpha=alpha,
                            beta=beta, bias=bias)
    model = make_model([node], [("x", F32, [2, 7, 5, 3])], [("y", F32)], opset=13)
    x = arr([2, 7, 5, 3])
    square_sum = np.stack([(x[:, max(0, c - 1):c + 3] ** 2).sum(axis=1) for c in range(7)], 1)
    expected = x / (bias + alpha / size * square_sum) ** beta
    assert_close(tilefuse.onnx.load(model)(x), expected)


def test_instance_norm() -> None:
    single("InstanceNormalization", {"x": arr([2, 3, 7, 5])},
           consts={"s": arr([3]), "b": arr([3])}, reduction=True, epsilon=1e-3)


@pytest.mark.parametrize("attrs", [
    {"strides": [3, 2], "pads": [1, 1, 1, 1], "output_padding": [1, 1]},
    {"strides": [2, 2], "dilations": [2, 1]},
    {"strides": [3, 2], "output_shape": [10, 8]},
    {"strides": [2, 2], "auto_pad": "SAME_UPPER"},
])
def test_conv_transpose(attrs: dict) -> None:
    single("ConvTranspose", {"x": arr([1, 3, 3, 4])}, consts={"w": arr([3, 2, 3, 3])},
           reduction=True, **attrs)


def test_conv_transpose_groups_bias_1d() -> None:
    single("ConvTranspose", {"x": arr([2, 4, 5])}, consts={"w": arr([4, 3, 3]), "b": arr([6])},
           reduction=True, group=2, strides=[2])


def test_conv3d() -> None:
    single("Conv", {"x": arr([2, 4, 5, 4, 5])}, consts={"w": arr([6, 2, 3, 2, 3]),
                                                       "b": arr([6])},
           reduction=True, group=2, strides=[2, 1, 2], pads=[1, 0, 1, 1, 1, 0],
           dilations=[1, 2, 1])


@pytest.mark.parametrize("op,attrs", [
    ("MaxPool", {"kernel_shape": [3, 2, 3], "strides": [2, 1, 2], "pads": [1, 0, 1, 1, 1, 1]}),
    ("MaxPool", {"kernel_shape": [2, 2, 2], "strides": [2, 2, 2], "ceil_mode": 1}),
    ("AveragePool", {"kernel_shape": [3, 3, 3], "strides": [2, 2, 2],
                     "pads": [1, 1, 1, 1, 1, 1]}),
    ("AveragePool", {"kernel_shape": [3, 3, 3], "strides": [2, 2, 2],
                     "pads": [1, 1, 1, 1, 1, 1], "count_include_pad": 1}),
])
def test_pool3d(op: str, attrs: dict) -> None:
    single(op, {"x": arr([2, 3, 7, 5, 6])}, reduction=True, **attrs)


def test_sequence_ops_compile_away() -> None:
    """Insert at a position given as a graph input (compiled per value), erase, split and
    concatenate with a new axis, against onnxruntime."""
    from onnxcheck import I64, compare

    nodes = [helper.make_node("SplitToSequence", ["x"], ["s"], axis=1, name="split"),
             helper.make_node("SequenceInsert", ["s", "y", "pos"], ["s2"], name="ins"),
             helper.make_node("SequenceErase", ["s2"], ["s3"], name="erase"),
             helper.make_node("ConcatFromSequence", ["s3"], ["out"], axis=0, new_axis=1,
                              name="cat")]
    model = make_model(nodes, [("x", F32, [3, 4]), ("y", F32, [3, 1]), ("pos", I64, [])],
                       [("out", F32)], opset=17)
    for pos in (0, -2):
        compare(model, {"x": arr([3, 4]), "y": arr([3, 1]), "pos": np.array(pos, np.int64)})


def test_shrink() -> None:
    single("Shrink", {"x": arr([7, 5])}, lambd=0.7, bias=0.2)
