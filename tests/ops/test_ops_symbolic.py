"""Shape rules on symbolic dims: what stays symbolic, what must be static, and graphs with
symbols interpreted on concrete inputs."""

from __future__ import annotations

import numpy as np
import pytest
from opcheck import array, infer, one_node_graph, rng

from tilefuse.dtypes import DType
from tilefuse.errors import ShapeError
from tilefuse.graph.interpreter import interpret
from tilefuse.graph.types import Sym, TensorType
from tilefuse.testing import assert_close

B, S, N = Sym("batch"), Sym("seq"), Sym("n")
BIG = 2**63 - 1


def T(*shape, dtype=DType.f32) -> TensorType:
    return TensorType(tuple(shape), dtype)


CASES = [
    ("add", [T(B, 7), T(7)], {}, [T(B, 7)]),
    ("add", [T(B, 1), T(1, S)], {}, [T(B, S)]),
    ("mul", [T(B, S), T(B, 1, dtype=DType.i32)], {}, [T(B, S, dtype=DType.f64)]),
    ("lt", [T(B, 7), T(1)], {}, [T(B, 7, dtype=DType.bool)]),
    ("where", [T(B, 1, dtype=DType.bool), T(1, S), T()], {}, [T(B, S)]),
    ("exp", [T(B, S, dtype=DType.i32)], {}, [T(B, S, dtype=DType.f64)]),
    ("matmul", [T(B, S, 64), T(64, 32)], {}, [T(B, S, 32)]),
    ("matmul", [T(B, S, 64), T(B, 64, S)], {}, [T(B, S, S)]),
    ("matmul", [T(N), T(B, N, 3)], {}, [T(B, 3)]),
    ("einsum", [T(B, 7, 5), T(5, 3)], {"equation": "bij,jk->bik"}, [T(B, 7, 3)]),
    ("reshape", [T(B, 12, 64)], {"shape": (B, 768)}, [T(B, 768)]),
    ("reshape", [T(B, 768)], {"shape": (B, 12, -1)}, [T(B, 12, 64)]),
    ("reshape", [T(B, 768)], {"shape": (-1, 12, 64)}, [T(B, 12, 64)]),
    ("reshape", [T(B, S, 768)], {"shape": (S, B, 768)}, [T(S, B, 768)]),
    ("sum", [T(B, S, 7)], {"axes": (1,), "keepdims": True}, [T(B, 1, 7)]),
    ("sum", [T(B, S, 7)], {"axes": (1,)}, [T(B, 7)]),
    ("mean", [T(B, S, 7, dtype=DType.i8)], {"axes": None}, [T(dtype=DType.f64)]),
    ("argmax", [T(B, 7)], {"axis": -1}, [T(B, dtype=DType.i64)]),
    ("softmax", [T(B, S, 7)], {}, [T(B, S, 7)]),
    ("layer_norm", [T(B, S, 768), T(768), T(768)], {}, [T(B, S, 768)]),
    ("transpose", [T(B, S, 64)], {"perm": (1, 0, 2)}, [T(S, B, 64)]),
    ("broadcast_to", [T(1, 7)], {"shape": (B, 7)}, [T(B, 7)]),
    ("broadcast_to", [T(B, 1)], {"shape": (7, 5)}, [T(7, 5)]),
    ("expand_dims", [T(B, 7)], {"axes": (1,)}, [T(B, 1, 7)]),
    ("squeeze", [T(B, 1, 7)], {"axes": (1,)}, [T(B, 7)]),
    ("slice", [T(B, 7)], {"starts": (0, 1), "stops": (BIG, 7), "steps": (1, 2)}, [T(B, 3)]),
    ("slice", [T(B, 7)], {"starts": (-1, 0), "stops": (-BIG, 7), "steps": (-1, 1)}, [T(B, 7)]),
    ("concat", [T(B, 3), T(B, 4)], {"axis": 1}, [T(B, 7)]),
    ("stack", [T(B, 3), T(B, 3)], {"axis": -1}, [T(B, 3, 2)]),
    ("split", [T(B, 12)], {"axis": 1, "sizes": (4, 8)}, [T(B, 4), T(B, 8)]),
    ("pad", [T(B, 5)], {"pads": (0, 0, 1, 2)}, [T(B, 8)]),
    ("take", [T(100, 64), T(B, S, dtype=DType.i64)], {"axis": 0}, [T(B, S, 64)]),
    ("take_along_axis", [T(B, 7), T(B, 2, dtype=DType.i32)], {"axis": 1}, [T(B, 2)]),
    ("full", [], {"shape": (B, 3), "value": 1.0, "dtype": DType.f16}, [T(B, 3, dtype=DType.f16)]),
    ("conv2d", [T(B, 3, 32, 32), T(8, 3, 3, 3)], {}, [T(B, 8, 30, 30)]),
    ("conv2d", [T(B, 3, S, N), T(8, 3, 1, 1)], {}, [T(B, 8, S, N)]),
    ("max_pool2d", [T(B, 3, 8, 8)], {"kernel": (2, 2), "stride": (2, 2)}, [T(B, 3, 4, 4)]),
]


@pytest.mark.parametrize("op,types,attrs,expected", CASES,
                         ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
def test_symbolic_shape_rules(op, types, attrs, expected) -> None:
    assert list(infer(op, types, attrs)) == expected


REJECTED = [
    ("matmul", [T(B, N), T(64, 3)], {}, "contraction dims differ"),
    ("add", [T(B, 3), T(S, 4)], {}, "do not broadcast"),
    ("reshape", [T(B, S, 768)], {"shape": (-1, 768)}, "cannot infer"),
    ("reshape", [T(B, 768)], {"shape": (S, 768)}, "cannot reshape"),
    ("concat", [T(B, 3), T(B, 3)], {"axis": 0}, "static"),
    ("slice", [T(B, 7)], {"starts": (1, 0), "stops": (BIG, 7), "steps": (1, 1)}, "static"),
    ("pad", [T(B, 5)], {"pads": (1, 0, 0, 0)}, "static"),
    ("squeeze", [T(B, 1)], {"axes": None}, "static"),
    ("broadcast_to", [T(7)], {"shape": (B,)}, "cannot broadcast"),
    ("conv2d", [T(1, 3, S, 8), T(8, 3, 3, 3)], {}, "static"),
    ("stack", [T(B, 3), T(S, 3)], {}, "equal shapes"),
]


@pytest.mark.parametrize("op,types,attrs,message", REJECTED,
                         ids=[f"{c[0]}-{i}" for i, c in enumerate(REJECTED)])
def test_symbolic_rejections(op, types, attrs, message) -> None:
    with pytest.raises(ShapeError, match=message):
        infer(op, types, attrs)


def test_symbolic_graphs_run_on_concrete_inputs() -> None:
    r = rng("symbolic-run")
    for batch in (1, 7):
        x, y = array(r, (batch, 7), DType.f32), array(r, (7,), DType.f32)
        (got,) = interpret(one_node_graph("add", [T(B, 7), T(7)]), x, y)
        assert_close(got, x + y)

        h = array(r, (batch, 12, 64), DType.f32)
        (got,) = interpret(one_node_graph("reshape", [T(B, 12, 64)], {"shape": (B, 768)}), h)
        assert_close(got, h.reshape(batch, 768))

        a, w = array(r, (batch, 5, 64), DType.f32), array(r, (64, 32), DType.f32)
        (got,) = interpret(one_node_graph("matmul", [T(B, S, 64), T(64, 32)]), a, w)
        assert_close(got, a @ w, reduction=True)

        (got,) = interpret(one_node_graph("sum", [T(B, S, 64)], {"axes": (1,), "keepdims": True}),
                           a)
        assert_close(got, a.sum(axis=1, keepdims=True), reduction=True)



def test_references_resolve_symbols_from_their_input_or_say_why_not() -> None:
    b = array(rng("bcast"), (7, 1), DType.f32)
    (got,) = interpret(one_node_graph("broadcast_to", [T(B, 1)], {"shape": (B, 5)}), b)
    assert_close(got, np.broadcast_to(b, (7, 5)))
    # broadcasting a size-1 dim to a symbol: the reference cannot know the symbol's size unless
    # its caller substitutes bound sizes into the attributes; it says so instead of guessing.
    graph = one_node_graph("broadcast_to", [T(1, 5)], {"shape": (B, 5)})
    with pytest.raises(ShapeError, match=r"^broadcast_to: .*symbol 'batch'"):
        interpret(graph, array(rng("bcast2"), (1, 5), DType.f32))
