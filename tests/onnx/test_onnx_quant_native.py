"""Quantized ONNX graphs on the integer kernels: DynamicQuantizeLinear, MatMulInteger and
QLinearMatMul with constant i8 weights become ``dynamic_quantize_u8`` / ``matmul_u8s8`` (VNNI)
and run natively, equal to onnx's reference evaluator (the spec) and bit for bit to tilefuse's
own reference interpreter; a model quantized by onnxruntime's ``quantize_dynamic`` runs with no
host step."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator
from onnxcheck import F32, make_model

import tilefuse.onnx
from tilefuse.codegen.target import host_target

pytestmark = pytest.mark.skipif(not host_target().has("avx512vnni"),
                                reason="the integer kernels need AVX-512 VNNI")
rng = np.random.default_rng(2929)


def _ops(model: tilefuse.onnx.OnnxModel, *args: np.ndarray) -> list[str]:
    return [n.op.name for n in model.lower(*args).optimized.nodes]


def _dynamic_model(k: int, n: int) -> tuple[onnx.ModelProto, np.ndarray]:
    w = rng.integers(-127, 128, size=(k, n)).astype(np.int8)
    scale = (rng.uniform(0.001, 0.01, size=n)).astype(np.float32)
    nodes = [helper.make_node("DynamicQuantizeLinear", ["x"], ["xq", "xs", "xz"]),
             helper.make_node("MatMulInteger", ["xq", "w", "xz"], ["acc"]),
             helper.make_node("Cast", ["acc"], ["accf"], to=TensorProto.FLOAT),
             helper.make_node("Mul", ["xs", "ws"], ["s"]),
             helper.make_node("Mul", ["accf", "s"], ["y"])]
    model = make_model(nodes, [("x", F32, [8, 9, k])], [("y", F32)],
                       initializers=[numpy_helper.from_array(w, "w"),
                                     numpy_helper.from_array(scale, "ws")])
    return model, w


@pytest.mark.parametrize("k,n", [(256, 70), (100, 130)])
def test_dynamic_quantize_and_matmul_integer_run_natively(k: int, n: int) -> None:
    model, _ = _dynamic_model(k, n)
    compiled = tilefuse.onnx.load(model)
    reference = tilefuse.onnx.load(model, target="reference")
    spec = ReferenceEvaluator(model)
    for scale in (1.0, 40.0):
        x = (rng.standard_normal((8, 9, k)) * scale).astype(np.float32)
        out = compiled(x)
        np.testing.assert_array_equal(out, reference(x))
        np.testing.assert_allclose(out, spec.run(None, {"x": x})[0], rtol=1e-6, atol=1e-6)
    ops = _ops(compiled, x)
    assert "dynamic_quantize_u8" in ops and "matmul_u8s8" in ops
    assert compiled.lower(x).executable.fallbacks == []


def test_qlinear_matmul_runs_on_the_integer_kernel() -> None:
    k, n = 128, 96
    w = rng.integers(-127, 128, size=(k, n)).astype(np.int8)
    node = helper.make_node("QLinearMatMul", ["a", "as", "az", "w", "ws", "wz", "ys", "yz"],
                            ["y"])
    inits = [numpy_helper.from_array(v, name) for name, v in (
        ("as", np.array(0.02, np.float32)), ("az", np.array(131, np.uint8)), ("w", w),
        ("ws", np.array(0.003, np.float32)), ("wz", np.array(0, np.int8)),
        ("ys", np.array(0.5, np.float32)), ("yz", np.array(120, np.uint8)))]
    model = make_model([node], [("a", TensorProto.UINT8, [7, k])], [("y", TensorProto.UINT8)],
                       initializers=inits)
    a = rng.integers(0, 256, size=(7, k)).astype(np.uint8)
    compiled = tilefuse.onnx.load(model)
    assert "matmul_u8s8" in _ops(compiled, a)
    np.testing.assert_array_equal(compiled(a), ReferenceEvaluator(model).run(None, {"a": a})[0])


def test_small_or_odd_products_keep_the_plain_path() -> None:
    k, n = 16, 8   # 128 weights: not worth the kernel
    w = rng.integers(-127, 128, size=(k, n)).astype(np.int8)
    node = helper.make_node("MatMulInteger", ["a", "w"], ["y"])
    model = make_model([node], [("a", TensorProto.UINT8, [3, k])], [("y", TensorProto.INT32)],
                       initializers=[numpy_helper.from_array(w, "w")])
    a = rng.integers(0, 256, size=(3, k)).astype(np.uint8)
    compiled = tilefuse.onnx.load(model)
    assert "matmul_u8s8" not in _ops(compiled, a)
    np.testing.assert_array_equal(compiled(a), a.astype(np.int32) @ w.astype(np.int32))


def test_onnxruntime_quantize_dynamic_file(tmp_path) -> None:
    torch = pytest.importorskip("torch")
    from onnxruntime.quantization import QuantType, quantize_dynamic

    net = torch.nn.Sequential(torch.nn.Linear(96, 192), torch.nn.ReLU(),
                              torch.nn.Linear(192, 64)).eval()
    x = torch.randn(5, 96)
    path, qpath = tmp_path / "mlp.onnx", tmp_path / "mlp.int8.onnx"
    torch.onnx.export(net, (x,), str(path), input_names=["x"], output_names=["y"],
                      opset_version=17, dynamo=False)
    quantize_dynamic(str(path), str(qpath), weight_type=QuantType.QInt8)
    compiled = tilefuse.onnx.load(str(qpath))
    xs = x.numpy()
    out = compiled(xs)
    assert compiled.lower(xs).executable.fallbacks == []
    assert _ops(compiled, xs).count("matmul_u8s8") == 2
    fused = [n for n in compiled.lower(xs).optimized.nodes if n.op.name == "matmul_u8s8"]
    assert all(n.attrs["epilogue"] and n.outputs[0].dtype.name == "f32" for n in fused)
    np.testing.assert_array_equal(out, tilefuse.onnx.load(str(qpath), target="reference")(xs))
    spec = ReferenceEvaluator(str(qpath)).run(None, {"x": xs})[0]
    np.testing.assert_allclose(out, spec, rtol=1e-5, atol=1e-5)
    with torch.no_grad():
        f32 = net(x).numpy()
    cos = float((out * f32).sum() / np.linalg.norm(out) / np.linalg.norm(f32))
    assert cos > 0.999


def test_quantize_dynamic_file_with_gelu_fuses_it(tmp_path) -> None:
    """torch's exported GELU (div, erf, add, mul by x, mul by 0.5) after a MatMulInteger's
    rescale and bias goes into matmul_u8s8's epilogue (the generated erf: to f32 rounding)."""
    torch = pytest.importorskip("torch")
    from onnxruntime.quantization import QuantType, quantize_dynamic

    net = torch.nn.Sequential(torch.nn.Linear(96, 200), torch.nn.GELU(),
                              torch.nn.Linear(200, 64)).eval()
    x = torch.randn(7, 96)
    path, qpath = tmp_path / "mlp.onnx", tmp_path / "mlp.int8.onnx"
    torch.onnx.export(net, (x,), str(path), input_names=["x"], output_names=["y"],
                      opset_version=17, dynamo=False)
    quantize_dynamic(str(path), str(qpath), weight_type=QuantType.QInt8)
    compiled = tilefuse.onnx.load(str(qpath))
    xs = x.numpy()
    out = compiled(xs)
    ops = _ops(compiled, xs)
    assert "erf" not in ops and ops.count("matmul_u8s8") == 2, ops
    fused = [n for n in compiled.lower(xs).optimized.nodes if n.op.name == "matmul_u8s8"]
    assert ("gelu",) in fused[0].attrs["epilogue"]
    ref = tilefuse.onnx.load(str(qpath), target="reference")(xs)
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-6)
    spec = ReferenceEvaluator(str(qpath)).run(None, {"x": xs})[0]
    np.testing.assert_allclose(out, spec, rtol=1e-5, atol=1e-5)
    own = tilefuse.onnx.load(str(path), quantize="int8")   # the f32 file: qmatmul_i8's act
    nodes = own.lower(xs).optimized.nodes
    assert [n.attrs["act"] for n in nodes if n.op.name == "qmatmul_i8"] == ["gelu", "none"]
    assert "erf" not in [n.op.name for n in nodes]


def _nbits_model(k: int, n: int, block: int, with_zero: bool, with_bias: bool, m: int = 3
                 ) -> tuple[onnx.ModelProto, np.ndarray]:
    """A com.microsoft MatMulNBits model and the f32 weight [K, N] it stands for."""
    blocks = -(-k // block)
    codes = rng.integers(0, 16, size=(n, blocks * block)).astype(np.uint8)
    packed = (codes[:, 0::2] | (codes[:, 1::2] << 4)).reshape(n, blocks, block // 2)
    scales = rng.uniform(0.01, 0.1, size=(n, blocks)).astype(np.float32)
    zeros = rng.integers(0, 16, size=(n, blocks)).astype(np.uint8) if with_zero else \
        np.full((n, blocks), 8, np.uint8)
    per_col = (blocks + 1) // 2
    zpad = np.zeros((n, 2 * per_col), np.uint8)
    zpad[:, :blocks] = zeros
    zpacked = (zpad[:, 0::2] | (zpad[:, 1::2] << 4)).reshape(-1)
    w = ((codes.astype(np.float32) - np.repeat(zeros, block, axis=1)) *
         np.repeat(scales, block, axis=1))[:, :k].T
    bias = rng.standard_normal(n).astype(np.float32)
    names = ["a", "b", "s", "z" if with_zero else "", "", "bias" if with_bias else ""]
    while names and not names[-1]:
        names.pop()
    node = helper.make_node("MatMulNBits", names, ["y"], domain="com.microsoft", K=k, N=n,
                            bits=4, block_size=block)
    inits = [numpy_helper.from_array(packed, "b"), numpy_helper.from_array(scales.reshape(-1), "s")]
    if with_zero:
        inits.append(numpy_helper.from_array(zpacked, "z"))
    if with_bias:
        inits.append(numpy_helper.from_array(bias, "bias"))
        w_bias = bias
    else:
        w_bias = np.zeros(n, np.float32)
    graph = helper.make_graph([node], "nbits",
                              [helper.make_tensor_value_info("a", F32, [m, k])],
                              [helper.make_tensor_value_info("y", F32, [m, n])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                    helper.make_opsetid("com.microsoft", 1)])
    model.ir_version = 8
    return model, (w, w_bias)


@pytest.mark.parametrize("k,n,block,zero,bias", [(256, 70, 32, False, False),
                                                  (384, 96, 128, True, True),
                                                  (80, 40, 16, True, False)])
def test_matmul_nbits(k: int, n: int, block: int, zero: bool, bias: bool) -> None:
    import onnxruntime as ort

    model, (w, b) = _nbits_model(k, n, block, zero, bias)
    a = rng.standard_normal((3, k)).astype(np.float32)
    compiled = tilefuse.onnx.load(model)
    out = compiled(a)
    np.testing.assert_allclose(out, a @ w + b, rtol=1e-4, atol=1e-4)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    np.testing.assert_allclose(out, session.run(None, {"a": a})[0], rtol=1e-3, atol=1e-3)
    native = block in (32, 64, 128)
    assert ("matmul_w4" in _ops(compiled, a)) == native
    assert compiled.lower(a).executable.fallbacks == []


def test_qdq_convolution_folds_its_weight_and_runs_natively() -> None:
    """QuantizeLinear -> DequantizeLinear of a constant f32 weight (onnxruntime's QDQ format)
    is computed at import at any size, so the convolution gets a constant weight: lowered to
    the matmul kernel, and to the int8 kernel with quantize="int8"."""
    cin, cout = 32, 64
    w = (rng.standard_normal((cout, cin, 3, 3)) * 0.1).astype(np.float32)
    consts = {"w": w, "ws": np.array(0.004, np.float32), "wz": np.array(0, np.int8),
              "xs": np.array(0.02, np.float32), "xz": np.array(128, np.uint8)}
    nodes = [helper.make_node("QuantizeLinear", ["x", "xs", "xz"], ["xq"]),
             helper.make_node("DequantizeLinear", ["xq", "xs", "xz"], ["xd"]),
             helper.make_node("QuantizeLinear", ["w", "ws", "wz"], ["wq"]),
             helper.make_node("DequantizeLinear", ["wq", "ws", "wz"], ["wd"]),
             helper.make_node("Conv", ["xd", "wd"], ["y"], pads=[1, 1, 1, 1])]
    model = make_model(nodes, [("x", F32, [1, cin, 10, 10])], [("y", F32)],
                       initializers=[numpy_helper.from_array(v, k) for k, v in consts.items()],
                       opset=19)
    x = rng.standard_normal((1, cin, 10, 10)).astype(np.float32)
    spec = ReferenceEvaluator(model).run(None, {"x": x})[0]
    compiled = tilefuse.onnx.load(model)
    np.testing.assert_allclose(compiled(x), spec, rtol=1e-4, atol=1e-4)
    assert "conv2d" not in _ops(compiled, x)
    assert compiled.lower(x).executable.fallbacks == []
    quantized = tilefuse.onnx.load(model, quantize="int8")
    assert "qconv_i8" in _ops(quantized, x)
    got = quantized(x)
    cos = float((got * spec).sum() / np.linalg.norm(got) / np.linalg.norm(spec))
    assert cos > 0.999
