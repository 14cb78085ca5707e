"""Whole models against onnxruntime: an MLP, a conv-bn-relu-pool-gemm LeNet, a transformer
block with a dim_param batch; the run() signature, one symbolic compilation and guards, and
import-time folding of shape computations."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper
from onnxcheck import F32, I64, arr, compare, init, make_model, ort_run

import tilefuse.onnx
from tilefuse.errors import GuardError
from tilefuse.testing import assert_close


def _mlp() -> object:
    nodes = [helper.make_node("Gemm", ["x", "w1", "b1"], ["h"], transB=1),
             helper.make_node("Relu", ["h"], ["r"]),
             helper.make_node("MatMul", ["r", "w2"], ["o"]),
             helper.make_node("Add", ["o", "b2"], ["logits"]),
             helper.make_node("Softmax", ["logits"], ["probs"], axis=-1)]
    inits = [init("w1", arr([32, 16])), init("b1", arr([32])), init("w2", arr([32, 10])),
             init("b2", arr([10]))]
    return make_model(nodes, [("x", F32, [8, 16])], [("logits", F32), ("probs", F32)],
                      initializers=inits, opset=13)


def test_mlp() -> None:
    compare(_mlp(), {"x": arr([8, 16])}, reduction=True)


def test_lenet() -> None:
    nodes = [
        helper.make_node("Conv", ["x", "cw", "cb"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("BatchNormalization", ["c", "g", "be", "mu", "var"], ["bn"]),
        helper.make_node("Relu", ["bn"], ["r"]),
        helper.make_node("MaxPool", ["r"], ["p"], kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("Conv", ["p", "cw2"], ["c2"], auto_pad="VALID"),
        helper.make_node("Relu", ["c2"], ["r2"]),
        helper.make_node("AveragePool", ["r2"], ["p2"], kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("Flatten", ["p2"], ["f"]),
        helper.make_node("Gemm", ["f", "fw", "fb"], ["y"], transB=1),
    ]
    inits = [init("cw", arr([6, 1, 3, 3])), init("cb", arr([6])), init("g", arr([6])),
             init("be", arr([6])), init("mu", arr([6])), init("var", arr([6], low=0.5)),
             init("cw2", arr([16, 6, 5, 5])), init("fw", arr([10, 16 * 2 * 2])),
             init("fb", arr([10]))]
    model = make_model(nodes, [("x", F32, [4, 1, 16, 16])], [("y", F32)], initializers=inits,
                       opset=13)
    compare(model, {"x": arr([4, 1, 16, 16])}, reduction=True)


def _transformer_block() -> object:
    """Single-head attention + LayerNorm over x: [batch, 6, 16], batch a dim_param; the head
    split's shape is computed in-graph from Shape."""
    d, s = 16, 6
    nodes = [
        helper.make_node("MatMul", ["x", "wq"], ["q"]),
        helper.make_node("MatMul", ["x", "wk"], ["k"]),
        helper.make_node("MatMul", ["x", "wv"], ["v"]),
        helper.make_node("Shape", ["x"], ["xs"]),
        helper.make_node("Gather", ["xs", "zero"], ["b"], axis=0),
        helper.make_node("Unsqueeze", ["b", "ax0"], ["b1"]),
        helper.make_node("Concat", ["b1", "heads"], ["hshape"], axis=0),
        helper.make_node("Reshape", ["q", "hshape"], ["qh"]),
        helper.make_node("Reshape", ["k", "hshape"], ["kh"]),
        helper.make_node("Reshape", ["v", "hshape"], ["vh"]),
        helper.make_node("Transpose", ["qh"], ["qt"], perm=[0, 2, 1, 3]),
        helper.make_node("Transpose", ["kh"], ["kt"], perm=[0, 2, 3, 1]),
        helper.make_node("Transpose", ["vh"], ["vt"], perm=[0, 2, 1, 3]),
        helper.make_node("MatMul", ["qt", "kt"], ["sc"]),
        helper.make_node("Mul", ["sc", "scale"], ["scs"]),
        helper.make_node("Softmax", ["scs"], ["att"], axis=-1),
        helper.make_node("MatMul", ["att", "vt"], ["ctx"]),
        helper.make_node("Transpose", ["ctx"], ["ct"], perm=[0, 2, 1, 3]),
        helper.make_node("Reshape", ["ct", "flat"], ["cf"]),
        helper.make_node("MatMul", ["cf", "wo"], ["o"]),
        helper.make_node("Add", ["o", "x"], ["res"]),
        helper.make_node("LayerNormalization", ["res", "gamma", "beta"], ["y"]),
    ]
    inits = [init("wq", arr([d, d])), init("wk", arr([d, d])), init("wv", arr([d, d])),
             init("wo", arr([d, d])), init("zero", np.array(0, np.int64)),
             init("ax0", np.array([0], np.int64)), init("heads", np.array([s, 2, 8], np.int64)),
             init("scale", np.float32(8 ** -0.5)), init("flat", np.array([0, 0, -1], np.int64)),
             init("gamma", arr([d])), init("beta", arr([d]))]
    return make_model(nodes, [("x", F32, ["batch", s, d])], [("y", F32)], initializers=inits,
                      opset=17)


@pytest.fixture(scope="module")
def block() -> tuple[object, tilefuse.onnx.OnnxModel]:
    model = _transformer_block()
    return model, tilefuse.onnx.load(model)


def test_transformer_block_dynamic_batch(block: tuple) -> None:
    proto, model = block
    for batch in (2, 3, 2, 1, 7):
        x = arr([batch, 6, 16])
        assert_close(model(x), ort_run(proto, {"x": x})[0], reduction=True)
    # one symbolic build (attention with a runtime batch) serves every batch: no per-shape one
    assert model.symbolic is not None and model.symbolic.executable.symbolic is not None
    assert repr(model).endswith("0 compiled signatures)>")


def test_shape_computations_fold(block: tuple) -> None:
    _, model = block
    lowered = model.lower(arr([2, 6, 16]))
    text = str(lowered.captured)
    for op in ("take(", "concat(", "expand_dims(", "i64"):
        assert op not in text, f"{op} left in the imported graph:\n{text}"
    assert "reshape(" in text and "softmax(" in text and "layer_norm(" in text


def test_wrong_rank_or_dtype_at_call_time(block: tuple) -> None:
    _, model = block
    with pytest.raises(GuardError, match="input 'x' expects rank 3"):
        model(arr([6, 16]))
    with pytest.raises(GuardError, match="input 'x' expects element type f32"):
        model(arr([2, 6, 16]).astype(np.float64))
    with pytest.raises(GuardError, match="input 'x' expects dim 1 = 6"):
        model(arr([2, 5, 16]))
    with pytest.raises(GuardError, match="takes 1 inputs"):
        model(arr([2, 6, 16]), arr([2]))


def test_run_signature() -> None:
    model_proto = _mlp()
    model = tilefuse.onnx.load(model_proto)
    x = arr([8, 16])
    logits, probs = ort_run(model_proto, {"x": x})
    both = model.run(None, {"x": x})
    assert isinstance(both, list) and len(both) == 2
    (only,) = model.run(["probs"], {"x": x})
    assert_close(only, probs, reduction=True)
    swapped = model.run(["probs", "logits"], {"x": x})
    assert_close(swapped[1], logits, reduction=True)
    direct = model(x)
    assert isinstance(direct, list) and len(direct) == 2
    assert model.input_names == ["x"] and model.output_names == ["logits", "probs"]
    with pytest.raises(GuardError, match="unknown outputs"):
        model.run(["nope"], {"x": x})
    with pytest.raises(GuardError, match="lacks"):
        model.run(None, {})
    with pytest.raises(GuardError, match="unknown inputs"):
        model.run(None, {"x": x, "z": x})


def test_load_from_path_and_bytes(tmp_path) -> None:
    proto = _mlp()
    path = tmp_path / "mlp.onnx"
    path.write_bytes(proto.SerializeToString())
    x = arr([8, 16])
    expected = ort_run(proto, {"x": x})
    for source in (path, str(path), proto.SerializeToString()):
        got = tilefuse.onnx.load(source, target="reference")(x)
        assert_close(got[1], expected[1], reduction=True)


def test_dim_param_consistency_and_unknown_dims() -> None:
    nodes = [helper.make_node("Add", ["a", "b"], ["y"])]
    model_proto = make_model(nodes, [("a", F32, ["n", None]), ("b", F32, ["n", None])],
                             [("y", F32)])
    model = tilefuse.onnx.load(model_proto)
    a, b = arr([3, 4]), arr([3, 4])
    assert_close(model(a, b), a + b)
    with pytest.raises(GuardError, match=r"dim 0 \(n\) is 2"):
        model(a, arr([2, 4]))


def test_integer_output_types_match() -> None:
    nodes = [helper.make_node("Shape", ["x"], ["s"]),
             helper.make_node("Mul", ["s", "two"], ["y"])]
    proto = make_model(nodes, [("x", F32, [None, 3])], [("y", I64)],
                       initializers=[init("two", np.array([2], np.int64))])
    x = arr([5, 3])
    assert_close(tilefuse.onnx.load(proto)(x), ort_run(proto, {"x": x})[0])
