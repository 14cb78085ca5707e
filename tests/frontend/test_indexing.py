"""Indexing traced arrays: ints, slices, None, Ellipsis, one integer array; errors for masks."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from jitcheck import arr, check_jit, noncontiguous, rng

from tilefuse.dtypes import DType
from tilefuse.errors import ShapeError, TraceError
from tilefuse.frontend import jit

SHAPE = (7, 1, 5)
IDX = np.array([[0, 6], [-1, 3]])   # for the axis of size 7
IDX5 = np.array([[0, 4], [-1, 3]])  # for the axis of size 5

KEYS = {
    "int": (2,), "negative int": (-1,), "int int": (3, 0), "int int int": (-7, 0, -5),
    "slice": (slice(1, 5),), "step": (slice(None, None, 2),),
    "negative step": (slice(None, None, -1),),
    "negative start": (slice(-3, None),), "neg bounds step": (slice(-2, -6, -2),),
    "empty": (slice(4, 2),), "empty reversed": (slice(2, 4, -1),), "clamped": (slice(-100, 100),),
    "ellipsis": (Ellipsis,), "ellipsis int": (Ellipsis, 3), "int ellipsis": (0, Ellipsis),
    "none": (None,), "none middle": (slice(None), None, 0), "none ellipsis none": (None, ..., None),
    "mixed": (slice(1, None, 3), 0, slice(None, None, -2)),
    "list": ([0, 2, 2, 6],), "array axis 2": (slice(None), slice(None), IDX5),
    "array then int": (IDX, 0), "int then array adjacent": (3, 0, [4, 1]),
    "int slice array": (0, slice(None), [1, 3]), "array slice int": ([1, 5], slice(None), 2),
    "none array": (None, slice(None), 0, IDX5), "zero-d array": (np.array(4),),
}


@pytest.mark.parametrize("name", list(KEYS))
def test_index_matches_numpy(name):
    key = KEYS[name]
    check_jit(lambda x: x[key], arr(rng("index", name), SHAPE))


def test_index_a_noncontiguous_input():
    check_jit(lambda x: (x[::-1, 2:], x[1]), noncontiguous(rng("nc-index"), (7, 6)))


def test_index_with_a_traced_integer_array():
    g = rng("traced-index")
    x, i = arr(g, (7, 5)), np.abs(arr(g, (3, 2), DType.i32)) % 7
    check_jit(lambda x, i: (x[i], x[:, i % 5], x[i, 1:], x[-1, i % 5]), x, i)


def test_index_with_a_traced_0d_integer():
    g = rng("0d-index")
    check_jit(lambda x, i: x[i], arr(g, (7, 5)), np.int64(3))


def test_chained_indexing_iteration_and_len():
    x = arr(rng("iter"), (4, 5))
    check_jit(lambda x: tuple(row[1:][::2] * len(x) for row in x), x)


def test_full_slices_record_no_node():
    graph = jit(lambda x: x[...][:, :][::1] + 1).lower(arr(rng("noop"), (3, 2))).captured
    assert [n.op.name for n in graph.nodes][-1] == "add"
    assert "slice" not in [n.op.name for n in graph.nodes]


@settings(max_examples=40, deadline=None)
@given(st.lists(st.one_of(st.integers(-7, 6), st.none(),
                          st.builds(slice, st.none() | st.integers(-9, 9),
                                    st.none() | st.integers(-9, 9),
                                    st.none() | st.integers(-3, 3).filter(bool))),
                min_size=0, max_size=3))
def test_random_basic_indexing(items):
    x = arr(rng("random-index"), (7, 6, 5))
    # ints must be in range for their axis
    axis, key = 0, []
    for item in items:
        if isinstance(item, int):
            item = item % x.shape[axis]
        key.append(item)
        axis += item is not None
    check_jit(lambda x: x[tuple(key)] * 2.0, x)


@pytest.mark.parametrize("key,error,words", [
    (lambda x: x > 0, TraceError, "boolean mask"),
    (lambda x: np.ones(7, bool), TraceError, "boolean mask"),
    (lambda x: True, TraceError, "boolean mask"),
    (lambda x: 7, ShapeError, "out of bounds"),
    (lambda x: (0, 0, 0), ShapeError, "too many indices"),
    (lambda x: ([0, 1], [1, 2]), TraceError, "more than one integer array"),
    (lambda x: 1.5, TraceError, "unsupported index"),
    (lambda x: np.array([0.5]), TraceError, "must be integers"),
    (lambda x: (Ellipsis, Ellipsis), ShapeError, "single ellipsis"),
    (lambda x: np.array([9]), ShapeError, "out of bounds"),
    (lambda x: slice(None, None, 0), ShapeError, "slice"),
], ids=["traced mask", "numpy mask", "bool", "out of range", "too many", "two arrays", "float",
        "float array", "two ellipses", "array out of range", "zero step"])
def test_index_errors_name_getitem_and_the_line(key, error, words):
    def fn(x):
        return x[key(x)]

    with pytest.raises(error) as info:
        jit(fn)(arr(rng("bad-index"), (7, 5)))
    assert words in str(info.value)
    assert info.value.loc is not None and info.value.loc.file == __file__


def test_item_assignment_is_rejected():
    def fn(x):
        x[0] = 1.0
        return x

    with pytest.raises(TraceError, match="in-place assignment"):
        jit(fn)(arr(rng("setitem"), (3,)))
