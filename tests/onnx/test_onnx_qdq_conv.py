"""QDQ ONNX models on the integer kernels: a convolution or product whose activation is a
QuantizeLinear/DequantizeLinear pair runs as ``qconv_i8`` with the pair's static scale (the
default for such models on the CPU), bit for bit equal to tilefuse's reference interpreter
(the ops' int32 references) and to onnx's reference evaluator up to f32 sum order; f32 models
with ``quantize="int8"`` read their convolution windows in place; a small CNN quantized by
onnxruntime's ``quantize_static`` agrees with onnxruntime."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator
from onnxcheck import F32, make_model

import tilefuse.onnx
from tilefuse.codegen.target import host_target

pytestmark = pytest.mark.skipif(not host_target().has("avx512vnni"),
                                reason="the integer kernels need AVX-512 VNNI")
rng = np.random.default_rng(2931)


def _nodes(model: tilefuse.onnx.OnnxModel, *args: np.ndarray) -> list:
    return list(model.lower(*args).optimized.nodes)


def _cos(a: np.ndarray, b: np.ndarray) -> float:
    a, b = a.astype(np.float64).ravel(), b.astype(np.float64).ravel()
    return float(a @ b / np.linalg.norm(a) / np.linalg.norm(b))


def _qdq_conv(cin: int, cout: int, k: int, stride: int, pad: int, x_dtype: int,
              x_zero: int, w_zero_per_channel: bool) -> tuple:
    np_x = np.uint8 if x_dtype == TensorProto.UINT8 else np.int8
    w = rng.integers(-127, 128, size=(cout, cin, k, k)).astype(np.int8)
    ws = (rng.uniform(0.002, 0.01, size=cout) if w_zero_per_channel
          else np.array(0.004)).astype(np.float32)
    consts = {"w": w, "ws": ws, "wz": np.zeros(ws.shape, np.int8),
              "xs": np.array(0.02, np.float32), "xz": np.array(x_zero, np_x),
              "b": rng.standard_normal(cout).astype(np.float32)}
    nodes = [helper.make_node("QuantizeLinear", ["x", "xs", "xz"], ["xq"]),
             helper.make_node("DequantizeLinear", ["xq", "xs", "xz"], ["xd"]),
             helper.make_node("DequantizeLinear", ["w", "ws", "wz"], ["wd"], axis=0),
             helper.make_node("Conv", ["xd", "wd", "b"], ["c"], pads=[pad] * 4,
                              strides=[stride, stride]),
             helper.make_node("Relu", ["c"], ["y"])]
    return make_model(nodes, [("x", F32, [2, cin, 11, 9])], [("y", F32)],
                      initializers=[numpy_helper.from_array(v, n) for n, v in consts.items()],
                      opset=19)


@pytest.mark.parametrize("cin,cout,k,stride,pad,x_dtype,x_zero,per_channel", [
    (32, 64, 3, 1, 1, TensorProto.UINT8, 128, False),
    (19, 70, 3, 2, 1, TensorProto.INT8, -3, True),
    (64, 96, 1, 2, 0, TensorProto.UINT8, 7, True),
    (3, 64, 7, 2, 3, TensorProto.INT8, 0, False),
])
def test_qdq_conv_runs_on_the_integer_kernel(cin: int, cout: int, k: int, stride: int,
                                             pad: int, x_dtype: int, x_zero: int,
                                             per_channel: bool) -> None:
    model = _qdq_conv(cin, cout, k, stride, pad, x_dtype, x_zero, per_channel)
    compiled = tilefuse.onnx.load(model)
    reference = tilefuse.onnx.load(model, target="reference")
    spec = ReferenceEvaluator(model)
    for scale in (1.0, 30.0):   # 30: many codes saturate
        x = (rng.standard_normal((2, cin, 11, 9)) * scale).astype(np.float32)
        out = compiled(x)
        np.testing.assert_array_equal(out, reference(x))
        want = spec.run(None, {"x": x})[0]
        np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())
    assert "pad" not in [n.op.name for n in _nodes(compiled, x)]   # read by the row phase
    convs = [n for n in _nodes(compiled, x) if n.op.name == "qconv_i8"]
    assert len(convs) == 1 and convs[0].attrs["x_scale"] == np.float32(0.02)
    assert convs[0].attrs["act"] == "relu"
    assert compiled.lower(x).executable.fallbacks == []
    f32 = tilefuse.onnx.load(model, quantize="none")
    assert "qconv_i8" not in [n.op.name for n in _nodes(f32, x)]
    np.testing.assert_allclose(f32(x), want, rtol=1e-4, atol=1e-4 * np.abs(want).max())


def test_qdq_matmul_on_3d_activations() -> None:
    k, n = 96, 80
    w = rng.integers(-127, 128, size=(k, n)).astype(np.int8)
    consts = {"w": w, "ws": np.array(0.003, np.float32), "xs": np.array(0.05, np.float32),
              "xz": np.array(100, np.uint8)}
    nodes = [helper.make_node("QuantizeLinear", ["x", "xs", "xz"], ["xq"]),
             helper.make_node("DequantizeLinear", ["xq", "xs", "xz"], ["xd"]),
             helper.make_node("DequantizeLinear", ["w", "ws"], ["wd"]),
             helper.make_node("MatMul", ["xd", "wd"], ["y"])]
    model = make_model(nodes, [("x", F32, [3, 7, k])], [("y", F32)],
                       initializers=[numpy_helper.from_array(v, n) for n, v in consts.items()],
                       opset=19)
    x = (rng.standard_normal((3, 7, k)) * 3).astype(np.float32)
    compiled = tilefuse.onnx.load(model)
    out = compiled(x)
    assert out.shape == (3, 7, n)
    assert "qconv_i8" in [n.op.name for n in _nodes(compiled, x)]
    np.testing.assert_array_equal(out, tilefuse.onnx.load(model, target="reference")(x))
    want = ReferenceEvaluator(model).run(None, {"x": x})[0]
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())


def test_f32_conv_with_quantize_int8_reads_windows_in_place() -> None:
    cin, cout = 24, 48
    w = (rng.standard_normal((cout, cin, 3, 3)) * 0.1).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1], strides=[2, 1])]
    model = make_model(nodes, [("x", F32, [1, cin, 13, 10])], [("y", F32)],
                       initializers=[numpy_helper.from_array(w, "w")])
    x = rng.standard_normal((1, cin, 13, 10)).astype(np.float32)
    quantized = tilefuse.onnx.load(model, quantize="int8")
    ops = [n.op.name for n in _nodes(quantized, x)]
    assert "qconv_i8" in ops and "window_patches" not in ops and "pad" not in ops
    out = quantized(x)
    np.testing.assert_array_equal(out, tilefuse.onnx.load(model, target="reference",
                                                          quantize="int8")(x))
    assert _cos(out, ReferenceEvaluator(model).run(None, {"x": x})[0]) > 0.999


def test_onnxruntime_quantize_static_cnn_matches_onnxruntime(tmp_path) -> None:
    """A conv-bn-relu stack with a residual add, a pool and a classifier with random weights,
    quantized by onnxruntime (QDQ, random calibration data): tilefuse runs every conv and the
    classifier on qconv_i8 and its logits follow onnxruntime's."""
    import onnxruntime as ort
    import torch
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, quantize_static

    torch.manual_seed(0)

    class Net(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.stem = torch.nn.Conv2d(3, 64, 7, stride=2, padding=3)
            self.bn = torch.nn.BatchNorm2d(64)
            self.c1 = torch.nn.Conv2d(64, 64, 3, padding=1)
            self.c2 = torch.nn.Conv2d(64, 128, 1, stride=2)
            self.fc = torch.nn.Linear(128, 100)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            h = torch.relu(self.bn(self.stem(x)))
            h = torch.relu(h + self.c1(h))
            h = torch.relu(self.c2(h))
            return self.fc(h.mean(dim=(2, 3)))

    net = Net().eval()
    path, qpath = tmp_path / "cnn.onnx", tmp_path / "cnn.qdq.onnx"
    x = rng.standard_normal((1, 3, 32, 32)).astype(np.float32)
    torch.onnx.export(net, (torch.from_numpy(x),), str(path), input_names=["x"],
                      output_names=["y"], opset_version=17, dynamo=False)

    class Reader(CalibrationDataReader):
        def __init__(self) -> None:
            self.left = [{"x": rng.standard_normal((1, 3, 32, 32)).astype(np.float32)}
                         for _ in range(4)]

        def get_next(self) -> dict | None:
            return self.left.pop() if self.left else None

    quantize_static(str(path), str(qpath), Reader(), quant_format=QuantFormat.QDQ)
    compiled = tilefuse.onnx.load(qpath)
    session = ort.InferenceSession(str(qpath), providers=["CPUExecutionProvider"])
    nodes = _nodes(compiled, x)
    ops = [n.op.name for n in nodes]
    assert ops.count("qconv_i8") == 4 and "matmul" not in ops
    fused = [n for n in nodes if n.op.name == "qconv_i8" and n.attrs["epilogue"]]
    assert fused and any(len(n.inputs) > 4 for n in fused)   # a residual operand
    assert compiled.lower(x).executable.fallbacks == []
    reference = tilefuse.onnx.load(qpath, target="reference")
    for _ in range(3):
        x = rng.standard_normal((1, 3, 32, 32)).astype(np.float32)
        got, want = compiled(x), session.run(None, {"x": x})[0]
        np.testing.assert_array_equal(got, reference(x))
        assert _cos(got, want) > 0.995
        assert _cos(got, net(torch.from_numpy(x)).detach().numpy()) > 0.99
