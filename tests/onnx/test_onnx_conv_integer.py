"""ONNX ConvInteger on the integer kernel: a 2-D ConvInteger with a constant weight whose
centred codes ``w - w_zero`` fit i8 runs on ``qconv_i8``'s raw i32 sums (the input's codes read
in place from NHWC, padding at x's zero point), checked bit for bit against NumPy's int64 sums
of the centred operands at odd sizes (channels, outputs and pixels off the 4 / 64 / 6 tiles),
u8 and i8 inputs, scalar and per-channel weight zero points, strides, pads and a row
dilation. The f64 path keeps what the kernel cannot take (tested in test_onnx_quant.py)."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnxcheck import make_model

import tilefuse.onnx
from tilefuse.codegen.target import host_target

pytestmark = pytest.mark.skipif(not host_target().has("avx512vnni"),
                                reason="the integer kernels need AVX-512 VNNI")
rng = np.random.default_rng(2930)


def _reference(x: np.ndarray, xz: int, w: np.ndarray, wz: np.ndarray, pads: tuple,
               strides: tuple, dilations: tuple) -> np.ndarray:
    """The ONNX definition in int64: (x - xz) padded with zeros, by (w - wz)."""
    xc = x.astype(np.int64) - xz
    wc = w.astype(np.int64) - wz.astype(np.int64).reshape(-1, 1, 1, 1)
    top, left, bottom, right = pads
    xc = np.pad(xc, [(0, 0), (0, 0), (top, bottom), (left, right)])
    n, _, h, wd = xc.shape
    o, _, kh, kw = wc.shape
    oh = (h - dilations[0] * (kh - 1) - 1) // strides[0] + 1
    ow = (wd - dilations[1] * (kw - 1) - 1) // strides[1] + 1
    out = np.zeros((n, o, oh, ow), np.int64)
    for i in range(kh):
        for j in range(kw):
            hs, ws = i * dilations[0], j * dilations[1]
            patch = xc[:, :, hs:hs + strides[0] * oh:strides[0], ws:ws + strides[1] * ow:strides[1]]
            out += np.einsum("nchw,oc->nohw", patch, wc[:, :, i, j])
    return out


def _case(x_type: int, w_type: int, cin: int, cout: int, k: tuple, hw: tuple, pads: tuple,
          strides: tuple, dilations: tuple, per_channel: bool) -> tuple:
    np_of = {TensorProto.UINT8: np.uint8, TensorProto.INT8: np.int8}
    x_np, w_np = np_of[x_type], np_of[w_type]
    xi = np.iinfo(x_np)
    x = rng.integers(xi.min, xi.max + 1, size=(2, cin, *hw)).astype(x_np)
    xz = np.array(117 if x_np is np.uint8 else -9, x_np)
    if w_np is np.int8:
        w = rng.integers(-128, 128, size=(cout, cin, *k)).astype(np.int8)
        wz = np.zeros(cout if per_channel else 1, np.int8)
    else:   # u8 weights around a zero point: w - wz within i8
        wz = (rng.integers(100, 150, size=cout) if per_channel else np.array([128])
              ).astype(np.uint8)
        w = (wz.astype(np.int32).reshape(-1, 1, 1, 1) +
             rng.integers(-100, 100, size=(cout, cin, *k))).astype(np.uint8)
    wz_arr = wz if per_channel else wz.reshape(())
    node = helper.make_node("ConvInteger", ["x", "w", "xz", "wz"], ["y"],
                            pads=[pads[0], pads[1], pads[2], pads[3]], strides=list(strides),
                            dilations=list(dilations))
    inits = [numpy_helper.from_array(v, n) for n, v in (("w", w), ("xz", xz), ("wz", wz_arr))]
    model = make_model([node], [("x", x_type, list(x.shape))], [("y", TensorProto.INT32)],
                       initializers=inits, opset=10)
    want = _reference(x, int(xz), w, wz.reshape(-1) if per_channel else np.full(cout, wz[0]),
                      pads, strides, dilations)
    return model, x, want


@pytest.mark.parametrize("x_type,w_type,cin,cout,k,hw,pads,strides,dilations,per_channel", [
    (TensorProto.UINT8, TensorProto.INT8, 3, 5, (3, 2), (7, 6), (0, 0, 0, 0), (1, 2), (1, 1),
     False),
    (TensorProto.UINT8, TensorProto.INT8, 19, 70, (3, 3), (13, 9), (1, 2, 1, 0), (2, 1),
     (1, 1), True),
    (TensorProto.INT8, TensorProto.INT8, 33, 67, (1, 1), (5, 11), (0, 0, 0, 0), (1, 1),
     (1, 1), False),
    (TensorProto.UINT8, TensorProto.UINT8, 24, 129, (3, 3), (9, 10), (1, 1, 1, 1), (1, 1),
     (2, 1), True),
    (TensorProto.INT8, TensorProto.UINT8, 7, 64, (5, 5), (12, 12), (2, 2, 2, 2), (2, 2),
     (1, 1), False),
])
def test_conv_integer_on_qconv_is_exact(x_type: int, w_type: int, cin: int, cout: int,
                                        k: tuple, hw: tuple, pads: tuple, strides: tuple,
                                        dilations: tuple, per_channel: bool) -> None:
    model, x, want = _case(x_type, w_type, cin, cout, k, hw, pads, strides, dilations,
                           per_channel)
    compiled = tilefuse.onnx.load(model)
    out = compiled(x)
    plan = compiled.lower(x)
    ops = [n.op.name for n in plan.optimized.nodes]
    assert ops.count("qconv_i8") == 1 and "conv2d" not in ops, ops
    assert not plan.executable.fallbacks
    assert out.dtype == np.int32 and out.shape == want.shape
    np.testing.assert_array_equal(out, want)


def test_conv_integer_without_a_fitting_weight_stays_exact_in_f64() -> None:
    """u8 weights whose centred codes leave i8 (w - w_zero up to 255): the f64 path, exact."""
    x = rng.integers(0, 256, size=(1, 4, 6, 5)).astype(np.uint8)
    w = rng.integers(0, 256, size=(3, 4, 3, 3)).astype(np.uint8)
    w[0, 0, 0, 0], w[1, 0, 0, 0] = 0, 255
    node = helper.make_node("ConvInteger", ["x", "w", "xz", "wz"], ["y"], pads=[1, 1, 1, 1])
    inits = [numpy_helper.from_array(v, n) for n, v in
             (("w", w), ("xz", np.array(3, np.uint8)), ("wz", np.array(0, np.uint8)))]
    model = make_model([node], [("x", TensorProto.UINT8, list(x.shape))],
                       [("y", TensorProto.INT32)], initializers=inits, opset=10)
    compiled = tilefuse.onnx.load(model)
    ops = [n.op.name for n in compiled.lower(x).optimized.nodes]
    assert "qconv_i8" not in ops
    want = _reference(x, 3, w, np.zeros(3, np.uint8), (1, 1, 1, 1), (1, 1), (1, 1))
    np.testing.assert_array_equal(compiled(x), want)
