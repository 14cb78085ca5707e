"""matmul and einsum against np.matmul / np.einsum."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from opcheck import LOW, array, in_f64, noncontiguous, rng, run1, seeds

from tilefuse.dtypes import DType
from tilefuse.testing import assert_close

MATMUL_SHAPES = [
    ((7, 513), (513, 1)), ((1, 7), (7, 513)), ((513,), (513, 7)), ((7, 3), (3,)),
    ((7,), (7,)), ((2, 1, 3, 4), (5, 4, 2)), ((4,), (3, 4, 2)), ((3, 7, 5), (5,)),
]
DTYPES = [DType.f32, DType.f64, DType.f16, DType.bf16, DType.i32, DType.i8, DType.u8]


def _expect(fn, *arrays: np.ndarray, dtype: DType) -> np.ndarray:
    if dtype in LOW:
        return in_f64(fn, *arrays, out=dtype)
    return np.asarray(fn(*arrays))


@pytest.mark.parametrize("dtype", DTYPES)
def test_matmul(dtype: DType) -> None:
    r = rng("matmul", dtype.value)
    for sa, sb in MATMUL_SHAPES:
        a, b = array(r, sa, dtype), array(r, sb, dtype)
        got = run1("matmul", [noncontiguous(a), b])
        assert_close(got, _expect(np.matmul, a, b, dtype=dtype), reduction=True,
                     msg=f"{sa} @ {sb}")


def test_matmul_mixed_dtypes_promote() -> None:
    a, b = array(rng(1), (7, 5), DType.i32), array(rng(2), (5, 3), DType.f32)
    got = run1("matmul", [a, b])
    assert got.dtype == np.float64
    assert_close(got, np.matmul(a, b), reduction=True)


@settings(max_examples=30, deadline=None)
@given(batch_a=st.lists(st.sampled_from([1, 2, 3]), max_size=2),
       batch_b=st.lists(st.sampled_from([1, 2, 3]), max_size=2),
       m=st.integers(1, 5), k=st.integers(1, 5), n=st.integers(1, 5), seed=seeds)
def test_matmul_batch_broadcasting(batch_a, batch_b, m, k, n, seed) -> None:
    try:
        np.broadcast_shapes(tuple(batch_a), tuple(batch_b))
    except ValueError:
        return  # not a valid pair; the error tests cover incompatible batches
    r = rng(seed)
    a = array(r, (*batch_a, m, k), DType.f32)
    b = array(r, (*batch_b, k, n), DType.f32)
    assert_close(run1("matmul", [a, b]), np.matmul(a, b), reduction=True)


EINSUM_CASES = [
    ("ij,jk->ik", [(7, 513), (513, 3)]),
    ("bij,bjk->bik", [(2, 7, 5), (2, 5, 3)]),
    ("bhqd,bhkd->bhqk", [(2, 3, 7, 4), (2, 3, 5, 4)]),
    ("ii->i", [(7, 7)]),
    ("ii", [(5, 5)]),
    ("ij->ji", [(7, 1)]),
    ("i,i->", [(513,), (513,)]),
    ("i,j->ij", [(7,), (5,)]),
    ("abc,c->ab", [(2, 3, 4), (4,)]),
    ("ij,jk,kl->il", [(3, 4), (4, 5), (5, 2)]),
    ("...ij,...jk", [(5, 1, 2, 3), (4, 3, 6)]),
    ("b...i->...b", [(3, 2, 4, 5)]),
    ("aB", [(2, 3)]),
    ("ij->", [(7, 5)]),
]


@pytest.mark.parametrize("dtype", [DType.f32, DType.f64, DType.f16, DType.bf16, DType.i32])
@pytest.mark.parametrize("equation,shapes", EINSUM_CASES)
def test_einsum(equation: str, shapes, dtype: DType) -> None:
    r = rng(equation, dtype.value)
    arrays = [array(r, s, dtype) for s in shapes]
    got = run1("einsum", arrays, {"equation": equation})
    expect = _expect(lambda *xs: np.einsum(equation, *xs), *arrays, dtype=dtype)
    assert_close(got, expect, reduction=True, msg=equation)
