"""Random valid graphs for differential fuzzing.

A graph grows one op at a time from a few random inputs; each step picks an op whose shape and
dtype constraints it can meet with the values made so far (broadcast-compatible partners, axes
that exist, pads that reflect legally) and builds it through :class:`GraphBuilder`, so every
graph type-checks by construction. Shapes mix sizes 1, odd and power-of-two sizes.

Ops that amplify rounding differences without bound (log, reciprocal, floor, comparisons,
floordiv, ...) are applied only to *exact* values: graph inputs and constants, which the compiled
code and the reference see bit for bit. Elsewhere a one-ulp difference in an operand could turn
into a large (and legitimate) difference in the result, which the numerics contract does not
promise to match. Smooth ops take any value.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from tilefuse.dtypes import DType
from tilefuse.graph.builder import GraphBuilder
from tilefuse.graph.ir import Graph, Literal, Value
from tilefuse.graph.types import TensorType

SMOOTH_UNARY = ("neg", "abs", "relu", "exp", "tanh", "sigmoid", "erf", "gelu", "silu",
                "softplus", "expm1")
SENSITIVE_UNARY = ("log", "log1p", "sqrt", "rsqrt", "reciprocal", "floor", "ceil", "round",
                   "sign", "sin", "cos", "isnan")
INT_UNARY = ("neg", "abs", "relu", "sign")
SMOOTH_BINARY = ("add", "sub", "mul", "maximum", "minimum")
SENSITIVE_BINARY = ("div", "pow", "floordiv", "mod", "lt", "le", "gt", "ge", "eq", "ne")
REDUCTIONS = ("sum", "mean", "max", "min", "prod", "var")
DIMS = (1, 1, 2, 3, 4, 5, 7, 8, 9, 16, 17)
DTYPES = (DType.f32,) * 6 + (DType.f64, DType.f64, DType.i32, DType.f16, DType.bf16)


@dataclass(frozen=True)
class GeneratorConfig:
    """How big generated graphs get."""

    max_ops: int = 6
    max_rank: int = 3
    max_inputs: int = 4
    max_elements: int = 4096


class _Growth:
    """One graph being grown: the builder, the values so far and which of them are exact."""

    def __init__(self, rng: np.random.Generator, config: GeneratorConfig, name: str):
        self.rng = rng
        self.config = config
        self.builder = GraphBuilder(name)
        self.values: list[Value] = []
        self.exact: set[Value] = set()
        self.inputs = 0

    # ---------------------------------------------------------------- helpers
    def pick(self, seq: Sequence):
        return seq[int(self.rng.integers(len(seq)))]

    def chance(self, p: float) -> bool:
        return bool(self.rng.random() < p)

    def shape(self, rank: int | None = None) -> tuple[int, ...]:
        rank = int(self.rng.integers(0, self.config.max_rank + 1)) if rank is None else rank
        dims = [int(self.pick(DIMS)) for _ in range(rank)]
        while dims and np.prod(dims) > self.config.max_elements:
            dims[int(np.argmax(dims))] = 1
        return tuple(dims)

    def new_input(self, shape: tuple[int, ...], dtype: DType) -> Value:
        if self.inputs >= self.config.max_inputs:
            return self.constant(shape, dtype)
        value = self.builder.input(TensorType(shape, dtype), f"in{self.inputs}")
        self.inputs += 1
        self.values.append(value)
        self.exact.add(value)
        return value

    def constant(self, shape: tuple[int, ...], dtype: DType) -> Value:
        from tilefuse.testing import random_array
        array = random_array(self.rng, shape, dtype)
        value = self.builder.add1("constant", [], {"value": Literal(array)})
        self.values.append(value)
        self.exact.add(value)
        return value

    def emit(self, op: str, inputs: Sequence[Value], attrs: dict | None = None) -> Value:
        value = self.builder.add1(op, list(inputs), attrs or {})
        self.values.append(value)
        return value

    def recent(self) -> Value:
        """A value made so far, the newer the likelier (so graphs grow deep, not wide)."""
        weights = np.arange(1, len(self.values) + 1, dtype=float) ** 2
        return self.values[int(self.rng.choice(len(self.values), p=weights / weights.sum()))]

    def floats(self, exact_only: bool = False) -> list[Value]:
        return [v for v in self.values if v.dtype.is_float and (not exact_only or v in self.exact)]

    def partner_shape(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        """A shape that broadcasts with ``shape``: leading dims dropped, some dims set to 1."""
        drop = int(self.rng.integers(0, len(shape) + 1)) if self.chance(0.4) else 0
        return tuple(1 if self.chance(0.3) else d for d in shape[drop:])

    def partner(self, x: Value, exact_only: bool = False) -> Value:
        """A value of x's dtype whose shape broadcasts with x's (an old one, or a new input)."""
        candidates = [v for v in self.values if v.dtype == x.dtype and v is not x
                      and (not exact_only or v in self.exact) and _broadcasts(v.shape, x.shape)]
        if candidates and self.chance(0.5):
            return self.pick(candidates)
        if self.chance(0.15):
            return self.constant((), x.dtype)
        return self.new_input(self.partner_shape(x.shape), x.dtype)


def _broadcasts(a: tuple[int, ...], b: tuple[int, ...]) -> bool:
    """Whether broadcasting a with b gives b's shape (so chains keep their shape)."""
    if len(a) > len(b):
        return False
    return all(da in (1, db) for da, db in zip(reversed(a), reversed(b)))


# ---- steps: each adds one op (or a small idiom) and returns its value, or None if it cannot --


def _unary(g: _Growth) -> Value | None:
    x = g.recent()
    if x.dtype is DType.bool:
        return g.emit("logical_not", [x])
    if not x.dtype.is_float:
        return g.emit(g.pick(INT_UNARY), [x])
    exact = g.floats(exact_only=True)
    if exact and g.chance(0.35):
        return g.emit(g.pick(SENSITIVE_UNARY), [g.pick(exact)])
    op = g.pick(SMOOTH_UNARY)
    attrs = {"approximate": g.pick(("none", "tanh"))} if op == "gelu" else {}
    return g.emit(op, [x], attrs)


def _binary(g: _Growth) -> Value | None:
    exact = [v for v in g.values if v in g.exact]
    if exact and g.chance(0.3):
        x = g.pick(exact)
        if x.dtype is DType.bool:
            return None
        ops = SENSITIVE_BINARY if x.dtype.is_float else ("floordiv", "mod", "lt", "eq")
        y = g.partner(x, exact_only=True)
        first = g.chance(0.5) or len(y.shape) > len(x.shape)
        return g.emit(g.pick(ops), [x, y] if first else [y, x])
    x = g.recent()
    y = g.partner(x)
    ops = ("logical_and", "logical_or", "logical_xor") if x.dtype is DType.bool \
        else SMOOTH_BINARY
    return g.emit(g.pick(ops), [x, y] if g.chance(0.5) else [y, x])


def _where(g: _Growth) -> Value | None:
    x = g.recent()
    a = g.new_input(g.partner_shape(x.shape), DType.f32)
    cond = g.emit(g.pick(("gt", "lt")), [a, g.constant((), DType.f32)])
    return g.emit("where", [cond, x, g.partner(x)])


def _reduce(g: _Growth) -> Value | None:
    ranked = [v for v in g.values if len(v.shape) >= 1 and v.dtype is not DType.bool]
    if not ranked:
        return None
    x = g.pick(ranked)
    op = g.pick(REDUCTIONS if x.dtype.is_float else ("sum", "max", "min"))
    keep = g.chance(0.5)
    if g.chance(0.5):
        axes: tuple[int, ...] | None = (len(x.shape) - 1,) if g.chance(0.6) else (-1,)
    elif g.chance(0.5):
        axes = tuple(sorted(set(int(a) for a in g.rng.integers(0, len(x.shape), size=2))))
    else:
        axes = None
    return g.emit(op, [x], {"axes": axes, "keepdims": keep})


def _arg_reduce(g: _Growth) -> Value | None:
    exact = [v for v in g.floats(exact_only=True) if len(v.shape) >= 1]
    if not exact:
        return None
    x = g.pick(exact)
    axis = int(g.rng.integers(-len(x.shape), len(x.shape)))
    return g.emit(g.pick(("argmax", "argmin")), [x], {"axis": axis, "keepdims": g.chance(0.5)})


def _row_op(g: _Growth) -> Value | None:
    ranked = [v for v in g.floats() if len(v.shape) >= 1]
    if not ranked:
        return None
    x = g.pick(ranked)
    kind = g.pick(("softmax", "log_softmax", "layer_norm", "rms_norm"))
    if kind in ("softmax", "log_softmax"):
        axis = -1 if g.chance(0.7) else int(g.rng.integers(-len(x.shape), len(x.shape)))
        return g.emit(kind, [x], {"axis": axis})
    n = x.shape[-1]
    gamma = g.new_input((n,), x.dtype)
    if kind == "rms_norm":
        return g.emit(kind, [x, gamma])
    return g.emit(kind, [x, gamma, g.new_input((n,), x.dtype)])


def _matmul(g: _Growth) -> Value | None:
    ranked = [v for v in g.values if 1 <= len(v.shape) <= 3 and v.dtype != DType.bool]
    if not ranked:
        return None
    x = g.pick(ranked)
    k, n = x.shape[-1], int(g.pick((*DIMS, 33, 64)))
    if len(x.shape) == 3 and g.chance(0.5):
        w_shape: tuple[int, ...] = (x.shape[0], k, n)
    else:
        w_shape = (k, n) if g.chance(0.85) else (k,)
    w = g.constant(w_shape, x.dtype) if g.chance(0.5) else g.new_input(w_shape, x.dtype)
    y = g.emit("matmul", [x, w])
    if len(y.shape) >= 1 and g.chance(0.5):   # a bias epilogue
        y = g.emit("add", [y, g.new_input((y.shape[-1],), y.dtype)])
    return y


def _movement(g: _Growth) -> Value | None:
    x = g.recent()
    kind = g.pick(("transpose", "reshape", "slice", "concat", "pad", "broadcast_to",
                   "expand_dims", "squeeze"))
    return _MOVES[kind](g, x)


def _transpose(g: _Growth, x: Value) -> Value | None:
    if len(x.shape) < 2:
        return None
    perm = tuple(int(p) for p in g.rng.permutation(len(x.shape)))
    return g.emit("transpose", [x], {"perm": perm})


def _reshape(g: _Growth, x: Value) -> Value | None:
    dims = list(x.shape)
    if g.chance(0.3) or len(dims) < 2:
        shape: tuple[int, ...] = (int(np.prod(dims)),)
    else:
        i = int(g.rng.integers(len(dims) - 1))
        shape = tuple([*dims[:i], dims[i] * dims[i + 1], *dims[i + 2:]])
        if g.chance(0.3):
            shape = (1, *shape)
    return g.emit("reshape", [x], {"shape": shape})


def _slice(g: _Growth, x: Value) -> Value | None:
    if len(x.shape) == 0:
        return None
    starts, stops, steps = [], [], []
    for d in x.shape:
        step = int(g.pick((1, 1, 2, 3, -1)))
        a, b = sorted(int(v) for v in g.rng.integers(0, d + 1, size=2))
        if b == a:
            a, b = 0, d
        if step < 0:
            a, b = b - 1, a - 1 if a > 0 else -d - 1
        starts.append(a)
        stops.append(b)
        steps.append(step)
    return g.emit("slice", [x], {"starts": tuple(starts), "stops": tuple(stops),
                                 "steps": tuple(steps)})


def _concat(g: _Growth, x: Value) -> Value | None:
    if len(x.shape) == 0:
        return None
    axis = int(g.rng.integers(len(x.shape)))
    shape = list(x.shape)
    shape[axis] = int(g.pick(DIMS))
    other = g.new_input(tuple(shape), x.dtype) if g.chance(0.7) else x
    return g.emit("concat", [x, other], {"axis": axis})


def _pad(g: _Growth, x: Value) -> Value | None:
    if len(x.shape) == 0:
        return None
    mode = g.pick(("constant", "constant", "edge", "reflect"))
    pads = []
    for d in x.shape:
        limit = d - 1 if mode == "reflect" else 3
        pads += [int(g.rng.integers(0, min(limit, 3) + 1)) for _ in range(2)]
    return g.emit("pad", [x], {"pads": tuple(pads), "mode": mode,
                               "value": float(g.pick((0.0, 1.5, -2.0)))})


def _broadcast_to(g: _Growth, x: Value) -> Value | None:
    shape = tuple(int(g.pick(DIMS[2:])) if d == 1 and g.chance(0.7) else d for d in x.shape)
    if len(x.shape) < g.config.max_rank and g.chance(0.5):
        shape = (int(g.pick(DIMS)), *shape)
    if np.prod(shape) > g.config.max_elements:
        return None
    return g.emit("broadcast_to", [x], {"shape": shape})


def _expand_dims(g: _Growth, x: Value) -> Value | None:
    if len(x.shape) >= g.config.max_rank + 1:
        return None
    return g.emit("expand_dims", [x], {"axes": (int(g.rng.integers(0, len(x.shape) + 1)),)})


def _squeeze(g: _Growth, x: Value) -> Value | None:
    ones = tuple(i for i, d in enumerate(x.shape) if d == 1)
    if not ones:
        return None
    return g.emit("squeeze", [x], {"axes": ones if g.chance(0.5) else ones[:1]})


_MOVES = {"transpose": _transpose, "reshape": _reshape, "slice": _slice, "concat": _concat,
          "pad": _pad, "broadcast_to": _broadcast_to, "expand_dims": _expand_dims,
          "squeeze": _squeeze}


def _cast_or_clip(g: _Growth) -> Value | None:
    x = g.recent()
    if g.chance(0.5) or x.dtype is DType.bool:
        target = g.pick((DType.f32, DType.f64, DType.f16)) if x.dtype.is_float \
            else g.pick((DType.f32, DType.f64, DType.i64))
        return g.emit("cast", [x], {"dtype": target})
    if not x.dtype.is_float:
        return g.emit("clip", [x], {"min": -3, "max": 4})
    low = float(g.rng.uniform(-1.5, 0.0))
    return g.emit("clip", [x], {"min": low if g.chance(0.8) else None,
                                "max": float(g.rng.uniform(0.0, 1.5))})


_STEPS = ((_unary, 4), (_binary, 4), (_where, 1), (_reduce, 2), (_arg_reduce, 0.3),
          (_row_op, 2), (_matmul, 2), (_movement, 3), (_cast_or_clip, 1))


def generate_graph(rng: np.random.Generator, config: GeneratorConfig | None = None,
                   name: str = "fuzz") -> Graph:
    """A random graph that verifies: inputs, up to ``config.max_ops`` steps, 1-2 outputs."""
    config = config or GeneratorConfig()
    g = _Growth(rng, config, name)
    dtype = g.pick(DTYPES)
    g.new_input(g.shape(), dtype)
    if g.chance(0.5):
        g.new_input(g.partner_shape(g.values[0].shape), dtype)
    weights = np.array([w for _, w in _STEPS], dtype=float)
    steps = int(rng.integers(1, config.max_ops + 1))
    made: list[Value] = []
    for _ in range(steps * 4):
        if len(made) >= steps:
            break
        step = _STEPS[int(rng.choice(len(_STEPS), p=weights / weights.sum()))][0]
        value = step(g)
        if value is not None and int(np.prod(value.shape)) <= config.max_elements:
            made.append(value)
    used = {v for node in g.builder.nodes for v in node.inputs}
    sinks = [v for v in made if v not in used]
    return g.builder.build(sinks[-3:] or [g.values[0]])
