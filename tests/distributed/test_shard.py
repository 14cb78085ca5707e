"""The sharding pass on NumPy models: every rank of a plan, run side by side with the reference
interpreter, computes what the unsharded graph computes; the plan is the one expected
(Megatron's column/row pairs, heads, vocabulary) and the same on every rank."""

from __future__ import annotations

import numpy as np
import pytest

import tilefuse
from tilefuse.distributed.build import simulate
from tilefuse.distributed.shard import shard_graph
from tilefuse.distributed.spec import REP, Spec, block, through_reshape
from tilefuse.driver import CompileOptions, optimize
from tilefuse.dtypes import DType
from tilefuse.graph.builder import GraphBuilder
from tilefuse.graph.interpreter import interpret
from tilefuse.graph.ir import Literal
from tilefuse.graph.parser import parse_graph
from tilefuse.graph.printer import print_graph
from tilefuse.graph.types import TensorType

RNG = np.random.default_rng(20261203)


def _rand(*shape: int) -> np.ndarray:
    return RNG.standard_normal(shape).astype(np.float32)


def _graph(fn, *arrays):
    return optimize(tilefuse.jit(fn).lower(*arrays).captured)[0]


def _check(graph, arrays, world, rtol=1e-5):
    cluster = simulate(graph, world, "reference", CompileOptions(optimize=False))
    want = interpret(graph, *arrays)
    outs = cluster(*arrays)
    assert len(outs) == world
    for rank_outs in outs:
        for got, ref in zip(rank_outs, want):
            np.testing.assert_allclose(got, ref, rtol=rtol, atol=rtol * np.abs(ref).max())
    return cluster.plan


W1, B1, W2, B2 = _rand(48, 128), _rand(128), _rand(128, 48), _rand(48)


def mlp(x):
    h = np.maximum(x @ W1 + B1, 0)
    return h @ W2 + B2


@pytest.mark.parametrize("world", [2, 4])
def test_mlp_is_a_column_row_pair_with_one_all_reduce(world):
    x = _rand(5, 48)
    plan = _check(_graph(mlp, x), [x], world)
    text = plan.text()
    assert "column-parallel" in text and "row-parallel" in text
    assert [c.op for c in plan.collectives] == ["all_reduce"]
    assert plan.local_weight_bytes < plan.weight_bytes / world + 2 * 48 * 4 + 1


H, D, E = 4, 8, 32
WQKV, WO = _rand(E, 3 * E), _rand(E, E)


def attention(x, mask):
    b, s, _ = x.shape
    q, k, v = np.split(x @ WQKV, 3, axis=-1)
    heads = [t.reshape(b, s, H, D).transpose(0, 2, 1, 3) for t in (q, k, v)]
    scores = heads[0] @ heads[1].transpose(0, 1, 3, 2) / np.sqrt(D) + mask
    scores = np.exp(scores - scores.max(axis=-1, keepdims=True))
    probs = scores / scores.sum(axis=-1, keepdims=True)
    out = (probs @ heads[2]).transpose(0, 2, 1, 3).reshape(b, s, E)
    return out @ WO + x


@pytest.mark.parametrize("world", [2, 4])
def test_fused_qkv_attention_splits_by_heads(world):
    x, mask = _rand(2, 7, E), np.triu(np.full((7, 7), -1e9, np.float32), 1)
    plan = _check(_graph(attention, x, mask), [x, mask], world)
    assert f"column-parallel (3 parts), each rank holds f32[{E},{3 * E // world}]" in plan.text()
    assert [c.op for c in plan.collectives] == ["all_reduce"]


TABLE, HEAD = _rand(64, 16), _rand(16, 64)


def embed_and_project(ids_type):
    b = GraphBuilder("embed")
    ids = b.input(ids_type, "ids")
    table = b.add1("constant", [], {"value": Literal(TABLE)})
    head = b.add1("constant", [], {"value": Literal(HEAD)})
    rows = b.add1("take", [table, ids], {"axis": 0})
    return b.build([b.add1("matmul", [rows, head])])


@pytest.mark.parametrize("world", [2, 4])
def test_embedding_splits_by_vocabulary_and_ids_out_of_a_ranks_range(world):
    ids = RNG.integers(0, 64, (3, 5))
    ids[0, :4] = [0, 63, 16, 47]           # the first and last rows of several ranks
    graph = embed_and_project(TensorType((3, 5), DType.i64))
    plan = _check(graph, [ids], world)
    assert "vocabulary-parallel" in plan.text()
    assert [c.op for c in plan.collectives] == ["all_reduce", "all_gather"]


def test_what_cannot_split_runs_replicated_and_is_gathered_correctly():
    w = _rand(12, 10)                      # 10 columns: no split over 4 ranks

    def fn(x):
        y = x @ w
        return np.cumsum(y, axis=1) + y.max()

    x = _rand(6, 12)
    plan = _check(_graph(fn, x), [x], 4)
    assert plan.collectives == []


def test_plan_is_the_same_on_every_rank_and_rank_graphs_round_trip():
    x = _rand(5, 48)
    graph = _graph(mlp, x)
    texts = set()
    for rank in range(2):
        rank_graph, plan = shard_graph(graph, 2, rank)
        texts.add(plan.text())
        printed = print_graph(rank_graph)
        assert "all_reduce" in printed
        assert print_graph(parse_graph(printed)) == printed
    assert len(texts) == 1


def test_spec_through_reshape_keeps_merged_heads_as_a_strided_split():
    assert through_reshape((32, 64), Spec.split(1), (2, 16, 4, 16), 2) == Spec.split(2)
    merged = through_reshape((2, 4, 16, 16), Spec.split(1), (8, 16, 16), 2)
    assert merged == Spec.split(0, 2)
    assert through_reshape((8, 16, 16), merged, (2, 4, 16, 16), 2) == Spec.split(1)
    assert through_reshape((32, 32), Spec.split(1), (2, 16, 2, 16), 4) is None
    assert through_reshape((4, 6), REP, (24,), 2) == REP


def test_block_takes_a_strided_block_for_outer_parts():
    a = np.arange(12).reshape(1, 12)
    assert block(a, Spec.split(1, 3), 2, 0).tolist() == [[0, 1, 4, 5, 8, 9]]
    assert block(a, Spec.split(1, 3), 2, 1).tolist() == [[2, 3, 6, 7, 10, 11]]


def test_collectives_have_no_single_process_reference():
    x = _rand(5, 48)
    rank_graph, _ = shard_graph(_graph(mlp, x), 2, 0)
    with pytest.raises(tilefuse.TilefuseError, match="all_reduce combines the arrays of 2"):
        interpret(rank_graph, x)


def test_bad_rank_is_a_compile_error():
    x = _rand(5, 48)
    with pytest.raises(tilefuse.CompileError, match="rank 2 of 2 ranks"):
        shard_graph(_graph(mlp, x), 2, 2)


WA, WB = _rand(16, 32), _rand(32, 16)


def two_branches(x, y):
    a = np.tanh(np.maximum(x @ WA, 0) @ WB)      # its all-reduce ...
    b = np.tanh(np.maximum(y @ WA, 0) @ WB)      # ... overlaps this branch's products
    return a + b


def test_a_collective_overlaps_independent_work():
    from tilefuse.distributed.program import cut

    x, y = _rand(3, 16), _rand(3, 16)
    graph = _graph(two_branches, x, y)
    _check(graph, [x, y], 2)
    program = cut(shard_graph(graph, 2, 0)[0])
    first = program.collectives[0]
    assert first.overlaps, program.text()
    assert "overlaps s" in program.text()


def _fused_attention_graph(with_mask: bool):
    b = GraphBuilder("fused")
    x = b.input(TensorType((2, 7, 32), DType.f32), "x")
    flat = b.add1("reshape", [x], {"shape": (14, 32)})
    heads = []
    for w in (_rand(32, 32), _rand(32, 32), _rand(32, 32)):
        y = b.add1("matmul", [flat, b.add1("constant", [], {"value": Literal(w)})])
        y = b.add1("reshape", [y], {"shape": (2, 7, 4, 8)})
        heads.append(b.add1("transpose", [y], {"perm": (0, 2, 1, 3)}))
    if with_mask:
        mask = b.add1("constant", [], {"value": Literal(_rand(2, 4, 7, 7))})
        heads.append(mask)
    a = b.add1("attention", heads, {"scale": 0.35})
    a = b.add1("reshape", [b.add1("transpose", [a], {"perm": (0, 2, 1, 3)})],
               {"shape": (14, 32)})
    wo = b.add1("constant", [], {"value": Literal(_rand(32, 32))})
    return b.build([b.add1("matmul", [a, wo])])


@pytest.mark.parametrize("world", [2, 4])
@pytest.mark.parametrize("with_mask", [False, True])
def test_the_fused_attention_op_splits_by_heads(world, with_mask):
    x = _rand(2, 7, 32)
    plan = _check(_fused_attention_graph(with_mask), [x], world)
    assert plan.text().count("column-parallel") == 3 and "row-parallel" in plan.text()
    assert [c.op for c in plan.collectives] == ["all_reduce"]
