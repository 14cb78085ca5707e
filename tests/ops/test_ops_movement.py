"""Data movement and source ops against the matching NumPy expressions."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import array_shapes
from opcheck import array, noncontiguous, rng, run1, run_op, seeds

from tilefuse.dtypes import DType
from tilefuse.errors import ShapeError
from tilefuse.graph.ir import Literal
from tilefuse.testing import assert_close

DTYPES = [DType.f32, DType.bf16, DType.i32, DType.u8, DType.bool]
ids = [d.value for d in DTYPES]


def _x(dtype: DType, shape: tuple[int, ...], *key: object) -> np.ndarray:
    return array(rng(dtype.value, shape, *key), shape, dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=ids)
def test_reshape(dtype: DType) -> None:
    for shape, target in [((7, 513), (513, 7)), ((7, 513), (-1,)), ((1,), ()),
                          ((2, 3, 4), (4, -1, 2)), ((6, 1), (1, 2, 1, 3)), ((0, 3), (3, 0))]:
        x = _x(dtype, shape)
        got = run1("reshape", [noncontiguous(x)], {"shape": target})
        assert_close(got, x.reshape(target))


@pytest.mark.parametrize("dtype", DTYPES, ids=ids)
def test_transpose_expand_squeeze(dtype: DType) -> None:
    x = _x(dtype, (7, 1, 513))
    assert_close(run1("transpose", [noncontiguous(x)], {"perm": (2, 0, 1)}),
                 np.transpose(x, (2, 0, 1)))
    assert_close(run1("transpose", [x], {"perm": (-1, 1, 0)}), np.transpose(x, (2, 1, 0)))
    assert_close(run1("expand_dims", [x], {"axes": (0, -1)}), np.expand_dims(x, (0, -1)))
    assert_close(run1("expand_dims", [x], {"axes": ()}), x)
    assert_close(run1("squeeze", [x], {"axes": (1,)}), np.squeeze(x, 1))
    assert_close(run1("squeeze", [x], {}), np.squeeze(x))
    y = _x(dtype, (1, 1))
    assert_close(run1("squeeze", [y], {"axes": None}), np.squeeze(y))


@pytest.mark.parametrize("dtype", DTYPES, ids=ids)
def test_broadcast_to(dtype: DType) -> None:
    for shape, target in [((7, 1), (3, 7, 513)), ((1,), (7,)), ((), (2, 3)), ((513,), (513,))]:
        x = _x(dtype, shape)
        assert_close(run1("broadcast_to", [x], {"shape": target}), np.broadcast_to(x, target))


BIG = 2**63 - 1


@settings(max_examples=50, deadline=None)
@given(n=st.integers(0, 12), start=st.integers(-15, 15), stop=st.integers(-15, 15),
       step=st.integers(-4, 4).filter(bool), seed=seeds)
def test_slice_matches_python_slicing(n, start, stop, step, seed) -> None:
    x = array(rng(seed), (3, n), DType.f32)
    attrs = {"starts": (0, start), "stops": (BIG, stop), "steps": (1, step)}
    assert_close(run1("slice", [x], attrs), x[:, start:stop:step])


@pytest.mark.parametrize("dtype", DTYPES, ids=ids)
def test_slice(dtype: DType) -> None:
    x = _x(dtype, (7, 513))
    cases = [((0, 0), (7, 513), (1, 1)), ((1, -1), (BIG, -600), (2, -3)),
             ((6, 5), (-BIG, 0), (-1, 7)), ((3, 100), (3, 50), (1, 1))]
    for starts, stops, steps in cases:
        got = run1("slice", [noncontiguous(x)],
                   {"starts": starts, "stops": stops, "steps": steps})
        assert_close(got, x[tuple(map(slice, starts, stops, steps))])


@pytest.mark.parametrize("dtype", DTYPES, ids=ids)
def test_concat_stack_split(dtype: DType) -> None:
    a, b, c = _x(dtype, (7, 3), 1), _x(dtype, (7, 1), 2), _x(dtype, (7, 513), 3)
    assert_close(run1("concat", [a, noncontiguous(b), c], {"axis": 1}),
                 np.concatenate([a, b, c], axis=1))
    assert_close(run1("concat", [a], {"axis": -1}), a)
    assert_close(run1("stack", [a, a[::-1]], {"axis": 1}), np.stack([a, a[::-1]], axis=1))
    assert_close(run1("stack", [c], {"axis": -1}), np.stack([c], axis=-1))
    parts = run_op("split", [noncontiguous(c)], {"axis": 1, "sizes": (1, 0, 500, 12)})
    expect = np.split(c, [1, 1, 501], axis=1)
    assert len(parts) == 4
    for got, want in zip(parts, expect):
        assert_close(got, want)


def test_concat_promotes() -> None:
    a, b = _x(DType.i8, (2, 3)), _x(DType.f32, (4, 3))
    got = run1("concat", [a, b], {"axis": 0})
    assert_close(got, np.concatenate([a, b]))


@pytest.mark.parametrize("dtype", DTYPES, ids=ids)
@pytest.mark.parametrize("mode", ["constant", "reflect", "edge"])
def test_pad(dtype: DType, mode: str) -> None:
    x = _x(dtype, (7, 1, 5))
    pads = (1, 2, 0, 3, 4, 0)
    width = ((1, 2), (0, 3), (4, 0))
    attrs = {"pads": pads, "mode": mode}
    if mode == "constant":
        attrs["value"] = 1.5
        expect = np.pad(x, width, constant_values=np.asarray(1.5).astype(x.dtype))
    else:
        expect = np.pad(x, width, mode=mode)
    assert_close(run1("pad", [noncontiguous(x)], attrs), expect)


@pytest.mark.parametrize("dtype", DTYPES, ids=ids)
def test_take(dtype: DType) -> None:
    x = _x(dtype, (7, 513))
    r = rng("take", dtype.value)
    for axis, idx in [(0, r.integers(-7, 7, size=(3, 4))), (1, r.integers(-513, 513, size=11)),
                      (-1, np.array(5)), (0, np.zeros((0,), dtype=np.int64))]:
        for idx_type in (np.int32, np.int64, np.uint8):
            size = x.shape[axis]
            ix = (idx % size if idx_type is np.uint8 else idx).astype(idx_type)
            got = run1("take", [x, ix], {"axis": axis})
            assert_close(got, np.take(x, ix, axis=axis))


def test_take_out_of_range_names_take() -> None:
    x = _x(DType.f32, (5,))
    with pytest.raises(ShapeError, match=r"take.*index 5 is out of range"):
        run1("take", [x, np.array([0, 5])], {"axis": 0})
    with pytest.raises(ShapeError, match=r"take_along_axis.*-6"):
        run1("take_along_axis", [x, np.array([-6])], {"axis": 0})


@pytest.mark.parametrize("dtype", DTYPES, ids=ids)
def test_take_along_axis(dtype: DType) -> None:
    x = _x(dtype, (7, 513))
    r = rng("tla", dtype.value)
    for axis, idx in [(1, r.integers(-513, 513, size=(7, 3))), (0, r.integers(0, 7, size=(2, 1))),
                      (-1, np.argsort(x, axis=-1))]:
        got = run1("take_along_axis", [noncontiguous(x), idx], {"axis": axis})
        assert_close(got, np.take_along_axis(x, idx, axis=axis))


@pytest.mark.parametrize("dtype", [DType.f32, DType.f64, DType.bf16, DType.i32, DType.u8])
def test_sources(dtype: DType) -> None:
    for start, stop, step in [(0, 7, 1), (2.0, 513.0, 1.0), (10, 0, -3), (0, 1, 0.25), (3, 3, 1)]:
        got = run1("arange", [], {"start": start, "stop": stop, "step": step, "dtype": dtype})
        n = len(np.arange(start, stop, step, dtype=np.float64))
        assert_close(got, (start + step * np.arange(n, dtype=np.float64)).astype(dtype.np))
    got = run1("full", [], {"shape": (7, 1, 3), "value": 2.5, "dtype": dtype})
    assert_close(got, np.full((7, 1, 3), 2.5).astype(dtype.np))
    payload = _x(dtype, (7, 3))
    assert_close(run1("constant", [], {"value": Literal(payload)}), payload)


@settings(max_examples=30, deadline=None)
@given(shape=array_shapes(min_dims=1, max_dims=4, max_side=5), data=st.data(), seed=seeds)
def test_random_permutations_and_reshapes(shape, data, seed) -> None:
    x = array(rng(seed), shape, DType.f32)
    perm = tuple(data.draw(st.permutations(range(len(shape)))))
    assert_close(run1("transpose", [x], {"perm": perm}), np.transpose(x, perm))
    target = tuple(data.draw(st.permutations(shape)))
    unknown = data.draw(st.integers(-1, len(target) - 1))
    if unknown >= 0 and 0 not in target:
        target = (*target[:unknown], -1, *target[unknown + 1:])
    assert_close(run1("reshape", [x], {"shape": target}), x.reshape(target))


@pytest.mark.parametrize("dtype", [DType.f32, DType.bf16, DType.i32], ids=lambda d: d.value)
@pytest.mark.parametrize("kernel,strides,dilations", [((3, 3), (1, 1), (1, 1)),
                                                      ((7, 7), (2, 2), (1, 1)),
                                                      ((2, 3), (2, 1), (2, 1)),
                                                      ((1, 1), (1, 1), (1, 1))])
def test_window_patches_is_every_window(dtype, kernel, strides, dilations) -> None:
    x = _x(dtype, (2, 13, 11, 3), kernel)
    got = run1("window_patches", [x], {"kernel": kernel, "strides": strides,
                                       "dilations": dilations})
    (kh, kw), (sh, sw), (dh, dw) = kernel, strides, dilations
    oh, ow = (13 - dh * (kh - 1) - 1) // sh + 1, (11 - dw * (kw - 1) - 1) // sw + 1
    want = np.empty((2, oh, ow, kh, kw, 3), x.dtype)
    for i in range(oh):
        for j in range(ow):
            for a in range(kh):
                for b in range(kw):
                    want[:, i, j, a, b] = x[:, i * sh + a * dh, j * sw + b * dw]
    assert_close(got, want)


def test_window_patches_rejects_bad_windows() -> None:
    from tilefuse.errors import AttrError

    x = _x(DType.f32, (1, 4, 4, 2))
    with pytest.raises(ShapeError, match="needs H >= 5"):
        run1("window_patches", [x], {"kernel": (3, 3), "dilations": (2, 1)})
    with pytest.raises(ShapeError, match="NHWC"):
        run1("window_patches", [x.reshape(4, 4, 2)], {"kernel": (1, 1)})
    with pytest.raises(AttrError, match="positive"):
        run1("window_patches", [x], {"kernel": (0, 1)})
