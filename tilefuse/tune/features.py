"""Features of a candidate schedule for the cost model, read from its lowered loop IR.

One vector (:data:`FEATURE_NAMES`) serves every kernel kind. It has three parts:

- **loops** (:func:`loop_features`): per loop kind (serial, parallel, vectorized, unrolled) the
  count and log2 trip counts; for the *hot loop* (the innermost non-unrolled loop executed most
  often, unrolled bodies expanded) its loads, stores, FMAs, other ops, prefetches, widest
  vector, log2 executions, depth and arithmetic intensity (flops per byte loaded or stored); then
  per loop level from the hot loop outwards (:data:`LEVELS` levels) its log2 trips, kind, log2
  bytes one iteration streams, and the share of the hot body's loaded bytes whose address does not
  depend on that level's variable (a reuse proxy: those bytes stay in cache or registers across
  its iterations); register accumulators (locals) and the number of functions;
- **work**: log2 flops, log2 compulsory bytes and their ratio (the kernel's intensity), the
  number of threads the parallel loop can use;
- **schedule** (:func:`schedule_features`): vector width, register tile (MR, NR, accumulators),
  per axis log2 tile and the share of the padded tile range wasted on the tail, packing, unroll,
  parallel chunks and their balance over the cores, B's prefetch distance (log2 k steps) and
  whether B's next panel is prefetched.

Lowering that fails gives NaNs (LightGBM treats them as missing).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from tilefuse.kernel.schedule import Schedule
from tilefuse.loop.ir import (
    Expr,
    For,
    Let,
    Local,
    LoopFunction,
    LoopKind,
    Prefetch,
    Stmt,
    Store,
    XOp,
    expr_children,
    stmt_children,
    walk_expr,
)

KINDS = (LoopKind.SERIAL, LoopKind.PARALLEL, LoopKind.VECTORIZED, LoopKind.UNROLLED)
LEVELS = 6
AXES = ("m", "n", "k", "b", "i", "r")
LOOP_NAMES = (
    *(f"{k.value}_{what}" for k in KINDS for what in ("count", "log_trips", "log_max")),
    "hot_loads", "hot_stores", "hot_fmas", "hot_ops", "hot_prefetches", "hot_lanes",
    "hot_log_exec", "hot_depth", "hot_intensity",
    *(f"level{i}_{what}" for i in range(LEVELS)
      for what in ("log_trips", "kind", "log_bytes", "reused")),
    "locals", "functions", "log_flops", "log_bytes", "intensity", "threads",
)
SCHEDULE_NAMES = (
    "width", "mr", "nr", "accumulators",
    *(f"{a}_{what}" for a in AXES for what in ("log_tile", "waste")),
    "packed", "log_unroll", "log_chunks", "balance", "log_prefetch_b", "prefetch_next",
)
FEATURE_NAMES = LOOP_NAMES + SCHEDULE_NAMES
_ARITH = frozenset(XOp) - {XOp.CONST, XOp.VAR, XOp.LOAD, XOp.LOCAL_LOAD, XOp.FMA}
_KIND_CODE = {k: float(i) for i, k in enumerate(KINDS)}

Deps = Mapping[str, frozenset[str]]


def _value(e: Expr, env: Mapping[str, int]) -> int | None:
    """An integer expression's value with loop variables at their first iteration."""
    if e.op is XOp.CONST:
        if isinstance(e.arg, float) and not math.isfinite(e.arg):
            return None                  # a float constant (a -inf max identity): no index
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


def _vars_of(e: Expr, deps: Deps) -> frozenset[str]:
    """The loop variables ``e`` depends on (through ``Let`` names)."""
    found: set[str] = set()
    for x in walk_expr(e):
        if x.op is XOp.VAR:
            found |= deps.get(str(x.arg), frozenset())
    return frozenset(found)


@dataclass
class _Body:
    """Per-execution counts of one statement (unrolled loops expanded); ``loaded`` maps the
    loop variables a load's address depends on to its bytes."""

    loads: float = 0.0
    stores: float = 0.0
    fmas: float = 0.0
    ops: float = 0.0
    prefetches: float = 0.0
    lanes: int = 1
    bytes: float = 0.0
    loaded: dict[frozenset[str], float] = field(default_factory=dict)

    def add(self, other: _Body, times: float = 1.0) -> None:
        self.loads += other.loads * times
        self.stores += other.stores * times
        self.fmas += other.fmas * times
        self.ops += other.ops * times
        self.prefetches += other.prefetches * times
        self.bytes += other.bytes * times
        self.lanes = max(self.lanes, other.lanes)
        for key, nbytes in other.loaded.items():
            self.loaded[key] = self.loaded.get(key, 0.0) + nbytes * times


def _work(body: _Body) -> float:
    return body.fmas + body.ops + body.loads + body.stores


@dataclass
class _Hot:
    executions: float = 0.0
    body: _Body = field(default_factory=_Body)
    chain: list[tuple[For, float]] = field(default_factory=list)  # hot loop first


class _Walker:
    """Collects loop statistics of one function (see the module docstring)."""

    def __init__(self) -> None:
        self.loops: dict[LoopKind, list[float]] = {k: [] for k in KINDS}
        self.hot = _Hot()
        self.locals = 0

    def stmt(self, s: Stmt, env: dict[str, int], deps: dict[str, frozenset[str]],
             outer: float, chain: list[tuple[For, float]]) -> tuple[_Body, bool]:
        """Counts for one execution of ``s``; whether it holds a non-unrolled loop."""
        body = _Body()
        if isinstance(s, Let):
            v = _value(s.value, env)
            if v is not None:
                env[s.name] = v
            deps[s.name] = _vars_of(s.value, deps)
        if isinstance(s, Local):
            self.locals += s.count * s.type.lanes
        if isinstance(s, For):
            return self.loop(s, env, deps, outer, chain)
        for e in expr_children(s):
            body.add(_expr_counts(e, deps))
        if isinstance(s, Prefetch):
            body.prefetches += 1
        if isinstance(s, Store):
            body.stores += 1
            body.bytes += s.value.type.lanes * s.value.type.dtype.itemsize
        has_loop = False
        for child in stmt_children(s):
            sub, inner = self.stmt(child, env, deps, outer, chain)
            body.add(sub)
            has_loop |= inner
        return body, has_loop

    def loop(self, s: For, env: dict[str, int], deps: dict[str, frozenset[str]], outer: float,
             chain: list[tuple[For, float]]) -> tuple[_Body, bool]:
        start, stop = _value(s.start, env), _value(s.stop, env)
        trips = 1.0
        if start is not None and stop is not None:
            trips = max(1.0, math.ceil((stop - start) / s.step))
        self.loops[s.kind].append(trips)
        inner_deps = {**deps, s.var: frozenset({s.var})}
        body, has_loop = self.stmt(s.body, {**env, s.var: start or 0}, inner_deps,
                                   outer * trips, [*chain, (s, trips)])
        total = _Body()
        total.add(body, trips)
        executions = outer * trips
        if s.kind is not LoopKind.UNROLLED and not has_loop and (
                executions > self.hot.executions or (executions == self.hot.executions and
                                                     _work(body) >= _work(self.hot.body))):
            # the most executed innermost loop; of equals, the one doing more work (a full
            # panel's tile rather than the narrower tile of the last partial panel)
            self.hot = _Hot(executions, body, [(s, trips), *chain[::-1]])
        return total, has_loop or s.kind is not LoopKind.UNROLLED


def _expr_counts(e: Expr, deps: Deps) -> _Body:
    body = _Body()
    for x in walk_expr(e):
        lanes = x.type.lanes
        body.lanes = max(body.lanes, lanes)
        if x.op is XOp.LOAD:
            nbytes = lanes * x.type.dtype.itemsize
            body.loads += 1
            body.bytes += nbytes
            key = _vars_of(x.args[0], deps)
            body.loaded[key] = body.loaded.get(key, 0.0) + nbytes
        elif x.op is XOp.FMA:
            body.fmas += 1
        elif x.op in _ARITH:
            body.ops += 1
    return body


def _log2(x: float) -> float:
    return math.log2(max(x, 1.0))


def _levels(hot: _Hot) -> list[float]:
    """Per level from the hot loop outwards: log2 trips, kind, log2 bytes, reused share."""
    row: list[float] = []
    streamed = hot.body.bytes
    loaded = sum(hot.body.loaded.values()) or 1.0
    for loop, trips in hot.chain[:LEVELS]:
        reused = sum(b for vs, b in hot.body.loaded.items() if loop.var not in vs) / loaded
        row += [_log2(trips), _KIND_CODE[loop.kind], _log2(streamed), reused]
        streamed *= trips
    return row + [0.0, -1.0, 0.0, 0.0] * (LEVELS - len(hot.chain[:LEVELS]))


def loop_features(functions: Sequence[LoopFunction], work: tuple[float, float],
                  cores: int) -> np.ndarray:
    """The loop part of the feature vector (:data:`LOOP_NAMES`) of lowered functions."""
    walker = _Walker()
    for fn in functions:
        walker.stmt(fn.body, {}, {}, 1.0, [])
    row: list[float] = []
    for kind in KINDS:
        trips = walker.loops[kind]
        row += [len(trips), sum(_log2(t) for t in trips), _log2(max(trips, default=1.0))]
    hot = walker.hot
    b = hot.body
    flops = 2.0 * b.fmas * b.lanes + b.ops * b.lanes
    row += [b.loads, b.stores, b.fmas, b.ops, b.prefetches, b.lanes, _log2(hot.executions),
            len(hot.chain), flops / max(b.bytes, 1.0)]
    row += _levels(hot)
    total_flops, moved = work
    parallel = walker.loops[LoopKind.PARALLEL]
    threads = min(cores, int(max(parallel, default=1.0))) if parallel else 1
    row += [walker.locals, len(functions), _log2(total_flops), _log2(moved),
            total_flops / max(moved, 1.0), threads]
    return np.asarray(row, dtype=np.float64)


def schedule_features(schedule: Schedule, extents: Mapping[str, int | None],
                      cores: int) -> np.ndarray:
    """The schedule part of the feature vector (:data:`SCHEDULE_NAMES`)."""
    width = schedule.vector_width
    mr, nr = schedule.micro_tile or (1, width)
    row: list[float] = [width, mr, nr, mr * nr / max(width, 1)]
    for axis in AXES:
        extent = extents.get(axis) or 0
        tile = schedule.tile(axis) or extent
        if extent and tile:
            padded = math.ceil(extent / tile) * tile
            row += [_log2(tile), (padded - extent) / padded]
        else:
            row += [0.0, 0.0]
    unroll = math.prod(u for _, u in schedule.unroll) if schedule.unroll else 1
    chunks = 1
    for axis in schedule.parallel_axes:
        extent = extents.get(axis) or 1
        chunks *= math.ceil(extent / (schedule.tile(axis) or extent))
    balance = chunks / (math.ceil(chunks / cores) * cores)
    prefetch = dict(schedule.prefetch)
    row += [len(schedule.pack), _log2(unroll), _log2(chunks), balance,
            _log2(prefetch.get("B", 0)), float(prefetch.get("B_next", 0))]
    return np.asarray(row, dtype=np.float64)


def candidate_features(functions: Sequence[LoopFunction] | None, schedule: Schedule,
                       extents: Mapping[str, int | None], work: tuple[float, float],
                       cores: int) -> np.ndarray:
    """The whole vector (:data:`FEATURE_NAMES`); ``functions`` None (lowering failed) gives
    NaNs for the loop part."""
    loops = (np.full(len(LOOP_NAMES), np.nan) if functions is None
             else loop_features(functions, work, cores))
    return np.concatenate([loops, schedule_features(schedule, extents, cores)])


__all__ = ["FEATURE_NAMES", "LEVELS", "LOOP_NAMES", "SCHEDULE_NAMES", "candidate_features",
           "loop_features", "schedule_features"]
