"""Index-driven kernels (kernel/lower_gather.py) run natively with no host step: take (any axis,
embedding rows, index arrays of any rank, i32/i64 indices, negative indices), take_along_axis,
scatter_elements and scatter_nd (every reduction, repeated indices: the last update wins),
topk (largest and smallest, ties by position, NaN above every number); in f32, f64, f16, i32,
i64 and bool, on odd shapes, against the reference interpreter. An out-of-range index raises
the reference's ShapeError after the call (never a read or write outside a buffer) and the
executable stays usable."""

from __future__ import annotations

import numpy as np
import pytest

from tilefuse.dtypes import DType
from tilefuse.errors import ShapeError
from tilefuse.graph.builder import GraphBuilder
from tilefuse.graph.interpreter import interpret
from tilefuse.graph.ir import Graph
from tilefuse.runtime.native import NativeExecutable
from tilefuse.testing import assert_close, random_array

F32, F64, F16, I32, I64, BOOL = (DType.f32, DType.f64, DType.f16, DType.i32, DType.i64,
                                 DType.bool)
DTYPES = [F32, F64, F16, I32, I64, BOOL]


def run(graph: Graph, arrays: list[np.ndarray]) -> NativeExecutable:
    exe = NativeExecutable(graph)
    assert exe.fallbacks == []
    for got, want in zip(exe(*arrays), interpret(graph, *arrays), strict=True):
        assert_close(got, want)
    return exe


def one_op(op: str, inputs: list[tuple[tuple[int, ...], DType]], attrs: dict,
           outputs: int = 1) -> Graph:
    b = GraphBuilder(op)
    values = [b.input(t, f"a{i}") for i, t in enumerate(inputs)]
    return b.build(list(b.add(op, values, attrs))[:outputs] if outputs > 1
                   else [b.add1(op, values, attrs)])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape,axis,idx_shape", [
    ((7, 5, 3), 1, (2, 4)), ((100, 64), 0, (9,)), ((33, 17), -1, (5, 3)), ((4, 3), 0, ()),
    ((1000, 35), 0, (3, 129))])
def test_take(dtype, shape, axis, idx_shape):
    rng = np.random.default_rng()
    n = shape[axis]
    for idx_dtype in (I32, I64):
        graph = one_op("take", [(shape, dtype), (idx_shape, idx_dtype)], {"axis": axis})
        idx = rng.integers(-n, n, idx_shape).astype(idx_dtype.np)
        run(graph, [random_array(rng, shape, dtype), idx])


@pytest.mark.parametrize("dtype", [F32, I64, BOOL])
def test_take_along_axis_with_broadcast_indices(dtype):
    rng = np.random.default_rng()
    for shape, axis, idx_shape in [((6, 5), 1, (6, 3)), ((4, 7, 5), 0, (9, 1, 5)),
                                   ((3, 8), -1, (3, 8))]:
        graph = one_op("take_along_axis", [(shape, dtype), (idx_shape, I64)], {"axis": axis})
        n = shape[axis]
        run(graph, [random_array(rng, shape, dtype), rng.integers(-n, n, idx_shape)])


@pytest.mark.parametrize("reduction", ["none", "add", "mul", "max", "min"])
@pytest.mark.parametrize("dtype", [F32, F64, I32, BOOL])
def test_scatters(reduction, dtype):
    rng = np.random.default_rng()
    graph = one_op("scatter_elements", [((6, 5), dtype), ((4, 5), I64), ((4, 5), dtype)],
                   {"axis": 0, "reduction": reduction})
    idx = rng.integers(-6, 6, (4, 5))  # repeated indices: the last (or every) update counts
    run(graph, [random_array(rng, (6, 5), dtype), idx, random_array(rng, (4, 5), dtype)])
    graph = one_op("scatter_nd", [((6, 5, 4), dtype), ((7, 2), I64), ((7, 4), dtype)],
                   {"reduction": reduction})
    idx = np.stack([rng.integers(-6, 6, 7), rng.integers(-5, 5, 7)], 1)
    run(graph, [random_array(rng, (6, 5, 4), dtype), idx, random_array(rng, (7, 4), dtype)])


@pytest.mark.parametrize("dtype", [F32, F64, F16, I32, I64])
@pytest.mark.parametrize("largest", [True, False])
def test_topk(dtype, largest):
    rng = np.random.default_rng()
    for shape, axis, k in [((7, 9, 3), 1, 4), ((5, 37), -1, 37), ((11,), 0, 1), ((3, 4), 0, 0)]:
        graph = one_op("topk", [(shape, dtype)], {"k": k, "axis": axis, "largest": largest},
                       outputs=2)
        x = rng.integers(-3, 3, shape).astype(dtype.np)  # many ties
        if dtype.is_float and len(shape) > 1:
            x.flat[[0, 5, 7]] = np.nan
        run(graph, [x])


def test_out_of_range_indices_raise_and_never_touch_memory_outside():
    rng = np.random.default_rng(2)
    cases = [
        ("take", [((7, 5), F32), ((3,), I64)], {"axis": 1}, [0, 5, 1], "axis 1 of size 5"),
        ("take", [((7, 5), F32), ((3,), I32)], {"axis": 0}, [-8, 0, 1], "index -8"),
        ("take_along_axis", [((4, 5), F32), ((4, 1), I64)], {"axis": 1}, [[0], [1], [9], [2]],
         "index 9"),
        ("scatter_elements", [((4, 5), F32), ((1, 5), I64), ((1, 5), F32)],
         {"axis": 0, "reduction": "none"}, [[0, 1, 2, 3, 1 << 40]], "index 1099511627776"),
    ]
    for op, inputs, attrs, bad, message in cases:
        graph = one_op(op, inputs, attrs)
        exe = NativeExecutable(graph)
        assert exe.fallbacks == []
        arrays = [random_array(rng, s, t) for s, t in inputs]
        arrays[1] = np.array(bad, dtype=inputs[1][1].np)
        with pytest.raises(ShapeError, match=message):
            exe(*arrays)
        with pytest.raises(ShapeError):  # the reference says the same
            interpret(graph, *arrays)
        arrays[1] = np.zeros_like(arrays[1])
        for got, want in zip(exe(*arrays), interpret(graph, *arrays)):
            assert_close(got, want)


def test_embedding_lookup_through_jit():
    import tilefuse

    def embed(table, ids, pos):
        return np.take(table, ids, axis=0) + pos

    rng = np.random.default_rng()
    table = rng.standard_normal((1000, 96)).astype(np.float32)
    ids = rng.integers(-1000, 1000, (2, 17))
    pos = rng.standard_normal((17, 96)).astype(np.float32)
    f = tilefuse.jit(embed)
    np.testing.assert_allclose(f(table, ids, pos), embed(table, ids, pos), rtol=1e-6)
    exe = f.lower(table, ids, pos).executable
    assert exe is not None and exe.fallbacks == []


def test_take_along_the_last_axis_checks_each_index_once():
    """Single elements along the last axis: the indices are wrapped, checked and clamped once
    into a local, and the rows read through it without a branch; out-of-range indices still
    raise after the call."""
    from tilefuse.kernel.fusion import form_kernels
    from tilefuse.kernel.lower_gather import lower_gather
    from tilefuse.loop import Local, format_function
    from tilefuse.loop.ir import If, walk_stmts

    rng = np.random.default_rng(11)
    graph = one_op("take", [((9, 37), F32), ((13,), I32)], {"axis": -1})
    (group,) = form_kernels(graph).groups
    fn = lower_gather(group)
    locals_ = [s for s in walk_stmts(fn.body) if isinstance(s, Local)]
    assert [s.count for s in locals_] == [13], format_function(fn)
    assert sum(isinstance(s, If) for s in walk_stmts(fn.body)) == 1   # the one check loop
    exe = run(graph, [random_array(rng, (9, 37), F32),
                      rng.integers(-37, 37, 13).astype(np.int32)])
    bad = np.arange(13, dtype=np.int32)
    bad[7] = 37
    with pytest.raises(ShapeError, match="index 37"):
        exe(random_array(rng, (9, 37), F32), bad)
