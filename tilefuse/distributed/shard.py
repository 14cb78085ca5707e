"""The sharding pass: one optimised graph becomes the graph one rank of N runs (tensor parallel).

Each value gets a :class:`~tilefuse.distributed.spec.Spec` in one walk over the graph, greedily
and deterministically (the same plan on every rank and every run):

- a matrix product of a replicated activation and a constant weight is **column-parallel**
  (each rank holds a block of the weight's columns) when the split survives what follows
  (reshapes into heads, elementwise ops, a ``split`` into q/k/v, which asks for a strided block:
  ``outer``); its split input then makes the next product **row-parallel**, which leaves
  partial sums. That is Megatron's MLP pair and attention split by heads, found rather than
  pattern-matched;
- batched products, softmax rows, norms and elementwise ops keep a split of an axis they do
  not reduce; constants and replicated operands are sliced to match (constants at plan time);
- an embedding lookup in a constant table is split by **vocabulary**: each rank looks up the
  ids in its range and the ranks' rows are summed;
- partial sums are all-reduced right before the first op that is not linear in them; a split
  value is all-gathered before an op that needs it whole, and at the graph's outputs;
- everything else runs replicated (correct, no communication).

The collectives are graph ops (``all_reduce``, ``all_gather``: :mod:`tilefuse.ops.collective`);
:class:`ShardPlan` says which rank holds which slice of which weight and what each collective
moves, and prints before anything compiles.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from tilefuse.distributed.spec import (
    PARTIAL,
    REP,
    Spec,
    block,
    local_shape,
    right_aligned,
    splittable,
    through_expand,
    through_reduce,
    through_reshape,
    through_squeeze,
    through_transpose,
)
from tilefuse.errors import CompileError
from tilefuse.graph.builder import GraphBuilder
from tilefuse.graph.ir import Graph, Literal, Node, Value
from tilefuse.graph.types import normalize_axes, normalize_axis
from tilefuse.ops.registry import OpKind

_LINEAR_IN_ALL = frozenset({"add", "sub"})           # partial op partial -> partial
_LINEAR_IN_FIRST = frozenset({"mul", "div"})          # partial op replicated -> partial
_ROW_OPS = {"softmax": "axis", "log_softmax": "axis"}
_LAST_AXIS_NORMS = frozenset({"layer_norm", "rms_norm"})
_REDUCTIONS = frozenset({"sum", "mean", "max", "min", "prod", "var"})
_ARG_REDUCTIONS = frozenset({"argmax", "argmin"})


@dataclass(frozen=True)
class CollectiveStep:
    """One collective of the plan: what it moves and why it is there."""

    op: str
    type: str
    bytes: int
    moved: int          # bytes each rank sends in a ring (all-reduce 2(N-1)/N, gather (N-1)/N)
    reason: str


@dataclass
class ShardPlan:
    """What the pass decided, rank-independent: printed before compilation, written to dumps."""

    graph: str
    world: int
    decisions: list[str] = field(default_factory=list)
    collectives: list[CollectiveStep] = field(default_factory=list)
    weight_bytes: int = 0
    local_weight_bytes: int = 0

    def text(self) -> str:
        lines = [f"shard plan of @{self.graph} over {self.world} ranks",
                 f"  weights: {_size(self.weight_bytes)} in all, "
                 f"{_size(self.local_weight_bytes)} on each rank"]
        lines += [f"  {d}" for d in self.decisions]
        total = sum(c.moved for c in self.collectives)
        counts = defaultdict(int)
        for c in self.collectives:
            counts[c.op] += 1
        shown = ", ".join(f"{n} {op}" for op, n in sorted(counts.items())) or "none"
        lines.append(f"  collectives: {shown}; each rank sends {_size(total)} per call")
        for i, c in enumerate(self.collectives):
            lines.append(f"    c{i} {c.op} {c.type} ({_size(c.bytes)}, sends {_size(c.moved)})"
                         f" {c.reason}")
        return "\n".join(lines) + "\n"


def _size(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def shard_graph(graph: Graph, world: int, rank: int) -> tuple[Graph, ShardPlan]:
    """The graph rank ``rank`` of ``world`` runs, and the plan (the same for every rank)."""
    if world < 1 or not 0 <= rank < world:
        raise CompileError(f"rank {rank} of {world} ranks is no rank")
    return _Sharder(graph, world, rank).run()


class _Sharder:
    def __init__(self, graph: Graph, world: int, rank: int):
        self.graph, self.world, self.rank = graph, world, rank
        self.b = GraphBuilder(graph.name if world == 1 else f"{graph.name}_rank{rank}")
        self.plan = ShardPlan(graph.name, world)
        self.local: dict[Value, Value | None] = {}
        self.spec: dict[Value, Spec] = {}
        self.consts: dict[Value, np.ndarray] = {}
        self.rep_of: dict[Value, Value] = {}
        self.laid_out: dict[tuple[Value, Spec], Value] = {}
        self.users: dict[Value, list[Node]] = defaultdict(list)
        for node in graph.nodes:
            for v in node.inputs:
                self.users[v].append(node)
            if node.op.name == "constant":   # known before their node: look-ahead reads them
                self.consts[node.outputs[0]] = node.attrs["value"].array
        self.node: Node | None = None
        self.const_nodes = 0

    # ---- driver ----------------------------------------------------------------------------

    def run(self) -> tuple[Graph, ShardPlan]:
        for v in self.graph.inputs:
            self._set(v, self.b.input(v.type, v.name), REP)
        for node in self.graph.nodes:
            self.node = node
            self._visit(node)
        self.node = None
        outs = [self.rep(v, "at the graph's outputs") for v in self.graph.outputs]
        self.plan.weight_bytes = sum(arr.nbytes for arr in self.consts.values())
        built = self.b.build(outs)
        self.plan.local_weight_bytes = sum(n.attrs["value"].array.nbytes for n in built.nodes
                                           if n.op.name == "constant")
        return built, self.plan

    def _visit(self, node: Node) -> None:
        name, kind = node.op.name, node.op.kind
        if name == "constant":
            self.consts[node.outputs[0]] = node.attrs["value"].array
            self._set(node.outputs[0], None, REP)
        elif self.world == 1:
            self._replicated(node)
        elif kind == OpKind.ELEMENTWISE:
            self._elementwise(node)
        elif name == "matmul":
            self._matmul(node)
        elif name == "take":
            self._take(node)
        elif name == "attention":
            self._attention(node)
        elif name in _REDUCTIONS or name in _ARG_REDUCTIONS or name in _ROW_OPS \
                or name in _LAST_AXIS_NORMS:
            self._reduction(node)
        elif name in _MOVEMENTS:
            _MOVEMENTS[name](self, node)
        else:
            self._replicated(node)

    # ---- values ----------------------------------------------------------------------------

    def _set(self, v: Value, local: Value | None, spec: Spec) -> None:
        self.local[v], self.spec[v] = local, spec

    def _emit(self, op: str, inputs: Sequence[Value], attrs: dict | None = None) -> Value:
        loc = self.node.loc if self.node is not None else None
        return self.b.add1(op, inputs, attrs or {}, loc)

    def _reason(self, why: str | None) -> str:
        if why:
            return why
        n = self.node
        return f"before {n.op.name}{_at(n)}" if n is not None else ""

    def rep(self, v: Value, why: str | None = None) -> Value:
        """``v`` whole on this rank: gathered, reduced or (constants) emitted as they are."""
        spec = self.spec[v]
        if spec == REP:
            local = self.local[v]
            if local is None:                       # a constant, emitted on first use
                local = self._emit("constant", [], {"value": Literal(self.consts[v])})
                self.local[v] = local
            return local
        if v in self.rep_of:
            return self.rep_of[v]
        x = self.local[v]
        assert x is not None
        t = v.type
        nbytes = int(np.prod(t.shape)) * t.dtype.np.itemsize
        if spec == PARTIAL:
            out = self._emit("all_reduce", [x], {"world": self.world})
            moved = 2 * (self.world - 1) * nbytes // self.world
            op = "all_reduce"
        else:
            out = self._gather(x, spec)
            moved = (self.world - 1) * nbytes // self.world
            op = "all_gather"
        self.plan.collectives.append(CollectiveStep(op, str(t), nbytes, moved,
                                                    self._reason(why)))
        self.rep_of[v] = out
        if spec == PARTIAL:                         # later readers take the sum
            self._set(v, out, REP)
        return out

    def _gather(self, x: Value, spec: Spec) -> Value:
        a, shape = spec.axis, x.type.shape
        if spec.outer == 1:
            return self._emit("all_gather", [x], {"world": self.world, "axis": a})
        inner = shape[a] // spec.outer
        split = (*tuple(shape[:a]), spec.outer, inner, *tuple(shape[a + 1:]))
        y = self._emit("reshape", [x], {"shape": split})
        y = self._emit("all_gather", [y], {"world": self.world, "axis": a + 1})
        full = (*tuple(shape[:a]), shape[a] * self.world, *tuple(shape[a + 1:]))
        return self._emit("reshape", [y], {"shape": full})

    def laid(self, v: Value, spec: Spec) -> Value:
        """``v`` as rank-local block of ``spec`` (REP: whole)."""
        if spec == REP:
            return self.rep(v)
        if self.spec[v] == spec:
            local = self.local[v]
            assert local is not None
            return local
        key = (v, spec)
        if key in self.laid_out:
            return self.laid_out[key]
        if v in self.consts:
            part = block(self.consts[v], spec, self.world, self.rank)
            out = self._emit("constant", [], {"value": Literal(part)})
        else:
            out = self._slice(self.rep(v), spec)
        self.laid_out[key] = out
        return out

    def _slice(self, x: Value, spec: Spec) -> Value:
        shape, a = tuple(x.type.shape), spec.axis
        inner = shape[a] // spec.outer
        view = (*shape[:a], spec.outer, inner, *shape[a + 1:])
        y = self._emit("reshape", [x], {"shape": view}) if spec.outer > 1 else x
        step = inner // self.world
        vshape = view if spec.outer > 1 else shape
        k = a + 1 if spec.outer > 1 else a
        starts = [0] * len(vshape)
        stops = list(vshape)
        starts[k], stops[k] = self.rank * step, (self.rank + 1) * step
        y = self._emit("slice", [y], {"starts": tuple(starts), "stops": tuple(stops),
                                      "steps": (1,) * len(vshape)})
        if spec.outer > 1:
            y = self._emit("reshape", [y], {"shape": local_shape(shape, spec, self.world)})
        return y

    def resolve(self, v: Value) -> Spec:
        """``v``'s spec once partial sums are reduced (for ops not linear in it)."""
        if self.spec[v] == PARTIAL:
            self.rep(v)
        return self.spec[v]

    # ---- op families ---------------------------------------------------------------------

    def _replicated(self, node: Node) -> None:
        outs = self.b.add(node.op, [self.rep(v) for v in node.inputs], dict(node.attrs),
                          node.loc)
        for v, o in zip(node.outputs, outs):
            self._set(v, o, REP)

    def _same(self, node: Node, inputs: Sequence[Value], spec: Spec,
              attrs: dict | None = None) -> None:
        """Emits ``node`` on local ``inputs``; its outputs get ``spec``."""
        given = dict(node.attrs) if attrs is None else attrs
        outs = self.b.add(node.op, inputs, given, node.loc)
        for v, o in zip(node.outputs, outs):
            self._set(v, o, spec)

    def _elementwise(self, node: Node) -> None:
        name, ins = node.op.name, node.inputs
        specs = [self.spec[v] for v in ins]
        if PARTIAL in specs:
            firsts = [s == PARTIAL for s in specs]
            if (name in _LINEAR_IN_ALL and all(firsts)) or (name == "neg") or \
                    (name in _LINEAR_IN_FIRST and firsts == [True, False]
                     and specs[1] == REP):
                others = [self.local[v] if s == PARTIAL else self.rep(v)
                          for v, s in zip(ins, specs)]
                return self._same(node, others, PARTIAL)
            specs = [self.resolve(v) for v in ins]
        out = node.outputs[0]
        rank_out = len(out.type.shape)
        chosen: Spec | None = None
        for v, s in zip(ins, specs):
            if s.is_split:
                axis = right_aligned(s.axis, len(v.type.shape), rank_out)
                if v.type.shape[s.axis] == out.type.shape[axis]:
                    chosen = Spec.split(axis, s.outer)
                    break
        if chosen is None:
            return self._same(node, [self.rep(v) for v in ins], REP)
        locals_ = []
        for v in ins:
            axis = chosen.axis - (rank_out - len(v.type.shape))
            if axis >= 0 and v.type.shape[axis] == out.type.shape[chosen.axis]:
                locals_.append(self.laid(v, Spec.split(axis, chosen.outer)))
            else:
                locals_.append(self.rep(v))
        self._same(node, locals_, chosen)

    def _reduction(self, node: Node) -> None:
        name, (x, *rest) = node.op.name, node.inputs
        rank = len(x.type.shape)
        if name in _ROW_OPS:
            axes: tuple[int, ...] = (normalize_axis(node.attrs["axis"], rank),)
            keep = True
        elif name in _LAST_AXIS_NORMS:
            axes, keep = (rank - 1,), True
        elif name in _ARG_REDUCTIONS:
            axis = node.attrs["axis"]
            axes = tuple(range(rank)) if axis is None else (normalize_axis(axis, rank),)
            keep = bool(node.attrs["keepdims"])
        else:
            given = node.attrs["axes"]
            axes = tuple(range(rank)) if given is None else normalize_axes(given, rank)
            keep = bool(node.attrs["keepdims"])
        spec = self.spec[x]
        if spec == PARTIAL and name == "sum":
            return self._same(node, [self.local[x]], PARTIAL)
        spec = self.resolve(x)
        if spec.is_split:
            out = through_reduce(spec, axes, keep)
            if out is None and name == "sum" and spec.outer == 1:
                return self._same(node, [self.local[x]], PARTIAL)
            if out is not None:
                return self._same(node, [self.local[x]] + [self.rep(v) for v in rest], out)
        self._replicated(node)

    def _attention(self, node: Node) -> None:
        """Split along a batch axis of q (heads, say): k, v and the mask follow where they
        have that axis, else they are read whole."""
        q, *rest = node.inputs
        out = node.outputs[0]
        sq = self.resolve(q)
        for t in rest:
            self.resolve(t)
        rq, ro = len(q.type.shape), len(out.type.shape)
        if not (sq.is_split and sq.axis < rq - 2):
            return self._replicated(node)
        axis = right_aligned(sq.axis, rq, ro)
        locals_ = [self.local[q]]
        for t in rest:
            rt = len(t.type.shape)
            ax = axis - (ro - rt)
            if 0 <= ax < rt - 2 and t.type.shape[ax] == out.type.shape[axis]:
                locals_.append(self.laid(t, Spec.split(ax, sq.outer)))
            else:
                locals_.append(self.rep(t))
        self._same(node, locals_, Spec.split(axis, sq.outer))

    def _take(self, node: Node) -> None:
        data, idx = node.inputs
        axis = normalize_axis(node.attrs["axis"], len(data.type.shape))
        if data in self.consts and axis == 0 and self.resolve(idx) == REP \
                and splittable(data.type.shape, 0, 1, self.world):
            return self._vocab_parallel(node, data, idx)
        sd, si = self.resolve(data), self.resolve(idx)
        if sd.is_split and sd.axis != axis and si == REP:
            ni = len(idx.type.shape)
            out_axis = sd.axis if sd.axis < axis else sd.axis + ni - 1
            return self._same(node, [self.local[data], self.rep(idx)],
                              Spec.split(out_axis, sd.outer))
        if sd == REP and si.is_split:
            return self._same(node, [self.rep(data), self.local[idx]],
                              Spec.split(axis + si.axis, si.outer))
        self._replicated(node)

    def _vocab_parallel(self, node: Node, data: Value, idx: Value) -> None:
        rows = data.type.shape[0] // self.world
        table = self.laid(data, Spec.split(0))
        ids = self.rep(idx)
        dt = idx.type.dtype
        lo = self._emit("constant", [], {"value": Literal(np.array(self.rank * rows, dt.np))})
        hi = self._emit("constant", [], {"value": Literal(np.array(rows, dt.np))})
        zero = self._emit("constant", [], {"value": Literal(np.array(0, dt.np))})
        rel = self._emit("sub", [ids, lo])
        inside = self._emit("logical_and", [self._emit("ge", [rel, zero]),
                                            self._emit("lt", [rel, hi])])
        safe = self._emit("where", [inside, rel, zero])
        rows_v = self._emit("take", [table, safe], {"axis": 0})
        keep = self._emit("expand_dims", [inside], {"axes": (-1,)})
        nothing = self._emit("constant", [], {"value": Literal(
            np.zeros((), data.type.dtype.np))})
        out = self._emit("where", [keep, rows_v, nothing])
        self._set(node.outputs[0], out, PARTIAL)
        self.plan.decisions.append(
            f"take {data.type}[{idx.type}]{_at(node)}: vocabulary-parallel, each rank holds "
            f"rows [{rows}*rank, {rows}*(rank+1)) of the table, partial sums")

    # ---- matrix products ------------------------------------------------------------------

    def _matmul(self, node: Node) -> None:
        a, b = node.inputs
        out = node.outputs[0]
        ra, rb, ro = len(a.type.shape), len(b.type.shape), len(out.type.shape)
        if ra < 2 or rb < 2:
            return self._replicated(node)
        sa, sb = self.resolve(a), self.resolve(b)
        w = self.world
        if sa == REP and sb == REP:
            if b in self.consts:
                outer = self._column_outer(out, ro - 1)
                if outer is not None and splittable(b.type.shape, rb - 1, outer, w):
                    spec = Spec.split(rb - 1, outer)
                    self._weight(node, b, spec, "column-parallel")
                    return self._same(node, [self.rep(a), self.laid(b, spec)],
                                      Spec.split(ro - 1, outer))
            return self._replicated(node)
        if sa == Spec.split(ra - 1) and sb == REP and b in self.consts:
            self._weight(node, b, Spec.split(rb - 2), "row-parallel")
            return self._same(node, [self.local[a], self.laid(b, Spec.split(rb - 2))],
                              PARTIAL)
        if sa.is_split and sa.axis < ra - 1:
            o = right_aligned(sa.axis, ra, ro) if sa.axis < ra - 2 else ro - 2
            j = o - (ro - rb)
            if sa.axis < ra - 2 and 0 <= j < rb - 2 and b.type.shape[j] == out.type.shape[o]:
                lb = self.laid(b, Spec.split(j, sa.outer))
            else:
                lb = self.rep(b)
            return self._same(node, [self.local[a], lb], Spec.split(o, sa.outer))
        if sa == REP and sb.is_split and sb.axis != rb - 2:
            o = ro - 1 if sb.axis == rb - 1 else right_aligned(sb.axis, rb, ro)
            i = o - (ro - ra)
            if sb.axis < rb - 2 and 0 <= i < ra - 2 and a.type.shape[i] == out.type.shape[o]:
                la = self.laid(a, Spec.split(i, sb.outer))
            else:
                la = self.rep(a)
            return self._same(node, [la, self.local[b]], Spec.split(o, sb.outer))
        if sa == Spec.split(ra - 1) and sb == Spec.split(rb - 2):
            return self._same(node, [self.local[a], self.local[b]], PARTIAL)
        self._replicated(node)

    def _weight(self, node: Node, w: Value, spec: Spec, how: str) -> None:
        shape = local_shape(w.type.shape, spec, self.world)
        parts = "" if spec.outer == 1 else f" ({spec.outer} parts)"
        self.plan.decisions.append(
            f"matmul {node.inputs[0].type} @ {w.type}{_at(node)}: {how}{parts}, each rank "
            f"holds {w.type.dtype}[{','.join(map(str, shape))}] of the weight")

    def _column_outer(self, value: Value, axis: int) -> int | None:
        """The ``outer`` a column split of ``value``'s ``axis`` needs so that it survives its
        readers (a ``split`` into k equal parts asks for k), or None when some reader within a
        few steps would have to gather it (then replicating the product is cheaper)."""
        for outer in (1, *self._split_parts(value, axis)):
            if self._survives(value, Spec.split(axis, outer), depth=8):
                return outer
        return None

    def _split_parts(self, value: Value, axis: int, depth: int = 4) -> list[int]:
        """The part counts of ``split`` ops that read ``value``'s ``axis`` (through reshapes
        that keep it last, and elementwise ops such as a bias add)."""
        found: list[int] = []
        if depth == 0:
            return found
        last = axis == len(value.type.shape) - 1
        for user in self.users[value]:
            out = user.outputs[0]
            if user.op.name == "split" and normalize_axis(user.attrs["axis"],
                                                          len(value.type.shape)) == axis:
                found.append(len(user.attrs["sizes"]))
            elif user.op.name == "reshape" and last \
                    and out.type.shape[-1] == value.type.shape[axis]:
                found += self._split_parts(out, len(out.type.shape) - 1, depth - 1)
            elif user.op.kind == OpKind.ELEMENTWISE and out.type.shape == value.type.shape:
                found += self._split_parts(out, axis, depth - 1)
        return found

    def _survives(self, value: Value, spec: Spec, depth: int) -> bool:
        if depth == 0:
            return True
        w = self.world
        for user in self.users[value]:
            name, outv = user.op.name, user.outputs
            if name == "reshape":
                nxt = through_reshape(value.type.shape, spec, outv[0].type.shape, w)
            elif name == "transpose":
                nxt = through_transpose(spec, user.attrs["perm"])
            elif name == "split":
                sizes = user.attrs["sizes"]
                ax = normalize_axis(user.attrs["axis"], len(value.type.shape))
                if ax != spec.axis:
                    nxt = spec
                elif spec.outer == len(sizes) and len(set(sizes)) == 1:
                    if not all(self._survives(o, Spec.split(ax), depth - 1) for o in outv):
                        return False
                    continue
                else:
                    return False
            elif user.op.kind == OpKind.ELEMENTWISE:
                ro = len(outv[0].type.shape)
                ax = right_aligned(spec.axis, len(value.type.shape), ro)
                nxt = Spec.split(ax, spec.outer)
            elif name == "matmul":
                return (user.inputs[0] is value and spec.axis == len(value.type.shape) - 1 \
                    and spec.outer == 1 and user.inputs[1] in self.consts) \
                    or spec.axis < len(value.type.shape) - 2
            elif name in _ROW_OPS or name == "attention":
                nxt = spec
            elif name in ("slice", "pad", "concat"):
                nxt = spec if _keeps_axis(user, value, spec.axis) else None
            elif name == "broadcast_to":
                nxt = Spec.split(right_aligned(spec.axis, len(value.type.shape),
                                               len(outv[0].type.shape)), spec.outer)
            elif name == "expand_dims":
                nxt = through_expand(spec, user.attrs["axes"], len(outv[0].type.shape))
            else:
                return False
            if nxt is None:
                return False
            if not all(self._survives(o, nxt, depth - 1) for o in outv):
                return False
        return True


def _keeps_axis(node: Node, value: Value, axis: int) -> bool:
    """Whether a slice, pad or concat leaves ``axis`` of ``value`` whole."""
    name, attrs, dim = node.op.name, node.attrs, value.type.shape[axis]
    if name == "slice":
        return attrs["starts"][axis] == 0 and attrs["stops"][axis] >= dim \
            and attrs["steps"][axis] == 1
    if name == "pad":
        return attrs["pads"][2 * axis] == 0 and attrs["pads"][2 * axis + 1] == 0
    return normalize_axis(attrs["axis"], len(value.type.shape)) != axis


def _at(node: Node) -> str:
    return f" at {node.loc}" if node.loc is not None else ""


# ---- movement ops ------------------------------------------------------------------------


def _reshape(s: _Sharder, node: Node) -> None:
    (x,), out = node.inputs, node.outputs[0]
    spec = s.spec[x]
    if spec == PARTIAL:
        return s._same(node, [s.local[x]], PARTIAL)
    if spec.is_split:
        nxt = through_reshape(x.type.shape, spec, out.type.shape, s.world)
        if nxt is not None:
            return s._same(node, [s.local[x]], nxt,
                           {"shape": local_shape(out.type.shape, nxt, s.world)})
    s._replicated(node)


def _transpose(s: _Sharder, node: Node) -> None:
    (x,) = node.inputs
    spec = s.spec[x]
    if spec == PARTIAL or spec.is_split:
        nxt = spec if spec == PARTIAL else through_transpose(spec, node.attrs["perm"])
        return s._same(node, [s.local[x]], nxt)
    s._replicated(node)


def _broadcast_to(s: _Sharder, node: Node) -> None:
    (x,), out = node.inputs, node.outputs[0]
    spec = s.spec[x]
    if spec.is_split:
        axis = right_aligned(spec.axis, len(x.type.shape), len(out.type.shape))
        nxt = Spec.split(axis, spec.outer)
        return s._same(node, [s.local[x]], nxt,
                       {"shape": local_shape(out.type.shape, nxt, s.world)})
    if spec == PARTIAL:
        return s._same(node, [s.local[x]], PARTIAL)
    s._replicated(node)


def _expand_dims(s: _Sharder, node: Node) -> None:
    (x,), out = node.inputs, node.outputs[0]
    spec = s.spec[x]
    if spec.is_split or spec == PARTIAL:
        nxt = through_expand(spec, node.attrs["axes"], len(out.type.shape))
        return s._same(node, [s.local[x]], nxt)
    s._replicated(node)


def _squeeze(s: _Sharder, node: Node) -> None:
    (x,), _out = node.inputs, node.outputs[0]
    spec = s.spec[x]
    rank = len(x.type.shape)
    given = node.attrs["axes"]
    removed = tuple(i for i, d in enumerate(x.type.shape) if d == 1) if given is None \
        else normalize_axes(given, rank)
    if spec.is_split or spec == PARTIAL:
        return s._same(node, [s.local[x]], through_squeeze(spec, removed))
    s._replicated(node)


def _slice(s: _Sharder, node: Node) -> None:
    (x,) = node.inputs
    spec = s.spec[x]
    if spec == PARTIAL:
        return s._same(node, [s.local[x]], PARTIAL)
    if spec.is_split:
        a, dim = spec.axis, x.type.shape[spec.axis]
        starts, stops, steps = (list(node.attrs[k]) for k in ("starts", "stops", "steps"))
        if starts[a] == 0 and stops[a] >= dim and steps[a] == 1:
            stops[a] = dim // s.world
            return s._same(node, [s.local[x]], spec,
                           {"starts": tuple(starts), "stops": tuple(stops),
                            "steps": tuple(steps)})
    s._replicated(node)


def _concat(s: _Sharder, node: Node) -> None:
    specs = [s.spec[v] for v in node.inputs]
    axis = normalize_axis(node.attrs["axis"], len(node.outputs[0].type.shape))
    if all(sp == PARTIAL for sp in specs):
        return s._same(node, [s.local[v] for v in node.inputs], PARTIAL)
    first = specs[0]
    if first.is_split and first.axis != axis and all(sp == first for sp in specs):
        return s._same(node, [s.local[v] for v in node.inputs], first)
    s._replicated(node)


def _split(s: _Sharder, node: Node) -> None:
    (x,) = node.inputs
    spec = s.resolve(x)
    axis = normalize_axis(node.attrs["axis"], len(x.type.shape))
    sizes = tuple(node.attrs["sizes"])
    if spec.is_split and spec.axis != axis:
        return s._same(node, [s.local[x]], spec)
    if spec.is_split and spec.outer == len(sizes) and len(set(sizes)) == 1:
        local = tuple(n // s.world for n in sizes)
        return s._same(node, [s.local[x]], Spec.split(axis),
                       {"axis": node.attrs["axis"], "sizes": local})
    s._replicated(node)


def _pad(s: _Sharder, node: Node) -> None:
    (x,) = node.inputs
    spec = s.resolve(x)
    pads = node.attrs["pads"]
    if spec.is_split and pads[2 * spec.axis] == 0 and pads[2 * spec.axis + 1] == 0:
        return s._same(node, [s.local[x]], spec)
    s._replicated(node)


_MOVEMENTS = {"reshape": _reshape, "transpose": _transpose, "broadcast_to": _broadcast_to,
              "expand_dims": _expand_dims, "squeeze": _squeeze, "slice": _slice,
              "concat": _concat, "split": _split, "pad": _pad}
