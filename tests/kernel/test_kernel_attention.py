"""The attention op and its native kernel: numerics against the reference, recognition from
NumPy, torch and ONNX spellings end to end, and the arena growing linearly in the sequence."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

import tilefuse
from tilefuse.codegen.target import host_target
from tilefuse.dtypes import DType
from tilefuse.errors import CompileError, ShapeError
from tilefuse.graph.builder import GraphBuilder
from tilefuse.graph.interpreter import interpret
from tilefuse.graph.ir import Graph
from tilefuse.kernel.fusion import KernelKind, form_kernels
from tilefuse.kernel.lower_attention import (
    AttentionShape,
    attention_scratch_bytes,
    attention_sizes,
)
from tilefuse.kernel.schedule import as_cpu_target, default_schedule, iteration_axes
from tilefuse.ops import get_op
from tilefuse.runtime.native import NativeExecutable
from tilefuse.testing import assert_close, random_array

ATTENTION = get_op("attention")


def attention_graph(batch: tuple[int, ...], sq: int, sk: int, d: int, dv: int,
                    mask: tuple[int, ...] | None = None, scale: float | None = None,
                    dtype: DType = DType.f32) -> Graph:
    b = GraphBuilder("attention")
    ins = [b.input(((*batch, sq, d), dtype), "q"), b.input(((*batch, sk, d), dtype), "k"),
           b.input(((*batch, sk, dv), dtype), "v")]
    if mask is not None:
        ins.append(b.input((mask, dtype), "mask"))
    scale = 1 / math.sqrt(d) if scale is None else scale
    return b.build([b.add1("attention", ins, {"scale": scale})])


def inputs_of(graph: Graph, seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [random_array(rng, tuple(v.shape), v.dtype) for v in graph.inputs]


def causal(sq: int, sk: int) -> np.ndarray:
    """-inf above the diagonal aligned at the bottom right (query i sees keys <= i + sk - sq)."""
    keep = np.tril(np.ones((sq, sk), bool), sk - sq)
    return np.where(keep, 0.0, -np.inf).astype(np.float32)


def run_native(graph: Graph, arrays: list[np.ndarray]) -> np.ndarray:
    exe = NativeExecutable(graph)
    assert exe.fallbacks == []
    return exe(*arrays)[0]


def reference(graph: Graph, arrays: list[np.ndarray]) -> np.ndarray:
    node = graph.nodes[-1]
    return node.op.reference(*arrays, scale=node.attrs["scale"])


def plain_numpy(q, k, v, mask=None, scale=1.0):
    s = q.astype(np.float64) @ np.swapaxes(k, -1, -2).astype(np.float64) * scale
    if mask is not None:
        s = s + mask
    e = np.exp(s - s.max(-1, keepdims=True))
    return ((e / e.sum(-1, keepdims=True)) @ v).astype(np.float32)


# ---- the op ----------------------------------------------------------------------------------


def test_reference_matches_plain_numpy_in_float64():
    g = attention_graph((2, 3), 7, 5, 8, 6, mask=(2, 1, 1, 5), scale=0.3)
    arrays = inputs_of(g, 1)
    assert_close(reference(g, arrays), plain_numpy(*arrays, scale=0.3), reduction=True)


def test_decomposition_matches_the_reference():
    g = attention_graph((3,), 7, 9, 5, 4, mask=(7, 9))
    b = GraphBuilder("plain")
    ins = [b.input(v.type, v.name) for v in g.inputs]
    outs = ATTENTION.decompose(b, ins, g.nodes[0].attrs)
    plain = b.build(list(outs))
    assert "attention" not in {n.op.name for n in plain.nodes}
    arrays = inputs_of(g, 2)
    assert_close(interpret(plain, *arrays)[0], reference(g, arrays), reduction=True)


@pytest.mark.parametrize("shapes, why", [
    (((2, 4, 8), (2, 5, 7), (2, 5, 3)), "head"),
    (((2, 4, 8), (2, 5, 8), (2, 6, 3)), "key count"),
    (((2, 4, 8), (2, 5, 8), (2, 5, 3), (2, 4, 6)), "mask"),
    (((4, 8), (5, 8)), "optional mask"),
])
def test_bad_shapes_are_shape_errors_naming_the_op(shapes, why):
    b = GraphBuilder()
    ins = [b.input((s, DType.f32)) for s in shapes]
    with pytest.raises(ShapeError, match="attention") as info:
        b.add1("attention", ins, {"scale": 1.0})
    assert why.split()[0] in str(info.value)


# ---- the native kernel -----------------------------------------------------------------------


@pytest.mark.parametrize("batch, sq, sk, d, dv, mask", [
    ((1,), 1, 1, 64, 64, None),
    ((2,), 7, 5, 8, 8, None),
    ((2, 3), 7, 130, 64, 64, (2, 1, 1, 130)),       # BERT's [B, 1, 1, S] mask
    ((1, 2), 513, 70, 64, 64, (1, 2, 513, 70)),      # a mask per head and row
    ((3,), 65, 513, 33, 17, (513,)),                 # odd head dims, Sk > Sq, key-only mask
    ((2,), 129, 64, 64, 80, (129, 1)),               # per-row mask, Dv not a power of two
])
@pytest.mark.parametrize("dtype", [DType.f32, DType.f64])
def test_native_matches_reference(batch, sq, sk, d, dv, mask, dtype):
    g = attention_graph(batch, sq, sk, d, dv, mask, dtype=dtype)
    arrays = inputs_of(g, sq + sk)
    assert_close(run_native(g, arrays), reference(g, arrays), reduction=True)


@pytest.mark.parametrize("sq, sk", [(7, 7), (513, 513), (9, 200), (66, 70)])
def test_native_causal_minus_inf_mask(sq, sk):
    """Whole key blocks masked out for early rows (the online max starts at -inf)."""
    g = attention_graph((2,), sq, sk, 16, 16, (sq, sk))
    arrays = inputs_of(g, 3)
    arrays[3] = causal(sq, sk)
    got = run_native(g, arrays)
    assert np.isfinite(got).all()
    assert_close(got, reference(g, arrays), reduction=True)


@pytest.mark.parametrize("block_q, key_vectors, rows, pv", [
    (45, 6, 3, 4),    # wide key blocks: 6 score vectors per row (all 83 keys); one query block
    (16, 2, 5, 1),    # rows not a multiple of the register tile, P·V one vector at a time
    (33, 1, 7, 3),    # odd query block, one vector of keys, a partial P·V chunk
    (8, 3, 1, 2),     # one-row tiles
])
@pytest.mark.parametrize("dtype", [DType.f32, DType.f64])
def test_native_matches_reference_for_other_schedules(block_q, key_vectors, rows, pv, dtype):
    """The blocking is the schedule's (what a search varies): every legal choice computes the
    same attention, on odd sizes, a causal -inf mask and random values."""
    from tilefuse.codegen.target import host_target
    from tilefuse.kernel.schedule import validate
    from tilefuse.runtime.schedules import ForcedSchedules

    g = attention_graph((2,), 45, 83, 24, 40, (45, 83), dtype=dtype)
    [group] = form_kernels(g).groups
    s = default_schedule(group, None)
    forced = dataclasses.replace(s, tiles=(("q", block_q), ("k", key_vectors * s.vector_width)),
                                 unroll=(("q", rows), ("v", pv)))
    validate(forced, iteration_axes(group))
    exe = NativeExecutable(g, schedules=ForcedSchedules(host_target(), {group.name: forced}))
    assert exe.fallbacks == []
    arrays = inputs_of(g, 11)
    arrays[3] = causal(45, 83).astype(dtype.np)
    assert_close(exe(*arrays)[0], reference(g, arrays), reduction=True)


def test_an_avx2_target_gets_its_own_blocking_and_matches_the_reference():
    """8 lanes and 16 ymm registers: 32-key blocks and 2-row tiles (8 accumulators)."""
    from tilefuse.codegen.target import CpuTarget, host_target

    host = host_target()
    if not host.has("avx2") or not host.has("fma"):
        pytest.skip("the host cannot run AVX2 code")
    avx2 = CpuTarget(host.triple, "haswell", "+avx,+avx2,+fma,+sse4.2,+f16c")
    g = attention_graph((2,), 45, 83, 24, 40, (45, 83))
    schedule = default_schedule(form_kernels(g).groups[0], avx2)
    assert (schedule.vector_width, schedule.tile("k"), dict(schedule.unroll)["q"]) == (8, 32, 2)
    arrays = inputs_of(g, 12)
    arrays[3] = causal(45, 83)
    exe = NativeExecutable(g, target=avx2)
    assert exe.fallbacks == []
    assert_close(exe(*arrays)[0], reference(g, arrays), reduction=True)


def test_a_register_tile_over_the_accumulator_budget_is_a_compile_error():
    g = attention_graph((1,), 64, 200, 16, 16)
    group = form_kernels(g).groups[0]
    schedule = dataclasses.replace(default_schedule(group, None),
                                   tiles=(("q", 64), ("k", 128)), unroll=(("q", 4),))
    with pytest.raises(CompileError, match="accumulators"):
        attention_sizes(AttentionShape.of(group.nodes[0]), schedule, 2)


def test_native_fully_masked_row_is_nan_like_the_reference():
    g = attention_graph((1,), 3, 70, 8, 8, (3, 70))
    arrays = inputs_of(g, 4)
    arrays[3][1, :] = -np.inf
    got, want = run_native(g, arrays), reference(g, arrays)
    assert np.isnan(want[0, 1]).all() and np.isnan(got[0, 1]).all()
    assert_close(got, want, reduction=True)


def test_native_nan_in_a_query_row_stays_nan_and_spares_the_other_rows():
    """The masked-exp flush (exp on a floor, 0 below it) must not turn a NaN score into 0."""
    g = attention_graph((2,), 5, 70, 8, 8, (5, 70))
    arrays = inputs_of(g, 8)
    arrays[3] = causal(5, 70)
    arrays[0][1, 2, 3] = np.nan
    got, want = run_native(g, arrays), reference(g, arrays)
    assert np.isnan(want[1, 2]).all() and np.isnan(got[1, 2]).all()
    keep = np.ones(got.shape[:2], bool)
    keep[1, 2] = False
    assert np.isfinite(got[keep]).all()
    assert_close(got[keep], want[keep], reduction=True)


@pytest.mark.parametrize("dtype", [DType.f16, DType.bf16])
def test_half_attention_runs_the_f32_kernel(dtype):
    """kernel/legalize.py widens f16/bf16 attention to f32 and rounds once, as the reference
    does: no host step."""
    b = GraphBuilder("half")
    ins = [b.input(((2, 7, 8), dtype), n) for n in "qkv"]
    g = b.build([b.add1("attention", ins, {"scale": 0.5})])
    exe = NativeExecutable(g)
    assert exe.fallbacks == []
    arrays = inputs_of(g, 5)
    assert_close(exe(*arrays)[0], reference(g, arrays), reduction=True)


# ---- memory: linear in the sequence ----------------------------------------------------------


def _aligned(n: int) -> int:
    return -(-n // 64) * 64


@pytest.mark.parametrize("seq", [2048, 4096])
def test_arena_is_the_linear_scratch_formula(seq):
    g = attention_graph((1, 12), seq, seq, 64, 64, (1, 1, 1, seq))
    exe = NativeExecutable(g)
    group = form_kernels(g).groups[0]
    assert group.kind is KernelKind.ATTENTION
    target = host_target()   # the build's target: its vector width sets the tiles
    schedule = default_schedule(group, target)
    sizes = attention_sizes(AttentionShape.of(group.nodes[0]), schedule,
                            as_cpu_target(target).cores)
    scratch = attention_scratch_bytes(AttentionShape.of(group.nodes[0]), sizes, 4)
    assert exe.arena.nbytes == sum(_aligned(n) for n in scratch.values())
    assert exe.arena.nbytes < seq * seq * 4   # less than one head's score matrix


def test_arena_doubles_not_quadruples_from_2048_to_4096():
    arenas = [NativeExecutable(attention_graph((1, 12), s, s, 64, 64)).arena.nbytes
              for s in (2048, 4096)]
    assert arenas[1] <= 2 * arenas[0]
    assert arenas[1] > 1.9 * arenas[0]   # linear: the k layout dominates, not a constant


# ---- recognition end to end --------------------------------------------------------------------


def _ops(graph: Graph) -> list[str]:
    return [n.op.name for n in graph.nodes]


def test_numpy_spellings_are_recognised_and_run_fused():
    def by_hand(q, k, v, mask):
        s = q @ k.swapaxes(-1, -2) / math.sqrt(q.shape[-1]) + mask
        e = np.exp(s - s.max(-1, keepdims=True))
        return e / e.sum(-1, keepdims=True) @ v

    def scaled_q(q, k, v, mask):
        s = (q * 0.25) @ np.transpose(k, (0, 2, 1)) + mask
        e = np.exp(s - np.max(s, axis=-1, keepdims=True))
        return (e / np.sum(e, axis=-1, keepdims=True)) @ v

    rng = np.random.default_rng(6)
    q = rng.standard_normal((3, 33, 16)).astype(np.float32)
    k = rng.standard_normal((3, 70, 16)).astype(np.float32)
    v = rng.standard_normal((3, 70, 24)).astype(np.float32)
    mask = causal(33, 70)
    for fn, scale in ((by_hand, 0.25), (scaled_q, 0.25)):
        jitted = tilefuse.jit(fn)
        lowered = jitted.lower(q, k, v, mask)
        assert _ops(lowered.optimized).count("attention") == 1, fn.__name__
        assert "exp" not in _ops(lowered.optimized)
        assert_close(jitted(q, k, v, mask), plain_numpy(q, k, v, mask, scale), reduction=True)


def test_torch_bert_layer_is_recognised_and_matches_eager():
    torch = pytest.importorskip("torch")
    from tilefuse import zoo
    from tilefuse.passes.manager import run_pipeline
    from tilefuse.passes.pipeline import GRAPH_PIPELINE

    module = zoo.bert_layer()
    arrays = zoo.bert_inputs(batch=1, seq=37)
    arrays[1] = np.where(np.arange(37) < 30, 0.0, -1e4).astype(np.float32).reshape(1, 1, 1, 37)
    graph, _ = run_pipeline(zoo.torch_graph(module, arrays), GRAPH_PIPELINE)
    assert _ops(graph).count("attention") == 1 and "exp" not in _ops(graph)
    exe = NativeExecutable(graph)
    assert exe.fallbacks == []
    assert any(g.kind is KernelKind.ATTENTION for g in form_kernels(graph).groups)
    with torch.no_grad():
        want = module(*(torch.from_numpy(a) for a in arrays)).numpy()
    assert_close(exe(*arrays)[0], want, reduction=True)


def test_onnx_attention_is_recognised_and_matches_onnxruntime():
    onnx = pytest.importorskip("onnx")
    ort = pytest.importorskip("onnxruntime")
    from onnx import TensorProto, helper, numpy_helper

    import tilefuse.onnx

    b, h, s, d = 2, 3, 45, 16
    nodes = [
        helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 1, 3, 2]),
        helper.make_node("MatMul", ["q", "kt"], ["qk"]),
        helper.make_node("Div", ["qk", "sqrt_d"], ["scaled"]),
        helper.make_node("Add", ["scaled", "mask"], ["masked"]),
        helper.make_node("Softmax", ["masked"], ["p"], axis=-1),
        helper.make_node("MatMul", ["p", "v"], ["out"]),
    ]
    f32 = TensorProto.FLOAT
    graph = helper.make_graph(
        nodes, "attention",
        [helper.make_tensor_value_info(n, f32, [b, h, s, d]) for n in "qkv"]
        + [helper.make_tensor_value_info("mask", f32, [b, 1, 1, s])],
        [helper.make_tensor_value_info("out", f32, [b, h, s, d])],
        [numpy_helper.from_array(np.array(math.sqrt(d), np.float32), "sqrt_d")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.checker.check_model(model)
    rng = np.random.default_rng(7)
    feeds = {n: rng.standard_normal((b, h, s, d)).astype(np.float32) for n in "qkv"}
    feeds["mask"] = np.where(rng.random((b, 1, 1, s)) < 0.2, -np.inf, 0).astype(np.float32)
    compiled = tilefuse.onnx.load(model)
    arrays = [feeds[n] for n in ("q", "k", "v", "mask")]
    assert _ops(compiled.lower(*arrays).optimized).count("attention") == 1
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    assert_close(compiled(*arrays), session.run(None, feeds)[0], reduction=True)
