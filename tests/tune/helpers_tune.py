"""Graphs for the tuning tests (not collected: no test_ prefix)."""

from __future__ import annotations

from typing import Any

import numpy as np

from tilefuse.dtypes import DType
from tilefuse.graph.builder import GraphBuilder
from tilefuse.graph.ir import Graph

F32 = DType.f32


def matmul_graph(m: int, k: int, n: int, *, constant_w: bool = True, gelu: bool = True,
                 seed: int = 0) -> Graph:
    """``[gelu](x @ w + b)``; ``w`` and ``b`` constants unless ``constant_w`` is off."""
    rng = np.random.default_rng(seed)
    b = GraphBuilder("mm")
    x = b.input(((m, k), F32), "x")
    if constant_w:
        w = b.add1("constant", [], {"value": rng.standard_normal((k, n), np.float32)})
    else:
        w = b.input(((k, n), F32), "w")
    bias = b.add1("constant", [], {"value": rng.standard_normal(n, np.float32)})
    y = b.add1("add", [b.add1("matmul", [x, w]), bias])
    return b.build([b.add1("gelu", [y]) if gelu else y])


def elementwise_graph(shape: tuple[int, ...]) -> Graph:
    b = GraphBuilder("ew")
    x = b.input((shape, F32), "x")
    y = b.input((shape, F32), "y")
    return b.build([b.add1("tanh", [b.add1("mul", [b.add1("add", [x, y]), x])])])


def rows_graph(shape: tuple[int, ...], op: str = "softmax") -> Graph:
    b = GraphBuilder("rows")
    x = b.input((shape, F32), "x")
    if op == "softmax":
        return b.build([b.add1(op, [x], {"axis": -1})])
    weight = b.input(((shape[-1],), F32), "weight")
    bias = b.input(((shape[-1],), F32), "bias")
    return b.build([b.add1(op, [x, weight, bias])])


def attention_graph(batch: tuple[int, ...], sq: int, sk: int, d: int, dv: int,
                    mask: bool = True) -> Graph:
    """One fused attention (what the attention pass makes of a transformer's scores)."""
    b = GraphBuilder("att")
    q = b.input(((*batch, sq, d), F32), "q")
    k = b.input(((*batch, sk, d), F32), "k")
    v = b.input(((*batch, sk, dv), F32), "v")
    inputs = [q, k, v] + ([b.input(((1,) * len(batch) + (sq, sk), F32), "mask")] if mask else [])
    return b.build([b.add1("attention", inputs, {"scale": float(d) ** -0.5})])


def tiny_function(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """For the CLI test: one elementwise kernel."""
    return np.tanh(x * y + x)


def matmul_candidates(count: int) -> tuple[Any, list[Any]]:
    """A small matmul kernel's task and ``count`` distinct schedules of its space, the default
    first (the runners' planted-failure tests use them)."""
    from tilefuse.tune.space import space_for
    from tilefuse.tune.task import tasks_from_graph

    [task] = tasks_from_graph(matmul_graph(24, 16, 40))
    space = space_for(task.group)
    rng = np.random.default_rng(3)
    found = [space.default()]
    while len(found) < count:
        s = space.sample(rng)
        if s not in found:
            found.append(s)
    return task, found


def small_probe() -> Any:
    """A peak probe that measures in milliseconds: one small matmul, a 1 MiB copy and small
    cache levels. The tuner's confirmation measures the peaks again around each pass
    (``measure_now``); with the real probe (1024³ matmuls, 256 MiB copies, half of L3
    streamed) that was ~60 % of a tuning test's CPU time, for a bound these tests do not
    check."""
    from tilefuse.tune.roofline import PeakProbe

    return PeakProbe(*SMALL_PROBE)


SMALL_PROBE = (((96, 80, 64),), 1 << 20, {"L1": 32 << 10, "L2": 1 << 20, "L3": 4 << 20})
""":class:`PeakProbe`'s arguments for :func:`small_probe`: shapes, copy bytes, cache sizes."""
