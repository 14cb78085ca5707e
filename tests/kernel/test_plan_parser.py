"""The kernel plan parses back against its graph: printed plans of several graphs (contraction
with epilogue, softmax rows, reductions, movement, symbolic dims, recomputed nodes) round-trip,
and a plan that does not match the graph is a ParseError naming the line."""

from __future__ import annotations

import numpy as np
import pytest

from tilefuse.driver import plan_kernels
from tilefuse.dtypes import DType
from tilefuse.errors import ParseError
from tilefuse.graph.builder import GraphBuilder
from tilefuse.graph.ir import Graph
from tilefuse.graph.types import Sym
from tilefuse.kernel.fusion import KernelPlan
from tilefuse.kernel.plan_parser import parse_plan
from tilefuse.kernel.plan_printer import print_plan

F32 = DType.f32


def mixed(m: int | Sym = 7) -> Graph:
    rng = np.random.default_rng(0)
    b = GraphBuilder("mixed")
    x = b.input(((m, 45), F32), "x")
    y = b.input(((45,), F32), "y")
    w = b.add1("constant", [], {"value": rng.standard_normal((45, 19)).astype(np.float32)})
    bias = b.add1("constant", [], {"value": np.ones(19, np.float32)})
    h = b.add1("gelu", [b.add1("add", [b.add1("matmul", [x, w]), bias])])
    s = b.add1("softmax", [h], {"axis": -1})
    t = b.add1("tanh", [b.add1("mul", [x, y])])
    col = b.add1("sum", [t], {"axes": (0,)})
    moved = b.add1("transpose", [t], {"perm": (1, 0)})
    return b.build([s, col, b.add1("exp", [moved]), b.add1("sum", [b.add1("exp", [t])],
                                                           {"axes": (1,)})])


def same(a: KernelPlan, b: KernelPlan) -> None:
    assert a.graph is b.graph and len(a.groups) == len(b.groups)
    for g, h in zip(a.groups, b.groups):
        assert (g.name, g.kind, g.domain, g.roles) == (h.name, h.kind, h.domain, h.roles)
        assert all(x is y for x, y in zip(g.nodes, h.nodes)) and len(g.nodes) == len(h.nodes)
        assert list(g.inputs) == list(h.inputs) and list(g.outputs) == list(h.outputs)
        assert g.anchor is h.anchor


@pytest.mark.parametrize("m", [7, Sym("m")])
def test_plans_round_trip(m: int | Sym) -> None:
    plan = plan_kernels(mixed(m))
    text = print_plan(plan)
    parsed = parse_plan(text, plan.graph)
    assert print_plan(parsed) == text
    same(parsed, plan)
    kinds = {g.kind.value for g in plan.groups}
    assert {"contraction", "row_reduction", "elementwise"} <= kinds, kinds


def test_recomputed_nodes_round_trip() -> None:
    b = GraphBuilder("shared")
    x = b.input(((8, 32), F32), "x")
    e = b.add1("exp", [x])   # read by a column and a row sum: recomputed in both
    g = b.build([b.add1("sum", [e], {"axes": (0,)}), b.add1("sum", [e], {"axes": (1,)})])
    plan = plan_kernels(g)
    text = print_plan(plan)
    assert "recomputed" in text
    same(parse_plan(text, plan.graph), plan)


def test_a_plan_of_another_graph_is_refused() -> None:
    plan = plan_kernels(mixed())
    text = print_plan(plan)
    other = plan_kernels(mixed(9)).graph
    with pytest.raises(ParseError, match=r"kernel plan line \d+: %x is f32\[9,45\] in the graph"):
        parse_plan(text, other)
    renamed = GraphBuilder("other")
    renamed.input(((1,), F32), "x")
    with pytest.raises(ParseError, match="the plan is of @mixed, the graph is @other"):
        parse_plan(text, renamed.build([]))


@pytest.mark.parametrize("edit,match", [
    (lambda t: t.replace(" contraction over", " contractio over"), "expected 'NAME KIND"),
    (lambda t: t.replace("  out: ", "  outs: "), "a kernel is its header"),
    (lambda t: t.replace("anchor %", "anchor %9"), "is no node of this kernel"),
    (lambda t: t.replace("= gelu(", "= tanh("), "no such node"),
    (lambda t: t.replace("epilogue", "epilog"), "expected '  ROLE"),
    (lambda t: "nonsense\n" + t, "expected 'plan @NAME"),
])
def test_malformed_plans(edit, match: str) -> None:
    plan = plan_kernels(mixed())
    with pytest.raises(ParseError, match=match):
        parse_plan(edit(print_plan(plan)), plan.graph)
