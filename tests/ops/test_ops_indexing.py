"""scatter_elements, scatter_nd and topk through the reference interpreter against NumPy
loops written out here, on fresh random data at odd sizes, with negative indices, repeated
indices under each reduction, ties and NaN in topk; and their named errors."""

from __future__ import annotations

import numpy as np
import pytest
from opcheck import infer, rng, run1, run_op

from tilefuse.dtypes import DType
from tilefuse.errors import ShapeError
from tilefuse.graph.types import Sym, TensorType

REDUCTIONS = ["none", "add", "mul", "max", "min"]
_COMBINE = {"add": np.add, "mul": np.multiply, "max": np.maximum, "min": np.minimum}


def _combine(reduction: str, old: float, new: float) -> float:
    return new if reduction == "none" else _COMBINE[reduction](old, new)


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("axis", [0, 1, -1])
def test_scatter_elements(reduction: str, axis: int) -> None:
    g = rng("scatter_elements", reduction, axis)
    data = g.uniform(-2, 2, (5, 7, 3)).astype(np.float32)
    n = data.shape[axis]
    shape = [4, 6, 2]
    idx = g.integers(-n, n, size=shape)
    if reduction == "none":  # distinct targets along the axis: the result is order-free
        wide = list(shape)
        wide[axis] = n
        distinct = np.argsort(g.random(wide), axis=axis)
        idx = np.take(distinct, np.arange(shape[axis]), axis=axis) - n * (g.random(shape) < 0.3)
    updates = g.uniform(-2, 2, idx.shape).astype(np.float32)
    expected = data.copy()
    for p in np.ndindex(idx.shape):
        target = list(p)
        target[axis % 3] = idx[p] % n
        expected[tuple(target)] = _combine(reduction, expected[tuple(target)], updates[p])
    got = run1("scatter_elements", [data, idx, updates], {"axis": axis, "reduction": reduction})
    np.testing.assert_allclose(got, expected, rtol=1e-6)


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("k", [1, 2, 3])
def test_scatter_nd(reduction: str, k: int) -> None:
    g = rng("scatter_nd", reduction, k)
    data = g.integers(-9, 10, size=(4, 5, 3)).astype(np.int32)
    count = min(6, int(np.prod(data.shape[:k])))
    if reduction == "none":  # distinct targets
        flat = g.choice(int(np.prod(data.shape[:k])), size=count, replace=False)
        idx = np.stack(np.unravel_index(flat, data.shape[:k]), -1)
    else:
        idx = np.stack([g.integers(0, d, size=count) for d in data.shape[:k]], -1)
    idx = idx - np.asarray(data.shape[:k]) * (g.random(idx.shape) < 0.3)  # some negative
    updates = g.integers(-9, 10, size=(count, *data.shape[k:])).astype(np.int32)
    expected = data.copy()
    for i in range(count):
        where = tuple(int(v) % s for v, s in zip(idx[i], data.shape))
        expected[where] = _combine(reduction, expected[where], updates[i])
    got = run1("scatter_nd", [data, idx.astype(np.int64), updates], {"reduction": reduction})
    np.testing.assert_array_equal(got, expected)


@pytest.mark.parametrize("largest", [True, False])
@pytest.mark.parametrize(("shape", "axis", "k"), [((7,), 0, 3), ((3, 513), -1, 5),
                                                  ((4, 6, 2), 1, 6), ((1,), 0, 1),
                                                  ((5, 3), 0, 0)])
def test_topk(largest: bool, shape: tuple[int, ...], axis: int, k: int) -> None:
    g = rng("topk", largest, shape, axis, k)
    x = g.integers(-3, 4, size=shape).astype(np.float32)  # many ties
    values, indices = run_op("topk", [x], {"k": k, "axis": axis, "largest": largest})
    moved = np.moveaxis(x, axis, -1)
    want_v = np.empty((*moved.shape[:-1], k), np.float32)
    want_i = np.empty((*moved.shape[:-1], k), np.int64)
    for p in np.ndindex(moved.shape[:-1]):
        row = list(moved[p])
        order = sorted(range(len(row)), key=lambda j: (-row[j] if largest else row[j], j))[:k]
        want_v[p], want_i[p] = [row[j] for j in order], order
    np.testing.assert_array_equal(values, np.moveaxis(want_v, -1, axis))
    np.testing.assert_array_equal(indices, np.moveaxis(want_i, -1, axis))


def test_topk_nan_is_largest() -> None:
    x = np.array([1.0, np.nan, 3.0, -1.0], np.float32)
    values, indices = run_op("topk", [x], {"k": 2})
    assert np.isnan(values[0]) and values[1] == 3.0 and list(indices) == [1, 2]


def test_shape_rules_and_symbols() -> None:
    b = Sym("b")
    (v, i) = infer("topk", [TensorType((b, 9), DType.f32)], {"k": 4})
    assert v.shape == (b, 4) and i.dtype is DType.i64
    (s,) = infer("scatter_nd", [TensorType((b, 5), DType.f32), TensorType((3, 1), DType.i64),
                                TensorType((3, 5), DType.f32)])
    assert s.shape == (b, 5)


def test_errors_name_the_op() -> None:
    data = rng("err").uniform(-1, 1, (3, 4)).astype(np.float32)
    with pytest.raises(ShapeError, match="scatter_elements: index 3 is out of range"):
        run1("scatter_elements", [data, np.array([[3]]), np.ones((1, 1), np.float32)])
    with pytest.raises(ShapeError, match="scatter_nd: index -4 is out of range"):
        run1("scatter_nd", [data, np.array([[-4, 0]]), np.ones(1, np.float32)])
    with pytest.raises(ShapeError, match="topk: k=5 is outside"):
        run_op("topk", [data], {"k": 5})
    with pytest.raises(ShapeError, match="updates"):
        infer("scatter_nd", [TensorType((3, 4), DType.f32), TensorType((2, 1), DType.i64),
                             TensorType((2, 3), DType.f32)])
