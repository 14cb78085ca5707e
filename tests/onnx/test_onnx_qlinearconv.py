"""ONNX QLinearConv on the integer kernels: the converter writes it as DequantizeLinear ->
Conv -> QuantizeLinear, which the "qdq" pipeline (the default of models holding QLinearConv)
maps onto ``qconv_i8`` with the requantize fused. The codes agree with onnxruntime's
QLinearConv within one quantization step (tilefuse rescales in f32 as acc · x_scale · w_scale
+ bias, then / y_scale; onnxruntime multiplies once by x_scale · w_scale / y_scale), and
exactly with tilefuse's reference interpreter. Grouped convolutions and asymmetric weights
stay on the exact f64 path (logged). onnxruntime has no QLinearConv with u8 x and i8 y."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnxcheck import F32, make_model

import tilefuse.onnx
from tilefuse.codegen.target import host_target

pytestmark = pytest.mark.skipif(not host_target().has("avx512vnni"),
                                reason="the integer kernels need AVX-512 VNNI")
rng = np.random.default_rng(2929)


def _model(cin: int, cout: int, k: int, stride: int, pad: int, x_type: int, y_type: int,
           per_channel: bool, group: int = 1, quantize_input: bool = True,
           w_zero: int = 0, hw: tuple[int, int] = (13, 9), w_min: int = -127) -> tuple:
    np_of = {TensorProto.UINT8: np.uint8, TensorProto.INT8: np.int8}
    x_np, y_np = np_of[x_type], np_of[y_type]
    w = rng.integers(w_min, 128, size=(cout, cin // group, k, k)).astype(np.int8)
    ws = (rng.uniform(0.002, 0.01, size=cout) if per_channel
          else np.array([0.004])).astype(np.float32)
    xz = 121 if x_np is np.uint8 else -5
    yz = 130 if y_np is np.uint8 else 3
    consts = {"xs": np.array(0.02, np.float32), "xz": np.array(xz, x_np), "w": w, "ws": ws,
              "wz": np.full(ws.shape, w_zero, np.int8), "ys": np.array(0.35, np.float32),
              "yz": np.array(yz, y_np),
              "b": rng.integers(-4000, 4000, size=cout).astype(np.int32)}
    first = "xq" if quantize_input else "x"
    nodes = [helper.make_node("QLinearConv", [first, "xs", "xz", "w", "ws", "wz", "ys", "yz",
                                              "b"], ["y"], pads=[pad] * 4,
                              strides=[stride, stride], group=group)]
    shape = [2, cin, *hw]
    if quantize_input:
        nodes.insert(0, helper.make_node("QuantizeLinear", ["x", "xs", "xz"], ["xq"]))
        inputs = [("x", F32, shape)]
    else:
        inputs = [("x", x_type, shape)]
    model = make_model(nodes, inputs, [("y", y_type)],
                       initializers=[numpy_helper.from_array(v, n) for n, v in consts.items()],
                       opset=13)
    if quantize_input:
        x = (rng.standard_normal(shape) * 1.5).astype(np.float32)
    else:
        info = np.iinfo(x_np)
        x = rng.integers(info.min, info.max + 1, size=shape).astype(x_np)
    return model, x


def _ort(model, x: np.ndarray) -> np.ndarray:
    import onnxruntime as ort
    session = ort.InferenceSession(model.SerializeToString(),
                                   providers=["CPUExecutionProvider"])
    return session.run(None, {"x": x})[0]


def _ops(model: tilefuse.onnx.OnnxModel, x: np.ndarray) -> list[str]:
    return [n.op.name for n in model.lower(x).optimized.nodes]


def _within_one_step(out: np.ndarray, want: np.ndarray) -> None:
    assert out.dtype == want.dtype and out.shape == want.shape
    diff = np.abs(out.astype(np.int32) - want.astype(np.int32))
    assert diff.max() <= 1, diff.max()
    assert (diff == 0).mean() > 0.95       # off by one only on rounding ties


@pytest.mark.parametrize("cin,cout,k,stride,pad,x_type,y_type,per_channel", [
    (32, 64, 3, 1, 1, TensorProto.UINT8, TensorProto.UINT8, False),
    (19, 70, 3, 2, 1, TensorProto.INT8, TensorProto.INT8, True),
    (64, 96, 1, 2, 0, TensorProto.UINT8, TensorProto.UINT8, True),
    (3, 64, 7, 2, 3, TensorProto.UINT8, TensorProto.UINT8, False),
    (40, 48, 5, 3, 2, TensorProto.INT8, TensorProto.INT8, True),
])
def test_qlinearconv_runs_on_qconv_and_matches_onnxruntime(
        cin: int, cout: int, k: int, stride: int, pad: int, x_type: int, y_type: int,
        per_channel: bool) -> None:
    model, x = _model(cin, cout, k, stride, pad, x_type, y_type, per_channel)
    compiled = tilefuse.onnx.load(model)
    out = compiled(x)
    _within_one_step(out, _ort(model, x))
    np.testing.assert_array_equal(out, tilefuse.onnx.load(model, target="reference")(x))
    ops = _ops(compiled, x)
    assert ops.count("qconv_i8") == 1 and "conv2d" not in ops, ops
    assert compiled.lower(x).executable.fallbacks == []
    x2 = (x * 20).astype(np.float32)   # saturating codes at both ends
    _within_one_step(compiled(x2), _ort(model, x2))


def test_qlinearconv_on_integer_input_is_correct() -> None:
    """A u8 graph input (no QuantizeLinear to read through) runs the QDQ form in f32."""
    model, x = _model(16, 32, 3, 1, 1, TensorProto.UINT8, TensorProto.UINT8, True,
                      quantize_input=False)
    _within_one_step(tilefuse.onnx.load(model)(x), _ort(model, x))


@pytest.mark.parametrize("group,w_zero,w_min", [(2, 0, -127), (1, 3, -127), (1, 0, -128)])
def test_grouped_or_asymmetric_qlinearconv_keeps_the_f64_path(group: int, w_zero: int,
                                                               w_min: int, caplog) -> None:
    model, x = _model(16, 32, 3, 1, 1, TensorProto.UINT8, TensorProto.UINT8, True,
                      group=group, w_zero=w_zero, w_min=w_min)
    with caplog.at_level("INFO"):
        compiled = tilefuse.onnx.load(model)
        out = compiled(x)
    assert "stays on the exact f64 path" in caplog.text
    assert "qconv_i8" not in _ops(compiled, x)
    _within_one_step(out, _ort(model, x))   # exact sums, f32 rescale: ties may differ


def test_qlinearconv_chain_reads_the_previous_conv_codes() -> None:
    """Two QLinearConvs: the second reads the first's requantized output through its
    QuantizeLinear, so both run on qconv_i8."""
    cin, mid, cout = 24, 64, 96
    w1 = rng.integers(-127, 128, size=(mid, cin, 3, 3)).astype(np.int8)
    w2 = rng.integers(-127, 128, size=(cout, mid, 1, 1)).astype(np.int8)
    consts = {"xs": np.array(0.02, np.float32), "xz": np.array(128, np.uint8),
              "w1": w1, "w1s": np.array(0.003, np.float32), "w1z": np.array(0, np.int8),
              "ms": np.array(0.3, np.float32), "mz": np.array(0, np.uint8),
              "w2": w2, "w2s": rng.uniform(0.002, 0.01, cout).astype(np.float32),
              "w2z": np.zeros(cout, np.int8),
              "ys": np.array(0.5, np.float32), "yz": np.array(100, np.uint8)}
    nodes = [helper.make_node("QuantizeLinear", ["x", "xs", "xz"], ["xq"]),
             helper.make_node("QLinearConv", ["xq", "xs", "xz", "w1", "w1s", "w1z", "ms",
                                              "mz"], ["m"], pads=[1] * 4),
             helper.make_node("QLinearConv", ["m", "ms", "mz", "w2", "w2s", "w2z", "ys",
                                              "yz"], ["y"], strides=[2, 2]),
             helper.make_node("DequantizeLinear", ["y", "ys", "yz"], ["out"])]
    model = make_model(nodes, [("x", F32, [1, cin, 15, 11])], [("out", F32)],
                       initializers=[numpy_helper.from_array(v, n) for n, v in consts.items()],
                       opset=13)
    x = (rng.standard_normal((1, cin, 15, 11)) * 2).astype(np.float32)
    compiled = tilefuse.onnx.load(model)
    out, want = compiled(x), _ort(model, x)
    assert np.abs(out - want).max() <= 2 * 0.5 + 1e-6    # one step here, one carried
    assert np.mean(out == want) > 0.9
    assert _ops(compiled, x).count("qconv_i8") == 2
