"""Elementwise kernels lowered to loop IR: every elementwise op's lowering (f32, f64, f16, bf16,
integers, bools; sizes 1, 7, 513 and broadcasting; special values), fused chains and epilogues,
movement ops as index remappings, vectorisation choices, parallel loops, the index helpers,
element_expr with overrides, errors, and one printed kernel.

Every kernel runs twice, in the loop interpreter and compiled, and both are compared with the
graph's reference interpreter. To keep compile time down, the op tables put all ops of one
dtype and shape into one kernel (one output per op) instead of one kernel per op.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import pytest

from tilefuse.codegen import compile_kernel, host_target
from tilefuse.dtypes import DType
from tilefuse.errors import CompileError
from tilefuse.graph.builder import GraphBuilder
from tilefuse.graph.interpreter import interpret as interpret_graph
from tilefuse.graph.ir import Graph, Value
from tilefuse.graph.parser import parse_graph
from tilefuse.graph.types import Sym, TensorType
from tilefuse.kernel.access import (
    Namer,
    NotVectorizable,
    broadcast_run,
    flatten,
    kernel_buffers,
    load_contiguous,
    reshaped_run,
    transposed_run,
    unflatten,
    whole_vector_run,
)
from tilefuse.kernel.fusion import KernelGroup, KernelKind, KernelPlan, form_kernels
from tilefuse.kernel.lower_elementwise import lower_elementwise, lower_group
from tilefuse.kernel.scalar_expr import ElementBuilder, element_expr
from tilefuse.kernel.schedule import Schedule, default_schedule
from tilefuse.loop import BufferParam, LoopFunction, LoopKind, Store, interpret, loop, var
from tilefuse.loop.ir import For, walk_stmts
from tilefuse.ops import OPS
from tilefuse.passes.decompose import decompose_composites
from tilefuse.testing import assert_close, random_array

F32, F64, F16, BF16 = DType.f32, DType.f64, DType.f16, DType.bf16
TARGET = host_target()

# ----------------------------------------------------------------------------- helpers


def plan_of(graph: Graph) -> KernelPlan:
    """The kernel plan of ``graph`` after decomposing composites."""
    graph, _ = decompose_composites(graph)
    return form_kernels(graph)


def default(group: KernelGroup) -> Schedule:
    return default_schedule(group, TARGET)


def outputs_of(group: KernelGroup) -> list[Value]:
    return list(dict.fromkeys(group.outputs))


def run_kernel(fn: LoopFunction, group: KernelGroup, env: dict[Value, np.ndarray],
               runner: Callable[..., None]) -> None:
    """Runs one lowered kernel on the arrays of ``env``, adding its outputs to ``env``."""
    outs = [np.full(tuple(v.shape), 7, v.dtype.np) for v in outputs_of(group)]
    runner(*(env[v] for v in dict.fromkeys(group.inputs)), *outs)
    env.update(zip(outputs_of(group), outs))


def check_groups(graph: Graph, groups: Sequence[KernelGroup], arrays: Sequence[np.ndarray], *,
                 schedule: Callable[[KernelGroup], Schedule] = default, reduction: bool = False,
                 compiled: bool = True, interpreted: bool = True, threads: int = 0,
                 labels: Sequence[str] = ()) -> list[LoopFunction]:
    """Lowers ``groups`` (in launch order), runs them with the loop interpreter and compiled,
    and compares the graph outputs with the reference interpreter. Returns the kernels."""
    expected = interpret_graph(graph, *arrays)
    fns = [lower_group(g, schedule(g)) for g in groups]
    runners: list[tuple[str, list[Callable[..., None]]]] = []
    if interpreted:
        runners.append(("interpreter", [lambda *a, fn=fn: interpret(fn, *a) for fn in fns]))
    if compiled:
        kernels = [compile_kernel(fn) for fn in fns]
        runners.append(("compiled", [lambda *a, k=k: k(*a, num_threads=threads)
                                     for k in kernels]))
    for how, run in runners:
        env = dict(zip(graph.inputs, arrays))
        for fn, group, runner in zip(fns, groups, run):
            run_kernel(fn, group, env, runner)
        for pos, (v, want) in enumerate(zip(graph.outputs, expected)):
            label = labels[pos] if pos < len(labels) else f"output {pos}"
            assert_close(env[v], want, reduction=reduction, msg=f"{how}: {label}")
    return fns


def check_graph(graph: Graph, arrays: Sequence[np.ndarray], **kwargs: Any) -> list[LoopFunction]:
    """:func:`check_groups` over the kernel plan of ``graph`` (composites decomposed)."""
    plan = plan_of(graph)
    return check_groups(plan.graph, plan.groups, arrays, **kwargs)


def random_inputs(graph: Graph, seed: int, low: float = -2.0, high: float = 2.0
                  ) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [random_array(rng, tuple(v.shape), v.dtype, low, high) for v in graph.inputs]


def kind_loops(fn: LoopFunction, kind: LoopKind) -> list[For]:
    return [s for s in walk_stmts(fn.body) if isinstance(s, For) and s.kind is kind]


def one_kernel(graph: Graph, name: str = "ops") -> KernelGroup:
    """All of ``graph``'s nodes as one ELEMENTWISE group writing every graph output."""
    domain = max((tuple(v.shape) for v in graph.outputs), key=lambda s: int(np.prod(s)))
    return KernelGroup(name, KernelKind.ELEMENTWISE, graph.nodes, graph.inputs,
                       graph.outputs, None, domain)


# ----------------------------------------------------------------------------- op tables

UNARY_ANY = ["neg", "abs", "relu", "sign", "floor", "ceil", "round", "exp", "log", "log1p",
             "expm1", "sqrt", "rsqrt", "reciprocal", "tanh", "sigmoid", "erf", "silu",
             "softplus", "sin", "cos", "logical_not", "isnan"]
FLOAT_UNARY: list[tuple[str, dict[str, Any]]] = [
    *((op, {}) for op in UNARY_ANY), ("gelu", {"approximate": "none"}),
    ("gelu", {"approximate": "tanh"}), ("clip", {"min": -0.5, "max": 0.7}),
    ("clip", {"min": None, "max": 1.25}), ("cast", {"dtype": DType.i32}),
    ("cast", {"dtype": DType.f64}), ("cast", {"dtype": DType.f16}),
    ("cast", {"dtype": DType.bf16}), ("cast", {"dtype": DType.bool})]
BINARY_ANY = ["add", "mul", "maximum", "minimum", "eq", "ne", "lt", "le", "gt", "ge",
              "logical_and", "logical_or", "logical_xor", "div"]
NUMERIC_BINARY = [*BINARY_ANY, "sub", "floordiv", "mod"]
INT_UNARY: list[tuple[str, dict[str, Any]]] = [
    *((op, {}) for op in ["neg", "abs", "relu", "sign", "floor", "ceil", "round", "logical_not",
                          "isnan", "exp", "sqrt", "reciprocal", "sigmoid"]),
    ("clip", {"min": -2.5, "max": 3.7}), ("clip", {"min": 1e9, "max": None}),
    ("cast", {"dtype": F32}), ("cast", {"dtype": DType.i64}), ("cast", {"dtype": DType.bool})]
BOOL_UNARY: list[tuple[str, dict[str, Any]]] = [
    ("logical_not", {}), ("isnan", {}), ("exp", {}), ("cast", {"dtype": F32}),
    ("cast", {"dtype": DType.i8})]

SHAPES = [((1,), (1,)), ((7,), (7,)), ((513,), (513,)), ((7, 1, 13), (5, 1))]


def op_table_graph(dtype: DType, x_shape: tuple[int, ...], y_shape: tuple[int, ...],
                   unary: Sequence[tuple[str, dict[str, Any]]], binary: Sequence[str],
                   *, pow_op: bool = False) -> tuple[Graph, list[str]]:
    """x, y (and a bool condition c) of ``dtype``; one output per unary op of x, binary op of
    (x, y), and where(c, x, y). With ``pow_op`` also x ** e for a non-negative exponent e."""
    b = GraphBuilder(f"ops_{dtype}")
    x, y = b.input((x_shape, dtype), "x"), b.input((y_shape, dtype), "y")
    c = b.input((y_shape, DType.bool), "c")
    outs: list[tuple[str, Value]] = []
    for op, attrs in unary:
        outs.append((f"{op}{attrs or ''}", b.add1(op, [x], attrs)))
    for op in binary:
        outs.append((op, b.add1(op, [x, y])))
    outs.append(("where", b.add1("where", [c, x, y])))
    if pow_op:
        e = b.input((y_shape, dtype), "e")
        outs.append(("pow", b.add1("pow", [x, e])))
    return b.build([v for _, v in outs]), [label for label, _ in outs]


def check_table(table: tuple[Graph, list[str]], seed: int, **kwargs: Any) -> LoopFunction:
    graph, labels = table
    arrays = random_inputs(graph, seed)
    if len(graph.inputs) == 4:  # pow's exponent: small and non-negative
        arrays[3] = np.abs(arrays[3]).astype(arrays[3].dtype)
    (fn,) = check_groups(graph, [one_kernel(graph)], arrays, labels=labels, **kwargs)
    return fn


# ----------------------------------------------------------------------------- every op


def test_every_elementwise_op_has_a_lowering():
    missing = [op.name for op in OPS.values() if op.kind.value == "elementwise"
               and op.lowering is None]
    assert missing == []


@pytest.mark.parametrize("dtype", [F32, F64])
@pytest.mark.parametrize(("x_shape", "y_shape"), SHAPES)
def test_float_ops(dtype, x_shape, y_shape):
    graph = op_table_graph(dtype, x_shape, y_shape, FLOAT_UNARY, NUMERIC_BINARY, pow_op=True)
    fn = check_table(graph, seed=len(x_shape) * 100 + x_shape[-1])
    if x_shape == (513,):  # contiguous operands: one flat vectorised loop
        assert kind_loops(fn, LoopKind.VECTORIZED)


@pytest.mark.parametrize("dtype", [F16, BF16])
@pytest.mark.parametrize(("x_shape", "y_shape"), [SHAPES[1], SHAPES[3]])
def test_low_precision_float_ops(dtype, x_shape, y_shape):
    """f16/bf16 compute in f32 and round once, like the references."""
    graph = op_table_graph(dtype, x_shape, y_shape, FLOAT_UNARY, NUMERIC_BINARY, pow_op=True)
    check_table(graph, seed=5)


@pytest.mark.parametrize("dtype", [DType.i32, DType.i8, DType.u8])
@pytest.mark.parametrize(("x_shape", "y_shape"), SHAPES)
def test_integer_ops(dtype, x_shape, y_shape):
    """Wrapping arithmetic, Python floor division and modulo (0 for a zero divisor), integer
    powers, integer clip bounds, promotion of float math to f64."""
    graph = op_table_graph(dtype, x_shape, y_shape, INT_UNARY, NUMERIC_BINARY, pow_op=True)
    check_table(graph, seed=x_shape[-1])


@pytest.mark.parametrize(("x_shape", "y_shape"), SHAPES)
def test_bool_ops(x_shape, y_shape):
    graph = op_table_graph(DType.bool, x_shape, y_shape, BOOL_UNARY, BINARY_ANY)
    check_table(graph, seed=3)


def test_mixed_dtype_promotion():
    graph = parse_graph("""
    graph @mixed(%a: i32[7,13], %b: f32[13], %c: u8[7,1], %d: i8[13], %h: f16[7,13],
                 %k: bf16[13], %m: bool[7,13]) -> (f64[7,13], i16[7,13], f32[7,13], f64[7,13],
                 bool[7,13], f32[7,13], f64[7,13]) {
      %0 = add(%a, %b) : f64[7,13]
      %1 = mul(%c, %d) : i16[7,13]
      %2 = where(%m, %h, %k) : f32[7,13]
      %3 = div(%a, %c) : f64[7,13]
      %4 = lt(%h, %b) : bool[7,13]
      %5 = sub(%h, %k) : f32[7,13]
      %6 = exp(%a) : f64[7,13]
      return %0, %1, %2, %3, %4, %5, %6
    }""")
    check_graph(graph, random_inputs(graph, 11))


SPECIAL = [np.nan, np.inf, -np.inf, 0.0, -0.0, 0.5, 1.5, 2.5, -2.5, -0.5, 1e30, -1e30, 1e-40,
           3.0, -7.25, 88.5, -104.0, 1.0]


@pytest.mark.parametrize("dtype", [F32, F64])
def test_special_values(dtype):
    """NaN, infinities, signed zeros, ties (round half to even), huge and tiny values."""
    n = len(SPECIAL)
    binary = [op for op in NUMERIC_BINARY if op not in ("floordiv", "mod")]
    graph, labels = op_table_graph(dtype, (n,), (n,), FLOAT_UNARY[:-5], binary)
    x = np.array(SPECIAL, dtype.np)
    y = np.roll(x, 5)
    c = np.arange(n) % 3 == 0
    check_groups(graph, [one_kernel(graph)], [x, y, c], labels=labels)


@pytest.mark.parametrize("dtype", [F32, F64, F16])
def test_float_floordiv_and_mod_special_values(dtype):
    """Python semantics: the remainder takes the divisor's sign; x // 0 is ±inf or NaN, x % 0
    NaN; a finite x over ±inf gives x or ±inf (and 0 or -1); quotients with at most 53 bits
    are exact."""
    values = [np.nan, np.inf, -np.inf, 0.0, -0.0, 0.5, 1.5, 2.5, -2.5, -0.75, 7.0, -7.0, 3.0,
              1e4, -1e4, 1e-3, 0.1, -0.1]
    n = len(values)
    graph, labels = op_table_graph(dtype, (n, n), (n,), [], ["floordiv", "mod"])
    x = np.repeat(np.array(values, dtype.np)[:, None], n, axis=1)
    y = np.array(values, dtype.np)
    # the loop interpreter's f64 fma is not fused (documented), and exactness needs it fused
    check_groups(graph, [one_kernel(graph)], [x, y, np.ones(n, bool)], labels=labels,
                 interpreted=dtype is not F64)


# ----------------------------------------------------------------------------- fused kernels


def chain_graph(shape: tuple[int, ...], dtype: DType = F32) -> Graph:
    """relu(2x + 1) * sigmoid(x)."""
    b = GraphBuilder("chain")
    x = b.input((shape, dtype), "x")
    two = b.add1("full", [], {"shape": (), "value": 2.0, "dtype": dtype})
    one = b.add1("full", [], {"shape": (), "value": 1.0, "dtype": dtype})
    y = b.add1("relu", [b.add1("add", [b.add1("mul", [two, x]), one])])
    return b.build([b.add1("mul", [y, b.add1("sigmoid", [x])])])


@pytest.mark.parametrize("shape", [(1,), (7,), (513,), (7, 513)])
def test_relu_sigmoid_chain_is_one_vectorised_kernel(shape):
    graph = chain_graph(shape)
    plan = plan_of(graph)
    assert [g.kind for g in plan.groups] == [KernelKind.ELEMENTWISE]
    (fn,) = check_graph(graph, random_inputs(graph, 1, -6.0, 6.0))
    lanes = default(plan.groups[0]).vector_width
    assert bool(kind_loops(fn, LoopKind.VECTORIZED)) == (int(np.prod(shape)) >= lanes > 1)


@pytest.mark.parametrize("approximate", ["none", "tanh"])
@pytest.mark.parametrize("dtype", [F32, F64])
def test_bias_gelu_epilogue(approximate, dtype):
    """The elementwise part of gelu(x @ w + b): the bias broadcasts along rows."""
    b = GraphBuilder("epilogue")
    h, bias = b.input(((7, 513), dtype), "h"), b.input(((513,), dtype), "b")
    y = b.add1("gelu", [b.add1("add", [h, bias])], {"approximate": approximate})
    graph = b.build([y])
    (fn,) = check_graph(graph, random_inputs(graph, 2, -4.0, 4.0))
    text = str(fn)
    assert "load<" in text and "parallel" not in text  # the bias is a vector load too


def test_movement_ops_are_index_remappings():
    graph = parse_graph("""
    graph @moves(%x: f32[6,20], %b: f32[4,5], %m: f32[6,1], %s: f32[]) -> (f32[20,6],
                 f32[6,4,5], f32[6,1,20], f32[6,20], f32[3,6,20]) {
      %0 = transpose(%x) {perm=[1,0]} : f32[20,6]
      %1 = exp(%0) : f32[20,6]
      %2 = reshape(%x) {shape=[6,4,5]} : f32[6,4,5]
      %3 = add(%2, %b) : f32[6,4,5]
      %4 = sub(%x, %m) : f32[6,20]
      %5 = expand_dims(%4) {axes=[1]} : f32[6,1,20]
      %6 = squeeze(%5) {axes=[1]} : f32[6,20]
      %7 = tanh(%6) : f32[6,20]
      %8 = broadcast_to(%s) {shape=[3,6,20]} : f32[3,6,20]
      %9 = mul(%8, %x) : f32[3,6,20]
      return %1, %3, %5, %7, %9
    }""")
    fns = check_graph(graph, random_inputs(graph, 4))
    for fn in fns:
        assert all(not isinstance(s, Store) or s.buffer.startswith("out")
                   for s in walk_stmts(fn.body))  # nothing is copied to a scratch buffer


def test_transpose_inside_the_block_falls_back_but_stays_correct():
    graph = parse_graph("""
    graph @t(%x: f32[40,24], %y: f32[24,40]) -> f32[24,40] {
      %0 = transpose(%x) {perm=[1,0]} : f32[24,40]
      %1 = add(%0, %y) : f32[24,40]
      return %1
    }""")
    (fn,) = check_graph(graph, random_inputs(graph, 6))
    assert not kind_loops(fn, LoopKind.VECTORIZED)  # x is read with stride 24 along a row


def test_broadcast_picks_the_largest_block():
    """A [7,1] operand stops the flat loop; the rows of 513 still vectorise."""
    graph = parse_graph("""
    graph @bc(%x: f32[7,513], %m: f32[7,1], %w: f32[513]) -> f32[7,513] {
      %0 = sub(%x, %m) : f32[7,513]
      %1 = mul(%0, %w) : f32[7,513]
      return %1
    }""")
    (fn,) = check_graph(graph, random_inputs(graph, 7))
    (vector,) = kind_loops(fn, LoopKind.VECTORIZED)
    assert vector.stop.arg == 513 - 513 % vector.step
    flat = parse_graph("""
    graph @flat(%x: f32[7,513], %s: f32[1,1]) -> f32[7,513] {
      %0 = mul(%x, %s) : f32[7,513]
      return %0
    }""")
    (fn,) = check_graph(flat, random_inputs(flat, 8))
    (vector,) = kind_loops(fn, LoopKind.VECTORIZED)
    assert vector.stop.arg == 7 * 513 - 7 * 513 % vector.step


def test_several_outputs_share_one_loop():
    graph = parse_graph("""
    graph @two(%x: f32[513], %y: f32[513]) -> (f32[513], f32[513], bool[513]) {
      %0 = add(%x, %y) : f32[513]
      %1 = exp(%0) : f32[513]
      %2 = gt(%0, %y) : bool[513]
      return %0, %1, %2
    }""")
    (group,) = plan_of(graph).groups
    (fn,) = check_groups(graph, [group], random_inputs(graph, 9))
    (vector,) = kind_loops(fn, LoopKind.VECTORIZED)
    assert sum(isinstance(s, Store) for s in walk_stmts(vector.body)) == 3
    assert str(fn).count("exp(") == 2  # once in the vector body, once in the tail


# ----------------------------------------------------------------------------- parallel loops


def parallel_loop(graph: Graph, vector_width: int, seed: int) -> For:
    """The one parallel loop of ``graph``'s one kernel under a schedule of 64-element chunks,
    checked on two threads."""
    (group,) = plan_of(graph).groups
    sched = Schedule(KernelKind.ELEMENTWISE, tiles=(("i", 64),), order=("i",),
                     vector_axis="i", vector_width=vector_width, parallel_axes=("i",))
    (fn,) = check_groups(graph, [group], random_inputs(graph, seed), schedule=lambda g: sched,
                         threads=2)
    (par,) = kind_loops(fn, LoopKind.PARALLEL)
    return par


def test_parallel_chunks_with_a_small_schedule():
    par = parallel_loop(chain_graph((513,)), vector_width=8, seed=12)
    assert par.stop.arg == 8  # 512 whole-vector elements in chunks of 64


def test_parallel_rows_with_broadcasting():
    graph = parse_graph("""
    graph @rows(%x: f32[9,40], %m: f32[9,1]) -> f32[9,40] {
      %0 = sub(%x, %m) : f32[9,40]
      return %0
    }""")
    assert parallel_loop(graph, vector_width=16, seed=13).stop.arg == 9


def test_default_schedule_runs_large_kernels_in_parallel():
    graph = chain_graph((600, 513))
    (group,) = plan_of(graph).groups
    if not default(group).parallel_axes:
        pytest.skip("one core: the default schedule is serial")
    (fn,) = check_graph(graph, random_inputs(graph, 14), interpreted=False, threads=2)
    assert kind_loops(fn, LoopKind.PARALLEL)


# ----------------------------------------------------------------------------- index helpers


def test_flatten_undoes_unflatten():
    i, r = var("i"), var("r")
    assert flatten(unflatten(i, (2, 3, 4)), (2, 3, 4)) == i
    assert flatten(unflatten(i, (2, 1, 4, 1)), (2, 1, 4, 1)) == i
    index = unflatten(r, (12, 5)) + unflatten(i, (64,))
    assert str(flatten(index, (12, 5, 64))) == "r*64 + i"
    assert str(flatten((r, i), (7, 13))) == "r*13 + i"
    assert str(flatten((i, r), (6, 20))) == "i*20 + r"


def test_lane_run_rules():
    assert broadcast_run((7, 1), (7, 13), 1) == 0  # uniform: one element, broadcast
    assert broadcast_run((13,), (7, 13), 1) == 1
    assert broadcast_run((1, 13), (7, 13), 1) == 1
    with pytest.raises(NotVectorizable):
        broadcast_run((1, 13), (7, 13), 2)
    assert reshaped_run((4, 3), (12,), 1) == 2
    assert reshaped_run((13, 1), (13,), 1) == 2
    with pytest.raises(NotVectorizable):
        reshaped_run((3, 4), (2, 6), 1)
    # an axis split inside the run: the fewest trailing axes holding whole vectors
    assert reshaped_run((2, 64, 56, 56), (2, 32, 6272), 1, lanes=16) == 2
    assert reshaped_run((4, 32), (8, 16), 1, lanes=16) == 1
    assert reshaped_run((3, 4), (2, 6), 1, lanes=2) == 1
    with pytest.raises(NotVectorizable):   # runs of 6 do not hold whole vectors of 4
        reshaped_run((3, 4), (2, 6), 1, lanes=4)
    assert transposed_run((2, 3, 5), (1, 0, 2), 1) == 1
    with pytest.raises(NotVectorizable):
        transposed_run((3, 5), (1, 0), 1)
    # merged attention heads: the exact [H, D] block narrowed to D, which holds whole vectors
    assert reshaped_run((7, 4, 32), (7, 128), 1, lanes=16) == 2
    assert whole_vector_run((7, 4, 32), (7, 128), 1, lanes=16) == 1
    assert whole_vector_run((7, 4, 24), (7, 96), 1, lanes=16) == 2   # 24 holds no whole vector
    assert whole_vector_run((7, 4, 32), (7, 128), 1, lanes=1) is None
    assert whole_vector_run((3, 4), (2, 6), 1, lanes=4) is None


def test_default_load_broadcasts_a_longer_index():
    x = Value(TensorType((7, 1), F32))
    load = load_contiguous({x: BufferParam("X", F32, readonly=True)})
    r, i = var("r"), var("i")
    assert str(load(x, (r, i), 8)) == "bcast<8>(X[r])"  # a stride-0 last axis
    assert str(load(x, (var("b"), r, i), 1)) == "X[r]"


# ----------------------------------------------------------------------------- element_expr


def test_element_expr_with_an_override():
    """What the matmul epilogue does: the accumulator is an override, the bias a load."""
    b = GraphBuilder("epi")
    acc_v, bias = b.input(((5, 24), F32), "acc"), b.input(((24,), F32), "bias")
    out = b.add1("gelu", [b.add1("add", [acc_v, bias])])
    graph = b.build([out])
    group = KernelGroup("epi", KernelKind.ELEMENTWISE, graph.nodes, (bias,), (out,), None,
                        (5, 24))
    buffers = kernel_buffers((acc_v, bias), (out,))
    r, i = var("r"), var("i")
    acc = buffers.inputs[acc_v].load(r * 24 + i, 8)
    value = element_expr(group, out, (r, i), 8, load_contiguous(buffers.inputs),
                         overrides={acc_v: acc})
    assert value.type.lanes == 8
    body = loop("r", 0, 5, [loop("i", 0, 24, [Store("out0", r * 24 + i, value)], 8,
                                 LoopKind.VECTORIZED)])
    fn = LoopFunction("epi", buffers.params, (), body)
    arrays = random_inputs(graph, 15)
    result = np.zeros((5, 24), np.float32)
    interpret(fn, *arrays, result)
    (expected,) = interpret_graph(graph, *arrays)
    assert_close(result, expected)


def test_element_expr_with_lets_keeps_long_chains_small():
    b = GraphBuilder("long")
    x = b.input(((16,), F32), "x")
    y = x
    for _ in range(12):  # each gelu reads its input three times
        y = b.add1("gelu", [y], {"approximate": "tanh"})
    graph = b.build([y])
    group = one_kernel(graph)
    buffers = kernel_buffers(group.inputs, group.outputs)
    lets: list = []
    value = element_expr(group, y, (var("i"),), 4, load_contiguous(buffers.inputs),
                         names=Namer(buffers.names()), lets=lets)
    assert len(lets) == 12 and value.op.name == "VAR"
    body = [*lets, Store("out0", var("i"), value)]
    fn = LoopFunction("long", buffers.params, (), loop("i", 0, 16, body, 4, LoopKind.VECTORIZED))
    arrays = random_inputs(graph, 16)
    result = np.zeros(16, np.float32)
    interpret(fn, *arrays, result)
    assert_close(result, interpret_graph(graph, *arrays)[0])


def test_builder_binds_each_value_once():
    graph = chain_graph((16,))
    (group,) = plan_of(graph).groups
    buffers = kernel_buffers(group.inputs, group.outputs)
    builder = ElementBuilder(group, load_contiguous(buffers.inputs), names=Namer())
    first = builder.value(group.outputs[0], (var("i"),), 4)
    again = builder.value(group.outputs[0], (var("i"),), 4)
    assert first is again
    assert len(builder.lets) == 5  # mul, add, relu, sigmoid, mul: one let each


# ----------------------------------------------------------------------------- errors


def test_kinds_without_a_lowering_are_refused():
    graph = parse_graph("""
    graph @mm(%a: f32[4,8], %b: f32[8,3]) -> f32[4,3] {
      %0 = matmul(%a, %b) : f32[4,3]
      return %0
    }""")
    (group,) = form_kernels(graph).groups
    with pytest.raises(CompileError, match="no lowering for contraction yet"):
        lower_group(group, None)


def test_unsupported_members_are_compile_errors():
    graph = parse_graph("""
    graph @pad(%x: f32[4,8]) -> (f32[4,10], f32[4]) {
      %0 = pad(%x) {mode="edge", pads=[0,0,1,1]} : f32[4,10]
      %1 = sum(%x) {axes=[1]} : f32[4]
      return %0, %1
    }""")
    pad, total = graph.nodes
    for node in (pad, total):
        group = KernelGroup("bad", KernelKind.ELEMENTWISE, (node,), graph.inputs,
                            node.outputs, None, tuple(node.output.shape))
        with pytest.raises(CompileError, match="kernel bad"):
            lower_elementwise(group, None)


def test_symbolic_dims_are_runtime_scalars():
    """Issue 8: a symbolic dim is the kernel's scalar ``dim_<symbol>`` (tests/dynamic runs
    such kernels on many sizes)."""
    b = GraphBuilder("sym")
    x = b.input(((Sym("n"), 4), F32), "x")
    graph = b.build([b.add1("exp", [x])])
    fn = lower_elementwise(one_kernel_symbolic(graph), None)
    assert fn.scalars == ("dim_n",)
    assert "dim_n" in str(fn.body)


def one_kernel_symbolic(graph: Graph) -> KernelGroup:
    return KernelGroup("sym", KernelKind.ELEMENTWISE, graph.nodes, graph.inputs,
                       graph.outputs, None, tuple(graph.outputs[0].shape))


# ----------------------------------------------------------------------------- golden text

GOLDEN = """\
kernel k0(x: f32 readonly, out0: f32):
  vectorized for i in 0..32 step 8:
    let t = splat<8>(2.0)*load<8>(x, i)
    let t1 = t + splat<8>(1.0)
    let t2 = max(t1, splat<8>(0.0))
    let t3 = sigmoid(load<8>(x, i))
    let t4 = t2*t3
    out0[i:+8] = t4
  let t5 = splat<4>(2.0)*load<4>(x, 32)
  let t6 = t5 + splat<4>(1.0)
  let t7 = max(t6, splat<4>(0.0))
  let t8 = sigmoid(load<4>(x, 32))
  let t9 = t7*t8
  out0[32:+4] = t9
  for i1 in 36..37:
    let t10 = 2.0*x[i1]
    let t11 = t10 + 1.0
    let t12 = max(t11, 0.0)
    let t13 = sigmoid(x[i1])
    let t14 = t12*t13
    out0[i1] = t14
"""


def test_printed_loop_ir_golden():
    graph = chain_graph((37,))
    (group,) = plan_of(graph).groups
    sched = Schedule(KernelKind.ELEMENTWISE, order=("i",), vector_axis="i", vector_width=8)
    text = str(lower_group(group, sched))
    assert text == GOLDEN, text


@pytest.mark.parametrize("shape,pads,vector", [
    ((2, 5, 7, 32), (0, 0, 1, 2, 2, 0, 0, 0), True),     # NHWC, C unpadded: vectors along C
    ((1, 3, 1, 16), (0, 1, 0, 0, 1, 1, 0, 0), True),
    ((3, 7, 13), (0, 0, 1, 1, 2, 3), False),             # last axis padded: scalars
    ((1, 1, 513), (1, 0, 0, 0, 0, 0), True),             # vectors along 513, a scalar tail
])
def test_constant_pad_is_an_index_remap(shape, pads, vector):
    """pad inside a kernel: the shifted, clamped load where every padded axis is in range,
    else the fill (-inf here, so a wrong select shows); bounds tested once per vector."""
    b = GraphBuilder("pad")
    x = b.input((shape, F32), "x")
    padded = b.add1("pad", [b.add1("exp", [x])], {"pads": pads, "value": -float("inf")})
    graph = b.build([b.add1("relu", [b.add1("neg", [padded])])])
    group = one_kernel(graph)
    (fn,) = check_groups(graph, [group], random_inputs(graph, seed=len(shape)))
    assert bool(kind_loops(fn, LoopKind.VECTORIZED)) is vector


@pytest.mark.parametrize("dtype", [F16, BF16])
def test_f64_to_half_types_rounds_once(dtype):
    """f64 -> f16 / bf16 is one rounding (NumPy's and ml_dtypes'), not two through f32:
    1 + 2^-11 + 2^-40 (f16) and 1 + 2^-8 + 2^-40 (bf16) lie just above a tie, which f32
    would erase. Also ties, signs, subnormals, overflow, inf, NaN and random values, in
    vectors and the remainder (the f16 cast was a call of ``__truncdfhf2`` the JIT could not
    resolve on hosts without AVX512-FP16)."""
    tie = 2.0 ** -(11 if dtype is F16 else 8)
    special = [1 + tie + 2.0**-40, -(1 + tie + 2.0**-40), 1 + tie, 1 + 3 * tie,
               2.0**-25 + 2.0**-60, 2.0**-24, -(2.0**-26), 65519.99, 65520.0, 3.4e38, 1e300,
               -1e300, 0.0, -0.0, np.inf, -np.inf, np.nan, 1e-320, 1e-40]
    rng = np.random.default_rng(7)
    values = np.concatenate([special, rng.standard_normal(496) * 1e3]).astype(np.float64)
    b = GraphBuilder("to_half")
    x = b.input(((values.size,), F64), "x")
    graph = b.build([b.add1("cast", [x], {"dtype": dtype})])
    group = one_kernel(graph)
    out = np.empty(values.size, dtype.np)
    compile_kernel(lower_group(group, default(group)))(values, out)
    want = values.astype(dtype.np)
    nan = np.isnan(want.astype(np.float32))
    assert np.array_equal(out.view(np.uint16)[~nan], want.view(np.uint16)[~nan])
    assert np.isnan(out[nan].astype(np.float32)).all()


@pytest.mark.parametrize("dtype,shape,g", [
    (F32, (1, 14, 14, 4 * 68), 4),     # ShuffleNet's shuffle after batch norm and relu
    (F32, (2, 3, 5, 3 * 17), 3),       # odd sizes, g = 3
    (F64, (1, 2, 7, 5 * 9), 5),
    (F32, (3, 1, 2, 2 * 40), 2),
])
def test_channel_shuffle_walks_the_last_axis_interleaved(dtype, shape, g):
    """A channels-last channel shuffle (reshape [.., g, m], swap, reshape back) after a
    per-channel scale, bias and relu: the last axis runs as ``for i in 0..m`` with g stores
    ``out[i*g + j]`` whose loads are contiguous in i (no gathers, no div/mod in an index)."""
    from tilefuse.loop.ir import XOp, walk_expr
    from tilefuse.loop.ir import expr_children as children

    n, h, w, c = shape
    m = c // g
    b = GraphBuilder("shuffle")
    x = b.input((shape, dtype), "x")
    scale = b.input(((c,), dtype), "scale")
    bias = b.input(((c,), dtype), "bias")
    y = b.add1("relu", [b.add1("add", [b.add1("mul", [x, scale]), bias])])
    y = b.add1("reshape", [y], {"shape": [n, h, w, g, m]})
    y = b.add1("transpose", [y], {"perm": [0, 1, 2, 4, 3]})
    graph = b.build([b.add1("reshape", [y], {"shape": [n, h, w, c]})])
    group = one_kernel(graph)
    (fn,) = check_groups(graph, [group], random_inputs(graph, seed=c))
    inner = [s for s in walk_stmts(fn.body) if isinstance(s, For) and s.stop.arg == m]
    assert inner, str(fn)
    for s in walk_stmts(fn.body):
        for e in children(s):
            for node in walk_expr(e):
                if node.op is XOp.LOAD:
                    assert not any(k.op in (XOp.MOD, XOp.FLOORDIV)
                                   for k in walk_expr(node.args[0])), str(fn)


def test_a_plain_transpose_is_not_interleaved():
    """A 2D transpose reads with stride M along the output's last axis: no g makes its loads
    contiguous, so it keeps the scalar loop over the whole axis."""
    b = GraphBuilder("t")
    x = b.input(((12, 8), F32), "x")
    graph = b.build([b.add1("transpose", [b.add1("exp", [x])], {"perm": [1, 0]})])
    group = one_kernel(graph)
    (fn,) = check_groups(graph, [group], random_inputs(graph, seed=3))
    stops = {s.stop.arg for s in walk_stmts(fn.body) if isinstance(s, For)}
    assert 12 in stops and not stops & {6, 4, 3, 2}, str(fn)


def test_a_run_remainder_goes_in_halving_vectors():
    """Runs of 29 channels (a pad keeps them per pixel): 16 lanes, then 8 and 4 at constant
    offsets, then one element; values checked compiled and interpreted."""
    b = GraphBuilder("pad29")
    x = b.input(((2, 5, 7, 29), F32), "x")
    padded = b.add1("pad", [b.add1("exp", [x])], {"pads": (0, 0, 1, 2, 2, 0, 0, 0),
                                                   "value": -float("inf")})
    graph = b.build([b.add1("relu", [b.add1("neg", [padded])])])
    group = one_kernel(graph)
    (fn,) = check_groups(graph, [group], random_inputs(graph, seed=29))
    widths = sorted({s.value.lanes for s in walk_stmts(fn.body) if isinstance(s, Store)})
    assert widths == [1, 4, 8, 16], str(fn)
