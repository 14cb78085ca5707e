"""Movement the cuda target need not launch (:mod:`tilefuse.runtime.gpu_views`): transposes of
size-1 axes become reshapes, RoPE's rotate_half one gather; values unchanged."""

from __future__ import annotations

import numpy as np
import pytest

from tilefuse.dtypes import DType
from tilefuse.graph.builder import GraphBuilder
from tilefuse.graph.interpreter import interpret
from tilefuse.graph.ir import Graph, Literal
from tilefuse.runtime.gpu_cross import cross_compile
from tilefuse.runtime.gpu_simulate import simulate
from tilefuse.runtime.gpu_views import gpu_views
from tilefuse.testing import random_array


def rope(dtype: DType, heads: int = 3, d: int = 8) -> Graph:
    """``x [1, 1, H, D]`` split into heads (a transpose moving a size-1 axis), rotated by
    ``x · cos + rotate_half(x) · sin``, merged back (the inverse transpose)."""
    rng = np.random.default_rng(5)
    b = GraphBuilder("rope")
    x = b.input(((1, 1, heads, d), dtype), "x")
    t = b.add1("transpose", [x], {"perm": (0, 2, 1, 3)})
    h = d // 2
    hi = b.add1("slice", [t], {"starts": [0, 0, 0, h], "stops": [1, heads, 1, d],
                               "steps": [1, 1, 1, 1]})
    lo = b.add1("slice", [t], {"starts": [0, 0, 0, 0], "stops": [1, heads, 1, h],
                               "steps": [1, 1, 1, 1]})
    rot = b.add1("concat", [b.add1("neg", [hi]), lo], {"axis": 3})
    cos = b.add1("constant", [], {"value": Literal(random_array(rng, (1, 1, 1, d), dtype))})
    sin = b.add1("constant", [], {"value": Literal(random_array(rng, (1, 1, 1, d), dtype))})
    y = b.add1("add", [b.add1("mul", [t, cos]), b.add1("mul", [rot, sin])])
    return b.build([b.add1("transpose", [y], {"perm": (0, 2, 1, 3)})])


@pytest.mark.parametrize("dtype", [DType.bf16, DType.f32])
def test_rope_has_no_slices_concats_or_transposes(dtype: DType) -> None:
    graph = rope(dtype)
    ops = {n.op.name for n in gpu_views(graph).nodes}
    assert not ops & {"slice", "concat", "transpose", "neg"} and "take" in ops
    built = cross_compile(graph, optimize=False)
    for seed in (0, 1):
        x = random_array(np.random.default_rng(seed), (1, 1, 3, 8), dtype)
        (got,), (want,) = simulate(built.program, [x]), interpret(graph, x)
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want))   # exact


def test_a_real_transpose_or_another_concat_stays() -> None:
    b = GraphBuilder("keep")
    x = b.input(((2, 3, 4), DType.f32), "x")
    t = b.add1("transpose", [x], {"perm": (1, 0, 2)})
    s = b.add1("slice", [x], {"starts": [0, 0, 2], "stops": [2, 3, 4], "steps": [1, 1, 1]})
    c = b.add1("concat", [s, b.add1("neg", [s])], {"axis": 2})   # not rotate_half
    graph = b.build([t, c])
    assert gpu_views(graph) is graph
