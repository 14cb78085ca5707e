"""Native movement kernels (kernel/lower_movement.py) against the reference interpreter, through
the whole native build: each op runs with no host fallback, on odd shapes and several dtypes."""

from __future__ import annotations

import numpy as np
import pytest

from tilefuse.dtypes import DType
from tilefuse.graph.builder import GraphBuilder
from tilefuse.graph.interpreter import interpret
from tilefuse.graph.ir import Graph
from tilefuse.kernel.fusion import KernelGroup, KernelKind, form_kernels
from tilefuse.kernel.lower_movement import MOVEMENT_MIN_ELEMENTS, lower_movement
from tilefuse.runtime.native import NativeExecutable, build_native
from tilefuse.testing import assert_close, random_array

F32, I64, BOOL = DType.f32, DType.i64, DType.bool
DTYPES = [F32, I64, BOOL]


def one_op(op: str, shapes: list[tuple[int, ...]], dtype: DType, attrs: dict,
           outputs: int = 1) -> Graph:
    builder = GraphBuilder(op)
    xs = [builder.input((shape, dtype), f"x{i}") for i, shape in enumerate(shapes)]
    return builder.build(list(builder.add(op, xs, attrs))[:outputs] if outputs > 1
                         else [builder.add1(op, xs, attrs)])


def check(graph: Graph, seed: int = 0) -> NativeExecutable:
    """Runs natively (no host fallback) and with the interpreter on fresh inputs; compares."""
    exe = build_native(graph)
    assert exe.fallbacks == []
    rng = np.random.default_rng(seed)
    arrays = [random_array(rng, tuple(v.shape), v.dtype) for v in graph.inputs]
    expected = interpret(graph, *arrays)
    got = exe(*arrays)
    assert len(got) == len(expected)
    for g, e in zip(got, expected, strict=True):
        assert g.shape == e.shape and g.dtype == e.dtype
        assert_close(g, e)
    return exe


def movement_groups(graph: Graph) -> list[KernelGroup]:
    return [g for g in form_kernels(graph).groups if g.kind is KernelKind.MOVEMENT]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape,axis", [((1, 1), 0), ((7, 5), 1), ((7, 5), 0), ((3, 513), 1),
                                        ((2, 7, 3), 2), ((513,), 0)])
def test_concat(shape, axis, dtype):
    other = tuple(d + 2 if a == axis else d for a, d in enumerate(shape))
    graph = one_op("concat", [shape, other, shape], dtype, {"axis": axis})
    check(graph)
    assert len(movement_groups(graph)) == 1


def test_concat_promotes_dtypes():
    builder = GraphBuilder("cat")
    a = builder.input(((7, 5), DType.i32), "a")
    b = builder.input(((7, 3), F32), "b")
    c = builder.input(((7, 1), BOOL), "c")
    check(builder.build([builder.add1("concat", [a, b, c], {"axis": 1})]))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape,starts,stops,steps", [
    ((7, 513), (1, 3), (6, 500), (1, 1)),
    ((7, 513), (-1, 512), (-8, 0), (-2, -3)),
    ((7, 513), (0, 5), (7, 400), (3, 7)),
    ((1, 7), (0, -1), (1, -2**62), (1, -1)),
    ((5, 4, 7), (4, 0, 2), (0, 4, 7), (-1, 2, 1)),
])
def test_slice(shape, starts, stops, steps, dtype):
    check(one_op("slice", [shape], dtype, {"starts": starts, "stops": stops, "steps": steps}))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("mode", ["constant", "edge", "reflect"])
@pytest.mark.parametrize("shape,pads", [((7, 5), (1, 2, 3, 0)), ((1, 513), (2, 0, 1, 3)),
                                        ((7,), (0, 0)), ((3, 4, 5), (1, 1, 0, 2, 2, 1)),
                                        ((3, 3), (5, 7, 4, 9))])
def test_pad(shape, pads, mode, dtype):
    if mode == "reflect" and any(d == 1 and (pads[2 * a] or pads[2 * a + 1])
                                 for a, d in enumerate(shape)):
        pytest.skip("np.pad reflects a length-1 axis as edge; covered by edge")
    check(one_op("pad", [shape], dtype, {"pads": pads, "mode": mode, "value": 1.5}))


def test_pad_constant_value_is_cast_like_the_reference():
    check(one_op("pad", [(7, 3)], I64, {"pads": (1, 1, 2, 2), "mode": "constant",
                                        "value": -2.7}))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape,axis,sizes", [((7, 513), 1, (1, 500, 12)), ((7, 5), 0, (3, 4)),
                                              ((1, 7, 3), 2, (1, 1, 1))])
def test_split(shape, axis, sizes, dtype):
    graph = one_op("split", [shape], dtype, {"axis": axis, "sizes": sizes},
                   outputs=len(sizes))
    check(graph)
    assert len(movement_groups(graph)) == 1


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape,axis", [((7, 5), 0), ((7, 5), 1), ((7, 5), 2), ((513,), 1),
                                        ((1,), 0)])
def test_stack(shape, axis, dtype):
    check(one_op("stack", [shape, shape, shape], dtype, {"axis": axis}))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("op,shape,attrs", [
    ("transpose", (7, 513), {"perm": (1, 0)}),
    ("transpose", (3, 7, 5), {"perm": (2, 0, 1)}),
    ("transpose", (3, 7, 5), {"perm": (1, 0, 2)}),
    ("reshape", (7, 6), {"shape": (3, -1, 2)}),
    ("broadcast_to", (7, 1), {"shape": (3, 7, 513)}),
    ("broadcast_to", (1, 5), {"shape": (7, 5)}),
    ("expand_dims", (7, 5), {"axes": (0, 2)}),
    ("squeeze", (7, 1, 5), {"axes": (1,)}),
])
def test_layout_ops(op, shape, attrs, dtype):
    check(one_op(op, [shape], dtype, attrs))


def test_large_copies_run_across_threads():
    """From 16 Ki elements per thread (MOVEMENT_MIN_ELEMENTS) a piece's copy loop is parallel,
    and still exact: ShuffleNet's concat of four [3136, 28] pieces is; a 16 Ki piece is not."""
    assert MOVEMENT_MIN_ELEMENTS == 16 * 1024
    small = one_op("concat", [(128, 64), (128, 64)], F32, {"axis": 1})
    (group,) = movement_groups(small)
    assert "parallel" not in str(lower_movement(group))
    for graph in (one_op("concat", [(600, 513), (600, 511)], F32, {"axis": 1}),
                  one_op("concat", [(3136, 28)] * 4, F32, {"axis": 1}),
                  one_op("pad", [(1, 300000)], F32, {"pads": (0, 0, 5, 3), "mode": "edge",
                                                     "value": 0.0})):
        check(graph)
        (group,) = movement_groups(graph)
        assert "parallel" in str(lower_movement(group))


def test_take_runs_natively():
    builder = GraphBuilder("take")
    x = builder.input(((7, 5), F32), "x")
    idx = builder.add1("constant", [], {"value": np.array([4, 0, 2], dtype=np.int64)})
    graph = builder.build([builder.add1("take", [builder.add1("exp", [x]), idx],
                                        {"axis": 1})])
    exe = build_native(graph)
    assert exe.fallbacks == []  # kernel/lower_gather.py
    xv = random_array(np.random.default_rng(3), (7, 5), F32)
    assert_close(exe(xv)[0], interpret(graph, xv)[0])


@pytest.mark.parametrize("n", [1, 7, 513])
def test_movement_and_elementwise_is_one_native_entry(n):
    builder = GraphBuilder("mixed")
    x = builder.input(((n, 5), F32), "x")
    y = builder.input(((n, 3), F32), "y")
    cat = builder.add1("concat", [builder.add1("exp", [x]), y], {"axis": 1})
    padded = builder.add1("pad", [cat], {"pads": (1, 0, 2, 2), "mode": "reflect"})
    out = builder.add1("tanh", [builder.add1("slice", [padded], {
        "starts": (0, 1), "stops": (n + 1, 12), "steps": (1, 2)})])
    graph = builder.build([out])
    exe = check(graph, seed=n)
    assert exe.single_entry and movement_groups(graph)
