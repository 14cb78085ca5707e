"""NegativeLogLikelihoodLoss and SoftmaxCrossEntropyLoss against onnxruntime on fresh random
inputs: every reduction, with and without class weights, ignore_index inside and outside the
class range, and extra spatial dims; plus the named error for a mis-shaped target."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper
from onnxcheck import F32, I64, arr, compare, init, make_model

import tilefuse.onnx
from tilefuse.onnx.tensors import OnnxError

rng = np.random.default_rng(11)


def _model(op: str, x_shape: list[int], n_out: int, weight: np.ndarray | None, **attrs):
    inputs = ["x", "t"] + (["w"] if weight is not None else [])
    outs = ["loss", "log_prob"][:n_out]
    node = helper.make_node(op, inputs, outs, **attrs)
    t_shape = [x_shape[0], *x_shape[2:]]
    return make_model([node], [("x", F32, x_shape), ("t", I64, t_shape)],
                      [(o, F32) for o in outs],
                      initializers=[init("w", weight)] if weight is not None else [], opset=13)


@pytest.mark.parametrize("op", ["NegativeLogLikelihoodLoss", "SoftmaxCrossEntropyLoss"])
@pytest.mark.parametrize("reduction", ["none", "sum", "mean"])
@pytest.mark.parametrize(("x_shape", "weighted", "ignore"), [
    ([7, 5], False, None), ([3, 4, 2, 5], True, None), ([6, 3, 9], True, 2),
    ([1, 5], False, -100)])
def test_losses(op: str, reduction: str, x_shape: list[int], weighted: bool,
                ignore: int | None) -> None:
    weight = arr([x_shape[1]], low=0.1, high=2.0) if weighted else None
    target = rng.integers(0, x_shape[1], size=[x_shape[0], *x_shape[2:]]).astype(np.int64)
    if ignore is not None:
        target.flat[::3] = ignore
    attrs = {"reduction": reduction, **({"ignore_index": ignore} if ignore is not None else {})}
    n_out = 2 if op == "SoftmaxCrossEntropyLoss" else 1
    compare(_model(op, x_shape, n_out, weight, **attrs), {"x": arr(x_shape), "t": target},
            reduction=True)


def test_target_shape_is_checked() -> None:
    node = helper.make_node("NegativeLogLikelihoodLoss", ["x", "t"], ["loss"])
    model = make_model([node], [("x", F32, [4, 3]), ("t", I64, [3])], [("loss", F32)], opset=13)
    with pytest.raises(OnnxError, match="needs input"):
        tilefuse.onnx.load(model)(arr([4, 3]), rng.integers(0, 3, size=3).astype(np.int64))
