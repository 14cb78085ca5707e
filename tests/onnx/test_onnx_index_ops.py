"""OneHot, Hardmax, CumSum, Einsum, DepthToSpace, SpaceToDepth and the composed reductions
(ReduceL1/L2/SumSquare/LogSum/LogSumExp) against onnxruntime on fresh random inputs at odd
sizes; CumSum keeps integers exact and infinities in place."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper
from onnxcheck import F32, I64, arr, compare, init, make_model, single

import tilefuse.onnx
from tilefuse.onnx.tensors import OnnxError
from tilefuse.testing import assert_close

rng = np.random.default_rng(5)


@pytest.mark.parametrize("axis", [-1, 0, 1])
def test_one_hot(axis: int) -> None:
    idx = rng.integers(-7, 9, size=(3, 5)).astype(np.int64)  # some out of range: all off
    single("OneHot", {"i": idx}, consts={"d": np.array(7, np.int64),
                                         "v": np.array([-0.5, 2.0], np.float32)},
           opset=11, axis=axis)


@pytest.mark.parametrize("depth", [0, 1 << 40])
def test_one_hot_depth_is_bounded(depth: int) -> None:
    node = helper.make_node("OneHot", ["i", "d", "v"], ["y"])
    model = make_model([node], [("i", I64, [4])], [("y", F32)], opset=11, initializers=[
        init("d", np.array(depth, np.int64)), init("v", np.array([0, 1], np.float32))])
    with pytest.raises(OnnxError, match="depth"):
        tilefuse.onnx.load(model)(rng.integers(0, 3, size=4).astype(np.int64))


@pytest.mark.parametrize(("opset", "axis"), [(13, -1), (13, 0), (11, 1)])
def test_hardmax(opset: int, axis: int) -> None:
    x = arr([3, 4, 7])
    x[0, 0, :2] = 1.5  # a tie: the first maximum wins
    single("Hardmax", {"x": x}, opset=opset, axis=axis)


@pytest.mark.parametrize(("exclusive", "reverse"), [(0, 0), (1, 0), (0, 1), (1, 1)])
@pytest.mark.parametrize("n", [1, 7, 513])
def test_cum_sum(exclusive: int, reverse: int, n: int) -> None:
    single("CumSum", {"x": arr([2, n])}, consts={"a": np.array(1, np.int64)}, opset=14,
           exclusive=exclusive, reverse=reverse, reduction=True)
    ints = rng.integers(-9, 10, size=(n, 3)).astype(np.int32)
    single("CumSum", {"x": ints}, consts={"a": np.array(0, np.int64)}, opset=14,
           exclusive=exclusive, reverse=reverse)


def test_cum_sum_keeps_infinities_after_them() -> None:
    x = arr([9])
    x[4] = np.inf
    model = single("CumSum", {"x": x}, consts={"a": np.array(0, np.int64)}, opset=14)
    got = model(x)
    assert np.isfinite(got[:4]).all() and np.isinf(got[4:]).all()
    assert_close(got[:4], np.cumsum(x[:4]))


@pytest.mark.parametrize(("equation", "shapes"), [
    ("ij,jk->ik", [(3, 5), (5, 7)]), ("bij,bjk->bik", [(2, 3, 4), (2, 4, 1)]),
    ("ii->i", [(5, 5)]), ("ij->ji", [(3, 7)]), ("i,i", [(7,), (7,)])])
def test_einsum(equation: str, shapes: list[tuple[int, ...]]) -> None:
    inputs = {f"x{i}": arr(list(s)) for i, s in enumerate(shapes)}
    single("Einsum", inputs, opset=12, equation=equation, reduction=True)


@pytest.mark.parametrize("mode", ["DCR", "CRD"])
def test_depth_to_space(mode: str) -> None:
    single("DepthToSpace", {"x": arr([2, 12, 3, 5])}, opset=13, blocksize=2, mode=mode)


def test_space_to_depth() -> None:
    single("SpaceToDepth", {"x": arr([1, 3, 6, 9])}, opset=13, blocksize=3)


@pytest.mark.parametrize("op", ["ReduceL1", "ReduceL2", "ReduceSumSquare", "ReduceLogSum",
                                "ReduceLogSumExp"])
@pytest.mark.parametrize("keepdims", [0, 1])
def test_composed_reductions(op: str, keepdims: int) -> None:
    x = arr([3, 7, 5], low=0.1, high=2.0)
    single(op, {"x": x}, consts={"a": np.array([1, -1], np.int64)}, opset=18,
           keepdims=keepdims, reduction=True)
    single(op, {"x": x}, opset=13, axes=[0], keepdims=keepdims, reduction=True)


def test_log_sum_exp_is_stable_for_large_values() -> None:
    x = arr([4, 6]) * 100.0
    model = single("ReduceLogSumExp", {"x": x}, opset=13, axes=[1], keepdims=0,
                   reduction=True)
    assert np.isfinite(model(x)).all()


@pytest.mark.parametrize("reduction", ["none", "add", "mul", "max", "min"])
def test_scatter_elements_and_nd(reduction: str) -> None:
    data = arr([5, 7])
    if reduction == "none":
        idx = np.stack([rng.permutation(7)[:4] for _ in range(5)]).astype(np.int64)
    else:
        idx = rng.integers(-7, 7, size=(5, 4)).astype(np.int64)
    single("ScatterElements", {"d": data}, consts={"i": idx, "u": arr([5, 4])}, opset=18,
           axis=1, reduction=reduction)
    rows = rng.permutation(5)[:3] if reduction == "none" else rng.integers(-5, 5, size=3)
    single("ScatterND", {"d": data}, consts={"i": rows.reshape(3, 1).astype(np.int64),
                                             "u": arr([3, 7])}, opset=18, reduction=reduction)


@pytest.mark.parametrize(("largest", "axis", "k"), [(1, -1, 2), (0, 0, 3), (1, 1, 7)])
def test_top_k(largest: int, axis: int, k: int) -> None:
    x = rng.permutation(5 * 7 * 2).reshape(5, 7, 2).astype(np.float32)  # distinct: one order
    node = helper.make_node("TopK", ["x", "k"], ["v", "i"], axis=axis, largest=largest)
    model = make_model([node], [("x", F32, [5, 7, 2])], [("v", F32), ("i", I64)],
                       initializers=[init("k", np.array([k], np.int64))], opset=11)
    compare(model, {"x": x})
