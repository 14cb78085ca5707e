"""Row-reduction kernels lowered to loop IR: softmax, log_softmax, layer_norm and rms_norm from
the composite ops (decomposed or not) and from hand-written graphs, over odd shapes; every row
reduction (sum, mean, max, min, var, prod) with per-row outputs; NaN propagation; the number of
passes; vectorisation fallback; parallel rows. Each kernel runs in the loop interpreter and
compiled, against the graph's reference interpreter."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from test_lower_elementwise import (
    check_groups,
    default,
    kind_loops,
    plan_of,
    random_inputs,
)

from tilefuse.dtypes import DType
from tilefuse.errors import CompileError
from tilefuse.graph.builder import GraphBuilder
from tilefuse.graph.ir import Graph, Value
from tilefuse.graph.parser import parse_graph
from tilefuse.kernel.fusion import KernelGroup, KernelKind, form_kernels
from tilefuse.kernel.lower_elementwise import lower_group
from tilefuse.kernel.lower_rows import lower_rows, plan_rows
from tilefuse.kernel.schedule import Schedule
from tilefuse.loop import Local, LoopFunction, LoopKind, Store
from tilefuse.loop.ir import walk_stmts

F32, F64, F16, BF16 = DType.f32, DType.f64, DType.f16, DType.bf16
SHAPES = [(1, 1), (7, 13), (3, 513), (12, 5, 64)]
COMPOSITES = ["softmax", "log_softmax", "layer_norm", "rms_norm"]


def composite_graph(op: str, shape: tuple[int, ...], dtype: DType = F32, k: int = 1) -> Graph:
    """``op`` over the trailing axis (``k`` trailing axes for the norms) of x."""
    b = GraphBuilder(op)
    x = b.input((shape, dtype), "x")
    params = shape[len(shape) - k:]
    if op in ("softmax", "log_softmax"):
        y = b.add1(op, [x], {"axis": -1})
    elif op == "layer_norm":
        w, bias = b.input((params, dtype), "w"), b.input((params, dtype), "b")
        y = b.add1(op, [x, w, bias], {"eps": 1e-5})
    else:
        y = b.add1(op, [x, b.input((params, dtype), "w")], {"eps": 1e-6})
    return b.build([y])


def check_rows(graph: Graph, decompose: bool = True, seed: int = 0, **kwargs: Any
               ) -> list[LoopFunction]:
    """One ROW_REDUCTION kernel for ``graph``, checked against the reference."""
    plan = plan_of(graph) if decompose else form_kernels(graph)
    assert [g.kind for g in plan.groups] == [KernelKind.ROW_REDUCTION]
    return check_groups(plan.graph, plan.groups, random_inputs(graph, seed), reduction=True,
                        **kwargs)


def vector_accumulators(fn: LoopFunction) -> int:
    return sum(isinstance(s, Local) and s.type.lanes > 1 for s in walk_stmts(fn.body))


# ----------------------------------------------------------------------------- composites


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("op", COMPOSITES)
def test_composites_decomposed(op, shape):
    check_rows(composite_graph(op, shape), seed=shape[-1])


@pytest.mark.parametrize("shape", [(7, 13), (12, 5, 64)])
@pytest.mark.parametrize("op", COMPOSITES)
def test_composites_left_whole_are_decomposed_by_the_lowering(op, shape):
    check_rows(composite_graph(op, shape), decompose=False)


@pytest.mark.parametrize("op", ["layer_norm", "rms_norm"])
def test_norms_over_two_trailing_axes(op):
    check_rows(composite_graph(op, (6, 5, 64), k=2))


@pytest.mark.parametrize("dtype", [F64, F16, BF16])
@pytest.mark.parametrize("op", ["softmax", "layer_norm"])
def test_composites_in_other_dtypes(op, dtype):
    check_rows(composite_graph(op, (3, 100), dtype))


def test_passes_per_composite():
    """softmax: max, sum, write; layer_norm: mean, variance, write; rms_norm: mean, write."""
    expected = {"softmax": 2, "log_softmax": 2, "layer_norm": 2, "rms_norm": 1}
    for op, reductions in expected.items():
        (group,) = plan_of(composite_graph(op, (4, 64))).groups
        sched = Schedule(KernelKind.ROW_REDUCTION, order=("r", "n"), vector_axis="n",
                         vector_width=8)
        fn = lower_group(group, sched)
        assert vector_accumulators(fn) == reductions, op
        stores = [s for s in kind_loops(fn, LoopKind.VECTORIZED)
                  if any(isinstance(x, Store) for x in walk_stmts(s.body))]
        assert len(stores) == 1, op  # one write pass


HAND_SOFTMAX = """
graph @softmax(%x: f32[{r},{n}]) -> f32[{r},{n}] {{
  %0 = max(%x) {{axes=[1]}} : f32[{r}]
  %1 = expand_dims(%0) {{axes=[1]}} : f32[{r},1]
  %2 = sub(%x, %1) : f32[{r},{n}]
  %3 = exp(%2) : f32[{r},{n}]
  %4 = sum(%3) {{axes=[-1], keepdims=true}} : f32[{r},1]
  %5 = div(%3, %4) : f32[{r},{n}]
  return %5
}}"""

HAND_LAYER_NORM = """
graph @layer_norm(%x: f32[{r},{n}], %w: f32[{n}], %b: f32[{n}]) -> f32[{r},{n}] {{
  %0 = mean(%x) {{axes=[1], keepdims=true}} : f32[{r},1]
  %1 = sub(%x, %0) : f32[{r},{n}]
  %2 = mul(%1, %1) : f32[{r},{n}]
  %3 = mean(%2) {{axes=[1], keepdims=true}} : f32[{r},1]
  %4 = full() {{shape=[], value=1e-05, dtype=f32}} : f32[]
  %5 = add(%3, %4) : f32[{r},1]
  %6 = sqrt(%5) : f32[{r},1]
  %7 = div(%1, %6) : f32[{r},{n}]
  %8 = mul(%7, %w) : f32[{r},{n}]
  %9 = add(%8, %b) : f32[{r},{n}]
  return %9
}}"""

HAND_RMS_NORM = """
graph @rms_norm(%x: f32[{r},{n}], %w: f32[{n}]) -> f32[{r},{n}] {{
  %0 = mul(%x, %x) : f32[{r},{n}]
  %1 = mean(%0) {{axes=[1], keepdims=true}} : f32[{r},1]
  %2 = full() {{shape=[], value=1e-06, dtype=f32}} : f32[]
  %3 = add(%1, %2) : f32[{r},1]
  %4 = rsqrt(%3) : f32[{r},1]
  %5 = mul(%x, %4) : f32[{r},{n}]
  %6 = mul(%5, %w) : f32[{r},{n}]
  return %6
}}"""

HAND_LOG_SOFTMAX = """
graph @log_softmax(%x: f32[{r},{n}]) -> f32[{r},{n}] {{
  %0 = max(%x) {{axes=[1], keepdims=true}} : f32[{r},1]
  %1 = sub(%x, %0) : f32[{r},{n}]
  %2 = exp(%1) : f32[{r},{n}]
  %3 = sum(%2) {{axes=[1], keepdims=true}} : f32[{r},1]
  %4 = log(%3) : f32[{r},1]
  %5 = sub(%1, %4) : f32[{r},{n}]
  return %5
}}"""


@pytest.mark.parametrize("shape", [(1, 1), (7, 13), (3, 513)])
@pytest.mark.parametrize("text", [HAND_SOFTMAX, HAND_LOG_SOFTMAX, HAND_LAYER_NORM,
                                  HAND_RMS_NORM], ids=["softmax", "log_softmax", "layer_norm",
                                                       "rms_norm"])
def test_hand_written(text, shape):
    r, n = shape
    check_rows(parse_graph(text.format(r=r, n=n)), seed=n)


# ----------------------------------------------------------------------------- every reduction

REDUCTIONS = """
graph @reductions(%x: {t}[6,37], %y: {m}[6,37]) -> ({s}[6], {m}[6,1], {t}[6], {t}[6,1],
                  {m}[6], {m}[6,1], {s}[6], {m}[6,37]) {{
  %0 = sum(%x) {{axes=[1]}} : {s}[6]
  %1 = mean(%x) {{axes=[1], keepdims=true}} : {m}[6,1]
  %2 = max(%x) {{axes=[1]}} : {t}[6]
  %3 = min(%x) {{axes=[-1], keepdims=true}} : {t}[6,1]
  %4 = var(%x) {{axes=[1]}} : {m}[6]
  %5 = var(%x) {{axes=[1], keepdims=true, ddof=1}} : {m}[6,1]
  %6 = prod(%x) {{axes=[1]}} : {s}[6]
  %7 = sub(%y, %5) : {m}[6,37]
  return %0, %1, %2, %3, %4, %5, %6, %7
}}"""


@pytest.mark.parametrize(("t", "s", "m"), [("f32", "f32", "f32"), ("f64", "f64", "f64"),
                                           ("i32", "i64", "f64")])
def test_every_row_reduction(t, s, m):
    graph = parse_graph(REDUCTIONS.format(t=t, s=s, m=m))
    arrays = random_inputs(graph, 21, 0.5, 1.5)  # prod over 37 values stays in range
    nodes = graph.nodes
    group = KernelGroup("reductions", KernelKind.ROW_REDUCTION, nodes, graph.inputs,
                        graph.outputs, nodes[0], (6, 37))
    check_groups(graph, [group], arrays, reduction=True)


def test_bool_max_and_int_sum():
    graph = parse_graph("""
    graph @flags(%b: bool[5,40], %i: u8[5,40]) -> (bool[5,1], i64[5], u8[5]) {
      %0 = max(%b) {axes=[1], keepdims=true} : bool[5,1]
      %1 = sum(%i) {axes=[1]} : i64[5]
      %2 = min(%i) {axes=[1]} : u8[5]
      return %0, %1, %2
    }""")
    group = KernelGroup("flags", KernelKind.ROW_REDUCTION, graph.nodes, graph.inputs,
                        graph.outputs, graph.nodes[0], (5, 40))
    check_groups(graph, [group], random_inputs(graph, 22), reduction=True)


def test_full_and_per_row_outputs_together():
    graph = parse_graph("""
    graph @both(%x: f32[9,70]) -> (f32[9,70], f32[9,1], f32[9,1]) {
      %0 = max(%x) {axes=[1], keepdims=true} : f32[9,1]
      %1 = sub(%x, %0) : f32[9,70]
      %2 = exp(%1) : f32[9,70]
      %3 = sum(%2) {axes=[1], keepdims=true} : f32[9,1]
      %4 = log(%3) : f32[9,1]
      %5 = div(%2, %3) : f32[9,70]
      return %5, %0, %4
    }""")
    check_rows(graph, seed=23)


# ----------------------------------------------------------------------------- NaN


def nan_rows(graph: Graph, seed: int) -> list[np.ndarray]:
    arrays = random_inputs(graph, seed)
    arrays[0][1, 3] = np.nan
    arrays[0][2, -1] = np.nan
    return arrays


@pytest.mark.parametrize("n", [13, 513])
def test_nan_propagates_through_max_and_softmax(n):
    graph = parse_graph(f"""
    graph @nan(%x: f32[4,{n}]) -> (f32[4,{n}], f32[4], f32[4]) {{
      %0 = softmax(%x) {{axis=-1}} : f32[4,{n}]
      %1 = max(%x) {{axes=[1]}} : f32[4]
      %2 = min(%x) {{axes=[1]}} : f32[4]
      return %0, %1, %2
    }}""")
    plan = plan_of(graph)
    check_groups(plan.graph, plan.groups, nan_rows(graph, n), reduction=True)


# ----------------------------------------------------------------------------- schedules


def test_transposed_input_makes_scalar_passes():
    graph = parse_graph("""
    graph @t(%x: f32[40,6]) -> f32[6,40] {
      %0 = transpose(%x) {perm=[1,0]} : f32[6,40]
      %1 = softmax(%0) {axis=-1} : f32[6,40]
      return %1
    }""")
    (fn,) = check_rows(graph)
    assert not kind_loops(fn, LoopKind.VECTORIZED)


def test_parallel_rows_in_tiles():
    plan = plan_of(composite_graph("layer_norm", (10, 100)))
    graph, (group,) = plan.graph, plan.groups
    sched = Schedule(KernelKind.ROW_REDUCTION, tiles=(("r", 3),), order=("r", "n"),
                     vector_axis="n", vector_width=16, parallel_axes=("r",),
                     unroll=(("n", 4),))
    (fn,) = check_groups(graph, [group], random_inputs(graph, 24), schedule=lambda g: sched,
                         reduction=True, threads=2)
    (par,) = kind_loops(fn, LoopKind.PARALLEL)
    assert par.stop.arg == 4  # ceil(10 / 3) tiles of rows
    assert kind_loops(fn, LoopKind.UNROLLED)


def test_default_schedule_parallel_rows():
    graph = composite_graph("softmax", (300, 513))
    (fn,) = check_rows(graph, interpreted=False, threads=2)
    (group,) = plan_of(graph).groups
    assert bool(kind_loops(fn, LoopKind.PARALLEL)) == bool(default(group).parallel_axes)


# ----------------------------------------------------------------------------- errors


def test_reductions_over_leading_axes_are_refused():
    graph = parse_graph("""
    graph @lead(%x: f32[6,7]) -> f32[7] {
      %0 = sum(%x) {axes=[0]} : f32[7]
      return %0
    }""")
    group = KernelGroup("lead", KernelKind.ROW_REDUCTION, graph.nodes, graph.inputs,
                        graph.outputs, graph.nodes[0], (6, 7))
    with pytest.raises(CompileError, match="trailing axes"):
        lower_rows(group, None)


def test_outputs_of_other_shapes_are_refused():
    b = GraphBuilder("odd")
    x, w = b.input(((6, 7), F32), "x"), b.input(((7,), F32), "w")
    s = b.add1("sum", [x], {"axes": (1,), "keepdims": True})
    w2 = b.add1("exp", [w])
    graph = b.build([s, w2])
    group = KernelGroup("odd", KernelKind.ROW_REDUCTION, graph.nodes, graph.inputs,
                        graph.outputs, graph.nodes[0], (6, 7))
    with pytest.raises(CompileError, match="neither the domain"):
        plan_rows(group)


def test_row_plan_levels():
    graph, _ = composite_graph("layer_norm", (3, 8)), None
    (group,) = plan_of(graph).groups
    plan = plan_rows(group)
    assert plan.rows == (3,) and plan.row == (8,)
    assert [s.level for s in plan.stages] == [1, 2]
    assert all(isinstance(v, Value) for v in plan.full_outputs)
