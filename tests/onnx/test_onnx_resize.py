"""Resize against onnx's reference implementation (what the backend test data holds) on fresh
random inputs at odd sizes: each mode with each coordinate transformation, up- and downsampling
by scales and by sizes, axes, antialias, exclude_outside, tf_crop_and_resize's extrapolation;
Upsample against onnxruntime; named errors. (onnxruntime differs from the reference where
scale · size is fractional: see tilefuse/onnx/converters_resize.py.)"""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper
from onnx.reference import ReferenceEvaluator
from onnxcheck import F32, arr, compare, init, make_model

import tilefuse.onnx
from tilefuse.onnx.tensors import OnnxError
from tilefuse.testing import assert_close

COORDINATES = ["half_pixel", "half_pixel_symmetric", "pytorch_half_pixel", "align_corners",
               "asymmetric"]


def _model(x_shape: list[int], *, scales=None, sizes=None, roi=None, opset: int = 19, **attrs):
    consts = {"roi": np.asarray(roi if roi is not None else [], np.float32),
              "scales": np.asarray(scales if scales is not None else [], np.float32)}
    names = ["x", "roi", "scales"]
    if sizes is not None:
        consts["sizes"] = np.asarray(sizes, np.int64)
        names.append("sizes")
    node = helper.make_node("Resize", names, ["y"], **attrs)
    return make_model([node], [("x", F32, x_shape)], [("y", F32)],
                      initializers=[init(k, v) for k, v in consts.items()], opset=opset)


def check(model, x: np.ndarray) -> None:
    expected = ReferenceEvaluator(model).run(None, {"x": x})[0]
    assert_close(tilefuse.onnx.load(model)(x), expected, reduction=True)


@pytest.mark.parametrize("mode", ["nearest", "linear", "cubic"])
@pytest.mark.parametrize("coordinates", COORDINATES)
@pytest.mark.parametrize("scales", [[1, 1, 2.0, 1.5], [1, 1, 0.6, 0.5]])
def test_modes_and_coordinates_by_scales(mode: str, coordinates: str, scales) -> None:
    model = _model([2, 3, 7, 10], scales=scales, mode=mode,
                   coordinate_transformation_mode=coordinates)
    check(model, arr([2, 3, 7, 10]))


@pytest.mark.parametrize(("mode", "nearest_mode"), [
    ("nearest", "round_prefer_ceil"), ("nearest", "floor"), ("nearest", "ceil"),
    ("linear", None), ("cubic", None)])
@pytest.mark.parametrize("sizes", [[1, 2, 13, 1], [1, 2, 3, 9], [1, 2, 1, 5]])
def test_sizes(mode: str, nearest_mode: str | None, sizes: list[int]) -> None:
    attrs = {"nearest_mode": nearest_mode} if nearest_mode else {}
    compare(_model([1, 2, 5, 1], sizes=sizes, mode=mode, **attrs), {"x": arr([1, 2, 5, 1])},
            reduction=True)


@pytest.mark.parametrize("policy", ["not_larger", "not_smaller"])
def test_axes_and_aspect_policy(policy: str) -> None:
    model = _model([1, 3, 9, 6], sizes=[4, 17], axes=[3, 2], mode="linear",
                   keep_aspect_ratio_policy=policy)
    check(model, arr([1, 3, 9, 6]))


@pytest.mark.parametrize("mode", ["linear", "cubic"])
def test_antialias_downsampling(mode: str) -> None:
    check(_model([1, 1, 33, 20], scales=[1, 1, 0.3, 0.45], mode=mode, antialias=1),
          arr([1, 1, 33, 20]))


def test_cubic_exclude_outside_and_coefficient() -> None:
    check(_model([1, 2, 6, 7], scales=[1, 1, 1.7, 0.8], mode="cubic", exclude_outside=1,
                   cubic_coeff_a=-0.5), arr([1, 2, 6, 7]))


def test_tf_crop_and_resize_extrapolates() -> None:
    model = _model([1, 1, 8, 8], sizes=[1, 1, 5, 6], roi=[0, 0, -0.2, 0.3, 1, 1, 0.7, 1.4],
                   mode="linear", coordinate_transformation_mode="tf_crop_and_resize",
                   extrapolation_value=7.5)
    check(model, arr([1, 1, 8, 8]))


def test_upsample_opset9() -> None:
    node = helper.make_node("Upsample", ["x", "s"], ["y"], mode="nearest")
    model = make_model([node], [("x", F32, [1, 2, 3, 5])], [("y", F32)],
                       initializers=[init("s", np.array([1, 1, 3, 2], np.float32))], opset=9)
    compare(model, {"x": arr([1, 2, 3, 5])})


def test_antialiased_nearest_is_an_error() -> None:
    model = _model([1, 1, 4, 4], scales=[1, 1, 0.5, 0.5], mode="nearest", antialias=1)
    with pytest.raises(OnnxError, match="antialias applies to linear and cubic"):
        tilefuse.onnx.load(model)(arr([1, 1, 4, 4]))


@pytest.mark.parametrize(("scales", "sizes", "attrs"), [
    ([1, 1, 1e9, 1], None, {}), ([1, 1, -2, 1], None, {}), (None, [1, 1, 0, 4], {}),
    ([1, 1, 1e-9, 1], None, {"mode": "linear", "antialias": 1})])
def test_hostile_scales_are_refused_quickly(scales, sizes, attrs) -> None:
    model = _model([1, 1, 4, 4], scales=scales, sizes=sizes, **attrs)
    with pytest.raises(OnnxError, match=r"positive|taps"):
        tilefuse.onnx.load(model)(arr([1, 1, 4, 4]))
