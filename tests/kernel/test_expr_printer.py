"""Golden text of the tensor-expression dump (kernels/<name>.expr)."""

from __future__ import annotations

from tilefuse.graph.parser import parse_graph
from tilefuse.kernel.expr_printer import format_group_expr
from tilefuse.kernel.fusion import form_kernels
from tilefuse.kernel.plan_printer import value_names

FFN = """graph @ffn(%x: f32[512,768], %w: f32[768,3072], %b: f32[3072]) -> f32[512,3072] {
  %0 = matmul(%x, %w) : f32[512,3072]
  %1 = add(%0, %b) : f32[512,3072]
  %2 = gelu(%1) {approximate="tanh"} : f32[512,3072]
  return %2
}
"""

NORM = """graph @norm(%x: f32[7,513]) -> f32[7,513] {
  %0 = max(%x) {axes=[1], keepdims=true} : f32[7,1]
  %1 = sub(%x, %0) : f32[7,513]
  return %1
}
"""


def _expr(text: str) -> str:
    graph = parse_graph(text)
    (group,) = form_kernels(graph).groups
    return format_group_expr(group, value_names(graph))


def test_contraction_expression():
    assert _expr(FFN) == (
        "k0 : contraction over [512,3072], axes i0 < 512, i1 < 3072\n"
        "  reads %x, %w, %b\n"
        "  %0[i0,i1] = sum(k0 < 768: %x[i0,k0] * %w[k0,i1])\n"
        "  %1[i0,i1] = add(%0[i0,i1], %b[i1])\n"
        '  %2[i0,i1] = gelu(%1[i0,i1]) {approximate="tanh"}\n'
        "  write %2\n")


def test_row_reduction_expression_names_reduced_axes():
    assert _expr(NORM) == (
        "k0 : row_reduction over [7,513], axes i0 < 7, i1 < 513\n"
        "  reads %x\n"
        "  %0[i0,0] = max(r0 < 513: %x[i0,r0])\n"
        "  %1[i0,i1] = sub(%x[i0,i1], %0[i0,0])\n"
        "  write %1\n")
