"""One differential check: a graph compiled natively against the reference interpreter.

The verdict names the stage that went wrong: ``passes`` (the optimised graph, interpreted,
disagrees with the original), ``build`` (compiling raised), ``run`` (calling raised, or the call
wrote to its inputs) or ``compare`` (native results outside the numerics contract of
:mod:`tilefuse.testing`). Any exception in the compiler is a crash: the graph verifies and the
reference runs it, so the compiler must too.
"""

from __future__ import annotations

import traceback
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from tilefuse.dtypes import DType, from_numpy
from tilefuse.errors import TilefuseError
from tilefuse.graph.interpreter import interpret
from tilefuse.graph.ir import Graph
from tilefuse.ops.registry import OpKind
from tilefuse.testing import assert_close, random_array

ACCUMULATING = frozenset({OpKind.REDUCTION, OpKind.CONTRACTION})


@dataclass(frozen=True)
class Verdict:
    """``kind`` is ok, mismatch, crash, host-step (right, but some kernel ran on the host:
    a defect, issue 28) or skipped (the reference itself cannot run it)."""

    kind: str
    stage: str = ""
    detail: str = ""

    @property
    def failed(self) -> bool:
        return self.kind in ("mismatch", "crash", "host-step")

    def signature(self) -> tuple[str, str]:
        """What a shrunk graph must keep failing with: the kind and the stage."""
        return self.kind, self.stage


OK = Verdict("ok")


def random_inputs(graph: Graph, seed: int, specials: float = 0.0) -> list[np.ndarray]:
    """Fresh random inputs for ``graph``: uniform floats in [-2, 2]; with ``specials`` > 0,
    that fraction of float elements is NaN, +Inf or -Inf (for NaN-propagation campaigns)."""
    rng = np.random.default_rng(seed)
    arrays = [random_array(rng, tuple(v.shape), v.dtype) for v in graph.inputs]
    if specials > 0:
        for array in arrays:
            if array.dtype.kind == "f" and array.size:
                hit = rng.random(array.shape) < specials
                array[hit] = rng.choice(np.array([np.nan, np.inf, -np.inf]), size=int(hit.sum()))
    return arrays


def accumulates(graph: Graph) -> bool:
    """Whether the graph reduces or contracts (results then get the reduction tolerance)."""
    return any(node.op.kind in ACCUMULATING for node in graph.nodes)


def loosest_float(graph: Graph) -> DType | None:
    """The least precise float dtype any value of ``graph`` has: an f64 output computed
    through f32 is held to the f32 contract, not the f64 one."""
    found = {v.dtype for v in (*graph.inputs, *(o for n in graph.nodes for o in n.outputs))
             if v.dtype.is_float}
    return max(found, key=_PRECISION_RANK.__getitem__, default=None)


_PRECISION_RANK = {DType.f64: 0, DType.f32: 1, DType.f16: 2, DType.bf16: 3}


def _in_dtype(array: np.ndarray, dtype: DType | None) -> np.ndarray:
    """``array`` rounded to ``dtype`` when it is a more precise float."""
    if dtype is None or array.dtype.kind != "f" or \
            _PRECISION_RANK[from_numpy(array.dtype)] >= _PRECISION_RANK[dtype]:
        return array
    return array.astype(dtype.np)


def _compare(actual: Sequence[np.ndarray], expected: Sequence[np.ndarray], reduction: bool,
             stage: str, dtype: DType | None = None) -> Verdict:
    if len(actual) != len(expected):
        return Verdict("mismatch", stage, f"{len(actual)} outputs, expected {len(expected)}")
    for i, (a, e) in enumerate(zip(actual, expected)):
        if a.dtype != e.dtype:
            return Verdict("mismatch", stage, f"output {i} is {a.dtype}, expected {e.dtype}")
        a, e = _in_dtype(a, dtype), _in_dtype(e, dtype)
        try:
            assert_close(a, e, reduction=reduction, msg=f"output {i}")
        except AssertionError as err:
            return Verdict("mismatch", stage, str(err).strip()[:2000])
    return OK


def _crash(stage: str, err: BaseException) -> Verdict:
    where = traceback.extract_tb(err.__traceback__)[-1:]
    at = f" at {where[0].filename}:{where[0].lineno}" if where else ""
    return Verdict("crash", stage, f"{type(err).__name__}: {err}{at}"[:2000])


def check_graph(graph: Graph, inputs: Sequence[np.ndarray], *,
                schedule_seed: int | None = None) -> Verdict:
    """Compiles ``graph`` (default schedules, or random valid ones drawn with
    ``schedule_seed``) and compares it with the reference on ``inputs``."""
    from tilefuse.codegen.target import host_target
    from tilefuse.driver import CompileOptions, compile, optimize
    from tilefuse.fuzz.schedules import RandomScheduleSource
    from tilefuse.runtime.kernel_cache import KernelCache

    with np.errstate(all="ignore"):
        try:
            expected = interpret(graph, *inputs)
        except TilefuseError as err:
            return Verdict("skipped", "reference", str(err))
        reduction = accumulates(graph)
        loosest = loosest_float(graph)
        try:
            optimised, _ = optimize(graph)  # the driver's stage 1, checked on its own
            verdict = _compare(interpret(optimised, *inputs), expected, reduction, "passes",
                               loosest)
        except Exception as err:
            return _crash("passes", err)
        if verdict.failed:
            return verdict
        target = host_target()
        schedules = None if schedule_seed is None \
            else RandomScheduleSource(target, schedule_seed)
        try:
            executable = compile(optimised, "cpu", CompileOptions(
                optimize=False, cache=KernelCache(None, target), schedules=schedules))
        except Exception as err:
            return _crash("build", err)
        given = [np.array(a, copy=True) for a in inputs]
        try:
            actual = executable(*given)
        except Exception as err:
            return _crash("run", err)
    for i, (before, after) in enumerate(zip(inputs, given)):
        if not np.array_equal(before, after, equal_nan=True):
            return Verdict("mismatch", "run", f"the call wrote to input {i}")
    verdict = _compare(actual, expected, reduction, "compare", loosest)
    if verdict.failed or not executable.fallbacks:
        return verdict
    return Verdict("host-step", "build", "; ".join(f"{name}: {why}"
                                                   for name, why in executable.fallbacks))
