"""Golden before/after text for the attention recognition pass, numeric equality of each
rewrite, and the spellings it must leave alone (not exact, or the scores are read elsewhere)."""

from __future__ import annotations

import numpy as np
import pytest

from tilefuse.graph.interpreter import interpret
from tilefuse.graph.parser import parse_graph
from tilefuse.graph.printer import print_graph
from tilefuse.passes.attention import DISABLE_ENV, fuse_attention
from tilefuse.passes.dce import dce
from tilefuse.testing import assert_close, random_array

SOFTMAX_BY_HAND = """\
  %5 = max(%4) {axes=[-1], keepdims=true} : f32[2,4,5]
  %6 = sub(%4, %5) : f32[2,4,5]
  %7 = exp(%6) : f32[2,4,5]
  %8 = sum(%7) {axes=[2], keepdims=true} : f32[2,4,1]
  %9 = div(%7, %8) : f32[2,4,5]
"""

GOLDEN = {
    # NumPy: q @ k.swapaxes(-1, -2) / 2 + mask, softmax by hand (as decomposed).
    "numpy_div_mask": ("""\
graph @g(%q: f32[2,4,8], %k: f32[2,5,8], %v: f32[2,5,3], %mask: f32[4,5]) -> f32[2,4,3] {
  %0 = transpose(%k) {perm=[0,2,1]} : f32[2,8,5]
  %1 = matmul(%q, %0) : f32[2,4,5]
  %2 = constant() {value=array<f32[]>2.0} : f32[]
  %3 = div(%1, %2) : f32[2,4,5]
  %4 = add(%3, %mask) : f32[2,4,5]
  %5 = max(%4) {axes=[-1], keepdims=true} : f32[2,4,1]
  %6 = sub(%4, %5) : f32[2,4,5]
  %7 = exp(%6) : f32[2,4,5]
  %8 = sum(%7) {axes=[2], keepdims=true} : f32[2,4,1]
  %9 = div(%7, %8) : f32[2,4,5]
  %10 = matmul(%9, %v) : f32[2,4,3]
  return %10
}
""", """\
graph @g(%q: f32[2,4,8], %k: f32[2,5,8], %v: f32[2,5,3], %mask: f32[4,5]) -> f32[2,4,3] {
  %0 = attention(%q, %k, %v, %mask) {scale=0.5} : f32[2,4,3]
  return %0
}
"""),
    # K already laid out [.., D, Sk] (a graph input), mask first in the add, scale by mul,
    # softmax as one op.
    "kt_input_softmax_op": ("""\
graph @g(%q: f32[3,6], %kt: f32[6,9], %v: f32[9,4], %mask: f32[1,9]) -> f32[3,4] {
  %0 = matmul(%q, %kt) : f32[3,9]
  %1 = full() {dtype=f32, shape=[], value=0.25} : f32[]
  %2 = mul(%1, %0) : f32[3,9]
  %3 = add(%mask, %2) : f32[3,9]
  %4 = softmax(%3) {axis=1} : f32[3,9]
  %5 = matmul(%4, %v) : f32[3,4]
  return %5
}
""", """\
graph @g(%q: f32[3,6], %kt: f32[6,9], %v: f32[9,4], %mask: f32[1,9]) -> f32[3,4] {
  %0 = transpose(%kt) {perm=[1,0]} : f32[9,6]
  %1 = attention(%q, %0, %v, %mask) {scale=0.25} : f32[3,4]
  return %1
}
"""),
    # torch's core ATen: batch dims flattened around bmm, heads split by a transpose of
    # [B,S,H,D], the key transpose folded into that permutation, mask [B,1,1,S].
    "torch_bmm_views": ("""\
graph @g(%x: f32[1,5,2,4], %y: f32[1,5,2,4], %v: f32[1,2,5,4], %mask: f32[1,1,1,5]) -> f32[2,5,4] {
  %0 = transpose(%x) {perm=[0,2,1,3]} : f32[1,2,5,4]
  %1 = transpose(%y) {perm=[0,2,3,1]} : f32[1,2,4,5]
  %2 = reshape(%0) {shape=[2,5,4]} : f32[2,5,4]
  %3 = reshape(%1) {shape=[2,4,5]} : f32[2,4,5]
  %4 = matmul(%2, %3) : f32[2,5,5]
  %5 = reshape(%4) {shape=[1,2,5,5]} : f32[1,2,5,5]
  %6 = constant() {value=array<f32[]>2.0} : f32[]
  %7 = div(%5, %6) : f32[1,2,5,5]
  %8 = add(%7, %mask) : f32[1,2,5,5]
  %9 = softmax(%8) {axis=3} : f32[1,2,5,5]
  %10 = reshape(%9) {shape=[2,5,5]} : f32[2,5,5]
  %11 = reshape(%v) {shape=[2,5,4]} : f32[2,5,4]
  %12 = matmul(%10, %11) : f32[2,5,4]
  return %12
}
""", """\
graph @g(%x: f32[1,5,2,4], %y: f32[1,5,2,4], %v: f32[1,2,5,4], %mask: f32[1,1,1,5]) -> f32[2,5,4] {
  %0 = transpose(%x) {perm=[0,2,1,3]} : f32[1,2,5,4]
  %1 = transpose(%y) {perm=[0,2,1,3]} : f32[1,2,5,4]
  %2 = attention(%0, %1, %v, %mask) {scale=0.5} : f32[1,2,5,4]
  %3 = reshape(%2) {shape=[2,5,4]} : f32[2,5,4]
  return %3
}
"""),
}


@pytest.mark.parametrize("name", sorted(GOLDEN))
def test_golden_before_after_and_numeric(name):
    before_text, after_text = GOLDEN[name]
    before = parse_graph(before_text)
    after, changed = fuse_attention(before)
    assert changed
    after, _ = dce(after)
    assert print_graph(after, locations=False) == after_text
    rng = np.random.default_rng(len(name))
    arrays = [random_array(rng, tuple(v.shape), v.dtype) for v in before.inputs]
    assert_close(interpret(after, *arrays)[0], interpret(before, *arrays)[0], reduction=True)


def _variant(old: str, new: str) -> str:
    text = GOLDEN["numpy_div_mask"][0]
    assert old in text
    return text.replace(old, new)


LEFT_ALONE = {
    "scores also returned": _variant("return %10", "return %10, %4").replace(
        "-> f32[2,4,3]", "-> (f32[2,4,3], f32[2,4,5])"),
    "probabilities also returned": _variant("return %10", "return %10, %9").replace(
        "-> f32[2,4,3]", "-> (f32[2,4,3], f32[2,4,5])"),
    "scale not a constant": _variant(
        "%2 = constant() {value=array<f32[]>2.0} : f32[]", "%2 = max(%q) : f32[]"),
    "softmax over another axis": _variant("%5 = max(%4) {axes=[-1]", "%5 = max(%4) {axes=[1]")
    .replace("f32[2,4,1]\n  %6", "f32[2,1,5]\n  %6"),
}


@pytest.mark.parametrize("why", sorted(LEFT_ALONE))
def test_inexact_or_shared_spellings_are_left_alone(why):
    graph = parse_graph(LEFT_ALONE[why])
    after, changed = fuse_attention(graph)
    assert not changed and after is graph


def test_mask_that_broadcasts_the_scores_up_is_left_alone():
    graph = parse_graph("""\
graph @g(%q: f32[4,8], %k: f32[5,8], %v: f32[5,3], %mask: f32[2,4,5]) -> f32[2,4,3] {
  %0 = transpose(%k) {perm=[1,0]} : f32[8,5]
  %1 = matmul(%q, %0) : f32[4,5]
  %2 = add(%1, %mask) : f32[2,4,5]
  %3 = softmax(%2) {axis=-1} : f32[2,4,5]
  %4 = matmul(%3, %v) : f32[2,4,3]
  return %4
}
""")
    assert fuse_attention(graph) == (graph, False)


def test_environment_switch_disables_the_pass(monkeypatch):
    graph = parse_graph(GOLDEN["numpy_div_mask"][0])
    monkeypatch.setenv(DISABLE_ENV, "1")
    assert fuse_attention(graph) == (graph, False)
    monkeypatch.delenv(DISABLE_ENV)
    assert fuse_attention(graph)[1]
