"""ONNX ConvInteger on the int8 convolution kernel ``qconv_i8`` (issue 29; see also
tests/onnx/test_onnx_conv_integer.py): exact against NumPy's int32 sums of the centred
operands, for u8 and i8 activations, constant and run-time zero points (``quantize_dynamic``'s
DynamicQuantizeLinear makes the latter: a correction, :mod:`tilefuse.onnx.conv_integer`),
per-channel weight zero points, pads, strides, a dilation along H, and sums past 2^24. Weights
the int8 kernel cannot hold keep the exact f64 path (logged). The same graphs cross-compile for
cuda with no host step (the cuda target writes ``qconv_i8`` as an integer product) and are
exact there too (simulated)."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnxcheck import make_model

import tilefuse.onnx
from tilefuse.codegen.target import host_target

pytestmark = pytest.mark.skipif(not host_target().has("avx512vnni"),
                                reason="the integer kernels need AVX-512 VNNI")
rng = np.random.default_rng(2929_29)
ONNX_OF = {np.uint8: TensorProto.UINT8, np.int8: TensorProto.INT8}


def reference(x: np.ndarray, w: np.ndarray, xz: int, wz: np.ndarray, pads: list[int],
              strides: list[int], dilations: list[int]) -> np.ndarray:
    """ConvInteger in NumPy int64 sums, then int32: (x - xz) zero padded, by (w - wz); ``pads``
    in ONNX's order (top, left, bottom, right)."""
    xc = x.astype(np.int64) - xz
    wc = w.astype(np.int64) - np.asarray(wz, np.int64).reshape(-1, 1, 1, 1)
    top, left, bottom, right = pads
    xp = np.pad(xc, [(0, 0), (0, 0), (top, bottom), (left, right)])
    n, _, h, wd = xp.shape
    o, _, kh, kw = wc.shape
    oh = (h - dilations[0] * (kh - 1) - 1) // strides[0] + 1
    ow = (wd - dilations[1] * (kw - 1) - 1) // strides[1] + 1
    out = np.zeros((n, o, oh, ow), np.int64)
    for a in range(kh):
        for b in range(kw):
            patch = xp[:, :, a * dilations[0]:a * dilations[0] + strides[0] * (oh - 1) + 1:
                       strides[0], b * dilations[1]:b * dilations[1] + strides[1] * (ow - 1)
                       + 1:strides[1]]
            out += np.einsum("nchw,oc->nohw", patch, wc[:, :, a, b])
    return out.astype(np.int32)


def conv_integer(x_dtype, w: np.ndarray, xz: int | None, wz: np.ndarray | None,
                 x_shape: tuple[int, ...], runtime_zero: bool = False, **attrs):
    inputs = [("x", ONNX_OF[x_dtype], list(x_shape))]
    consts = {"w": w}
    names = ["x", "w", "", ""]
    if xz is not None:
        names[2] = "xz"
        if runtime_zero:
            inputs.append(("xz", ONNX_OF[x_dtype], []))
        else:
            consts["xz"] = np.array(xz, x_dtype)
    if wz is not None:
        names[3] = "wz"
        consts["wz"] = wz
    while names[-1] == "":
        names.pop()
    node = helper.make_node("ConvInteger", names, ["y"], **attrs)
    return make_model([node], inputs, [("y", TensorProto.INT32)], opset=10,
                      initializers=[numpy_helper.from_array(v, n) for n, v in consts.items()])


def _codes(dtype, shape) -> np.ndarray:
    info = np.iinfo(dtype)
    return rng.integers(info.min, info.max + 1, size=shape).astype(dtype)


CASES = [
    # x dtype, cin, cout, k, pads, strides, dilations, x zero, w dtype, w zero (per channel?)
    (np.uint8, 3, 8, 3, [1, 1, 1, 1], [1, 1], [1, 1], 121, np.int8, None),
    (np.uint8, 16, 12, 3, [0, 2, 1, 0], [2, 1], [2, 1], 0, np.uint8, "per-channel"),
    (np.int8, 7, 5, 5, [2, 2, 2, 2], [1, 2], [1, 1], -5, np.int8, "scalar"),
    (np.int8, 9, 6, 1, [0, 0, 0, 0], [2, 2], [1, 1], None, np.int8, None),
]


def _weight(w_dtype, cout, cin, k, wz_kind):
    if w_dtype is np.uint8:     # centred codes within -127..127 around each zero point
        wz = rng.integers(127, 129, size=cout).astype(np.uint8)
        w = (rng.integers(-127, 128, size=(cout, cin, k, k)) + wz.reshape(-1, 1, 1, 1)
             .astype(np.int64)).astype(np.uint8)
        return w, wz
    w = rng.integers(-120, 121, size=(cout, cin, k, k)).astype(np.int8)
    if wz_kind == "scalar":
        return w, np.array(-3, np.int8)
    return w, None


@pytest.mark.parametrize("case", range(len(CASES)))
def test_conv_integer_runs_on_qconv_exactly(case: int) -> None:
    x_dtype, cin, cout, k, pads, strides, dilations, xz, w_dtype, wz_kind = CASES[case]
    w, wz = _weight(w_dtype, cout, cin, k, wz_kind)
    shape = (2, cin, 11, 9)
    attrs = {"pads": pads, "strides": strides, "dilations": dilations}
    model = conv_integer(x_dtype, w, xz, wz, shape, **attrs)
    compiled = tilefuse.onnx.load(model)
    for _ in range(2):
        x = _codes(x_dtype, shape)
        got = compiled(x)
        want = reference(x, w, xz or 0, 0 if wz is None else wz, pads, strides, dilations)
        assert got.dtype == np.int32
        np.testing.assert_array_equal(got, want)
    lowered = compiled.lower(x)
    assert "qconv_i8" in [n.op.name for n in lowered.optimized.nodes]
    assert "conv2d" not in [n.op.name for n in lowered.optimized.nodes]
    assert lowered.executable.fallbacks == []


def test_a_run_time_zero_point_is_a_correction() -> None:
    """x's zero point as an input (DynamicQuantizeLinear's): the sums of the in-bounds taps."""
    w = rng.integers(-127, 128, size=(6, 4, 3, 3)).astype(np.int8)
    shape = (1, 4, 8, 7)
    model = conv_integer(np.uint8, w, 0, None, shape, runtime_zero=True, pads=[1, 0, 1, 2])
    compiled = tilefuse.onnx.load(model)
    for zero in (0, 37, 255):
        x = _codes(np.uint8, shape)
        got = compiled(x, np.array(zero, np.uint8))
        np.testing.assert_array_equal(got, reference(x, w, zero, 0, [1, 0, 1, 2], [1, 1],
                                                     [1, 1]))
    ops = [n.op.name for n in compiled.lower(x, np.array(0, np.uint8)).optimized.nodes]
    assert "qconv_i8" in ops and "conv2d" not in ops, ops


def test_large_sums_are_exact() -> None:
    """|sum| up to 255 · 127 · 9 · 96 > 2^24 (past f32's integers): the raw i32 sums, exact."""
    w = np.where(rng.random((4, 96, 3, 3)) < 0.5, 127, 126).astype(np.int8)
    shape = (1, 96, 5, 5)
    model = conv_integer(np.uint8, w, None, None, shape, pads=[1, 1, 1, 1])
    compiled = tilefuse.onnx.load(model)
    x = np.full(shape, 255, np.uint8)
    x[0, :, 2, 2] = rng.integers(0, 256, size=96)
    got = compiled(x)
    want = reference(x, w, 0, 0, [1, 1, 1, 1], [1, 1], [1, 1])
    assert np.abs(want.astype(np.int64)).max() > 2 ** 24
    np.testing.assert_array_equal(got, want)
    ops = [n.op.name for n in compiled.lower(x).optimized.nodes]
    assert ops.count("qconv_i8") == 1, ops


def test_weights_outside_the_int8_codes_keep_the_f64_path(caplog) -> None:
    w = rng.integers(0, 256, size=(4, 3, 3, 3)).astype(np.uint8)
    model = conv_integer(np.uint8, w, 100, np.array(110, np.uint8), (1, 3, 6, 6))
    with caplog.at_level("INFO"):
        compiled = tilefuse.onnx.load(model)
        x = _codes(np.uint8, (1, 3, 6, 6))
        got = compiled(x)
    assert "stays on the exact f64 path" in caplog.text
    np.testing.assert_array_equal(got, reference(x, w, 100, 110, [0, 0, 0, 0], [1, 1], [1, 1]))


@pytest.mark.parametrize("case", [0, 2])
def test_conv_integer_cross_compiles_for_cuda_exactly(case: int) -> None:
    from tilefuse.runtime.gpu_cross import cross_compile
    from tilefuse.runtime.gpu_simulate import simulate

    x_dtype, cin, cout, k, pads, strides, dilations, xz, w_dtype, wz_kind = CASES[case]
    w, wz = _weight(w_dtype, cout, cin, k, wz_kind)
    shape = (1, cin, 7, 6)
    model = conv_integer(x_dtype, w, xz, wz, shape, pads=pads, strides=strides,
                         dilations=dilations)
    x = _codes(x_dtype, shape)
    graph = tilefuse.onnx.load(model).lower(x).captured
    assert "qconv_i8" in [n.op.name for n in graph.nodes]
    built = cross_compile(graph)
    assert not built.host_steps, [s.reason for s in built.host_steps]
    (got,) = simulate(built.program, [x])
    np.testing.assert_array_equal(got, reference(x, w, xz or 0, 0 if wz is None else wz, pads,
                                                 strides, dilations))


def test_dynamic_quantize_and_matmul_integer_cross_compile_for_cuda_exactly() -> None:
    """quantize_dynamic's MatMul: DynamicQuantizeLinear (``dynamic_quantize_u8`` at this size)
    then MatMulInteger with a constant i8 weight (``matmul_u8s8``) and the f32 rescale: on the
    CPU's VNNI kernels, written as tilefuse ops for cuda (no host step) with the same result."""
    from tilefuse.runtime.gpu_cross import cross_compile
    from tilefuse.runtime.gpu_simulate import simulate

    w = rng.integers(-127, 128, size=(256, 24)).astype(np.int8)
    nodes = [helper.make_node("DynamicQuantizeLinear", ["x"], ["xq", "xs", "xz"]),
             helper.make_node("MatMulInteger", ["xq", "w", "xz"], ["acc"]),
             helper.make_node("Cast", ["acc"], ["accf"], to=TensorProto.FLOAT),
             helper.make_node("Mul", ["accf", "xs"], ["y"])]
    model = make_model(nodes, [("x", TensorProto.FLOAT, [16, 256])],
                       [("y", TensorProto.FLOAT), ("xq", TensorProto.UINT8)], opset=13,
                       initializers=[numpy_helper.from_array(w, "w")])
    x = rng.standard_normal((16, 256)).astype(np.float32)
    compiled = tilefuse.onnx.load(model)
    graph = compiled.lower(x).captured
    ops = {n.op.name for n in graph.nodes}
    assert {"dynamic_quantize_u8", "matmul_u8s8"} <= ops, ops
    cpu = compiled(x)
    built = cross_compile(graph)
    assert not built.host_steps, [s.reason for s in built.host_steps]
    device = simulate(built.program, [x])
    xq = cpu[1]
    np.testing.assert_array_equal(device[1], xq)
    np.testing.assert_array_equal(device[0], cpu[0])
    # the CPU pipeline's graph: the rescale fused into matmul_u8s8's epilogue
    fused = compiled.lower(x).optimized
    assert any(n.op.name == "matmul_u8s8" and n.attrs["epilogue"] for n in fused.nodes)
    built = cross_compile(fused)
    assert not built.host_steps, [s.reason for s in built.host_steps]
    np.testing.assert_array_equal(simulate(built.program, [x])[0], cpu[0])


def test_onnxruntime_quantize_dynamic_cnn(tmp_path) -> None:
    """onnxruntime's ``quantize_dynamic`` of a small CNN: ConvInteger after DynamicQuantizeLinear
    (a run-time zero point) runs on ``qconv_i8``; the output equals onnxruntime's and the
    reference's bit for bit, and the graph cross-compiles for cuda with no host step and the
    same output (simulated)."""
    torch = pytest.importorskip("torch")
    ort = pytest.importorskip("onnxruntime")
    from onnxruntime.quantization import QuantType, quantize_dynamic

    from tilefuse.runtime.gpu_cross import cross_compile
    from tilefuse.runtime.gpu_simulate import simulate

    torch.manual_seed(0)
    # the whole-tensor min/max of the second DynamicQuantizeLinear fuses the first conv's
    # NCHW dequantize: as an unrolled register row that was 30 s of NVPTX emission
    # (kernel/lower_gpu.py's REGISTER_ROW_DIVISIONS)
    net = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.ReLU(),
                              torch.nn.Conv2d(8, 4, 3, stride=2, padding=1), torch.nn.Flatten(),
                              torch.nn.Linear(4 * 4 * 4, 10)).eval()
    x = torch.randn(2, 3, 8, 8)
    path, qpath = tmp_path / "cnn.onnx", tmp_path / "cnn.int8.onnx"
    torch.onnx.export(net, (x,), str(path), input_names=["x"], output_names=["y"],
                      opset_version=17, dynamo=False)
    quantize_dynamic(str(path), str(qpath), weight_type=QuantType.QUInt8)
    compiled = tilefuse.onnx.load(str(qpath))
    xs = x.numpy()
    out = compiled(xs)
    lowered = compiled.lower(xs)
    assert "qconv_i8" in [n.op.name for n in lowered.optimized.nodes]
    assert lowered.executable.fallbacks == []
    want = ort.InferenceSession(str(qpath), providers=["CPUExecutionProvider"]).run(
        None, {"x": xs})[0]
    np.testing.assert_array_equal(out, want)
    np.testing.assert_array_equal(out, tilefuse.onnx.load(str(qpath), target="reference")(xs))
    built = cross_compile(lowered.captured)
    assert not built.host_steps, [s.reason for s in built.host_steps]
    np.testing.assert_array_equal(simulate(built.program, [xs])[0], out)
