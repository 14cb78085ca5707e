"""Malformed, unsupported and hostile models: every failure is a TilefuseError (OnnxError)
that says what is wrong, never a crash; external data stays inside the model's folder."""

from __future__ import annotations

import os

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper
from onnxcheck import F32, I64, arr, init, make_model

import tilefuse.onnx
from tilefuse.errors import TilefuseError
from tilefuse.onnx import OnnxError
from tilefuse.testing import assert_close


def _relu_model(opset: int = 17) -> onnx.ModelProto:
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"], name="mm"),
             helper.make_node("Relu", ["h"], ["y"], name="act")]
    return make_model(nodes, [("x", F32, [2, 4])], [("y", F32)],
                      initializers=[init("w", arr([4, 3]))], opset=opset)


def test_unsupported_op_is_named() -> None:
    node = helper.make_node("NoSuchOp", ["x"], ["y"], name="nso1")
    model = make_model([node], [("x", F32, [2, 4])], [("y", F32)], opset=13)
    with pytest.raises(OnnxError, match=r"unsupported ONNX op NoSuchOp \(node 'nso1', "
                                        r"domain ai.onnx, opset 13\)"):
        tilefuse.onnx.load(model)


def test_op_with_data_dependent_shape_has_no_fallback() -> None:
    """NonMaxSuppression has no converter and onnx's reference has it, but how many boxes it
    keeps depends on the scores: there is no fallback, and the error says why."""
    node = helper.make_node("NonMaxSuppression", ["b", "s"], ["y"], name="nms1")
    model = make_model([node], [("b", F32, [1, 6, 4]), ("s", F32, [1, 1, 6])], [("y", I64)],
                       opset=13)
    with pytest.raises(OnnxError, match=r"ONNX NonMaxSuppression node 'nms1' \(ai.onnx opset "
                                        r"13\): tilefuse does not support it: .*depends on the "
                                        r"input values"):
        tilefuse.onnx.load(model)(arr([1, 6, 4]), arr([1, 1, 6]))


def test_custom_domain_and_too_new_ops_are_named() -> None:
    node = helper.make_node("FusedGelu", ["x"], ["y"], name="fg", domain="com.microsoft")
    model = make_model([node], [("x", F32, [2])], [("y", F32)])
    model.opset_import.append(helper.make_opsetid("com.microsoft", 1))
    with pytest.raises(OnnxError, match=r"FusedGelu \(node 'fg', domain com.microsoft, opset 1"):
        tilefuse.onnx.load(model)
    gelu = make_model([helper.make_node("Gelu", ["x"], ["y"], name="g")], [("x", F32, [2])],
                      [("y", F32)], opset=17)
    with pytest.raises(OnnxError, match=r"Gelu .*opset 17.*converts it from opset 20"):
        tilefuse.onnx.load(gelu)


def test_conversion_error_names_node_opset_and_shapes() -> None:
    node = helper.make_node("Reshape", ["x", "s"], ["y"], name="rs")
    model = make_model([node], [("x", F32, [2, 3])], [("y", F32)],
                       initializers=[init("s", np.array([4, -1], np.int64))])
    with pytest.raises(OnnxError, match=r"ONNX Reshape node 'rs' \(ai.onnx opset 17\): cannot "
                                        r"infer the -1.*inputs f32\[2,3\], i64\[2\]"):
        tilefuse.onnx.load(model)


@pytest.mark.parametrize("data", [b"", b"\x00\x01garbage\xff" * 7, os.urandom(64)],
                         ids=["empty", "garbage", "random"])
def test_garbage_bytes(tmp_path, data: bytes) -> None:
    path = tmp_path / "bad.onnx"
    path.write_bytes(data)
    with pytest.raises(OnnxError):
        tilefuse.onnx.load(path)


def test_truncated_file(tmp_path) -> None:
    data = _relu_model().SerializeToString()
    for cut in (len(data) // 2, len(data) - 3, 10):
        path = tmp_path / f"cut{cut}.onnx"
        path.write_bytes(data[:cut])
        with pytest.raises(OnnxError):
            tilefuse.onnx.load(path)


def test_mutated_files_never_crash() -> None:
    data = bytearray(_relu_model().SerializeToString())
    rng = np.random.default_rng(7)
    for _ in range(150):
        mutated = bytearray(data)
        for i in rng.integers(0, len(data), size=int(rng.integers(1, 4))):
            mutated[i] = int(rng.integers(0, 256))
        try:
            model = tilefuse.onnx.load(bytes(mutated), target="reference")
            model(arr([2, 4]))
        except TilefuseError:
            pass


def test_structural_defects() -> None:
    missing = make_model([helper.make_node("Relu", ["nowhere"], ["y"], name="r")],
                         [("x", F32, [2])], [("y", F32)])
    with pytest.raises(OnnxError, match="reads 'nowhere', which names no value"):
        tilefuse.onnx.load(missing)
    cycle = make_model([helper.make_node("Add", ["x", "b"], ["a"], name="n1"),
                        helper.make_node("Relu", ["a"], ["b"], name="n2")],
                       [("x", F32, [2])], [("a", F32)])
    with pytest.raises(OnnxError, match="cycle"):
        tilefuse.onnx.load(cycle)
    dup = make_model([helper.make_node("Relu", ["x"], ["y"], name="a"),
                      helper.make_node("Neg", ["x"], ["y"], name="b")],
                     [("x", F32, [2])], [("y", F32)])
    with pytest.raises(OnnxError, match="defines 'y', which is already defined"):
        tilefuse.onnx.load(dup)
    no_graph = onnx.ModelProto(ir_version=8)
    with pytest.raises(OnnxError, match="no graph"):
        tilefuse.onnx.load(no_graph)
    with pytest.raises(OnnxError, match="opset 0 is outside"):
        tilefuse.onnx.load(_relu_model(opset=0))
    with pytest.raises(OnnxError, match="opset 99 is outside"):
        tilefuse.onnx.load(_relu_model(opset=99))


@pytest.mark.parametrize("dim", [-3, 2**50])
def test_bad_input_dims(dim: int) -> None:
    model = _relu_model()
    model.graph.input[0].type.tensor_type.shape.dim[0].dim_value = dim
    with pytest.raises(OnnxError, match="invalid dim"):
        tilefuse.onnx.load(model)


def test_wrong_initializer_size() -> None:
    model = _relu_model()
    w = model.graph.initializer[0]
    w.raw_data = w.raw_data[:-4]
    with pytest.raises(OnnxError, match=r"initializer 'w' \(FLOAT\[4, 3\]\) needs 12 elements"):
        tilefuse.onnx.load(model)
    w.dims[:] = [4, -3]
    with pytest.raises(OnnxError, match="negative"):
        tilefuse.onnx.load(model)


def test_non_tensor_source_and_missing_file(tmp_path) -> None:
    with pytest.raises(OnnxError, match="needs a path"):
        tilefuse.onnx.load(12)
    with pytest.raises(OnnxError, match="is not a file"):
        tilefuse.onnx.load(tmp_path / "missing.onnx")


# ---- external data ---------------------------------------------------------------------------


def _external_model(location: str, offset: int = 0, length: int | None = 48
                    ) -> onnx.ModelProto:
    model = _relu_model()
    w = model.graph.initializer[0]
    w.ClearField("raw_data")
    w.data_location = TensorProto.EXTERNAL
    entries = {"location": location, "offset": str(offset)}
    if length is not None:
        entries["length"] = str(length)
    for k, v in entries.items():
        w.external_data.add(key=k, value=v)
    return model


def _save(folder, model: onnx.ModelProto) -> str:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "model.onnx"
    path.write_bytes(model.SerializeToString())
    return str(path)


def test_external_data_inside_folder_loads(tmp_path) -> None:
    w = arr([4, 3])
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "weights.bin").write_bytes(b"\0" * 16 + w.tobytes())
    model = tilefuse.onnx.load(_save(tmp_path / "m", _external_model("weights.bin", 16)))
    x = arr([2, 4])
    assert_close(model(x), np.maximum(x @ w, 0), reduction=True)


@pytest.mark.parametrize("location", ["../secret.bin", "/etc/passwd", "sub/../../secret.bin",
                                      "C:\\secret.bin", "..\\secret.bin"])
def test_external_data_path_traversal(tmp_path, location: str) -> None:
    (tmp_path / "secret.bin").write_bytes(b"\0" * 64)
    path = _save(tmp_path / "m", _external_model(location))
    with pytest.raises(OnnxError, match="external data location"):
        tilefuse.onnx.load(path)


def test_external_data_symlink_out_of_folder(tmp_path) -> None:
    (tmp_path / "secret.bin").write_bytes(b"\0" * 64)
    path = _save(tmp_path / "m", _external_model("link.bin"))
    os.symlink(tmp_path / "secret.bin", tmp_path / "m" / "link.bin")
    with pytest.raises(OnnxError, match="outside the model's folder"):
        tilefuse.onnx.load(path)


def test_external_data_offsets_checked(tmp_path) -> None:
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "w.bin").write_bytes(b"\0" * 50)
    with pytest.raises(OnnxError, match="does not fit"):
        tilefuse.onnx.load(_save(tmp_path / "m", _external_model("w.bin", offset=8)))
    with pytest.raises(OnnxError, match="length 40 does not match"):
        tilefuse.onnx.load(_save(tmp_path / "m", _external_model("w.bin", length=40)))
    with pytest.raises(OnnxError, match="not loaded from a path"):
        tilefuse.onnx.load(_external_model("w.bin"))
    with pytest.raises(OnnxError, match="cannot open"):
        tilefuse.onnx.load(_save(tmp_path / "m", _external_model("absent.bin")))
