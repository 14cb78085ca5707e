"""Golden before/after text and numeric checks for the algebraic peepholes."""

from __future__ import annotations

import numpy as np

from tilefuse.dtypes import DType
from tilefuse.graph.interpreter import interpret
from tilefuse.graph.parser import parse_graph
from tilefuse.graph.printer import print_graph
from tilefuse.passes import dce, simplify_algebra
from tilefuse.testing import assert_close, random_array

BEFORE = """graph @g(%x: f32[7,513], %y: f32[513]) -> (f32[7,513], f32[7,513], f32[7,513]) {
  %0 = constant() {value=array<f32[]>2.0} : f32[]
  %1 = pow(%x, %0) : f32[7,513]
  %2 = constant() {value=array<f32[]>1.0} : f32[]
  %3 = pow(%x, %2) : f32[7,513]
  %4 = constant() {value=array<f32[]>3.0} : f32[]
  %5 = pow(%x, %4) : f32[7,513]
  return %1, %3, %5
}
"""

AFTER = """graph @g(%x: f32[7,513], %y: f32[513]) -> (f32[7,513], f32[7,513], f32[7,513]) {
  %0 = mul(%x, %x) : f32[7,513]
  %1 = constant() {value=array<f32[]>3.0} : f32[]
  %2 = pow(%x, %1) : f32[7,513]
  return %0, %x, %2
}
"""


def test_pow_peepholes_golden_and_numeric():
    graph = parse_graph(BEFORE)
    after, changed = simplify_algebra(graph)
    assert changed
    after, _ = dce(after)
    assert print_graph(after) == AFTER
    rng = np.random.default_rng(11)
    x, y = random_array(rng, (7, 513), DType.f32), random_array(rng, (513,), DType.f32)
    for got, want in zip(interpret(after, x, y), interpret(graph, x, y), strict=True):
        assert_close(got, want)


def test_pow_with_broadcasting_exponent_or_int_base_is_left_alone():
    text = """graph @g(%x: f32[7], %n: i32[7]) -> (f32[2,7], i32[7]) {
  %0 = constant() {value=array<f32[2,1]>[[2.0],[2.0]]} : f32[2,1]
  %1 = pow(%x, %0) : f32[2,7]
  %2 = constant() {value=array<i32[]>2} : i32[]
  %3 = pow(%n, %2) : i32[7]
  return %1, %3
}
"""
    graph = parse_graph(text)
    assert simplify_algebra(graph) == (graph, False)
