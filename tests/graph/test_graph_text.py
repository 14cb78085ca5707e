"""The graph text format: exact printed form, and print → parse → print round trips."""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tilefuse.dtypes import DType
from tilefuse.errors import ParseError, SourceLoc, VerifyError
from tilefuse.graph.builder import GraphBuilder
from tilefuse.graph.ir import Graph, Literal, structurally_equal
from tilefuse.graph.parser import parse_attr_value, parse_graph
from tilefuse.graph.printer import (
    SMALL_LITERAL_ELEMENTS,
    format_attr_value,
    format_loc,
    parse_loc_comment,
    print_graph,
)
from tilefuse.graph.types import Sym
from tilefuse.graph.verifier import verify
from tilefuse.ops import OpDef, OpKind
from tilefuse.ops.rules import same_dtype, same_shape


def round_trip(graph: Graph) -> Graph:
    back = parse_graph(print_graph(graph))
    assert structurally_equal(back, graph), print_graph(back)
    return back


def test_prints_the_documented_form():
    b = GraphBuilder("ffn")
    x = b.input(((4, 6), DType.f32), "x")
    bias = b.input(((6,), DType.f32), "bias")
    h = b.add1("add", [x, bias], loc=SourceLoc("model.py", 12, "forward"))
    g = b.add1("gelu", [h], {"approximate": "none"})
    lo, _ = b.add("split", [g], {"axis": 1, "sizes": (2, 4)})
    text = print_graph(b.build([g, lo]))
    assert text == (
        "graph @ffn(%x: f32[4,6], %bias: f32[6]) -> (f32[4,6], f32[4,2]) {\n"
        "  %0 = add(%x, %bias) : f32[4,6]  # model.py:12 in forward\n"
        '  %1 = gelu(%0) {approximate="none"} : f32[4,6]\n'
        "  %2, %3 = split(%1) {axis=1, sizes=[2,4]} : f32[4,2], f32[4,4]\n"
        "  return %1, %2\n"
        "}\n")


def test_single_result_prints_bare_and_locations_can_be_left_out():
    b = GraphBuilder("g")
    x = b.input(((Sym("batch"), 3), DType.bf16), "x")
    y = b.add1("neg", [x], loc=SourceLoc("m.py", 3))
    text = print_graph(b.build([y]), locations=False)
    assert text.splitlines()[0] == "graph @g(%x: bf16[batch,3]) -> bf16[batch,3] {"
    assert "#" not in text


def test_unnamed_and_clashing_inputs_get_arg_names():
    b = GraphBuilder("g")
    a = b.input(((2,), DType.f32))
    c = b.input(((2,), DType.f32), "arg0")
    d = b.input(((2,), DType.f32), "not an identifier")
    graph = b.build([b.add1("add", [a, b.add1("add", [c, d])])])
    head = print_graph(graph).splitlines()[0]
    assert head.startswith("graph @g(%arg0_1: f32[2], %arg0: f32[2], %arg2: f32[2])")
    back = parse_graph(print_graph(graph))
    assert [v.name for v in back.inputs] == ["arg0_1", "arg0", "arg2"]


def test_odd_graph_names_and_empty_graphs_round_trip():
    b = GraphBuilder('<lambda> "q"')
    graph = b.build([])
    assert print_graph(graph) == 'graph @"<lambda> \\"q\\""() -> () {\n  return\n}\n'
    assert parse_graph(print_graph(graph)).name == '<lambda> "q"'


def test_every_attribute_kind_round_trips():
    b = GraphBuilder("attrs")
    x = b.input(((Sym("batch"), 6), DType.f32), "x")
    b.add1("gelu", [x], {"approximate": "tanh"})                             # str
    b.add1("cast", [x], {"dtype": DType.bf16})                               # dtype
    b.add1("sum", [x], {"axes": (1,), "keepdims": True})                     # ints, bool
    b.add1("sum", [x], {"axes": None})                                       # none
    b.add1("reshape", [x], {"shape": (Sym("batch"), 2, -1)})                 # syms, negative
    b.add("split", [x], {"axis": -1, "sizes": (1, 5)})                       # multi-output
    for value in (math.inf, -math.inf, math.nan, -0.0, 1e-300, 0.1):
        b.add1("full", [], {"shape": (2,), "value": value, "dtype": DType.f64})  # floats
    graph = b.build([x])
    back = round_trip(graph)
    assert "value=-inf" in print_graph(back) and "value=nan" in print_graph(back)


def _literal_graph(array: np.ndarray) -> Graph:
    b = GraphBuilder("lit")
    return b.build([b.add1("constant", [], {"value": array})])


def _bit_patterns(rng: np.random.Generator, dtype: DType, shape: tuple[int, ...]) -> np.ndarray:
    """Arbitrary bit patterns: NaNs with payloads, infinities, subnormals, -0.0."""
    raw = rng.integers(0, 256, size=math.prod(shape) * dtype.itemsize, dtype=np.uint8)
    if dtype is DType.bool:
        return (raw % 2).astype(bool).reshape(shape)
    return raw.view(dtype.np).reshape(shape)


@pytest.mark.parametrize("dtype", list(DType))
@pytest.mark.parametrize("shape", [(3,), (2, 3), (0,), (2, 0, 1), (SMALL_LITERAL_ELEMENTS + 1,)])
def test_constants_of_every_dtype_round_trip_bit_exactly(dtype, shape):
    rng = np.random.default_rng(abs(hash((dtype.value, shape))) % 2**32)
    array = _bit_patterns(rng, dtype, shape)
    back = round_trip(_literal_graph(array))
    lit = back.nodes[0].attrs["value"]
    assert lit.array.dtype == dtype.np and lit.array.shape == shape
    assert lit.array.tobytes() == array.tobytes()


def test_small_constants_print_as_readable_values():
    text = print_graph(_literal_graph(np.array([[1.5, -np.inf], [np.nan, 0.1]], np.float32)))
    assert "array<f32[2,2]>[[1.5,-inf],[nan,0.1]]" in text
    bf = np.array([0.1, 3.0], dtype=ml_dtypes.bfloat16)
    assert "array<bf16[2]>[0.10009765625,3.0]" in print_graph(_literal_graph(bf))
    assert "array<bool[2]>[true,false]" in print_graph(_literal_graph(np.array([True, False])))
    big = np.arange(SMALL_LITERAL_ELEMENTS + 1, dtype=np.int32)
    assert 'b64("' in print_graph(_literal_graph(big))


def test_elided_constants_print_their_digest():
    array = np.arange(20, dtype=np.int16)
    graph = _literal_graph(array)
    text = print_graph(graph, elide_constants_over=10)
    assert f'array<i16[20]>elided("{Literal(array).digest}")' in text
    assert "elided" not in print_graph(graph, elide_constants_over=20)


def test_source_locations_are_read_back():
    locs = [SourceLoc("model.py", 12, "forward"), SourceLoc("/a b/c.py", 1),
            SourceLoc("we:ird\nname.py", 7, "f"), SourceLoc("x.py", -1, "<lambda>")]
    b = GraphBuilder("g")
    x = b.input(((2,), DType.f32), "x")
    v = x
    for loc in locs:
        v = b.add1("neg", [v], loc=loc)
    back = round_trip(b.build([v]))
    assert [n.loc for n in back.nodes] == locs


def test_plain_comments_are_ignored():
    text = """# a graph
    graph @g(%x: f32[2]) -> f32[2] {  # header
      %0 = neg(%x) : f32[2]  # TODO: not a location
      %y = exp(%0) : f32[2]
      return %y  # done
    }  # end"""
    graph = parse_graph(text)
    assert [n.loc for n in graph.nodes] == [None, None]
    assert [n.op.name for n in graph.nodes] == ["neg", "exp"]


@pytest.mark.parametrize("loc", [SourceLoc("model.py", 3), SourceLoc("p:q.py", 4, "f g")])
def test_location_comments_read_back(loc):
    assert parse_loc_comment(format_loc(loc)) == loc


# ---- attribute values, one at a time ----------------------------------------------------------

_names = st.text(min_size=1, max_size=8)
_scalars = (st.integers(-(2**70), 2**70) | st.floats(allow_nan=True) | st.text(max_size=12)
            | st.booleans() | st.none() | st.sampled_from(list(DType)) | _names.map(Sym))
_values = st.recursive(_scalars, lambda inner: st.lists(inner, max_size=4).map(tuple),
                       max_leaves=12)


@settings(max_examples=50, deadline=None)
@given(_values)
def test_attribute_values_round_trip(value):
    text = format_attr_value(value)
    back = parse_attr_value(text)
    assert format_attr_value(back) == text
    assert type(back) is type(value)


@settings(max_examples=30, deadline=None)
@given(st.sampled_from(list(DType)), st.lists(st.integers(0, 3), max_size=3),
       st.integers(0, 2**32 - 1))
def test_array_values_round_trip(dtype, shape, seed):
    array = _bit_patterns(np.random.default_rng(seed), dtype, tuple(shape))
    back = parse_attr_value(format_attr_value(Literal(array)))
    assert isinstance(back, Literal)
    assert back.array.tobytes() == array.tobytes() and back.type == Literal(array).type


def test_random_graphs_round_trip(graph_factory):
    for seed in range(20):
        round_trip(graph_factory(np.random.default_rng(seed), 15))


# ---- the suite-wide round-trip fixture (tests/conftest.py) ---------------------------------------


def test_the_round_trip_fixture_fails_loudly_on_graphs_the_text_cannot_express():
    unregistered = OpDef("not_registered", OpKind.ELEMENTWISE, 1, same_shape, same_dtype,
                         lambda x: x)
    b = GraphBuilder("g")
    y = b.add1(unregistered, [b.input(((2,), DType.f32), "x")])
    with pytest.raises(pytest.fail.Exception, match="does not parse back"):
        b.build([y])


def test_the_round_trip_fixture_leaves_broken_graphs_to_the_verifier():
    other = GraphBuilder("other")
    foreign = other.add1("neg", [other.input(((2,), DType.f32), "x")])
    graph = GraphBuilder("g").build([foreign])
    with pytest.raises(VerifyError, match="never defined"):
        verify(graph)
    with pytest.raises(ParseError, match="never defined"):
        parse_graph(print_graph(graph))
