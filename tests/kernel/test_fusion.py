"""Kernel formation: golden plan text for the patterns the rules name, numeric replay of every plan
(each kernel run on its declared inputs only, in launch order, against the reference
interpreter), invariants on random graphs, plan checking and the fusion log."""

from __future__ import annotations

import logging
import textwrap

import numpy as np
import pytest
from plancheck import (
    assert_plan_computes_graph,
    check_invariants,
    random_fusion_graph,
)

from tilefuse.dtypes import DType
from tilefuse.errors import VerifyError
from tilefuse.graph.builder import GraphBuilder
from tilefuse.graph.parser import parse_graph
from tilefuse.kernel import KernelKind, KernelPlan, Role, form_kernels, print_plan, verify_plan
from tilefuse.kernel.fusion import MAX_RECOMPUTE_OPS, KernelGroup, op_cost
from tilefuse.passes.decompose import decompose_composites


def text(s: str) -> str:
    return textwrap.dedent(s).lstrip("\n")


def plan_of(src: str) -> KernelPlan:
    """The kernel plan of the graph text ``src`` (dedented)."""
    return form_kernels(parse_graph(text(src)))


def golden(src: str, expected: str, *, decompose: bool = False) -> KernelPlan:
    graph = parse_graph(text(src))
    if decompose:
        graph, _ = decompose_composites(graph)
    plan = form_kernels(graph)
    assert print_plan(plan) == text(expected)
    assert str(plan) == print_plan(plan)
    assert_plan_computes_graph(plan)
    return plan


# ---- contraction -----------------------------------------------------------------------------

def test_gelu_of_matmul_plus_bias_is_one_contraction_kernel():
    plan = golden("""
        graph @ffn(%x: f32[8,6], %w: f32[6,12], %b: f32[12]) -> f32[8,12] {
          %0 = matmul(%x, %w) : f32[8,12]
          %1 = add(%0, %b) : f32[8,12]
          %2 = gelu(%1) {approximate="none"} : f32[8,12]
          return %2
        }
        """, """
        plan @ffn: 3 nodes -> 1 kernel
          written between kernels: 768 B one kernel per op, 0 B fused
          written as graph outputs: 384 B

        k0 contraction over [8,12], anchor %0
          in:  %x: f32[8,6], %w: f32[6,12], %b: f32[12]
          anchor      %0 = matmul(%x, %w) : f32[8,12]
          epilogue    %1 = add(%0, %b) : f32[8,12]
          epilogue    %2 = gelu(%1) {approximate="none"} : f32[8,12]
          out: %2: f32[8,12]
        """)
    (k,) = plan.groups
    assert k.anchor is k.nodes[0] and k.domain == (8, 12)
    assert k.role_of(k.nodes[2]) is Role.EPILOGUE


def test_prologues_on_both_operands_and_a_cheap_bias_leaf():
    golden("""
        graph @attn(%q: f32[2,4,8], %k: f32[2,4,8], %b: f32[4]) -> f32[2,4,4] {
          %0 = full() {dtype=f32, shape=[], value=0.5} : f32[]
          %1 = mul(%q, %0) : f32[2,4,8]
          %2 = transpose(%k) {perm=[0,2,1]} : f32[2,8,4]
          %3 = matmul(%1, %2) : f32[2,4,4]
          %4 = exp(%b) : f32[4]
          %5 = add(%3, %4) : f32[2,4,4]
          return %5
        }
        """, """
        plan @attn: 6 nodes -> 1 kernel
          written between kernels: 660 B one kernel per op, 0 B fused
          written as graph outputs: 128 B

        k0 contraction over [2,4,4], anchor %3
          in:  %q: f32[2,4,8], %k: f32[2,4,8], %b: f32[4]
          leaf        %0 = full() {dtype=f32, shape=[], value=0.5} : f32[]
          prologue    %1 = mul(%q, %0) : f32[2,4,8]
          prologue_b  %2 = transpose(%k) {perm=[0,2,1]} : f32[2,8,4]
          anchor      %3 = matmul(%1, %2) : f32[2,4,4]
          leaf        %4 = exp(%b) : f32[4]
          epilogue    %5 = add(%3, %4) : f32[2,4,4]
          out: %5: f32[2,4,4]
        """)


def test_an_epilogue_that_would_close_a_cycle_stays_out():
    golden("""
        graph @cycle(%x: f32[8,6], %w: f32[6,12]) -> f32[8,12] {
          %0 = matmul(%x, %w) : f32[8,12]
          %1 = sum(%0) {axes=[0], keepdims=true} : f32[1,12]
          %2 = sub(%0, %1) : f32[8,12]
          return %2
        }
        """, """
        plan @cycle: 3 nodes -> 3 kernels
          written between kernels: 432 B one kernel per op, 432 B fused
          written as graph outputs: 384 B

        k0 contraction over [8,12], anchor %0
          in:  %x: f32[8,6], %w: f32[6,12]
          anchor      %0 = matmul(%x, %w) : f32[8,12]
          out: %0: f32[8,12]

        k1 reduction over [8,12], anchor %1
          in:  %0: f32[8,12]
          anchor      %1 = sum(%0) {axes=[0], keepdims=true} : f32[1,12]
          out: %1: f32[1,12]

        k2 elementwise over [8,12]
          in:  %0: f32[8,12], %1: f32[1,12]
          domain      %2 = sub(%0, %1) : f32[8,12]
          out: %2: f32[8,12]
        """)


def test_constant_only_computations_stay_apart_but_fills_are_inlined():
    builder = GraphBuilder("c")
    x = builder.input(((4, 6), DType.f32), "x")
    weight = np.arange(48, dtype=np.float32).reshape(8, 6) / 48
    w = builder.add1("constant", [], {"value": weight})
    wt = builder.add1("transpose", [w], {"perm": (1, 0)})
    mm = builder.add1("matmul", [x, wt])
    half = builder.add1("full", [], {"shape": (8,), "value": 0.5, "dtype": DType.f32})
    plan = form_kernels(builder.build([builder.add1("add", [mm, half])]))
    assert [(k.kind, [n.op.name for n in k.nodes]) for k in plan.groups] == [
        (KernelKind.MOVEMENT, ["transpose"]),
        (KernelKind.CONTRACTION, ["matmul", "full", "add"])]
    assert plan.groups[0].inputs == (w,) and plan.groups[1].inputs == (x, wt)
    assert_plan_computes_graph(plan)


# ---- row reductions --------------------------------------------------------------------------

SOFTMAX_PLAN = """
    plan @softmax: 5 nodes -> 1 kernel
      written between kernels: 288 B one kernel per op, 0 B fused
      written as graph outputs: 128 B

    k0 row_reduction over [4,8], anchor %0
      in:  %x: f32[4,8]
      anchor      %0 = max(%x) {axes=[-1], keepdims=true} : f32[4,1]
      domain      %1 = sub(%x, %0) : f32[4,8]
      domain      %2 = exp(%1) : f32[4,8]
      reduce      %3 = sum(%2) {axes=[-1], keepdims=true} : f32[4,1]
      domain      %4 = div(%2, %3) : f32[4,8]
      out: %4: f32[4,8]
    """


def test_softmax_op_decomposed_is_one_row_kernel():
    golden("""
        graph @softmax(%x: f32[4,8]) -> f32[4,8] {
          %0 = softmax(%x) {axis=-1} : f32[4,8]
          return %0
        }
        """, SOFTMAX_PLAN, decompose=True)


def test_softmax_written_by_hand_is_the_same_row_kernel():
    golden("""
        graph @softmax(%x: f32[4,8]) -> f32[4,8] {
          %0 = max(%x) {axes=[-1], keepdims=true} : f32[4,1]
          %1 = sub(%x, %0) : f32[4,8]
          %2 = exp(%1) : f32[4,8]
          %3 = sum(%2) {axes=[-1], keepdims=true} : f32[4,1]
          %4 = div(%2, %3) : f32[4,8]
          return %4
        }
        """, SOFTMAX_PLAN)


def test_softmax_without_keepdims_is_one_row_kernel():
    plan = golden("""
        graph @sm(%x: f32[4,8]) -> f32[4,8] {
          %0 = max(%x) {axes=[1], keepdims=false} : f32[4]
          %1 = expand_dims(%0) {axes=[1]} : f32[4,1]
          %2 = sub(%x, %1) : f32[4,8]
          %3 = exp(%2) : f32[4,8]
          %4 = sum(%3) {axes=[-1], keepdims=true} : f32[4,1]
          %5 = div(%3, %4) : f32[4,8]
          return %5
        }
        """, """
        plan @sm: 6 nodes -> 1 kernel
          written between kernels: 304 B one kernel per op, 0 B fused
          written as graph outputs: 128 B

        k0 row_reduction over [4,8], anchor %0
          in:  %x: f32[4,8]
          anchor      %0 = max(%x) {axes=[1], keepdims=false} : f32[4]
          row         %1 = expand_dims(%0) {axes=[1]} : f32[4,1]
          domain      %2 = sub(%x, %1) : f32[4,8]
          domain      %3 = exp(%2) : f32[4,8]
          reduce      %4 = sum(%3) {axes=[-1], keepdims=true} : f32[4,1]
          domain      %5 = div(%3, %4) : f32[4,8]
          out: %5: f32[4,8]
        """)
    assert plan.groups[0].kind is KernelKind.ROW_REDUCTION


def test_an_undecomposed_composite_is_a_one_node_row_kernel():
    plan = plan_of("""
        graph @g(%x: f32[4,8]) -> f32[4,8] {
          %0 = log_softmax(%x) {axis=1} : f32[4,8]
          %1 = neg(%0) : f32[4,8]
          return %1
        }
        """)
    (k,) = plan.groups
    assert k.kind is KernelKind.ROW_REDUCTION and k.roles == (Role.ANCHOR, Role.DOMAIN)
    assert_plan_computes_graph(plan)


def test_layer_norm_is_one_row_kernel():
    golden("""
        graph @ln(%x: f32[2,3,8], %w: f32[8], %b: f32[8]) -> f32[2,3,8] {
          %0 = layer_norm(%x, %w, %b) {eps=1e-05} : f32[2,3,8]
          return %0
        }
        """, """
        plan @ln: 10 nodes -> 1 kernel
          written between kernels: 868 B one kernel per op, 0 B fused
          written as graph outputs: 192 B

        k0 row_reduction over [2,3,8], anchor %0
          in:  %x: f32[2,3,8], %w: f32[8], %b: f32[8]
          anchor      %0 = mean(%x) {axes=[2], keepdims=true} : f32[2,3,1]
          domain      %1 = sub(%x, %0) : f32[2,3,8]
          domain      %2 = mul(%1, %1) : f32[2,3,8]
          reduce      %3 = mean(%2) {axes=[2], keepdims=true} : f32[2,3,1]
          leaf        %4 = full() {dtype=f32, shape=[], value=1e-05} : f32[]
          row         %5 = add(%3, %4) : f32[2,3,1]
          row         %6 = rsqrt(%5) : f32[2,3,1]
          domain      %7 = mul(%1, %6) : f32[2,3,8]
          domain      %8 = mul(%7, %w) : f32[2,3,8]
          domain      %9 = add(%8, %b) : f32[2,3,8]
          out: %9: f32[2,3,8]
        """, decompose=True)


def test_layer_norm_written_by_hand_with_constants_is_one_row_kernel():
    plan = golden("""
        graph @w2(%x: f32[8,6], %g: f32[6], %b: f32[6]) -> f32[8,6] {
          %0 = mean(%x) {axes=[1], keepdims=true} : f32[8,1]
          %1 = sub(%x, %0) : f32[8,6]
          %2 = constant() {value=array<f32[]>2.0} : f32[]
          %3 = pow(%1, %2) : f32[8,6]
          %4 = mean(%3) {axes=[1], keepdims=true} : f32[8,1]
          %5 = constant() {value=array<f32[]>1e-05} : f32[]
          %6 = add(%4, %5) : f32[8,1]
          %7 = sqrt(%6) : f32[8,1]
          %8 = div(%1, %7) : f32[8,6]
          %9 = mul(%8, %g) : f32[8,6]
          %10 = add(%9, %b) : f32[8,6]
          return %10
        }
        """, """
        plan @w2: 9 nodes -> 1 kernel
          written between kernels: 896 B one kernel per op, 0 B fused
          written as graph outputs: 192 B
          constants: %2: f32[], %5: f32[]

        k0 row_reduction over [8,6], anchor %0
          in:  %x: f32[8,6], %2: f32[], %5: f32[], %g: f32[6], %b: f32[6]
          anchor      %0 = mean(%x) {axes=[1], keepdims=true} : f32[8,1]
          domain      %1 = sub(%x, %0) : f32[8,6]
          domain      %3 = pow(%1, %2) : f32[8,6]
          reduce      %4 = mean(%3) {axes=[1], keepdims=true} : f32[8,1]
          row         %6 = add(%4, %5) : f32[8,1]
          row         %7 = sqrt(%6) : f32[8,1]
          domain      %8 = div(%1, %7) : f32[8,6]
          domain      %9 = mul(%8, %g) : f32[8,6]
          domain      %10 = add(%9, %b) : f32[8,6]
          out: %10: f32[8,6]
        """)
    assert len(plan.groups) == 1


def test_rms_norm_is_one_row_kernel():
    golden("""
        graph @rms(%x: f32[4,8], %w: f32[8]) -> f32[4,8] {
          %0 = rms_norm(%x, %w) {eps=1e-06} : f32[4,8]
          return %0
        }
        """, """
        plan @rms: 7 nodes -> 1 kernel
          written between kernels: 308 B one kernel per op, 0 B fused
          written as graph outputs: 128 B

        k0 row_reduction over [4,8], anchor %1
          in:  %x: f32[4,8], %w: f32[8]
          domain      %0 = mul(%x, %x) : f32[4,8]
          anchor      %1 = mean(%0) {axes=[1], keepdims=true} : f32[4,1]
          leaf        %2 = full() {dtype=f32, shape=[], value=1e-06} : f32[]
          row         %3 = add(%1, %2) : f32[4,1]
          row         %4 = rsqrt(%3) : f32[4,1]
          domain      %5 = mul(%x, %4) : f32[4,8]
          domain      %6 = mul(%5, %w) : f32[4,8]
          out: %6: f32[4,8]
        """, decompose=True)


@pytest.mark.parametrize("dtype", ["f16", "bf16"])
def test_low_precision_norm_casts_its_weights_in_the_same_kernel(dtype):
    graph, _ = decompose_composites(parse_graph(text(f"""
        graph @g(%x: {dtype}[2,8], %w: {dtype}[8], %b: {dtype}[8]) -> {dtype}[2,8] {{
          %0 = layer_norm(%x, %w, %b) {{eps=1e-05}} : {dtype}[2,8]
          return %0
        }}
        """)))
    plan = form_kernels(graph)
    (k,) = plan.groups
    casts = [r for n, r in zip(k.nodes, k.roles) if n.op.name == "cast"]
    assert casts == [Role.DOMAIN, Role.LEAF, Role.LEAF, Role.DOMAIN]
    assert_plan_computes_graph(plan)


def test_a_row_value_read_across_rows_breaks_the_row_kernel():
    golden("""
        graph @cross(%x: f32[4,4]) -> f32[4,4] {
          %0 = max(%x) {axes=[1], keepdims=true} : f32[4,1]
          %1 = reshape(%0) {shape=[1,4]} : f32[1,4]
          %2 = sub(%x, %1) : f32[4,4]
          return %2
        }
        """, """
        plan @cross: 3 nodes -> 2 kernels
          written between kernels: 32 B one kernel per op, 16 B fused
          written as graph outputs: 64 B

        k0 row_reduction over [4,4], anchor %0
          in:  %x: f32[4,4]
          anchor      %0 = max(%x) {axes=[1], keepdims=true} : f32[4,1]
          out: %0: f32[4,1]

        k1 elementwise over [4,4]
          in:  %0: f32[4,1], %x: f32[4,4]
          leaf        %1 = reshape(%0) {shape=[1,4]} : f32[1,4]
          domain      %2 = sub(%x, %1) : f32[4,4]
          out: %2: f32[4,4]
        """)


def test_symbolic_rows_and_symbolic_byte_counts():
    golden("""
        graph @s(%x: f32[batch,8]) -> f32[batch,8] {
          %0 = softmax(%x) {axis=-1} : f32[batch,8]
          %1 = neg(%0) : f32[batch,8]
          %2 = sum(%1) {axes=[0], keepdims=true} : f32[1,8]
          %3 = sub(%1, %2) : f32[batch,8]
          return %3
        }
        """, """
        plan @s: 8 nodes -> 3 kernels
          written between kernels: 136*batch + 32 B one kernel per op, 32*batch + 32 B fused
          written as graph outputs: 32*batch B

        k0 row_reduction over [batch,8], anchor %0
          in:  %x: f32[batch,8]
          anchor      %0 = max(%x) {axes=[-1], keepdims=true} : f32[batch,1]
          domain      %1 = sub(%x, %0) : f32[batch,8]
          domain      %2 = exp(%1) : f32[batch,8]
          reduce      %3 = sum(%2) {axes=[-1], keepdims=true} : f32[batch,1]
          domain      %4 = div(%2, %3) : f32[batch,8]
          domain      %5 = neg(%4) : f32[batch,8]
          out: %5: f32[batch,8]

        k1 reduction over [batch,8], anchor %6
          in:  %5: f32[batch,8]
          anchor      %6 = sum(%5) {axes=[0], keepdims=true} : f32[1,8]
          out: %6: f32[1,8]

        k2 elementwise over [batch,8]
          in:  %5: f32[batch,8], %6: f32[1,8]
          domain      %7 = sub(%5, %6) : f32[batch,8]
          out: %7: f32[batch,8]
        """, decompose=True)


# ---- elementwise -----------------------------------------------------------------------------

def test_elementwise_chain_with_broadcasting_and_a_transpose_is_one_kernel():
    golden("""
        graph @chain(%x: f32[4,8], %s: f32[4,1], %b: f32[8], %z: f32[8,4]) -> f32[8,4] {
          %0 = mul(%x, %s) : f32[4,8]
          %1 = add(%0, %b) : f32[4,8]
          %2 = relu(%1) : f32[4,8]
          %3 = transpose(%2) {perm=[1,0]} : f32[8,4]
          %4 = add(%3, %z) : f32[8,4]
          return %4
        }
        """, """
        plan @chain: 5 nodes -> 1 kernel
          written between kernels: 512 B one kernel per op, 0 B fused
          written as graph outputs: 128 B

        k0 elementwise over [8,4]
          in:  %x: f32[4,8], %s: f32[4,1], %b: f32[8], %z: f32[8,4]
          domain      %0 = mul(%x, %s) : f32[4,8]
          domain      %1 = add(%0, %b) : f32[4,8]
          domain      %2 = relu(%1) : f32[4,8]
          domain      %3 = transpose(%2) {perm=[1,0]} : f32[8,4]
          domain      %4 = add(%3, %z) : f32[8,4]
          out: %4: f32[8,4]
        """)


LRN_TAIL = """
    graph @lrn(%s: f32[1,8,3,5], %x: f32[15,8], %a: f32[], %b: f32[], %e: f32[]) -> f32[15,8] {{
      %0 = mul(%s, %a) : f32[1,8,3,5]
      %1 = add(%0, %b) : f32[1,8,3,5]
      %2 = {op} : f32[1,8,3,5]
      %3 = transpose(%2) {{perm=[0,2,3,1]}} : f32[1,3,5,8]
      %4 = reshape(%3) {{shape=[15,8]}} : f32[15,8]
      %5 = div(%x, %4) : f32[15,8]
      return %5
    }}
    """


def test_a_transcendental_behind_a_lane_moving_transpose_gets_a_kernel_of_its_own():
    """The LRN's tail in channels-last layout: pow of the NCHW window sums, transposed to
    NHWC, divides the input. Read through the transpose, the pow would run one element at a
    time; it is computed vectorised by a kernel of its own. A cheap producer (relu) still
    joins the transpose's kernel (ShuffleNet's batch norm and relu before the shuffle)."""
    split = plan_of(LRN_TAIL.format(op="pow(%1, %e)"))
    assert [[n.op.name for n in g.nodes] for g in split.groups] == \
        [["mul", "add", "pow"], ["transpose", "reshape", "div"]]
    assert_plan_computes_graph(split)
    fused = plan_of(LRN_TAIL.format(op="relu(%1)"))
    assert len(fused.groups) == 1
    assert_plan_computes_graph(fused)


SHUFFLED_SUM = """
    graph @shuffled_sum(%x: f32[6,4,34]) -> f32[136] {{
      %0 = transpose(%x) {{perm={perm}}} : {shape}
      %1 = reshape(%0) {{shape=[6,136]}} : f32[6,136]
      %2 = sum(%1) {{axes=[0]}} : f32[136]
      return %2
    }}
    """


def test_a_transpose_that_moves_the_lane_axis_stays_out_of_a_reduction():
    """A channel shuffle ([6, 4, 34] -> [6, 34, 4]) read by a reduction along its last axis
    would load one element at a time in every tap of the reduction: it is written once by a
    kernel of its own instead; a transpose that keeps the last axis still joins."""
    moved = plan_of(SHUFFLED_SUM.format(perm="[0,2,1]", shape="f32[6,34,4]"))
    assert [g.kind for g in moved.groups] == [KernelKind.MOVEMENT, KernelKind.REDUCTION]
    assert "transpose" not in [n.op.name for n in moved.groups[1].nodes]
    assert_plan_computes_graph(moved)
    kept = plan_of(SHUFFLED_SUM.format(perm="[1,0,2]", shape="f32[4,6,34]"))
    assert [g.kind for g in kept.groups] == [KernelKind.REDUCTION]
    assert_plan_computes_graph(kept)
    negative = plan_of(SHUFFLED_SUM.format(perm="[1,0,-1]", shape="f32[4,6,34]"))
    assert [g.kind for g in negative.groups] == [KernelKind.REDUCTION]  # -1 is the last axis


def test_a_small_producer_joins_as_a_leaf_only_while_cheap():
    cheap = plan_of("""
        graph @small(%x: f32[4,8], %b: f32[8]) -> f32[4,8] {
          %0 = exp(%b) : f32[8]
          %1 = add(%x, %0) : f32[4,8]
          return %1
        }
        """)
    assert [k.roles for k in cheap.groups] == [(Role.LEAF, Role.DOMAIN)]
    costly = golden("""
        graph @small(%x: f32[4,8], %b: f32[8]) -> f32[4,8] {
          %0 = exp(%b) : f32[8]
          %1 = tanh(%0) : f32[8]
          %2 = sigmoid(%1) : f32[8]
          %3 = add(%x, %2) : f32[4,8]
          return %3
        }
        """, """
        plan @small: 4 nodes -> 2 kernels
          written between kernels: 96 B one kernel per op, 32 B fused
          written as graph outputs: 128 B

        k0 elementwise over [8]
          in:  %b: f32[8]
          domain      %0 = exp(%b) : f32[8]
          out: %0: f32[8]

        k1 elementwise over [4,8]
          in:  %0: f32[8], %x: f32[4,8]
          leaf        %1 = tanh(%0) : f32[8]
          leaf        %2 = sigmoid(%1) : f32[8]
          domain      %3 = add(%x, %2) : f32[4,8]
          out: %3: f32[4,8]
        """)
    leaves = [n for n, r in zip(costly.groups[1].nodes, costly.groups[1].roles) if r is Role.LEAF]
    assert sum(op_cost(n) for n in leaves) == MAX_RECOMPUTE_OPS


def test_a_diamond_inside_one_domain_is_one_kernel_writing_both_results():
    plan = golden("""
        graph @multi(%x: f32[4,8], %y: f32[8]) -> (f32[4,8], f32[4,8]) {
          %0 = exp(%x) : f32[4,8]
          %1 = neg(%0) : f32[4,8]
          %2 = mul(%0, %y) : f32[4,8]
          %3 = add(%1, %2) : f32[4,8]
          return %3, %1
        }
        """, """
        plan @multi: 4 nodes -> 1 kernel
          written between kernels: 256 B one kernel per op, 0 B fused
          written as graph outputs: 256 B

        k0 elementwise over [4,8]
          in:  %x: f32[4,8], %y: f32[8]
          domain      %0 = exp(%x) : f32[4,8]
          domain      %1 = neg(%0) : f32[4,8]
          domain      %2 = mul(%0, %y) : f32[4,8]
          domain      %3 = add(%1, %2) : f32[4,8]
          out: %1: f32[4,8], %3: f32[4,8]
        """)
    assert plan.recomputed() == {}


# ---- a producer feeding two kernels: recompute or materialise --------------------------------

def test_a_cheap_shared_producer_is_recomputed_in_each_consumer_kernel():
    plan = golden("""
        graph @diamond(%x: f32[4,6], %w: f32[6,8]) -> (f32[4,8], f32[1,6]) {
          %0 = full() {dtype=f32, shape=[], value=2.0} : f32[]
          %1 = mul(%x, %0) : f32[4,6]
          %2 = matmul(%1, %w) : f32[4,8]
          %3 = sum(%1) {axes=[0], keepdims=true} : f32[1,6]
          return %2, %3
        }
        """, """
        plan @diamond: 4 nodes -> 2 kernels
          written between kernels: 100 B one kernel per op, 0 B fused
          written as graph outputs: 152 B

        k0 contraction over [4,8], anchor %2
          in:  %x: f32[4,6], %w: f32[6,8]
          leaf        %0 = full() {dtype=f32, shape=[], value=2.0} : f32[]  (recomputed, also in k1)
          prologue    %1 = mul(%x, %0) : f32[4,6]  (recomputed, also in k1)
          anchor      %2 = matmul(%1, %w) : f32[4,8]
          out: %2: f32[4,8]

        k1 reduction over [4,6], anchor %3
          in:  %x: f32[4,6]
          leaf        %0 = full() {dtype=f32, shape=[], value=2.0} : f32[]  (recomputed, also in k0)
          prologue    %1 = mul(%x, %0) : f32[4,6]  (recomputed, also in k0)
          anchor      %3 = sum(%1) {axes=[0], keepdims=true} : f32[1,6]
          out: %3: f32[1,6]
        """)
    assert set(plan.recomputed()) == {plan.graph.nodes[0], plan.graph.nodes[1]}


def test_a_costly_shared_producer_is_materialised():
    golden("""
        graph @diamond(%x: f32[4,6], %w: f32[6,8]) -> (f32[4,8], f32[1,6]) {
          %0 = sigmoid(%x) : f32[4,6]
          %1 = tanh(%0) : f32[4,6]
          %2 = exp(%1) : f32[4,6]
          %3 = matmul(%2, %w) : f32[4,8]
          %4 = sum(%2) {axes=[0], keepdims=true} : f32[1,6]
          return %3, %4
        }
        """, """
        plan @diamond: 5 nodes -> 3 kernels
          written between kernels: 288 B one kernel per op, 96 B fused
          written as graph outputs: 152 B

        k0 elementwise over [4,6]
          in:  %x: f32[4,6]
          domain      %0 = sigmoid(%x) : f32[4,6]
          domain      %1 = tanh(%0) : f32[4,6]
          domain      %2 = exp(%1) : f32[4,6]
          out: %2: f32[4,6]

        k1 contraction over [4,8], anchor %3
          in:  %2: f32[4,6], %w: f32[6,8]
          anchor      %3 = matmul(%2, %w) : f32[4,8]
          out: %3: f32[4,8]

        k2 reduction over [4,6], anchor %4
          in:  %2: f32[4,6]
          anchor      %4 = sum(%2) {axes=[0], keepdims=true} : f32[1,6]
          out: %4: f32[1,6]
        """)


def test_a_shared_producer_whose_inputs_outweigh_it_is_materialised():
    plan = plan_of("""
        graph @diamond(%x: f32[4,6], %y: f32[4,6], %w: f32[6,8]) -> (f32[4,8], f32[1,6]) {
          %0 = add(%x, %y) : f32[4,6]
          %1 = matmul(%0, %w) : f32[4,8]
          %2 = sum(%0) {axes=[0], keepdims=true} : f32[1,6]
          return %1, %2
        }
        """)
    assert [[n.op.name for n in k.nodes] for k in plan.groups] == [["add"], ["matmul"], ["sum"]]
    assert plan.groups[0].outputs == (plan.graph.nodes[0].output,)
    assert_plan_computes_graph(plan)


def test_a_shared_producer_that_is_returned_is_written_once_and_read():
    plan = plan_of("""
        graph @diamond(%x: f32[4,6], %w: f32[6,8]) -> (f32[4,8], f32[1,6], f32[4,6]) {
          %0 = neg(%x) : f32[4,6]
          %1 = matmul(%0, %w) : f32[4,8]
          %2 = sum(%0) {axes=[0], keepdims=true} : f32[1,6]
          return %1, %2, %0
        }
        """)
    assert plan.recomputed() == {}
    assert [k.name for k in plan.groups if plan.graph.nodes[0].output in k.inputs] == ["k1", "k2"]
    assert_plan_computes_graph(plan)


# ---- several outputs, movement ---------------------------------------------------------------

def test_a_multi_output_graph():
    golden("""
        graph @multi(%x: f32[4,8]) -> (f32[4,8], f32[4,1], f32[4,8]) {
          %0 = max(%x) {axes=[1], keepdims=true} : f32[4,1]
          %1 = sub(%x, %0) : f32[4,8]
          %2 = exp(%1) : f32[4,8]
          %3 = sum(%2) {axes=[1], keepdims=true} : f32[4,1]
          %4 = div(%2, %3) : f32[4,8]
          %5 = neg(%x) : f32[4,8]
          return %4, %0, %5
        }
        """, """
        plan @multi: 6 nodes -> 2 kernels
          written between kernels: 272 B one kernel per op, 0 B fused
          written as graph outputs: 272 B

        k0 row_reduction over [4,8], anchor %0
          in:  %x: f32[4,8]
          anchor      %0 = max(%x) {axes=[1], keepdims=true} : f32[4,1]
          domain      %1 = sub(%x, %0) : f32[4,8]
          domain      %2 = exp(%1) : f32[4,8]
          reduce      %3 = sum(%2) {axes=[1], keepdims=true} : f32[4,1]
          domain      %4 = div(%2, %3) : f32[4,8]
          out: %0: f32[4,1], %4: f32[4,8]

        k1 elementwise over [4,8]
          in:  %x: f32[4,8]
          domain      %5 = neg(%x) : f32[4,8]
          out: %5: f32[4,8]
        """)


def test_movement_ops_stay_their_own_kernels():
    golden("""
        graph @moves(%x: f32[4,8], %y: f32[4,2]) -> (f32[4,6], f32[2,4,8]) {
          %0 = exp(%x) : f32[4,8]
          %1 = slice(%0) {starts=[0,0], stops=[4,8], steps=[1,2]} : f32[4,4]
          %2 = concat(%1, %y) {axis=1} : f32[4,6]
          %3 = neg(%2) : f32[4,6]
          %4 = stack(%x, %0) {axis=0} : f32[2,4,8]
          return %3, %4
        }
        """, """
        plan @moves: 5 nodes -> 5 kernels
          written between kernels: 288 B one kernel per op, 288 B fused
          written as graph outputs: 352 B

        k0 elementwise over [4,8]
          in:  %x: f32[4,8]
          domain      %0 = exp(%x) : f32[4,8]
          out: %0: f32[4,8]

        k1 movement over [4,4]
          in:  %0: f32[4,8]
          single      %1 = slice(%0) {starts=[0,0], steps=[1,2], stops=[4,8]} : f32[4,4]
          out: %1: f32[4,4]

        k2 movement over [4,6]
          in:  %1: f32[4,4], %y: f32[4,2]
          single      %2 = concat(%1, %y) {axis=1} : f32[4,6]
          out: %2: f32[4,6]

        k3 elementwise over [4,6]
          in:  %2: f32[4,6]
          domain      %3 = neg(%2) : f32[4,6]
          out: %3: f32[4,6]

        k4 movement over [2,4,8]
          in:  %x: f32[4,8], %0: f32[4,8]
          single      %4 = stack(%x, %0) {axis=0} : f32[2,4,8]
          out: %4: f32[2,4,8]
        """)


def test_a_lone_reshape_is_a_movement_kernel_and_dead_nodes_are_left_out():
    plan = plan_of("""
        graph @g(%x: f32[4,8]) -> f32[8,4] {
          %0 = exp(%x) : f32[4,8]
          %1 = reshape(%x) {shape=[8,4]} : f32[8,4]
          return %1
        }
        """)
    (k,) = plan.groups
    assert k.kind is KernelKind.MOVEMENT and [n.op.name for n in k.nodes] == ["reshape"]
    assert_plan_computes_graph(plan)


# ---- invariants on random graphs -------------------------------------------------------------

@pytest.mark.parametrize("seed", range(40))
def test_random_graphs_partition_validly_and_compute_the_same(seed):
    rng = np.random.default_rng(seed)
    graph = random_fusion_graph(rng, n_nodes=int(rng.integers(4, 24)))
    plan = form_kernels(graph)
    check_invariants(plan)
    assert_plan_computes_graph(plan, seed)


def test_random_graphs_exercise_every_kind_and_role():
    kinds, roles, recomputed = set(), set(), 0
    for seed in range(40):
        rng = np.random.default_rng(seed)
        plan = form_kernels(random_fusion_graph(rng, n_nodes=int(rng.integers(4, 24))))
        kinds |= {k.kind for k in plan.groups}
        roles |= {r for k in plan.groups for r in k.roles}
        recomputed += len(plan.recomputed())
    assert kinds >= {KernelKind.ELEMENTWISE, KernelKind.ROW_REDUCTION, KernelKind.REDUCTION,
                     KernelKind.CONTRACTION, KernelKind.MOVEMENT}
    assert roles >= {Role.ANCHOR, Role.DOMAIN, Role.ROW, Role.EPILOGUE, Role.PROLOGUE,
                     Role.LEAF, Role.SINGLE}
    assert recomputed > 0


@pytest.mark.parametrize("seed", range(10))
def test_suite_random_graphs_partition_validly(graph_factory, seed):
    plan = form_kernels(graph_factory(np.random.default_rng(seed), 14))
    check_invariants(plan)
    assert_plan_computes_graph(plan, seed)


# ---- plan checking and the log ---------------------------------------------------------------

def _two_kernel_plan() -> KernelPlan:
    return plan_of("""
        graph @g(%x: f32[4,8]) -> f32[4,8] {
          %0 = max(%x) {axes=[1], keepdims=true} : f32[4,1]
          %1 = reshape(%0) {shape=[1,4]} : f32[1,4]
          %2 = exp(%1) : f32[1,4]
          %3 = tanh(%2) : f32[1,4]
          %4 = sigmoid(%3) : f32[1,4]
          %5 = transpose(%4) {perm=[1,0]} : f32[4,1]
          %6 = sub(%x, %5) : f32[4,8]
          return %6
        }
        """)


def test_verify_plan_rejects_a_wrong_launch_order_and_missing_nodes():
    plan = _two_kernel_plan()
    assert len(plan.groups) == 3
    verify_plan(plan)
    with pytest.raises(VerifyError, match="before any earlier kernel writes it"):
        verify_plan(KernelPlan(plan.graph, plan.groups[::-1]))
    with pytest.raises(VerifyError, match="is in 0 kernels"):
        verify_plan(KernelPlan(plan.graph, plan.groups[:1]))
    k = plan.groups[1]
    wrong = KernelGroup(k.name, k.kind, k.nodes, k.inputs[:-1], k.outputs, k.anchor, k.domain,
                        k.roles)
    with pytest.raises(VerifyError, match="declares inputs other than those it reads"):
        verify_plan(KernelPlan(plan.graph, (plan.groups[0], wrong, plan.groups[2])))
    with pytest.raises(VerifyError, match="is not in kernel k0"):
        plan.groups[0].role_of(plan.graph.nodes[-1])


def test_fusion_decisions_are_logged(caplog):
    caplog.set_level(logging.DEBUG, logger="tilefuse.fusion")
    plan_of("""
        graph @diamond(%x: f32[4,6], %w: f32[6,8], %b: f32[8]) -> (f32[4,8], f32[1,6]) {
          %0 = neg(%x) : f32[4,6]
          %1 = matmul(%0, %w) : f32[4,8]
          %2 = add(%1, %b) : f32[4,8]
          %3 = sum(%0) {axes=[0], keepdims=true} : f32[1,6]
          %4 = sigmoid(%x) : f32[4,6]
          %5 = tanh(%4) : f32[4,6]
          %6 = exp(%5) : f32[4,6]
          %7 = sum(%6) {axes=[0], keepdims=true} : f32[1,6]
          %8 = matmul(%6, %w) : f32[4,8]
          %9 = add(%3, %7) : f32[1,6]
          %10 = add(%2, %8) : f32[4,8]
          return %10, %9
        }
        """)
    plan_of("""
        graph @cycle(%x: f32[8,6], %w: f32[6,12]) -> f32[8,12] {
          %0 = matmul(%x, %w) : f32[8,12]
          %1 = sum(%0) {axes=[0], keepdims=true} : f32[1,12]
          %2 = sub(%0, %1) : f32[8,12]
          return %2
        }
        """)
    messages = [r.getMessage() for r in caplog.records if r.name == "tilefuse.fusion"]
    assert "g0: contraction group seeded at %1 = matmul" in messages
    assert "g0: %2 = add joins as epilogue" in messages
    assert any(m.startswith("recompute %0 = neg (1 nodes, 1 ops per element) in") for m in messages)
    assert "materialise %6 = exp: recomputing costs 12 ops per element > 8" in messages
    assert "g0: %2 = sub stays out: the kernel graph would have a cycle" in messages
    assert any(m.startswith("g0 -> k") for m in messages)


def test_a_hand_built_group_without_roles_still_prints():
    graph = parse_graph(text("""
        graph @g(%x: f32[4]) -> f32[4] {
          %0 = exp(%x) : f32[4]
          return %0
        }
        """))
    group = KernelGroup("hand", KernelKind.ELEMENTWISE, graph.nodes, graph.inputs,
                        graph.outputs, None, (4,))
    assert "  -           %0 = exp(%x) : f32[4]\n" in print_plan(KernelPlan(graph, (group,)))
    with pytest.raises(VerifyError, match="lists its nodes or roles inconsistently"):
        verify_plan(KernelPlan(graph, (group,)))
