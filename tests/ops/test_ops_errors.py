"""Errors: every rejection is the right TilefuseError subclass, and its message names the op and
the input types. Random op applications never leak a bare Python exception."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from opcheck import array, infer, rng, run1, seeds

from tilefuse.dtypes import DType
from tilefuse.errors import AttrError, DTypeError, ShapeError, TilefuseError, UnknownOpError
from tilefuse.graph.builder import GraphBuilder
from tilefuse.graph.interpreter import interpret
from tilefuse.graph.types import TensorType
from tilefuse.ops import OPS, OpKind


def T(*shape, dtype=DType.f32) -> TensorType:
    return TensorType(tuple(shape), dtype)


F = DType.f32
CASES = [
    # (error, op, input types, attrs)
    (ShapeError, "add", [T(2, 3), T(4)], {}),
    (ShapeError, "where", [T(2, dtype=DType.bool), T(3), T(2)], {}),
    (ShapeError, "matmul", [T(2, 3), T(4, 5)], {}),
    (ShapeError, "matmul", [T(2, 2, 3), T(3, 3, 4)], {}),
    (ShapeError, "matmul", [T(), T(3)], {}),
    (ShapeError, "einsum", [T(2, 3), T(3, 4)], {"equation": "ij->ij"}),
    (ShapeError, "einsum", [T(2, 3), T(4, 5)], {"equation": "ij,jk->ik"}),
    (ShapeError, "einsum", [T(2, 3)], {"equation": "...i->i"}),
    (AttrError, "einsum", [T(2, 3)], {"equation": "i1->i"}),
    (AttrError, "einsum", [T(2, 3)], {"equation": "ij->iz"}),
    (AttrError, "einsum", [T(2, 3)], {"equation": "ij->ii"}),
    (ShapeError, "sum", [T(2, 3)], {"axes": (2,)}),
    (ShapeError, "sum", [T(2, 3)], {"axes": (1, -1)}),
    (ShapeError, "max", [T(0, 3)], {"axes": (0,)}),
    (ShapeError, "argmax", [T(2, 3)], {"axis": -3}),
    (ShapeError, "softmax", [T(2, 3)], {"axis": 2}),
    (ShapeError, "layer_norm", [T(2, 3), T(2), T(2)], {}),
    (ShapeError, "layer_norm", [T(2, 3), T(3), T(2)], {}),
    (ShapeError, "rms_norm", [T(3), T(2, 3)], {}),
    (ShapeError, "reshape", [T(2, 3)], {"shape": (4, 2)}),
    (ShapeError, "reshape", [T(2, 3)], {"shape": (4, -1)}),
    (AttrError, "reshape", [T(2, 3)], {"shape": (-1, -1)}),
    (AttrError, "reshape", [T(2, 3)], {"shape": (6, "x")}),
    (ShapeError, "transpose", [T(2, 3)], {"perm": (0, 0)}),
    (ShapeError, "transpose", [T(2, 3)], {"perm": (0,)}),
    (ShapeError, "broadcast_to", [T(2, 3)], {"shape": (3, 3)}),
    (ShapeError, "broadcast_to", [T(2, 3)], {"shape": (3,)}),
    (ShapeError, "squeeze", [T(2, 1)], {"axes": (0,)}),
    (ShapeError, "expand_dims", [T(2)], {"axes": (0, 0)}),
    (ShapeError, "slice", [T(5)], {"starts": (0,), "stops": (5,), "steps": (0,)}),
    (ShapeError, "slice", [T(5, 2)], {"starts": (0,), "stops": (5,), "steps": (1,)}),
    (ShapeError, "concat", [T(2, 3), T(3, 2)], {"axis": 0}),
    (ShapeError, "concat", [T(2, 3), T(2)], {"axis": 0}),
    (ShapeError, "stack", [T(2, 3), T(2, 4)], {}),
    (ShapeError, "split", [T(6, 2)], {"axis": 0, "sizes": (2, 3)}),
    (ShapeError, "pad", [T(2, 3)], {"pads": (1, 1)}),
    (AttrError, "pad", [T(2, 3)], {"pads": (1, 1, -1, 0)}),
    (ShapeError, "pad", [T(0, 3)], {"pads": (1, 1, 0, 0), "mode": "edge"}),
    (ShapeError, "take_along_axis", [T(2, 3), T(3, dtype=DType.i64)], {"axis": 0}),
    (ShapeError, "conv2d", [T(1, 3, 5, 5), T(2, 4, 3, 3)], {}),
    (ShapeError, "conv2d", [T(1, 3, 2, 2), T(2, 3, 3, 3)], {}),
    (ShapeError, "conv2d", [T(1, 4, 5, 5), T(3, 2, 3, 3)], {"groups": 2}),
    (ShapeError, "conv2d", [T(1, 3, 5, 5), T(2, 3, 3, 3), T(3)], {}),
    (ShapeError, "conv2d", [T(1, 3, 5, 5)], {}),
    (AttrError, "conv2d", [T(1, 3, 5, 5), T(2, 3, 3, 3)], {"stride": (0, 1)}),
    (AttrError, "conv2d", [T(1, 3, 5, 5), T(2, 3, 3, 3)], {"padding": (1, 1)}),
    (ShapeError, "max_pool2d", [T(1, 1, 5, 5)], {"kernel": (2, 2), "stride": (1, 1),
                                                 "padding": (2, 0, 0, 0)}),
    (ShapeError, "avg_pool2d", [T(5, 5)], {"kernel": (2, 2), "stride": (1, 1)}),
    (ShapeError, "add", [T(2), T(2), T(2)], {}),
    # attributes
    (AttrError, "add", [T(2), T(2)], {"alpha": 1}),
    (AttrError, "sum", [T(2)], {"axes": "0"}),
    (AttrError, "gelu", [T(2)], {"approximate": "fast"}),
    (AttrError, "transpose", [T(2)], {}),
    (AttrError, "clip", [T(2)], {"min": "zero"}),
    (AttrError, "pad", [T(2)], {"pads": (1, 1), "mode": "wrap"}),
    (AttrError, "arange", [], {"stop": 3.0, "step": 0.0, "dtype": DType.f32}),
    (AttrError, "full", [], {"shape": (2, -3), "value": 1.0, "dtype": DType.f32}),
    # dtypes
    (DTypeError, "neg", [T(2, dtype=DType.bool)], {}),
    (DTypeError, "sub", [T(2, dtype=DType.bool), T(2, dtype=DType.bool)], {}),
    (DTypeError, "matmul", [T(2, 2, dtype=DType.bool), T(2, 2, dtype=DType.bool)], {}),
    (DTypeError, "conv2d", [T(1, 1, 3, 3, dtype=DType.i32), T(1, 1, 1, 1, dtype=DType.i32)], {}),
    (DTypeError, "take", [T(3), T(2)], {"axis": 0}),
    (DTypeError, "softmax", [T(3, dtype=DType.i32)], {}),
    (DTypeError, "clip", [T(3, dtype=DType.bool)], {}),
]


@pytest.mark.parametrize("error,op,types,attrs", CASES,
                         ids=[f"{c[1]}-{i}" for i, c in enumerate(CASES)])
def test_rejections_name_op_and_inputs(error, op, types, attrs) -> None:
    with pytest.raises(error) as info:
        infer(op, types, attrs)
    err = info.value
    assert type(err) is error
    assert err.op == op and str(err).startswith(f"{op}: ")
    for t in types:
        assert str(t) in str(err), f"{t} not named in: {err}"


def test_unknown_op() -> None:
    with pytest.raises(UnknownOpError, match="frobnicate"):
        infer("frobnicate", [T(2)])


def test_runtime_errors_name_the_op() -> None:
    a = np.array([2, 3], dtype=np.int32)
    with pytest.raises(DTypeError, match=r"^pow: .*negative"):
        run1("pow", [a, np.array([1, -1], dtype=np.int32)])
    with pytest.raises(ShapeError, match=r"^take: .*out of range"):
        run1("take", [a, np.array([2])], {"axis": 0})


# ---- fuzz: never a bare exception -------------------------------------------------------------

_SIMPLE = sorted(n for n, op in OPS.items()
                 if op.kind in (OpKind.ELEMENTWISE, OpKind.REDUCTION) and op.arity in (1, 2, 3)
                 and n not in ("cast",))
_dims = st.lists(st.integers(0, 3), max_size=3).map(tuple)
_attr_values = st.one_of(st.none(), st.integers(-3, 3), st.booleans(), st.floats(-2, 2),
                         st.lists(st.integers(-3, 3), max_size=3).map(tuple),
                         st.sampled_from(["none", "tanh", "x"]))


@settings(max_examples=50, deadline=None)
@given(name=st.sampled_from(_SIMPLE), data=st.data(), seed=seeds)
def test_random_applications_raise_only_tilefuse_errors(name, data, seed) -> None:
    op = OPS[name]
    dtypes = st.sampled_from(list(DType))
    types = [TensorType(data.draw(_dims), data.draw(dtypes)) for _ in range(op.arity)]
    attrs = {spec.name: data.draw(_attr_values) for spec in op.attrs if data.draw(st.booleans())}
    b = GraphBuilder("fuzz")
    ins = [b.input(t, f"x{i}") for i, t in enumerate(types)]
    try:
        graph = b.build(b.add(name, ins, attrs))
        r = rng(seed)
        interpret(graph, *[array(r, t.shape, t.dtype) for t in types])
    except TilefuseError:
        pass

