"""The native CPU executable on whole graphs, against the reference interpreter: which groups run
natively, host fallbacks (logged), the arena, guards, multi-output graphs and dumps."""

from __future__ import annotations

import logging

import numpy as np
import pytest

from tilefuse.dtypes import DType
from tilefuse.errors import CompileError, GuardError, ShapeError
from tilefuse.graph.builder import GraphBuilder
from tilefuse.graph.interpreter import interpret
from tilefuse.graph.ir import Graph, Value
from tilefuse.runtime.launch import HostStep, NativeStep
from tilefuse.runtime.native import NativeExecutable, build_native
from tilefuse.testing import assert_close, random_array

F32 = DType.f32


def constant(builder: GraphBuilder, array: np.ndarray) -> Value:
    return builder.add1("constant", [], {"value": array})


def ffn_graph(m: int, k: int, n: int, *, weight_input: bool = False) -> Graph:
    """gelu(x @ w + b), w and b constants (or w a graph input)."""
    rng = np.random.default_rng(k)
    builder = GraphBuilder("ffn")
    x = builder.input(((m, k), F32), "x")
    w = builder.input(((k, n), F32), "w") if weight_input else \
        constant(builder, random_array(rng, (k, n), F32, -0.5, 0.5))
    b = constant(builder, random_array(rng, (n,), F32))
    y = builder.add1("matmul", [x, w])
    y = builder.add1("add", [y, b])
    return builder.build([builder.add1("gelu", [y])])


def check(graph: Graph, *, reduction: bool = False, seed: int = 0,
          executable: NativeExecutable | None = None) -> NativeExecutable:
    """Runs ``graph`` natively and with the interpreter on fresh random inputs; compares."""
    exe = executable or NativeExecutable(graph)
    rng = np.random.default_rng(seed)
    arrays = [random_array(rng, tuple(v.shape), v.dtype) for v in graph.inputs]
    expected = interpret(graph, *arrays)
    got = exe(*arrays)
    assert len(got) == len(expected)
    for g, e in zip(got, expected):
        assert_close(g, e, reduction=reduction)
    return exe


def native_steps(exe: NativeExecutable) -> list[NativeStep]:
    return [s for s in exe.steps if isinstance(s, NativeStep)]


@pytest.mark.parametrize("m,k,n", [(1, 1, 1), (7, 5, 3), (13, 35, 17), (100, 513, 257)])
def test_gelu_matmul_bias_is_one_native_kernel(m, k, n):
    exe = check(ffn_graph(m, k, n), reduction=True)
    assert exe.fallbacks == []
    assert len(exe.steps) == 1 and len(native_steps(exe)[0].launches) == 1


def test_weight_from_an_input_is_packed_at_run_time():
    # M = 40: several register blocks (M within one is read in place: test_small_calls.py)
    exe = check(ffn_graph(40, 35, 17, weight_input=True), reduction=True)
    assert exe.fallbacks == []
    [step] = native_steps(exe)
    assert len(step.launches) == 2  # packing kernel, then the matmul


def test_transposed_constant_weight_is_packed_once_at_build_time():
    """x @ w.T + b with w constant: the prologue runs now, so the call is one kernel."""
    rng = np.random.default_rng(3)
    builder = GraphBuilder("linear")
    x = builder.input(((13, 35), F32), "x")
    w = constant(builder, random_array(rng, (17, 35), F32))
    y = builder.add1("matmul", [x, builder.add1("transpose", [w], {"perm": (1, 0)})])
    graph = builder.build([builder.add1("add", [y, constant(builder, random_array(
        rng, (17,), F32))])])
    exe = check(graph, reduction=True)
    [step] = native_steps(exe)
    assert len(step.launches) == 1 and exe.fallbacks == []


def test_batched_matmul_graph():
    builder = GraphBuilder("bmm")
    q = builder.input(((3, 13, 35), F32), "q")
    k = builder.input(((3, 35, 17), F32), "k")
    scores = builder.add1("matmul", [q, k])
    exe = check(builder.build([builder.add1("softmax", [scores])]), reduction=True)
    assert exe.fallbacks == []


@pytest.mark.parametrize("dtype", [DType.f32, DType.f64, DType.f16, DType.bf16, DType.i32,
                                   DType.i64])
@pytest.mark.parametrize("a_shape,b_shape", [((7, 5), (5,)), ((5,), (5, 9)), ((5,), (5,)),
                                             ((3, 7, 5), (5,)), ((2, 7, 5), (2, 5, 3)),
                                             ((2, 1, 7, 5), (3, 5, 4)), ((4, 0), (0, 3)),
                                             ((0, 5), (5, 3))])
def test_every_matmul_runs_natively(a_shape, b_shape, dtype):
    """1-D operands, broadcast batch dims, empty dims, f16/bf16 and integers: legalised
    (kernel/legalize.py), no host step."""
    builder = GraphBuilder("mv")
    x = builder.input((a_shape, dtype), "x")
    v = builder.input((b_shape, dtype), "v")
    exe = check(builder.build([builder.add1("matmul", [x, v])]), reduction=True)
    assert exe.fallbacks == []


@pytest.mark.parametrize("dtype", [DType.f32, DType.f64, DType.f16])
@pytest.mark.parametrize("groups,attrs", [
    (1, {}), (1, {"stride": (2, 1), "padding": (1, 0, 2, 1), "dilation": (1, 2)}),
    (2, {"padding": (1, 1, 1, 1)}), (6, {"stride": (2, 2), "padding": (0, 1, 1, 0)})])
def test_a_conv_with_a_runtime_weight_runs_natively(groups, attrs, dtype):
    """conv_lowering takes constant f32 weights only; the rest is legalised (im2col and one
    batched matmul over the groups), so no conv is a host step."""
    builder = GraphBuilder("conv")
    x = builder.input(((2, 6, 9, 11), dtype), "x")
    w = builder.input(((12, 6 // groups, 3, 2), dtype), "w")
    bias = builder.input(((12,), dtype), "b")
    graph = builder.build([builder.add1("conv2d", [x, w, bias], {"groups": groups, **attrs})])
    exe = check(graph, reduction=True)
    assert exe.fallbacks == []


def test_groups_of_constants_are_folded_at_build_time():
    """sum(c) (a reduction: no native lowering) over a constant runs once, at build time, and
    keeps its 0-d shape."""
    builder = GraphBuilder("folded")
    x = builder.input(((7,), F32), "x")
    c = constant(builder, np.arange(5, dtype=np.float32))
    total = builder.add1("sum", [c], {"axes": None})
    exe = check(builder.build([builder.add1("mul", [x, total]), total]))
    assert exe.fallbacks == [] and len(exe.steps) == 1


def test_softmax():
    builder = GraphBuilder("softmax")
    x = builder.input(((7, 513), F32), "x")
    exe = check(builder.build([builder.add1("softmax", [x])]), reduction=True)
    assert exe.fallbacks == []


def test_layer_norm():
    builder = GraphBuilder("ln")
    x = builder.input(((13, 257), F32), "x")
    g = builder.input(((257,), F32), "g")
    b = builder.input(((257,), F32), "b")
    exe = check(builder.build([builder.add1("layer_norm", [x, g, b])]), reduction=True)
    assert exe.fallbacks == []


def test_elementwise_chain():
    builder = GraphBuilder("chain")
    x = builder.input(((7, 513), F32), "x")
    y = builder.input(((513,), F32), "y")
    t = builder.add1("tanh", [builder.add1("mul", [x, y])])
    out = builder.add1("sigmoid", [builder.add1("sub", [t, x])])
    exe = check(builder.build([out]))
    assert exe.fallbacks == []
    assert len(exe.steps) == 1


def host_graph(builder: GraphBuilder, monkeypatch: pytest.MonkeyPatch) -> Value:
    """exp -> a 3x3 max pool -> neg, with the pool lowering made to fail (every kernel kind
    lowers natively now): the host fallback's path, on a graph built with ``builder``."""
    import tilefuse.backend.cpu as cpu_backend

    def failing(*args: object, **kwargs: object) -> None:
        raise CompileError("made to fail by the test")

    monkeypatch.setattr(cpu_backend, "lower_pool", failing)
    x = builder.input(((1, 1, 17, 17), F32), "x")
    pooled = builder.add1("max_pool2d", [builder.add1("exp", [x])],
                          {"kernel": (3, 3), "stride": (1, 1), "padding": (0, 0, 0, 0)})
    return builder.add1("neg", [pooled])


def test_a_host_step_says_so_at_warning(caplog, monkeypatch):
    builder = GraphBuilder("pooled")
    graph = builder.build([host_graph(builder, monkeypatch)])
    with caplog.at_level(logging.WARNING, logger="tilefuse.fallback"):
        exe = check(graph)
    assert [s for s in exe.steps if isinstance(s, HostStep)]
    records = [r for r in caplog.records if r.name == "tilefuse.fallback"]
    assert len(records) == 1 and records[0].levelno == logging.WARNING
    assert "max_pool2d" in records[0].getMessage() and "@pooled" in records[0].getMessage()
    assert exe.fallbacks and all(reason for _, reason in exe.fallbacks)


def test_take_runs_natively_and_a_bad_index_raises_the_reference_error():
    builder = GraphBuilder("take")
    x = builder.input(((7, 5), F32), "x")
    idx = builder.input(((3,), DType.i64), "idx")
    joined = builder.add1("take", [builder.add1("exp", [x]), idx], {"axis": 1})
    graph = builder.build([builder.add1("tanh", [joined])])
    exe = build_native(graph)
    assert exe.fallbacks == [] and exe.single_entry
    xv = random_array(np.random.default_rng(4), (7, 5), F32)
    for good in ([4, 0, -1], [-5, 4, 2]):
        got, = exe(xv, np.array(good, np.int64))
        assert_close(got, np.tanh(np.take(np.exp(xv), good, axis=1)))
    with pytest.raises(ShapeError, match="take: index 5 is out of range for axis 1 of size 5"):
        exe(xv, np.array([0, 5, 1], np.int64))
    with pytest.raises(ShapeError, match="index -6"):
        exe(xv, np.array([-6, 0, 1], np.int64))
    got, = exe(xv, np.array([1, 2, 3], np.int64))  # still usable after the error
    assert_close(got, np.tanh(np.take(np.exp(xv), [1, 2, 3], axis=1)))


def test_multi_output_graph_and_outputs_never_alias():
    rng = np.random.default_rng(9)
    builder = GraphBuilder("multi")
    x = builder.input(((13, 35), F32), "x")
    w = constant(builder, random_array(rng, (35, 17), F32))
    h = builder.add1("matmul", [x, w])
    g = builder.add1("gelu", [h])
    s = builder.add1("exp", [builder.add1("neg", [g])])
    c = constant(builder, random_array(rng, (3,), F32))
    graph = builder.build([h, g, s, x, g, c])
    exe = check(graph, reduction=True)
    outs = exe(random_array(rng, (13, 35), F32))
    again = exe(random_array(rng, (13, 35), F32))
    for i, out in enumerate(outs):
        assert out.flags.writeable
        assert not np.shares_memory(out, exe.arena)
        for j, other in enumerate(outs):
            assert i == j or not np.shares_memory(out, other)
        assert not np.shares_memory(out, again[i])


def test_intermediates_live_in_the_arena():
    builder = GraphBuilder("two_kernels")
    x = builder.input(((64, 64), F32), "x")
    y = builder.add1("matmul", [x, x])  # the operand is not a constant: packed at run time
    z = builder.add1("softmax", [y])
    exe = check(builder.build([z]), reduction=True)
    assert exe.memory_plan.arena_bytes >= 64 * 64 * 4
    assert exe.arena.ctypes.data % 64 == 0


def test_guards_reject_what_was_not_compiled_for():
    exe = NativeExecutable(ffn_graph(7, 5, 3))
    good = np.ones((7, 5), np.float32)
    exe(good)
    with pytest.raises(GuardError, match=r"f32|float32"):
        exe(np.ones((7, 6), np.float32))
    with pytest.raises(GuardError):
        exe(np.ones((7, 5), np.float64))
    with pytest.raises(GuardError, match="C-contiguous"):
        exe(np.ones((5, 7), np.float32).T)
    with pytest.raises(GuardError, match="takes 1 inputs"):
        exe(good, good)


def test_dump_files(tmp_path):
    build_native(ffn_graph(13, 35, 17, weight_input=True), tmp_path)
    plan = (tmp_path / "kernels.plan").read_text()
    assert "memory plan" in plan and "native" in plan
    kernels = tmp_path / "kernels"
    for suffix in (".schedule.json", ".loop", ".ll", ".s"):
        assert list(kernels.glob(f"*{suffix}")), suffix
    assert any("vfmadd" in p.read_text() for p in kernels.glob("*.s"))


def test_fallback_is_marked_in_the_plan_dump(tmp_path, monkeypatch):
    builder = GraphBuilder("pooled")
    build_native(builder.build([host_graph(builder, monkeypatch)]), tmp_path)
    assert "HOST FALLBACK" in (tmp_path / "kernels.plan").read_text()


_REUSE_PROGRAM = """
import numpy as np
from tilefuse.dtypes import DType
from tilefuse.graph.builder import GraphBuilder
from tilefuse.runtime.native import build_native
from tilefuse.testing import assert_close, random_array

b = GraphBuilder("pool")
x = b.input(((513,), DType.f32), "x")
y = b.add1("exp", [x])
exe = build_native(b.build([y]))
g = np.random.default_rng(7)
first_in = random_array(g, (513,), DType.f32)
held = exe(first_in)[0]
second = exe(random_array(g, (513,), DType.f32))[0]
assert not np.shares_memory(held, second)
assert_close(held, np.exp(first_in))           # not overwritten by the second call
address = second.ctypes.data
del second
again_in = random_array(g, (513,), DType.f32)
again = exe(again_in)[0]
assert again.ctypes.data == address, "a released output was not reused"
assert_close(again, np.exp(again_in))
view = again[5:]
del again
last_in = random_array(g, (513,), DType.f32)
fresh = exe(last_in)[0]
assert not np.shares_memory(fresh, view)       # a view keeps the memory alive
assert_close(view, np.exp(again_in)[5:])
assert_close(fresh, np.exp(last_in))
print("ok")
"""


def test_outputs_reuse_released_buffers_only():
    """A released output's memory is reused; one still held, or viewed, never is. Run in a
    fresh interpreter: reuse is decided by reference counts, which state other tests leave
    in this process can raise (seen once under the full xdist suite, never alone)."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    done = subprocess.run([sys.executable, "-c", _REUSE_PROGRAM], capture_output=True,
                          text=True, cwd=root, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(root)})
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-3000:]


def test_all_native_sequences_run_through_one_entry_and_host_steps_do_not(monkeypatch):
    b = GraphBuilder("mlp")
    x = b.input(((1, 33), DType.f32), "x")
    g = np.random.default_rng(21)
    w1 = b.add1("constant", [], {"value": random_array(g, (33, 65), DType.f32)})
    w2 = b.add1("constant", [], {"value": random_array(g, (65, 7), DType.f32)})
    h = b.add1("relu", [b.add1("matmul", [x, w1])])
    y = b.add1("matmul", [h, w2])
    graph = b.build([y, h])
    exe = build_native(graph)
    assert exe.single_entry and len(exe.steps) >= 2
    for _ in range(3):  # repeated calls reuse the launcher's tables and pooled outputs
        xv = random_array(g, (1, 33), DType.f32)
        for got, want in zip(exe(xv), interpret(graph, xv), strict=True):
            assert_close(got, want, reduction=True)

    c = GraphBuilder("pooled")
    graph = c.build([host_graph(c, monkeypatch)])
    mixed = build_native(graph)
    assert not mixed.single_entry
    av = random_array(g, (1, 1, 17, 17), DType.f32)
    assert_close(mixed(av)[0], interpret(graph, av)[0])


@pytest.mark.parametrize("a_shape,b_shape", [((0, 5), (5, 3)), ((4, 0), (0, 3)), ((4, 5), (5, 0))])
def test_matmul_with_an_empty_dim_compiles_and_matches_numpy(a_shape, b_shape):
    import tilefuse

    g = np.random.default_rng(31)
    a = random_array(g, a_shape, DType.f32)
    b = random_array(g, b_shape, DType.f32)
    got = tilefuse.jit(lambda x, w: np.maximum(x @ w, 0.0))(a, b)
    assert_close(got, np.maximum(a @ b, 0.0), reduction=True)
