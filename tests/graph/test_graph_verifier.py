"""The verifier: graphs broken on purpose (built from Graph/Node directly) raise VerifyError."""

from __future__ import annotations

import numpy as np
import pytest

from tilefuse.dtypes import DType
from tilefuse.errors import SourceLoc, VerifyError
from tilefuse.graph.builder import GraphBuilder
from tilefuse.graph.ir import Attrs, Graph, Node, Value
from tilefuse.graph.types import Sym, TensorType
from tilefuse.graph.verifier import verify
from tilefuse.ops import get_op

F32 = TensorType((2, 3), DType.f32)


def node(op: str, inputs, outputs, attrs=None, loc=None) -> Node:
    return Node(get_op(op), tuple(inputs), Attrs(attrs or {}), tuple(outputs), loc)


def test_graphs_from_the_builder_verify(graph_factory):
    for seed in range(10):
        verify(graph_factory(np.random.default_rng(seed), 12))
    b = GraphBuilder("sym")
    x = b.input(((Sym("n"), 3), DType.bf16), "x")
    verify(b.build([b.add1("gelu", [x])]))


def test_use_before_definition():
    x, a, c = Value(F32, "x"), Value(F32), Value(F32)
    graph = Graph("g", (x,), (node("neg", [a], [c]), node("exp", [x], [a])), (c,))
    with pytest.raises(VerifyError, match=r"node #0: input 0 is used before its definition "
                                          r"by node #1"):
        verify(graph)


def test_use_of_a_value_never_defined():
    x, stray, out = Value(F32, "x"), Value(F32), Value(F32)
    graph = Graph("g", (x,), (node("add", [x, stray], [out]),), (out,))
    with pytest.raises(VerifyError, match=r"input 1 .* is never defined") as info:
        verify(graph)
    assert info.value.op == "add" and info.value.inputs == ("f32[2,3]", "f32[2,3]")


def test_duplicate_definition():
    x, a = Value(F32, "x"), Value(F32)
    graph = Graph("g", (x,), (node("neg", [x], [a]), node("exp", [x], [a])), (a,))
    with pytest.raises(VerifyError, match=r"node #1: output 0 redefines %0"):
        verify(graph)


def test_node_redefining_a_graph_input():
    x = Value(F32, "x")
    graph = Graph("g", (x,), (node("neg", [x], [x]),), (x,))
    with pytest.raises(VerifyError, match="redefines %x"):
        verify(graph)


def test_wrong_output_type_names_op_and_location():
    x, a = Value(F32, "x"), Value(TensorType((2, 3), DType.f16))
    loc = SourceLoc("model.py", 7)
    graph = Graph("g", (x,), (node("exp", [x], [a], loc=loc),), (a,))
    with pytest.raises(VerifyError, match=r"output types f16\[2,3\] differ from the inferred "
                                          r"f32\[2,3\]") as info:
        verify(graph)
    assert info.value.op == "exp" and info.value.loc == loc
    assert "model.py:7" in str(info.value)


def test_wrong_output_count():
    x, a, b = Value(F32, "x"), Value(F32), Value(F32)
    graph = Graph("g", (x,), (node("neg", [x], [a, b]),), (a,))
    with pytest.raises(VerifyError, match="differ from the inferred"):
        verify(graph)


def test_dangling_output():
    x, a = Value(F32, "x"), Value(F32)
    graph = Graph("g", (x,), (node("neg", [x], [a]),), (a, Value(F32)))
    with pytest.raises(VerifyError, match=r"graph output 1 .* never defined"):
        verify(graph)


def test_inputs_must_be_unique_values_with_unique_identifier_names():
    x = Value(F32, "x")
    with pytest.raises(VerifyError, match=r"input 1 repeats input 0 \(%x\)"):
        verify(Graph("g", (x, x), (), (x,)))
    with pytest.raises(VerifyError, match="two graph inputs are named 'x'"):
        verify(Graph("g", (x, Value(F32, "x")), (), (x,)))
    with pytest.raises(VerifyError, match="not an identifier"):
        verify(Graph("g", (Value(F32, "a b"),), (), ()))


def test_attributes_must_validate():
    x, a = Value(F32, "x"), Value(F32)
    with pytest.raises(VerifyError, match="unknown attribute 'alpha'"):
        verify(Graph("g", (x,), (node("neg", [x], [a], {"alpha": 1}),), (a,)))
    with pytest.raises(VerifyError, match="must be one of"):
        verify(Graph("g", (x,), (node("gelu", [x], [a], {"approximate": "x"}),), (a,)))
    # gelu without its defaulted attribute: valid once filled in, but not in validated form
    with pytest.raises(VerifyError, match="not in the validated form"):
        verify(Graph("g", (x,), (node("gelu", [x], [a]),), (a,)))


def test_wrong_arity_is_a_verify_error():
    x, a = Value(F32, "x"), Value(F32)
    with pytest.raises(VerifyError, match="expects 2 inputs, got 1"):
        verify(Graph("g", (x,), (node("add", [x], [a]),), (a,)))


def test_garbage_is_a_verify_error_not_a_crash():
    x = Value(F32, "x")
    with pytest.raises(VerifyError):
        verify(Graph("g", (x,), ("not a node",), (x,)))  # type: ignore[arg-type]
    with pytest.raises(VerifyError):
        verify(Graph("g", (x, 3), (), (x,)))  # type: ignore[arg-type]
    with pytest.raises(VerifyError):
        verify("graph")  # type: ignore[arg-type]
