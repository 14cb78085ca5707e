"""Row-reduction kernels lowered to loop IR: softmax, log_softmax, layer_norm and rms_norm from
the composite ops (decomposed or not) and from hand-written graphs, over odd shapes; every row
reduction (sum, mean, max, min, var, prod) with per-row outputs; NaN propagation; the number of
passes; vectorisation fallback; parallel rows; expensive row values stored by the pass computing
them and read back by the write pass (the cost rule; bit-identical results). Each kernel runs in
the loop interpreter and compiled, against the graph's reference interpreter."""

from __future__ import annotations

import math
import re
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

from tilefuse.codegen import compile_kernel
from tilefuse.codegen.target import host_target
from tilefuse.dtypes import DType
from tilefuse.errors import CompileError
from tilefuse.graph.builder import GraphBuilder
from tilefuse.graph.ir import Graph, Value
from tilefuse.graph.parser import parse_graph
from tilefuse.kernel import row_store
from tilefuse.kernel.fusion import KernelGroup, KernelKind, form_kernels
from tilefuse.kernel.lower_elementwise import fit_lanes, lower_group
from tilefuse.kernel.lower_rows import TAIL_MIN_LANES, lower_rows, plan_rows, row_shape
from tilefuse.kernel.row_store import row_varying
from tilefuse.kernel.schedule import Schedule
from tilefuse.loop import Local, LocalStore, LoopFunction, LoopKind, Store
from tilefuse.loop.ir import For, Stmt, XOp, expr_children, walk_expr, walk_stmts

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


def loads_from(stmt: Stmt, prefix: str = "out") -> bool:
    """Whether ``stmt`` reads a buffer whose name starts with ``prefix`` (an output)."""
    return any(e.op is XOp.LOAD and str(e.arg).startswith(prefix)
               for s in walk_stmts(stmt) for root in expr_children(s) for e in walk_expr(root))


def reads_output(stmt: Stmt) -> bool:
    return loads_from(stmt, "out")


def row_loops(fn: LoopFunction) -> tuple[list[For], list[For]]:
    """The innermost loops over the row: those of reduction passes (they accumulate into a
    local) and those of the write pass."""
    loops = [s for s in walk_stmts(fn.body)
             if isinstance(s, For) and s.kind is not LoopKind.UNROLLED]
    inner = [s for s in loops if not any(x in loops for x in walk_stmts(s.body))]
    passes = [s for s in inner if any(isinstance(x, LocalStore) for x in walk_stmts(s.body))]
    return passes, [s for s in inner if s not in passes]


def count_op(stmt: Stmt, op: XOp) -> int:
    """Occurrences of ``op`` in the expressions of ``stmt`` and its nested statements."""
    return sum(e.op is op for s in walk_stmts(stmt) for root in expr_children(s)
               for e in walk_expr(root))


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


@pytest.mark.parametrize(("shape", "groups"), [((2, 64, 8, 8), 32), ((1, 32, 7, 9), 4),
                                               ((3, 6, 5), 3), ((1, 48, 513), 3)])
def test_group_norm_rows(shape, groups):
    """group_norm's rows are [N, C, H, W] viewed as [N, G, C/G·H·W]: the reshape splits the
    channel axis inside a row, and the row passes still run in vectors where a row holds whole
    vectors (C/G·H·W a multiple of the host's f32 lanes: with 16, 2·8·8 and 16·513 here, not
    8·63 or 2·5; with 8, also 8·63)."""
    b = GraphBuilder("group_norm")
    x = b.input((shape, F32), "x")
    w, bias = b.input(((shape[1],), F32), "w"), b.input(((shape[1],), F32), "b")
    graph = b.build([b.add1("group_norm", [x, w, bias], {"groups": groups, "eps": 1e-4})])
    plan = plan_of(graph)
    fns = check_groups(plan.graph, plan.groups, random_inputs(graph, groups), reduction=True)
    (rows,) = [f for f, g in zip(fns, plan.groups) if g.kind is KernelKind.ROW_REDUCTION]
    whole_vectors = (math.prod(shape[1:]) // groups) % (host_target().vector_bits // 32) == 0
    assert (vector_accumulators(rows) > 0) == whole_vectors


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
        writes = [s for s in kind_loops(fn, LoopKind.VECTORIZED)
                  if any(isinstance(x, Store) for x in walk_stmts(s.body))
                  and not any(isinstance(x, LocalStore) for x in walk_stmts(s.body))]
        assert len(writes) == 1, op  # one write pass (a reduction pass may store a row value)


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
    assert vector_accumulators(fn) == 0  # the passes reading x are scalar
    # only the write pass vectorises: it reads exp(x - max) back from the contiguous output
    (write,) = kind_loops(fn, LoopKind.VECTORIZED)
    assert reads_output(write)


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


# ----------------------------------------------------------------------------- stored values


def recompute_everything(monkeypatch: pytest.MonkeyPatch) -> None:
    """Turns the stored path off (every value costs at most the threshold)."""
    monkeypatch.setattr(row_store, "RECOMPUTE_MAX_OPS", 10**9)


@pytest.mark.parametrize("shape", SHAPES)
def test_softmax_stores_exp_and_the_write_pass_reads_it(shape):
    """exp(x - max) is computed once per element, in the sum pass, which stores it into the
    output row; the write pass reads it back and multiplies by the sum's reciprocal, taken
    once per row (a vector division per element cost about as much as the exp)."""
    (fn,) = check_rows(composite_graph("softmax", shape), seed=shape[-1] + 1)
    passes, writes = row_loops(fn)
    assert writes and all(count_op(w, XOp.EXP) == 0 and reads_output(w) for w in writes)
    assert all(count_op(w, XOp.DIV) == 0 and count_op(w, XOp.MUL) >= 1 for w in writes)
    assert count_op(fn.body, XOp.DIV) >= 1   # 1 / sum, outside the row loops
    storing = [p for p in passes if any(isinstance(x, Store) for x in walk_stmts(p))]
    exps = re.findall(r"\bexp\(", str(fn))  # in the printed loop IR
    assert len(storing) == sum_loops(shape)
    assert len(exps) == sum_loops(shape) + tail_vectors(shape)


def sum_loops(shape: tuple[int, ...]) -> int:
    """Loops of the sum pass at the default schedule: a vector loop and a scalar tail (what
    the narrower tail vectors leave)."""
    n = shape[-1]
    lanes = fit_lanes(16, n)
    rest = n % lanes
    for width in (lanes // 2, lanes // 4):
        if width >= TAIL_MIN_LANES and rest >= width:
            rest -= width
    return (1 if n >= lanes or lanes == 1 else 0) + (1 if rest and lanes > 1 else 0)


def tail_vectors(shape: tuple[int, ...]) -> int:
    """Straight-line steps of the sum pass's tail in vectors of 8 or 4 lanes."""
    n = shape[-1]
    lanes = fit_lanes(16, n)
    rest, steps = n % lanes, 0
    for width in (lanes // 2, lanes // 4):
        if width >= TAIL_MIN_LANES and rest >= width:
            rest, steps = rest - width, steps + 1
    return steps


@pytest.mark.parametrize("shape", SHAPES)
def test_log_softmax_computes_exp_once_and_stores_nothing(shape):
    """The write pass of log_softmax needs x - max only (1 op): recomputed, nothing stored."""
    (fn,) = check_rows(composite_graph("log_softmax", shape), seed=shape[-1] + 2)
    passes, writes = row_loops(fn)
    assert len(re.findall(r"\bexp\(", str(fn))) == sum_loops(shape) + tail_vectors(shape)
    assert not any(count_op(w, XOp.EXP) or reads_output(w) for w in writes)
    assert not any(isinstance(x, Store) for p in passes for x in walk_stmts(p))


@pytest.mark.parametrize("shape", SHAPES)
def test_layer_norm_recomputes_the_cheap_centred_value(shape):
    """x - mean costs 1 op: the write pass recomputes it from x, the passes store nothing."""
    (fn,) = check_rows(composite_graph("layer_norm", shape), seed=shape[-1] + 3)
    passes, writes = row_loops(fn)
    assert writes and not any(reads_output(w) for w in writes)
    assert not any(isinstance(x, Store) for p in passes for x in walk_stmts(p))


COST_EDGE = """
graph @edge(%x: f32[5,40]) -> f32[5,40] {{
  %m = max(%x) {{axes=[1], keepdims=true}} : f32[5,1]
  %0 = mul(%x, %x) : f32[5,40]
  %1 = add(%0, %x) : f32[5,40]
  %2 = {value} : f32[5,40]
  %3 = sum(%2) {{axes=[1], keepdims=true}} : f32[5,1]
  %4 = div(%2, %3) : f32[5,40]
  return %4
}}"""


@pytest.mark.parametrize(("value", "stored"), [
    ("sub(%1, %m)", True),   # x*x + x - m: 3 ops, stored
    ("add(%0, %x)", False),  # x*x + x: 2 ops, recomputed
    ("sub(%x, %m)", False),  # 1 op, recomputed
    ("exp(%x)", True),       # a transcendental, stored
])
def test_the_cost_rule(value, stored):
    """Recompute a value costing <= 2 ops per element, store one costing more."""
    (fn,) = check_rows(parse_graph(COST_EDGE.format(value=value)), seed=31)
    passes, writes = row_loops(fn)
    assert writes and all(reads_output(w) == stored for w in writes)
    assert any(isinstance(x, Store) for p in passes for x in walk_stmts(p)) == stored


@pytest.mark.parametrize("dtype", [F32, F64, F16, BF16])
def test_stored_only_when_the_output_holds_the_value_exactly(dtype):
    """f16/bf16 softmax computes exp in f32: the output cannot hold it, so it is recomputed."""
    (fn,) = check_rows(composite_graph("softmax", (3, 100), dtype), seed=32)
    _, writes = row_loops(fn)
    exact = dtype in (F32, F64)
    assert all(reads_output(w) == exact and bool(count_op(w, XOp.EXP)) != exact
               for w in writes)


def test_long_rows_are_recomputed(monkeypatch):
    monkeypatch.setattr(row_store, "STORE_ROW_BYTES", 4 * 63)
    (fn,) = check_rows(composite_graph("softmax", (3, 64)), seed=33)
    _, writes = row_loops(fn)
    assert all(count_op(w, XOp.EXP) == 1 and not reads_output(w) for w in writes)


@pytest.mark.parametrize("op", ["softmax", "layer_norm", "rms_norm"])
@pytest.mark.parametrize("dtype", [F32, F64])
@pytest.mark.parametrize("threads", [1, 2])
def test_stored_results_are_bitwise_those_recomputed(monkeypatch, op, dtype, threads):
    """Storing changes where a value lives, not how it is computed: compiled outputs are
    bit-identical with the stored path on and off (NaN rows included)."""
    plan = plan_of(composite_graph(op, (37, 300), dtype))
    (group,) = plan.groups
    arrays = nan_rows(plan.graph, 34)
    arrays[0] *= 30

    def run() -> np.ndarray:
        fn = lower_group(group, default(group))
        out = np.empty(arrays[0].shape, arrays[0].dtype)
        compile_kernel(fn)(*arrays, out, num_threads=threads)
        return out

    stored = run()
    recompute_everything(monkeypatch)
    assert stored.tobytes() == run().tobytes()


EXP_TOO = """
graph @both(%x: f32[{r},{n}]) -> ({outs}) {{
  %0 = max(%x) {{axes=[1], keepdims=true}} : f32[{r},1]
  %1 = sub(%x, %0) : f32[{r},{n}]
  %2 = exp(%1) : f32[{r},{n}]
  %3 = sum(%2) {{axes=[1], keepdims=true}} : f32[{r},1]
  %4 = div(%2, %3) : f32[{r},{n}]
  %5 = cast(%2) {{dtype=f16}} : f16[{r},{n}]
  return {returned}
}}"""


@pytest.mark.parametrize("shape", [(1, 1), (7, 13), (3, 513)])
@pytest.mark.parametrize("returned", [True, False])
def test_other_outputs_reading_the_stored_value(shape, returned):
    """Returned, e = exp(x - max) is stored in its own buffer by the sum pass, for good;
    otherwise in softmax's, and the f16 cast of e reads it before softmax overwrites it."""
    r, n = shape
    outs = ", ".join(f"{t}[{r},{n}]" for t in ("f32", "f16", *(("f32",) if returned else ())))
    text = EXP_TOO.format(r=r, n=n, outs=outs, returned="%4, %5, %2" if returned else "%4, %5")
    (fn,) = check_rows(parse_graph(text), seed=35)
    passes, writes = row_loops(fn)
    stored = {s.buffer for p in passes for s in walk_stmts(p) if isinstance(s, Store)}
    assert len(stored) == 1
    for w in writes:
        written = {s.buffer for s in walk_stmts(w) if isinstance(s, Store)}
        assert count_op(w, XOp.EXP) == 0 and reads_output(w)
        assert bool(written & stored) != returned


def test_row_varying_values():
    (group,) = plan_of(composite_graph("layer_norm", (4, 8))).groups
    plan = plan_rows(group)
    varying = row_varying(group, row_shape(group, plan))
    per_row = {v for n in group.nodes if n.op.name == "mean" for v in n.outputs}
    assert group.inputs[0] in varying and not per_row & varying
    assert group.outputs[0] in varying


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


@pytest.mark.parametrize(("shape", "view"), [
    ((2, 6, 8, 8), (2, 3, 128)),     # rows of 128 across a split channel axis: vectors
    ((3, 4, 6, 4), (3, 2, 48)),      # rows of 48 = 3 vectors over blocks of 24 (no 16 | 24)
    ((2, 10, 16), (4, 80)),          # rows of 80 over blocks of 16: vectors
    ((5, 6, 7), (10, 21)),           # rows of 21: scalars
    ((1, 64, 4, 4), (2, 512)),       # a row over several whole input axes
])
def test_rows_through_a_reshape_that_splits_axes(shape, view):
    """softmax over the trailing axis of x reshaped so a row ends inside an input axis, and the
    result reshaped back and scaled by a per-element input: compiled and interpreted kernels
    against the reference, whether the rows run in vectors or not."""
    b = GraphBuilder("split_rows")
    x = b.input((shape, F32), "x")
    y = b.input((shape, F32), "y")
    rows = b.add1("softmax", [b.add1("reshape", [x], {"shape": view})], {"axis": -1})
    back = b.add1("reshape", [rows], {"shape": shape})
    graph = b.build([b.add1("mul", [back, y], {})])
    plan = plan_of(graph)
    check_groups(plan.graph, plan.groups, random_inputs(graph, sum(view)), reduction=True)


# ----------------------------------------------------------------------------- streaming


def streaming_stores(fn: LoopFunction) -> list[Store]:
    return [s for s in walk_stmts(fn.body) if isinstance(s, Store) and s.streaming]


@pytest.mark.parametrize("op", COMPOSITES)
@pytest.mark.parametrize("shape", [(7, 64), (3, 5, 256), (2, 7, 13), (5, 1000)])
def test_large_outputs_stream_and_stored_values_use_a_scratch_row(monkeypatch, op, shape):
    """Past the threshold, rows of whole aligned vectors write their output once, in the
    write pass, with streaming stores; softmax's exp goes to a scratch row, not the output
    (the output would be read for ownership first). Other rows store as before."""
    monkeypatch.setattr(row_store, "STREAM_MIN_BYTES", 1)
    (fn,) = check_rows(composite_graph(op, shape), seed=41)
    passes, writes = row_loops(fn)
    if shape[-1] * 4 % row_store.STREAM_ALIGN:   # then whole vectors too (<= 16 lanes)
        assert not streaming_stores(fn)
        return
    assert streaming_stores(fn)
    assert not any(isinstance(s, Store) for p in passes for s in walk_stmts(p))
    assert all(not reads_output(w) for w in writes)
    assert all(s.streaming for w in writes for s in walk_stmts(w) if isinstance(s, Store))


def test_small_outputs_do_not_stream():
    (fn,) = check_rows(composite_graph("softmax", (7, 64)), seed=42)
    assert not streaming_stores(fn) and row_store.stream_min_bytes() > 7 * 64 * 4


@pytest.mark.parametrize("op", ["softmax", "log_softmax", "layer_norm", "rms_norm"])
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("offset", [0, 1])
def test_streamed_results_are_bitwise_those_stored_normally(monkeypatch, op, threads, offset):
    """Streaming changes how the output is written, not what: bit-identical outputs, also
    into an output buffer that is not vector-aligned (``offset`` elements in), where the
    kernel falls back to plain stores."""
    plan = plan_of(composite_graph(op, (37, 320)))
    (group,) = plan.groups
    arrays = nan_rows(plan.graph, 36)
    arrays[0] *= 30

    def run() -> np.ndarray:
        fn = lower_group(group, default(group))
        room = np.empty(arrays[0].size + 16, arrays[0].dtype)
        start = (-room.ctypes.data // 4) % 16 + offset
        out = room[start:start + arrays[0].size].reshape(arrays[0].shape)
        compile_kernel(fn)(*arrays, out, num_threads=threads)
        return out.copy(), fn

    plain, fn = run()
    assert not streaming_stores(fn)
    monkeypatch.setattr(row_store, "STREAM_MIN_BYTES", 1)
    streamed, fn = run()
    assert streaming_stores(fn)
    assert plain.tobytes() == streamed.tobytes()
