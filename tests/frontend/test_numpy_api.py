"""Every entry of the NumPy API table, traced and compared with NumPy (values and dtypes)."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.special
from jitcheck import arr, check_jit, noncontiguous, rng

from tilefuse.dtypes import DType
from tilefuse.frontend import jit
from tilefuse.frontend.numpy_api import FUNCTIONS, LOGICAL_UFUNCS, UFUNC_BUILDERS, UFUNC_OPS

# (ufunc, low, high): an input range inside the ufunc's domain
UNARY = [
    (np.negative, -2, 2), (np.positive, -2, 2), (np.absolute, -2, 2), (np.sign, -2, 2),
    (np.exp, -2, 2), (np.log, 0.1, 3), (np.log1p, -0.5, 2), (np.expm1, -2, 2),
    (np.sqrt, 0.1, 4), (np.square, -2, 2), (np.reciprocal, 0.5, 2), (np.tanh, -2, 2),
    (np.sin, -3, 3), (np.cos, -3, 3), (np.floor, -3, 3), (np.ceil, -3, 3), (np.rint, -3, 3),
    (np.isnan, -2, 2), (scipy.special.erf, -2, 2), (scipy.special.expit, -4, 4),
]
BINARY = [
    np.add, np.subtract, np.multiply, np.true_divide, np.floor_divide, np.remainder,
    np.maximum, np.minimum, np.equal, np.not_equal, np.less, np.less_equal, np.greater,
    np.greater_equal, np.logical_and, np.logical_or, np.logical_xor,
]


def _name(u: np.ufunc) -> str:
    return u.__name__


@pytest.mark.parametrize("ufunc,low,high", UNARY, ids=[_name(u) for u, _, _ in UNARY])
@pytest.mark.parametrize("shape", [(7,), (3, 513)])
def test_unary_ufuncs_f32(ufunc, low, high, shape):
    g = rng("unary", ufunc.__name__, shape)
    check_jit(lambda x: ufunc(x), arr(g, shape, DType.f32, low, high))


@pytest.mark.parametrize("ufunc,low,high", UNARY, ids=[_name(u) for u, _, _ in UNARY])
@pytest.mark.parametrize("dtype", [DType.f64, DType.f16, DType.bf16])
def test_unary_ufuncs_other_float_types_on_noncontiguous_input(ufunc, low, high, dtype):
    g = rng("unary", ufunc.__name__, dtype)
    check_jit(lambda x: ufunc(x), noncontiguous(g, (5, 7), dtype, low, high))


def test_isnan_finds_nans():
    x = arr(rng("isnan"), (7,))
    x[[1, 4]] = np.nan
    check_jit(lambda x: (np.isnan(x), np.isnan(x * 0.0 + 1.0)), x)


INT_UFUNC_CASES = [(u, d) for u in (np.exp, np.sqrt, np.tanh, scipy.special.erf, np.floor)
                   for d in (DType.i32, DType.i8, DType.bool)
                   if not (u is np.floor and d is DType.bool)]  # NumPy has no such loop


@pytest.mark.parametrize("ufunc,dtype", INT_UFUNC_CASES,
                         ids=[f"{u.__name__}-{d.value}" for u, d in INT_UFUNC_CASES])
def test_float_ufuncs_of_ints_and_bools_take_numpys_loop_dtype(ufunc, dtype):
    x = np.abs(arr(rng("int-ufunc", ufunc.__name__, dtype), (7,), dtype))
    check_jit(lambda x: ufunc(x), x)


def test_bitwise_ufuncs_on_bools_are_logical_ops():
    g = rng("bitwise")
    p, q = arr(g, (7, 1), DType.bool), arr(g, (5,), DType.bool)
    check_jit(lambda p, q: (np.bitwise_and(p, q), np.bitwise_or(p, q), np.bitwise_xor(p, q),
                            np.invert(p), np.logical_not(q)), p, q)


def test_ufunc_aliases():
    g = rng("aliases")
    a, b = arr(g, (7,), low=1, high=3), arr(g, (7,), low=1, high=3)
    check_jit(lambda a, b: (np.divide(a, b), np.mod(a, b), np.abs(-a), np.around(a, 0)), a, b)


@pytest.mark.parametrize("ufunc", BINARY, ids=_name)
@pytest.mark.parametrize("dtypes", [(DType.f32, DType.f32), (DType.f32, DType.f64),
                                    (DType.i32, DType.f32), (DType.i32, DType.i64)],
                         ids=lambda d: f"{d[0].value}-{d[1].value}")
def test_binary_ufuncs_broadcast_and_promote(ufunc, dtypes):
    g = rng("binary", ufunc.__name__, dtypes)
    a = arr(g, (7, 1), dtypes[0], 1, 6)
    b = arr(g, (5,), dtypes[1], 1, 6)  # positive: no division by zero
    check_jit(lambda a, b: ufunc(a, b), a, b)


def test_power_with_positive_base():
    g = rng("power")
    check_jit(lambda a, b: (np.power(a, b), a ** 2, 2 ** b, b ** -1.5),
              arr(g, (7, 3), low=0.5, high=2), arr(g, (3,), low=0.5, high=2))


def test_python_operators_and_reflected_forms_with_ndarrays():
    g = rng("operators")
    x, c = arr(g, (7, 5), low=0.5, high=2), arr(g, (5,), low=0.5, high=2)
    m = arr(g, (5, 3))

    def fn(x):
        return (c + x, c - x, c * x, c / x, c // x, c % x, c ** x, x @ m, m.T @ x.T,
                c < x, c <= x, c > x, c >= x, c == x, c != x, -x, +x, abs(x))

    check_jit(fn, x, reduction=True)


def test_ndarray_on_the_left_dispatches_to_the_tracer():
    c = arr(rng("left"), (5,))
    jitted = jit(lambda x: c + x)
    graph = jitted.lower(arr(rng("left-x"), (5,))).captured
    assert [n.op.name for n in graph.nodes] == ["constant", "add"]


REDUCTIONS = {
    "sum": lambda x: (np.sum(x), np.sum(x, axis=0), x.sum(axis=(0, 2), keepdims=True)),
    "mean": lambda x: (np.mean(x, axis=-1), x.mean(keepdims=True)),
    "max": lambda x: (np.max(x, axis=1), np.amax(x), x.max(axis=(1, 2))),
    "min": lambda x: (np.min(x, axis=0, keepdims=True), np.amin(x, axis=2)),
    "prod": lambda x: (np.prod(x, axis=1), x.prod()),
    "var": lambda x: (np.var(x, axis=0), x.var(axis=(1, 2), ddof=1), np.std(x, axis=2)),
    "argmax": lambda x: (np.argmax(x), np.argmax(x, axis=1), x.argmax(axis=-1, keepdims=True)),
    "argmin": lambda x: (np.argmin(x, axis=2), x.argmin()),
    "cumsum": lambda x: (np.cumsum(x), np.cumsum(x, axis=1), np.cumsum(x, axis=-1)),
    "cumprod": lambda x: (np.cumprod(x, axis=0), np.cumprod(x)),
    "ufunc.reduce": lambda x: (np.add.reduce(x), np.maximum.reduce(x, axis=2),
                               np.multiply.reduce(x, axis=(0, 1))),
}


REDUCTION_CASES = [(name, d) for name in REDUCTIONS
                   for d in (DType.f32, DType.f64, DType.i32, DType.bool)
                   if not (d is DType.bool and name in ("var", "prod", "ufunc.reduce"))]


@pytest.mark.parametrize("name,dtype", REDUCTION_CASES,
                         ids=[f"{n}-{d.value}" for n, d in REDUCTION_CASES])
def test_reductions(name, dtype):
    x = arr(rng("reduce", name, dtype), (3, 7, 5), dtype, 0.5, 1.5)
    check_jit(REDUCTIONS[name], x, reduction=True)


def test_reduction_with_dtype_argument():
    x = arr(rng("reduce-dtype"), (7, 5), DType.i32)
    check_jit(lambda x: (np.sum(x, dtype=np.int32), np.mean(x, axis=0, dtype=np.float32),
                         x.sum(dtype=np.float64)), x, reduction=True)


SHAPES = {
    "reshape": lambda x: (np.reshape(x, (5, -1)), x.reshape(-1), x.reshape(7, 1, 5),
                          np.reshape(x, 35)),
    "transpose": lambda x: (np.transpose(x), x.T, x.transpose(1, 0), np.transpose(x, (1, 0))),
    "swapaxes": lambda x: (np.swapaxes(x, 0, 1), x[None].swapaxes(0, 2)),
    "moveaxis": lambda x: np.moveaxis(x[None], 0, -1),
    "expand_dims": lambda x: (np.expand_dims(x, 0), np.expand_dims(x, (0, 3)),
                              np.expand_dims(x, -1)),
    "squeeze": lambda x: (np.squeeze(x[None, :, None]), x[:, :1].squeeze(1),
                          np.squeeze(x[None], axis=0)),
    "ravel": lambda x: (np.ravel(x), x.flatten(), x.ravel()),
    "broadcast_to": lambda x: (np.broadcast_to(x, (2, 7, 5)), np.broadcast_to(x[:1], (4, 5))),
    "concatenate": lambda x: (np.concatenate([x, x * 2]), np.concatenate((x, x[:, :2]), axis=1),
                              np.concatenate([x, x], axis=None)),
    "stack": lambda x: (np.stack([x, -x]), np.stack((x, x, x), axis=-1)),
    "split": lambda x: (tuple(np.split(x, [2, 5])), tuple(np.split(x, 5, axis=1)),
                        tuple(np.split(x, [4, 2], axis=0)), tuple(np.array_split(x, 3))),
    "pad": lambda x: (np.pad(x, 1), np.pad(x, ((1, 0), (2, 3)), constant_values=1.5),
                      np.pad(x, 2, mode="edge"), np.pad(x, ((1, 1), (0, 2)), mode="reflect")),
    "take": lambda x: (np.take(x, [0, 4, 4], axis=1), np.take(x, 3), np.take(x, [[1], [-1]]),
                       x.take(np.array([6, 0]), axis=0)),
    "take_along_axis": lambda x: np.take_along_axis(
        x, np.argsort(np.arange(35).reshape(7, 5) % 3, axis=1), axis=1),
    "where": lambda x: (np.where(x > 0, x, 0.0), np.where(x < 0, -1, 1), np.where(1.0, x, 2)),
    "clip": lambda x: (np.clip(x, -0.5, 0.5), x.clip(0, None), np.clip(x, None, 1),
                       np.clip(x, x[0], x[1]), np.clip(x, np.float64(-1), 1)),
    "round": lambda x: (np.round(x * 10), np.around(x, 1), np.round(x * 100, -1)),
    "dot": lambda x: (np.dot(x, x.T), np.dot(x[0], x[1]), np.dot(x, 2.0), x.dot(x[0])),
    "einsum": lambda x: (np.einsum("ij,kj->ik", x, x), np.einsum("ij->j", x),
                         np.einsum("i j , j", x, x[0])),
    "matmul": lambda x: (np.matmul(x, x.T), x[0] @ x.T, x @ x[0], x[None] @ x.T),
    "like": lambda x: (np.zeros_like(x), np.ones_like(x, dtype=np.int32),
                       np.full_like(x, 2.5), np.full_like(x, 7, dtype=np.int8),
                       np.full_like(x, x[0, 0])),
    "astype": lambda x: (x.astype(np.float16), x.astype(np.int32), x.astype(bool),
                         x.astype("float64")),
    "copy": lambda x: (np.copy(x), x.copy()),
}


@pytest.mark.parametrize("name", list(SHAPES))
def test_functions(name):
    check_jit(SHAPES[name], arr(rng("fn", name), (7, 5)), reduction=True)


def test_static_metadata_functions_return_python_values():
    seen = {}

    def fn(x):
        seen.update(shape=np.shape(x), ndim=np.ndim(x), size=np.size(x), axis=np.size(x, 1),
                    dtype=x.dtype, len=len(x), result=np.result_type(x, np.float64))
        return x * x.ndim

    check_jit(fn, arr(rng("static"), (7, 5)))
    assert seen == {"shape": (7, 5), "ndim": 2, "size": 35, "axis": 5,
                    "dtype": np.dtype(np.float32), "len": 7, "result": np.dtype(np.float64)}


def test_every_table_entry_is_exercised_by_these_tests():
    """Keeps this file in step with the table: each mapped callable appears above."""
    with open(__file__) as f:
        source = f.read()
    missing = [f for f in [*UFUNC_OPS, *LOGICAL_UFUNCS, *UFUNC_BUILDERS]
               if f"np.{f.__name__}" not in source and f"special.{f.__name__}" not in source]
    missing += [f for f in FUNCTIONS if f"np.{f.__name__}" not in source
                and f".{f.__name__}(" not in source]
    assert not missing, [getattr(f, "__name__", f) for f in missing]
