"""Cost models: rank candidate schedules before measuring them.

Features come from the lowered loop IR (:func:`loop_features`), so one model serves every
kernel kind: per loop kind (serial, parallel, vectorized, unrolled) the count and log2 trip
counts; for the hot loop (the innermost non-unrolled loop executed most often, unrolled bodies
expanded) its loads, stores, FMAs, other ops, widest vector and executions; log2 bytes one
iteration of the hot loop and of each of its next three enclosing loops touches; local
(register) accumulators; the kernel's flops, bytes and arithmetic intensity; the thread count.

- :class:`RandomModel` (trivial): random scores.
- :class:`LightGBMModel`: gradient-boosted trees (LightGBM, an optional dependency) regressing
  log seconds; failed candidates train as 4x the slowest good one. Until it has
  ``min_samples`` measurements it scores randomly.

Lower scores mean faster. :func:`top_k_recall` measures how well a model's top k matches the
measured top k.
"""

from __future__ import annotations

import abc
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from tilefuse.errors import TilefuseError
from tilefuse.loop.ir import (
    Expr,
    For,
    Let,
    Local,
    LoopFunction,
    LoopKind,
    Stmt,
    Store,
    XOp,
    expr_children,
    stmt_children,
    walk_expr,
)

KINDS = (LoopKind.SERIAL, LoopKind.PARALLEL, LoopKind.VECTORIZED, LoopKind.UNROLLED)
LEVELS = 4
FEATURE_NAMES = (
    *(f"{k.value}_{what}" for k in KINDS for what in ("count", "log_trips", "log_max")),
    "hot_loads", "hot_stores", "hot_fmas", "hot_ops", "hot_lanes", "hot_log_exec", "hot_depth",
    *(f"log_bytes_level{i}" for i in range(LEVELS)),
    "locals", "functions", "log_flops", "log_bytes", "intensity", "threads",
)
_ARITH = frozenset(XOp) - {XOp.CONST, XOp.VAR, XOp.LOAD, XOp.LOCAL_LOAD, XOp.FMA}


def _value(e: Expr, env: Mapping[str, int]) -> int | None:
    """An integer expression's value with loop variables at their first iteration."""
    if e.op is XOp.CONST:
        return int(e.arg) if isinstance(e.arg, int | float) else None  # type: ignore[arg-type]
    if e.op is XOp.VAR:
        return env.get(str(e.arg), 0)
    vals = [_value(a, env) for a in e.args]
    if any(v is None for v in vals) or len(vals) != 2:
        return None
    a, b = vals
    ops = {XOp.ADD: lambda: a + b, XOp.SUB: lambda: a - b, XOp.MUL: lambda: a * b,
           XOp.MIN: lambda: min(a, b), XOp.MAX: lambda: max(a, b),
           XOp.FLOORDIV: lambda: a // b if b else 0, XOp.MOD: lambda: a % b if b else 0}
    fn = ops.get(e.op)
    return fn() if fn is not None else None  # type: ignore[no-untyped-call]


@dataclass
class _Body:
    """Per-execution counts of one statement (unrolled loops expanded)."""

    loads: float = 0.0
    stores: float = 0.0
    fmas: float = 0.0
    ops: float = 0.0
    lanes: int = 1
    bytes: float = 0.0

    def add(self, other: _Body, times: float = 1.0) -> None:
        self.loads += other.loads * times
        self.stores += other.stores * times
        self.fmas += other.fmas * times
        self.ops += other.ops * times
        self.bytes += other.bytes * times
        self.lanes = max(self.lanes, other.lanes)


@dataclass
class _Hot:
    executions: float = 0.0
    body: _Body = field(default_factory=_Body)
    depth: int = 0
    level_bytes: list[float] = field(default_factory=list)


class _Walker:
    """Collects loop statistics of one function (see the module docstring)."""

    def __init__(self) -> None:
        self.loops: dict[LoopKind, list[float]] = {k: [] for k in KINDS}
        self.hot = _Hot()
        self.locals = 0

    def stmt(self, s: Stmt, env: dict[str, int], outer: float, chain: list[float]
             ) -> tuple[_Body, bool]:
        """Counts for one execution of ``s``; whether it holds a non-unrolled loop."""
        body = _Body()
        if isinstance(s, Let):
            v = _value(s.value, env)
            if v is not None:
                env[s.name] = v
        if isinstance(s, Local):
            self.locals += s.count * s.type.lanes
        if isinstance(s, For):
            return self.loop(s, env, outer, chain)
        for e in expr_children(s):
            body.add(_expr_counts(e))
        if isinstance(s, Store):
            body.stores += 1
            body.bytes += s.value.type.lanes * s.value.type.dtype.itemsize
        has_loop = False
        for child in stmt_children(s):
            sub, inner = self.stmt(child, env, outer, chain)
            body.add(sub)
            has_loop |= inner
        return body, has_loop

    def loop(self, s: For, env: dict[str, int], outer: float, chain: list[float]
             ) -> tuple[_Body, bool]:
        start, stop = _value(s.start, env), _value(s.stop, env)
        trips = max(1.0, math.ceil((stop - start) / s.step)) if None not in (start, stop) \
            else 1.0  # type: ignore[operator]
        self.loops[s.kind].append(trips)
        inner_env = {**env, s.var: start or 0}
        body, has_loop = self.stmt(s.body, inner_env, outer * trips, [*chain, trips])
        total = _Body()
        total.add(body, trips)
        if s.kind is not LoopKind.UNROLLED and not has_loop:
            executions = outer * trips
            if executions >= self.hot.executions:
                levels, size = [], body.bytes
                for t in [trips, *chain[::-1]][:LEVELS]:
                    levels.append(size)
                    size *= t
                self.hot = _Hot(executions, body, len(chain) + 1, levels)
        return total, has_loop or s.kind is not LoopKind.UNROLLED


def _expr_counts(e: Expr) -> _Body:
    body = _Body()
    for x in walk_expr(e):
        lanes = x.type.lanes
        body.lanes = max(body.lanes, lanes)
        if x.op is XOp.LOAD:
            body.loads += 1
            body.bytes += lanes * x.type.dtype.itemsize
        elif x.op is XOp.FMA:
            body.fmas += 1
        elif x.op in _ARITH:
            body.ops += 1
    return body


def _log2(x: float) -> float:
    return math.log2(max(x, 1.0))


def loop_features(functions: Sequence[LoopFunction], work: tuple[float, float],
                  cores: int) -> np.ndarray:
    """The feature vector (:data:`FEATURE_NAMES`) of a schedule's lowered functions."""
    walker = _Walker()
    for fn in functions:
        walker.stmt(fn.body, {}, 1.0, [])
    row: list[float] = []
    for kind in KINDS:
        trips = walker.loops[kind]
        row += [len(trips), sum(_log2(t) for t in trips), _log2(max(trips, default=1.0))]
    hot = walker.hot
    row += [hot.body.loads, hot.body.stores, hot.body.fmas, hot.body.ops, hot.body.lanes,
            _log2(hot.executions), hot.depth]
    levels = (hot.level_bytes + [0.0] * LEVELS)[:LEVELS]
    row += [_log2(b) for b in levels]
    flops, moved = work
    parallel = walker.loops[LoopKind.PARALLEL]
    threads = min(cores, int(max(parallel, default=1.0))) if parallel else 1
    row += [walker.locals, len(functions), _log2(flops), _log2(moved), flops / max(moved, 1.0),
            threads]
    return np.asarray(row, dtype=np.float64)


class CostModel(abc.ABC):
    """Scores feature rows (lower: predicted faster) and learns from measurements."""

    @abc.abstractmethod
    def update(self, features: np.ndarray, times: np.ndarray) -> None:
        """Adds measurements (rows of features, seconds; inf for failures) and retrains."""

    @abc.abstractmethod
    def predict(self, features: np.ndarray) -> np.ndarray:
        """One score per row."""


class RandomModel(CostModel):
    """The trivial model: random scores (the search then measures at random)."""

    def __init__(self, seed: int = 0):
        self.rng = np.random.default_rng(seed)

    def update(self, features: np.ndarray, times: np.ndarray) -> None:
        pass

    def predict(self, features: np.ndarray) -> np.ndarray:
        return self.rng.random(len(features))


def lightgbm_available() -> bool:
    try:
        import lightgbm  # noqa: F401
    except ImportError:
        return False
    return True


class LightGBMModel(CostModel):
    """LightGBM regression on log seconds (see the module docstring)."""

    def __init__(self, seed: int = 0, min_samples: int = 8, rounds: int = 150):
        if not lightgbm_available():
            raise TilefuseError("LightGBMModel needs lightgbm: pip install 'tilefuse[tune]'")
        self.seed, self.min_samples, self.rounds = seed, min_samples, rounds
        self.rng = np.random.default_rng(seed)
        self.features: list[np.ndarray] = []
        self.times: list[float] = []
        self.booster = None

    def update(self, features: np.ndarray, times: np.ndarray) -> None:
        self.features.extend(np.atleast_2d(features))
        self.times.extend(float(t) for t in times)
        good = [t for t in self.times if math.isfinite(t) and t > 0]
        if len(good) < self.min_samples:
            return
        import lightgbm

        worst = math.log(max(good) * 4.0)
        target = np.array([math.log(t) if math.isfinite(t) and t > 0 else worst
                           for t in self.times])
        params = {"objective": "regression", "learning_rate": 0.1, "num_leaves": 15,
                  "min_data_in_leaf": 2, "min_data_in_bin": 1, "verbose": -1,
                  "seed": self.seed, "deterministic": True, "num_threads": 1}
        data = lightgbm.Dataset(np.vstack(self.features), target, params={"verbose": -1})
        self.booster = lightgbm.train(params, data, num_boost_round=self.rounds)

    def predict(self, features: np.ndarray) -> np.ndarray:
        if self.booster is None:
            return self.rng.random(len(features))
        return np.asarray(self.booster.predict(np.atleast_2d(features)))


def best_model(seed: int = 0) -> CostModel:
    """LightGBM when it is installed, else random."""
    return LightGBMModel(seed) if lightgbm_available() else RandomModel(seed)


def top_k_recall(scores: Sequence[float], times: Sequence[float], k: int) -> float:
    """The share of the k fastest measured candidates among the k best-scored ones."""
    k = max(1, min(k, len(times)))
    predicted = set(np.argsort(np.asarray(scores), kind="stable")[:k].tolist())
    actual = set(np.argsort(np.asarray(times), kind="stable")[:k].tolist())
    return len(predicted & actual) / k


__all__ = ["FEATURE_NAMES", "CostModel", "LightGBMModel", "RandomModel", "best_model",
           "lightgbm_available", "loop_features", "top_k_recall"]
