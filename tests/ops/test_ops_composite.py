"""Composites: softmax, log_softmax, layer_norm, rms_norm, group_norm. Their references are
checked against independent NumPy/SciPy formulas, and each decomposition, run through the
interpreter, against the composite's own reference."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.special
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import array_shapes
from opcheck import FLOATS, LOW, array, in_f64, noncontiguous, rng, run1, seeds, type_of

from tilefuse.dtypes import DType
from tilefuse.errors import TilefuseError
from tilefuse.graph.builder import GraphBuilder
from tilefuse.graph.interpreter import interpret
from tilefuse.graph.verifier import verify
from tilefuse.ops import OPS, Trait
from tilefuse.testing import assert_close

COMPOSITES = ("softmax", "log_softmax", "layer_norm", "rms_norm", "group_norm")


def layer_norm_np(x, w, b, eps, k):
    axes = tuple(range(x.ndim - k, x.ndim))
    mu = x.mean(axis=axes, keepdims=True)
    var = ((x - mu) ** 2).mean(axis=axes, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * w + b


def rms_norm_np(x, w, eps, k):
    axes = tuple(range(x.ndim - k, x.ndim))
    return x / np.sqrt((x**2).mean(axis=axes, keepdims=True) + eps) * w


def group_norm_np(x, w, b, groups, eps):
    """Channel by channel: each group's channels gathered, normalised, then scaled."""
    out = np.empty_like(x)
    per = x.shape[1] // groups
    for n in range(x.shape[0]):
        for g in range(groups):
            chunk = x[n, g * per:(g + 1) * per]
            mu, var = chunk.mean(), chunk.var()
            for c in range(g * per, (g + 1) * per):
                out[n, c] = (x[n, c] - mu) / np.sqrt(var + eps) * w[c] + b[c]
    return out


def _expect(fn, *arrays, dtype):
    if dtype in LOW:
        return in_f64(fn, *arrays, out=dtype)
    return np.asarray(fn(*arrays))


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("name,fn", [("softmax", scipy.special.softmax),
                                     ("log_softmax", scipy.special.log_softmax)])
def test_softmax_references(name, fn, dtype: DType) -> None:
    r = rng(name, dtype.value)
    for shape, axis in [((513,), -1), ((7, 513), 0), ((7, 1, 5), 1), ((2, 7, 3), -1)]:
        x = array(r, shape, dtype, -5, 5)
        got = run1(name, [noncontiguous(x)], {"axis": axis})
        expect = _expect(lambda v, axis=axis: fn(v, axis=axis), x, dtype=dtype)
        assert_close(got, expect, reduction=True)


def test_softmax_is_stable_for_large_inputs() -> None:
    x = np.array([[1000.0, 1001.0, 999.0], [-1e4, 0.0, 1e4]], dtype=np.float32)
    assert_close(run1("softmax", [x]), scipy.special.softmax(x, axis=-1).astype(np.float32))
    assert_close(run1("log_softmax", [x]),
                 scipy.special.log_softmax(x.astype(np.float64), axis=-1).astype(np.float32))


@pytest.mark.parametrize("dtype", FLOATS)
def test_norm_references(dtype: DType) -> None:
    r = rng("norms", dtype.value)
    for shape, k in [((7, 513), 1), ((2, 7, 5), 2), ((1,), 1), ((3, 1, 4), 1)]:
        x = array(r, shape, dtype)
        w, b = array(r, shape[-k:], dtype), array(r, shape[-k:], dtype)
        got = run1("layer_norm", [noncontiguous(x), w, b], {"eps": 1e-3})
        expect = _expect(lambda x, w, b, k=k: layer_norm_np(x, w, b, 1e-3, k), x, w, b, dtype=dtype)
        assert_close(got, expect, reduction=True)
        got = run1("rms_norm", [x, w], {})
        assert_close(got, _expect(lambda x, w, k=k: rms_norm_np(x, w, 1e-6, k), x, w, dtype=dtype),
                     reduction=True)


@pytest.mark.parametrize("dtype", FLOATS)
def test_group_norm_reference(dtype: DType) -> None:
    r = rng("group_norm", dtype.value)
    for shape, groups in [((2, 6, 7, 5), 3), ((1, 4, 513), 1), ((3, 8, 1, 1), 8), ((1, 2), 2)]:
        x = array(r, shape, dtype, -3, 3)
        w, b = array(r, shape[1:2], dtype), array(r, shape[1:2], dtype)
        got = run1("group_norm", [noncontiguous(x), w, b], {"groups": groups, "eps": 1e-3})
        expect = _expect(lambda x, w, b, g=groups: group_norm_np(x, w, b, g, 1e-3), x, w, b,
                         dtype=dtype)
        assert_close(got, expect, reduction=True, msg=f"{shape} groups={groups}")


@pytest.mark.parametrize("shapes,groups,message", [
    (((2, 6, 4), (6,), (6,)), 4, "must divide"),
    (((2, 6, 4), (3,), (3,)), 3, "one per channel"),
    (((6,), (6,), (6,)), 2, "at least"),
])
def test_group_norm_rejects_bad_shapes(shapes, groups, message) -> None:
    b = GraphBuilder("bad_group_norm")
    ins = [b.input(type_of(np.zeros(s, np.float32)), f"x{i}") for i, s in enumerate(shapes)]
    with pytest.raises(TilefuseError, match=message):
        b.add1("group_norm", ins, {"groups": groups})


def test_composites_are_marked() -> None:
    for name in COMPOSITES:
        op = OPS[name]
        assert op.has(Trait.COMPOSITE) and op.decompose is not None, name


def _decomposed(name: str, arrays, attrs) -> np.ndarray:
    """Builds the composite's decomposition as a graph and interprets it."""
    op = OPS[name]
    b = GraphBuilder(f"decomposed_{name}")
    ins = [b.input(type_of(a), f"x{i}") for i, a in enumerate(arrays)]
    outs = op.decompose(b, ins, op.validate_attrs(attrs), None)
    graph = b.build(outs)
    verify(graph)
    assert all(node.op.name != name for node in graph.nodes)
    (out,) = interpret(graph, *arrays)
    return out


def _cases(dtype: DType):
    r = rng("decompose", dtype.value)
    x = array(r, (7, 513), dtype, -4, 4)
    x3 = array(r, (2, 7, 5), dtype, -4, 4)
    w1, b1 = array(r, (513,), dtype), array(r, (513,), dtype)
    w2, b2 = array(r, (7, 5), dtype), array(r, (7, 5), dtype)
    return [
        ("softmax", [x], {}), ("softmax", [x3], {"axis": 1}),
        ("log_softmax", [x], {"axis": 0}), ("log_softmax", [x3], {}),
        ("layer_norm", [x, w1, b1], {}), ("layer_norm", [x3, w2, b2], {"eps": 0.5}),
        ("rms_norm", [x, w1], {}), ("rms_norm", [x3, w2], {"eps": 1e-2}),
        ("group_norm", [x3, w1[:7], b1[:7]], {"groups": 7}),
        ("group_norm", [array(r, (2, 6, 3, 5), dtype), w1[:6], b1[:6]], {"groups": 2}),
    ]


@pytest.mark.parametrize("dtype", FLOATS)
def test_decompositions_match_references(dtype: DType) -> None:
    for name, arrays, attrs in _cases(dtype):
        assert_close(_decomposed(name, arrays, attrs), run1(name, arrays, attrs),
                     reduction=True, msg=f"{name} {attrs}")


def test_decomposition_of_mixed_dtypes() -> None:
    r = rng("mixed-norm")
    x, w, b = array(r, (7, 5), DType.bf16), array(r, (5,), DType.f32), array(r, (5,), DType.f16)
    got = _decomposed("layer_norm", [x, w, b], {})
    assert got.dtype == np.float32
    assert_close(got, run1("layer_norm", [x, w, b], {}), reduction=True)


@settings(max_examples=25, deadline=None)
@given(shape=array_shapes(min_dims=1, max_dims=3, max_side=6), data=st.data(), seed=seeds)
def test_random_decompositions(shape, data, seed) -> None:
    axis = data.draw(st.integers(-len(shape), len(shape) - 1))
    k = data.draw(st.integers(1, len(shape)))
    r = rng(seed)
    x = array(r, shape, DType.f64, -3, 3)
    w, b = array(r, shape[len(shape) - k:], DType.f64), array(r, shape[len(shape) - k:], DType.f64)
    for name, arrays, attrs in [("softmax", [x], {"axis": axis}),
                                ("log_softmax", [x], {"axis": axis}),
                                ("layer_norm", [x, w, b], {}), ("rms_norm", [x, w], {})]:
        assert_close(_decomposed(name, arrays, attrs), run1(name, arrays, attrs),
                     reduction=True, msg=name)
