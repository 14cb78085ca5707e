"""RotaryEmbedding, CumProd, LpNormalization, LpPool, IsInf, Swish, EyeLike and CenterCropPad
against onnx's reference implementation on fresh random inputs at odd sizes."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from onnx import helper
from onnx.reference import ReferenceEvaluator
from onnxcheck import arr, init, make_model, single

import tilefuse.onnx
from tilefuse.dtypes import from_numpy
from tilefuse.testing import assert_close

rng = np.random.default_rng(17)
_TYPES = {np.dtype(np.float32): 1, np.dtype(np.int64): 7, np.dtype(bool): 9}


def check(op: str, inputs: dict[str, np.ndarray], opset: int,
          consts: dict[str, np.ndarray] | None = None, out_type: int = 1, **attrs: Any) -> None:
    consts = consts or {}
    node = helper.make_node(op, [*inputs, *consts], ["y"], **attrs)
    model = make_model([node], [(n, _TYPES[a.dtype], list(a.shape)) for n, a in inputs.items()],
                       [("y", out_type)], initializers=[init(k, v) for k, v in consts.items()],
                       opset=opset)
    expected = ReferenceEvaluator(model).run(None, inputs)[0]
    got = tilefuse.onnx.load(model)(*inputs.values())
    reduction = from_numpy(expected.dtype).is_float
    assert_close(got, expected, reduction=reduction)


@pytest.mark.parametrize("interleaved", [0, 1])
@pytest.mark.parametrize("rotary_dim", [0, 4])
def test_rotary_embedding_4d_with_positions(interleaved: int, rotary_dim: int) -> None:
    half = (rotary_dim or 8) // 2
    check("RotaryEmbedding", {"x": arr([2, 3, 5, 8]), "cos": arr([9, half]),
                              "sin": arr([9, half]),
                              "pos": rng.integers(0, 9, size=(2, 5)).astype(np.int64)}, 23,
          interleaved=interleaved, rotary_embedding_dim=rotary_dim)


def test_rotary_embedding_3d_without_positions() -> None:
    check("RotaryEmbedding", {"x": arr([1, 7, 12]), "cos": arr([1, 7, 2]),
                              "sin": arr([1, 7, 2])}, 23, num_heads=3)


@pytest.mark.parametrize(("exclusive", "reverse"), [(0, 0), (1, 1)])
def test_cum_prod(exclusive: int, reverse: int) -> None:
    check("CumProd", {"x": arr([3, 7], low=0.5, high=1.5)}, 26,
          consts={"a": np.array(1, np.int64)}, exclusive=exclusive, reverse=reverse)


@pytest.mark.parametrize("p", [1, 2])
def test_lp_normalization_and_pool(p: int) -> None:
    """LpNormalization against onnxruntime: onnx's reference forgets the absolute value of
    the L1 norm (sum(x) instead of sum(|x|))."""
    x = arr([2, 3, 7, 6])
    single("LpNormalization", {"x": x}, opset=1, axis=2, p=p, reduction=True)
    x[0, 0, :, 0] = 0
    model = single("LpNormalization", {"x": x[:1, :1, :, :1]}, opset=1, axis=2, p=p)
    assert not model(x[:1, :1, :, :1]).any()  # a zero vector stays zero, not NaN
    check("LpPool", {"x": x}, 18, kernel_shape=[3, 2], strides=[2, 1], pads=[2, 1, 2, 1], p=p)


def test_is_inf_swish_eye_like_center_crop_pad() -> None:
    x = arr([4, 5])
    x[0, 1], x[2, 3], x[3, 0] = np.inf, -np.inf, np.nan
    check("IsInf", {"x": x}, 20, out_type=9)
    check("IsInf", {"x": x}, 20, out_type=9, detect_negative=0)
    check("Swish", {"x": arr([3, 7])}, 24, alpha=0.7)
    check("EyeLike", {"x": arr([4, 7])}, 9, k=2)
    check("CenterCropPad", {"x": arr([5, 8, 3])}, 18, consts={"s": np.array([3, 11], np.int64)},
          axes=[0, 1])
