"""Helpers for the kernel tests: a plan replayer (each kernel run on its declared inputs only, in
launch order), independent plan invariants, and a random graph generator that exercises every
kind of kernel."""

from __future__ import annotations

import numpy as np

from tilefuse.dtypes import DType
from tilefuse.graph.builder import GraphBuilder
from tilefuse.graph.interpreter import interpret, run_node
from tilefuse.graph.ir import Graph, Node, Value
from tilefuse.graph.types import ShapeError, broadcast_shapes
from tilefuse.kernel import KernelPlan, Role
from tilefuse.kernel.fusion import (
    MAX_RECOMPUTE_OPS,
    KernelGroup,
    is_pointwise,
    live_nodes,
    op_cost,
)
from tilefuse.testing import assert_close, random_array


def run_plan(plan: KernelPlan, *arrays: np.ndarray) -> list[np.ndarray]:
    """Runs each kernel in launch order on its declared inputs only; a kernel sees nothing but
    what earlier kernels wrote (a KeyError here means the plan reads an unwritten value)."""
    graph = plan.graph
    memory: dict[Value, np.ndarray] = dict(zip(graph.inputs, arrays))
    for node in graph.nodes:
        if node.op.name == "constant":
            memory.update(zip(node.outputs, run_node(node, [])))
    for k in plan.groups:
        env = {v: memory[v] for v in k.inputs}
        for node in k.nodes:
            env.update(zip(node.outputs, run_node(node, [env[v] for v in node.inputs])))
        memory.update({v: env[v] for v in k.outputs})
    return [memory[v] for v in graph.outputs]


def random_inputs(graph: Graph, seed: int) -> list[np.ndarray]:
    """Fresh random inputs; every symbolic dim is bound to 3."""
    rng = np.random.default_rng(seed)
    return [random_array(rng, tuple(d if isinstance(d, int) else 3 for d in v.type.shape),
                         v.type.dtype) for v in graph.inputs]


def assert_plan_computes_graph(plan: KernelPlan, seed: int = 0) -> None:
    args = random_inputs(plan.graph, seed)
    for got, want in zip(run_plan(plan, *args), interpret(plan.graph, *args), strict=True):
        assert_close(got, want)


_SHAPES = ((4, 6), (4, 1), (1, 6), (6,), (4,), (), (6, 4), (6, 6))
_UNARY = ("neg", "exp", "tanh", "relu", "sigmoid")
_BINARY = ("add", "sub", "mul", "maximum")


def _pick(rng: np.random.Generator, values: list[Value], ok=lambda v: True) -> Value | None:
    found = [v for v in values if ok(v)]
    return found[int(rng.integers(len(found)))] if found else None


def _random_node(rng: np.random.Generator, b: GraphBuilder, values: list[Value]) -> None:
    """Appends one random op over ``values`` (if one fits) and records its outputs."""
    roll = rng.random()
    a = _pick(rng, values)
    if roll < 0.25:
        out = [b.add1(str(rng.choice(_UNARY)), [a])]
    elif roll < 0.5:
        def fits(v: Value) -> bool:
            try:
                broadcast_shapes(a.shape, v.shape)
            except ShapeError:
                return False
            return True
        out = [b.add1(str(rng.choice(_BINARY)), [a, _pick(rng, values, fits)])]
    elif roll < 0.62 and a.type.rank >= 1:
        axis = int(rng.choice([-1, 0]))
        op = str(rng.choice(["sum", "max", "mean"]))
        out = [b.add1(op, [a], {"axes": (axis,), "keepdims": bool(rng.random() < 0.7)})]
    elif roll < 0.72:
        lhs = _pick(rng, values, lambda v: v.type.rank == 2)
        rhs = lhs and _pick(rng, values, lambda v: v.type.rank == 2 and v.shape[0] == lhs.shape[1])
        out = [b.add1("matmul", [lhs, rhs])] if rhs is not None else []
    elif roll < 0.8 and a.type.rank == 2:
        out = [b.add1("transpose", [a], {"perm": (1, 0)})]
    elif roll < 0.86 and a.type.rank == 1:
        out = [b.add1("expand_dims", [a], {"axes": (int(rng.choice([0, 1])),)})]
    elif roll < 0.9:
        out = [b.add1("full", [], {"shape": (), "value": 0.5, "dtype": DType.f32})]
    elif roll < 0.94 and a.type.rank == 2:
        out = [b.add1("slice", [a], {"starts": (0, 0), "stops": tuple(a.shape),
                                     "steps": (1, 1)})]
    else:
        out = [b.add1("constant", [], {"value": rng.uniform(-1, 1, size=(6,))
                                       .astype(np.float32)})]
    values.extend(out)


def random_fusion_graph(rng: np.random.Generator, n_nodes: int) -> Graph:
    b = GraphBuilder("random")
    values = [b.input((s, DType.f32), f"in{i}") for i, s in enumerate(_SHAPES)]
    for _ in range(n_nodes):
        _random_node(rng, b, values)
    computed = values[len(_SHAPES):] or values
    used = {v for n in b.nodes for v in n.inputs}
    sinks = [v for v in computed if v not in used][-5:]
    extra = [computed[int(i)] for i in rng.choice(len(computed), size=int(rng.integers(0, 2)))]
    return b.build(sinks + extra or computed[-1:])


def check_invariants(plan: KernelPlan) -> None:
    graph = plan.graph
    producer = graph.producers()
    order = {n: i for i, n in enumerate(graph.nodes)}
    held: dict[Node, list[KernelGroup]] = {}
    available = set(graph.inputs) | {v for n in graph.nodes if n.op.name == "constant"
                                     for v in n.outputs}
    writers: dict[Value, str] = {}
    for k in plan.groups:
        assert [order[n] for n in k.nodes] == sorted(order[n] for n in k.nodes)
        inside = set(k.nodes)
        reads = {v for n in k.nodes for v in n.inputs if producer.get(v) not in inside}
        assert set(k.inputs) == reads, k.name
        assert all(v in available for v in k.inputs), f"{k.name} reads a later value"
        for v in k.outputs:
            assert producer[v] in inside and v not in writers
            writers[v] = k.name
        available |= set(k.outputs)
        for n in k.nodes:
            held.setdefault(n, []).append(k)
        if Role.SINGLE in k.roles:
            assert k.roles == (Role.SINGLE,), f"{k.name} is not a one-node kernel"

    for n in live_nodes(graph):
        groups = held.get(n, [])
        if n.op.name == "constant":
            assert not groups
            continue
        assert groups, f"{n} is in no kernel"
        if len(groups) > 1:  # only under the recompute rule
            assert is_pointwise(n) and op_cost(n) <= MAX_RECOMPUTE_OPS
            assert sum(n.output in k.outputs for k in groups) <= 1
    for v in graph.outputs:
        if v in producer and producer[v].op.name != "constant":
            assert v in writers
