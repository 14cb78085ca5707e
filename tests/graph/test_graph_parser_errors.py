"""Parser errors: every bad input is a ParseError naming line and column; fuzzing finds no crash."""

from __future__ import annotations

import re

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tilefuse.dtypes import DType
from tilefuse.errors import ParseError
from tilefuse.graph.builder import GraphBuilder
from tilefuse.graph.ir import Graph
from tilefuse.graph.parser import parse_attr_value, parse_graph
from tilefuse.graph.printer import print_graph
from tilefuse.graph.types import Sym

HEAD = "graph @g(%x: f32[2,3], %b: f32[3]) -> f32[2,3] {\n"

# (text, line the error must name, words the message must contain)
BAD = [
    ("", 1, "expected 'graph'"),
    ("graf @g() -> () {\n  return\n}", 1, "expected 'graph'"),
    (HEAD + "  %0 = nope(%x) : f32[2,3]\n  return %0\n}", 2, "unknown op 'nope'"),
    (HEAD + "  %0 = neg(%y) : f32[2,3]\n  return %0\n}", 2, "undefined value %y"),
    (HEAD + "  %0 = neg(%x) : f32[2,3]\n  %0 = neg(%x) : f32[2,3]\n  return %0\n}", 3,
     "defined twice"),
    (HEAD + "  %0 = neg(%x) : f32[2,4]\n  return %0\n}", 2, "rules infer f32[2,3]"),
    (HEAD + "  %0 = lt(%x, %b) : f32[2,3]\n  return %0\n}", 2, "rules infer bool[2,3]"),
    (HEAD + "  %0, %1 = neg(%x) : f32[2,3]\n  return %0\n}", 2, "has 1 results"),
    (HEAD + "  %0 = neg(%x) : q32[2,3]\n  return %0\n}", 2, "unknown dtype 'q32'"),
    (HEAD + "  %0 = neg(%x) : f32[2,3] $\n  return %0\n}", 2, "unexpected character '$'"),
    (HEAD + "  %0 = neg(%x) : f32[2,3]\n}", 3, "expected an op name or 'return'"),
    (HEAD + "  return %x\n}\n}", 4, "end of input"),
    (HEAD + "  return %b\n}", 2, "declares results f32[2,3] but returns f32[3]"),
    (HEAD + "  %0 = add(%x, %x) {alpha=1} : f32[2,3]\n  return %0\n}", 2, "unknown attribute"),
    (HEAD + "  %0 = gelu(%x) {approximate=1} : f32[2,3]\n  return %0\n}", 2, "must be str"),
    (HEAD + '  %0 = gelu(%x) {approximate="a", approximate="b"} : f32[2,3]\n  return %0\n}',
     2, "given twice"),
    ("graph @g(%x: f32[2,3], %y: f32[4]) -> f32[2,3] {\n  %0 = add(%x, %y) : f32[2,3]\n"
     "  return %0\n}", 2, "do not broadcast"),
    (HEAD + "  %0 = neg(%x) : f32[2,3]\n  return %?0\n}", 3, "never defined"),
    (HEAD + '  %0 = gelu(%x) {approximate="unterminated} : f32[2,3]\n  return %0\n}', 2,
     "unexpected character"),
    (HEAD + '  %0 = gelu(%x) {approximate="\\q"} : f32[2,3]\n  return %0\n}', 2,
     "bad string literal"),
    ("graph @g() -> f32[2] {\n  %0 = constant() {value=array<f32[2]>elided(\"ab12\")} : f32[2]"
     "\n  return %0\n}", 2, "was elided"),
    ("graph @g() -> f32[2] {\n  %0 = constant() {value=array<f32[2]>b64(\"AAAA\")} : f32[2]"
     "\n  return %0\n}", 2, "needs 8 bytes"),
    ("graph @g() -> f32[2] {\n  %0 = constant() {value=array<f32[2]>b64(\"!!\")} : f32[2]"
     "\n  return %0\n}", 2, "bad base64"),
    ("graph @g() -> f32[2] {\n  %0 = constant() {value=array<f32[2]>[1.0]} : f32[2]"
     "\n  return %0\n}", 2, "expected 2 entries"),
    ("graph @g() -> i8[1] {\n  %0 = constant() {value=array<i8[1]>[300]} : i8[1]"
     "\n  return %0\n}", 2, "do not fit i8[1]"),
    ("graph @g() -> i8[1] {\n  %0 = constant() {value=array<i8[1]>[1.5]} : i8[1]"
     "\n  return %0\n}", 2, "expected an integer"),
    ("graph @g() -> bool[1] {\n  %0 = constant() {value=array<bool[1]>[1]} : bool[1]"
     "\n  return %0\n}", 2, "expected true or false"),
    ("graph @g() -> f32[n] {\n  %0 = constant() {value=array<f32[n]>[1.0]} : f32[n]"
     "\n  return %0\n}", 2, "static shape"),
    ("graph @g(%x: f32[-1]) -> () {\n  return\n}", 1, "expected a dim"),
    ("graph @g(%x: f32[2], %x: f32[2]) -> () {\n  return\n}", 1, "defined twice"),
    ("graph @g(%x: f32[2],\n %0: f32[2]) -> () {\n  return\n}", 2, "must be named by an"),
]


@pytest.mark.parametrize(("text", "line", "words"), BAD)
def test_bad_text_is_a_parse_error_naming_the_line(text, line, words):
    with pytest.raises(ParseError) as info:
        parse_graph(text)
    message = str(info.value)
    assert re.match(rf"line {line}, column \d+: ", message), message
    assert words in message, message
    assert info.value.line == line  # type: ignore[attr-defined]


def test_deep_nesting_is_an_error_not_a_recursion_crash():
    with pytest.raises(ParseError, match="nested more than"):
        parse_attr_value("[" * 5000 + "]" * 5000)


def test_huge_integers_are_an_error_not_a_crash():
    with pytest.raises(ParseError, match="integer too long"):
        parse_attr_value("1" * 5000)
    with pytest.raises(ParseError, match="line 1, column 18: integer too long"):
        parse_graph("graph @g(%x: f32[" + "9" * 5000 + "]) -> () {\n  return\n}")


def test_non_string_input_is_a_parse_error():
    with pytest.raises(ParseError):
        parse_graph(b"graph")  # type: ignore[arg-type]


# ---- fuzzing ---------------------------------------------------------------------------------


def _rich_graph() -> Graph:
    b = GraphBuilder("rich")
    x = b.input(((Sym("n"), 6), DType.f32), "x")
    w = b.input(((6,), DType.bf16), "w")
    c = b.add1("constant", [], {"value": np.array([[1.5, np.nan, -np.inf]], np.float16)})
    h = b.add1("add", [x, b.add1("cast", [w], {"dtype": DType.f32})])
    g = b.add1("gelu", [h], {"approximate": "tanh"})
    lo, hi = b.add("split", [g], {"axis": 1, "sizes": (3, 3)})
    m = b.add1("where", [b.add1("lt", [lo, hi]), lo, b.add1("cast", [c], {"dtype": DType.f32})])
    return b.build([m, hi])


_VOCAB = ["graph", "@g", "(", ")", "{", "}", "[", "]", "<", ">", ",", ":", "=", "->", "%x",
          "%0", "%1", "f32", "bool", "2", "-1", "1.5", "nan", "-", "inf", "neg", "add", "split",
          "constant", "array", "b64", '"AA=="', "sym", "return", "true", "none", "# a.py:1",
          "\n", " ", '"s"', "axis", "sizes", "%?0", "@", "%"]


def _assert_parses_or_parse_error(text: str) -> None:
    try:
        graph = parse_graph(text)
    except ParseError as err:
        assert re.match(r"line \d+, column \d+: ", str(err)), str(err)
        return
    assert parse_graph(print_graph(graph)) is not None


@settings(max_examples=50, deadline=None)
@given(st.text(max_size=200))
def test_fuzz_arbitrary_text(text):
    _assert_parses_or_parse_error(text)


@settings(max_examples=50, deadline=None)
@given(st.lists(st.sampled_from(_VOCAB), max_size=60))
def test_fuzz_token_soup(tokens):
    _assert_parses_or_parse_error(" ".join(tokens))
    _assert_parses_or_parse_error("graph @g(%x: f32[2]) -> f32[2] {" + "".join(tokens))


_edits = st.lists(st.tuples(st.sampled_from(["delete", "insert", "duplicate", "swap"]),
                            st.floats(0, 1), st.integers(1, 12), st.sampled_from(_VOCAB)),
                  min_size=1, max_size=4)


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_edits)
def test_fuzz_mutated_valid_text(edits):
    text = print_graph(_rich_graph())
    for kind, where, length, token in edits:
        i = int(where * len(text))
        if kind == "delete":
            text = text[:i] + text[i + length:]
        elif kind == "insert":
            text = text[:i] + token + text[i:]
        elif kind == "duplicate":
            text = text[:i] + text[i:i + length] + text[i:]
        else:
            j = min(len(text), i + length)
            text = text[:i] + text[j:j + length] + text[i:j] + text[j + length:]
    _assert_parses_or_parse_error(text)
