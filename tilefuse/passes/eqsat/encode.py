"""Graph -> e-graph: terms for the ops the rules know, leaves for everything else, and the tables
(types, permutations, constants) the rules consult.

Modelled ops: elementwise ops of one or two inputs, ``cast``, ``transpose``, ``reshape`` (and
``squeeze`` / ``expand_dims``, which are reshapes), ``broadcast_to`` and ``matmul``. Any other node
is a region boundary: its inputs become roots (extracted terms) and its results become leaves, so
the e-graph holds the regions between such nodes and the decoder rebuilds those nodes as they
were.

The graph reaches egglog as rows of plain relations (see :class:`Rows`), which the ``load``
rules turn into terms.
"""

from __future__ import annotations

import itertools
import tempfile
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from egglog import EGraph

from tilefuse.dtypes import DType
from tilefuse.errors import TilefuseError
from tilefuse.graph.builder import infer_types
from tilefuse.graph.ir import Attrs, Graph, Literal, Node, Value
from tilefuse.graph.types import TensorType
from tilefuse.ops import OpDef, OpKind, get_op
from tilefuse.passes.eqsat import lang

MAX_PERMS = 512
"""Permutation closure cap (rank 6 alone has 720); beyond it, compositions are left out."""

MAX_MERGE_GROUP = 4
"""At most this many parallel matmuls of one input are offered to the merge rule."""

_RESHAPES = frozenset({"reshape", "squeeze", "expand_dims"})

_EXACT_INTO: dict[DType, frozenset[DType]] = {
    DType.bool: frozenset(DType),
    DType.u8: frozenset({DType.u8, DType.i16, DType.i32, DType.i64, DType.f16, DType.f32,
                         DType.f64, DType.bf16}),
    DType.i8: frozenset({DType.i8, DType.i16, DType.i32, DType.i64, DType.f16, DType.f32,
                         DType.f64, DType.bf16}),
    DType.i16: frozenset({DType.i16, DType.i32, DType.i64, DType.f32, DType.f64}),
    DType.i32: frozenset({DType.i32, DType.i64, DType.f64}),
    DType.i64: frozenset({DType.i64}),
    DType.f16: frozenset({DType.f16, DType.f32, DType.f64}),
    DType.bf16: frozenset({DType.bf16, DType.f32, DType.f64}),
    DType.f32: frozenset({DType.f32, DType.f64}),
    DType.f64: frozenset({DType.f64}),
}
"""``b in _EXACT_INTO[a]``: casting ``a`` to ``b`` keeps every value exactly."""


def elementwise_key(node: Node) -> str:
    """The op key of an elementwise node: its name, plus its attributes when it has any."""
    if not node.attrs:
        return node.op.name
    return node.op.name + "{" + ",".join(f"{k}={node.attrs[k]!r}" for k in node.attrs) + "}"


def is_modelled(node: Node) -> bool:
    """Whether the e-graph has a term for ``node`` (one result, an op the rules know)."""
    if len(node.outputs) != 1:
        return False
    name = node.op.name
    if name in _RESHAPES or name in ("transpose", "broadcast_to", "matmul", "cast"):
        return True
    return node.op.kind is OpKind.ELEMENTWISE and len(node.inputs) in (1, 2)


class Rows:
    """Rows of the encoder's relations and tables, loaded into egglog in bulk: one TSV file per
    relation through egglog's ``input`` command, then the ``load`` rules build the terms.
    (Building each fact as a Python egglog expression costs ~0.5 ms, and egglog runs separate
    top-level commands in time that grows with the e-graph: seconds on a 12-layer BERT.)"""

    def __init__(self) -> None:
        self.rows: dict[int, tuple[Callable, list[str]]] = {}

    def add(self, fn: Callable, *columns: object) -> None:
        entry = self.rows.setdefault(id(fn), (fn, []))
        entry[1].append("\t".join(str(c) for c in columns))

    def load(self, egraph: EGraph) -> None:
        with tempfile.TemporaryDirectory(prefix="tilefuse-eqsat-") as folder:
            for index, (fn, lines) in enumerate(self.rows.values()):
                path = Path(folder) / f"{index}.tsv"
                path.write_text("\n".join(lines) + "\n")
                egraph.input(fn, str(path))
        egraph.run(lang.load_rules)


@dataclass
class Encoding:
    """Ids of types, permutations, leaves, op keys and roots, both ways."""

    types: list[TensorType] = field(default_factory=list)
    type_ids: dict[TensorType, int] = field(default_factory=dict)
    perms: list[tuple[int, ...]] = field(default_factory=list)
    perm_ids: dict[tuple[int, ...], int] = field(default_factory=dict)
    leaves: list[Value] = field(default_factory=list)         # value id -> graph value
    constant_leaves: set[int] = field(default_factory=set)
    ops: dict[str, tuple[OpDef, Attrs]] = field(default_factory=dict)
    roots: list[Value] = field(default_factory=list)
    terms: dict[Value, int] = field(default_factory=dict)     # graph value -> value id

    def value_id(self, value: Value) -> int:
        if value not in self.terms:
            self.terms[value] = len(self.leaves)
            self.leaves.append(value)
        return self.terms[value]

    def type_id(self, t: TensorType) -> int:
        if t not in self.type_ids:
            self.type_ids[t] = len(self.types)
            self.types.append(t)
        return self.type_ids[t]

    def perm_id(self, perm: tuple[int, ...]) -> int:
        if perm not in self.perm_ids:
            self.perm_ids[perm] = len(self.perms)
            self.perms.append(perm)
        return self.perm_ids[perm]


def _constant_facts(rows: Rows, node: Node, vid: int) -> None:
    rows.add(lang.const_row, vid)
    literal = node.attrs["value"]
    if isinstance(literal, Literal) and 0 < literal.array.size <= 4096 \
            and literal.array.dtype.kind in "fiub":
        array = literal.array
        if np.all(array == 1):
            rows.add(lang.one_row, vid)
        elif np.all(array == 0) and not np.any(np.signbit(array)):
            rows.add(lang.zero_row, vid)


def _node_row(rows: Rows, enc: Encoding, node: Node) -> None:
    name, out = node.op.name, node.outputs[0]
    vid, tid = enc.value_id(out), enc.type_id(out.type)
    args = [enc.terms[v] for v in node.inputs]
    if name in _RESHAPES:
        rows.add(lang.reshape_row, vid, args[0], tid)
    elif name == "transpose":
        rows.add(lang.transpose_row, vid, args[0], enc.perm_id(tuple(node.attrs["perm"])), tid)
    elif name == "broadcast_to":
        rows.add(lang.broadcast_row, vid, args[0], tid)
    elif name == "cast":
        rows.add(lang.cast_row, vid, args[0], tid)
    elif name == "matmul":
        rows.add(lang.matmul_row, vid, args[0], args[1], tid)
    else:
        key = elementwise_key(node)
        enc.ops[key] = (node.op, node.attrs)
        if len(args) == 1:
            rows.add(lang.unary_row, vid, key, args[0], tid)
        else:
            rows.add(lang.binary_row, vid, key, args[0], args[1], tid)


def encode(graph: Graph, egraph: EGraph) -> Encoding:
    """Adds ``graph``'s terms and tables to ``egraph``; returns the ids used."""
    enc, rows = Encoding(), Rows()

    def leaf(value: Value) -> int:
        vid = enc.value_id(value)
        rows.add(lang.leaf_row, vid, enc.type_id(value.type))
        return vid

    for value in graph.inputs:
        leaf(value)
    for node in graph.nodes:
        if is_modelled(node):
            _node_row(rows, enc, node)
            continue
        enc.roots.extend(node.inputs)
        for value in node.outputs:
            vid = leaf(value)
            if node.op.name == "constant":
                enc.constant_leaves.add(vid)
                _constant_facts(rows, node, vid)
    enc.roots.extend(graph.outputs)
    for index, value in enumerate(enc.roots):
        rows.add(lang.root_row, index, enc.terms[value])
    _tables(rows, enc, graph)
    rows.load(egraph)
    return enc


def _tables(rows: Rows, enc: Encoding, graph: Graph) -> None:
    """Permutation closure, transposed types, shapes, casts, scales, matmul and merge types."""
    _perm_tables(rows, enc)
    _matmul_tables(rows, enc, graph)
    _ranked_constants(rows, enc)
    for tid, t in list(enumerate(enc.types)):
        for pid, perm in enumerate(enc.perms):
            if len(perm) == t.rank:
                moved = TensorType(tuple(t.shape[i] for i in perm), t.dtype)
                rows.add(lang.transposed, tid, pid, enc.type_id(moved))
    shapes: dict[tuple, int] = {}
    for tid, t in enumerate(enc.types):
        rows.add(lang.shape_of, tid, shapes.setdefault(t.shape, len(shapes)))
        if t.rank == 0:
            rows.add(lang.scalar_type, tid)
        if t.rank == 2:
            rows.add(lang.rank2_type, tid)
        rows.add(lang.rank_of, tid, t.rank)
        if t.rank and isinstance(t.shape[-1], int):
            rows.add(lang.last_dim, tid, t.shape[-1])
    for (ia, a), (ib, b) in itertools.product(enumerate(enc.types), repeat=2):
        if a.shape == b.shape and b.dtype in _EXACT_INTO[a.dtype]:
            rows.add(lang.exact_cast, ia, ib)


def _ranked_constants(rows: Rows, enc: Encoding) -> None:
    """``ranked`` for each constant's type and each higher rank a permutation has."""
    ranks = {len(p) for p in enc.perms}
    for t in {enc.leaves[i].type for i in enc.constant_leaves}:
        for rank in ranks:
            if rank >= t.rank:
                full = TensorType((1,) * (rank - t.rank) + tuple(t.shape), t.dtype)
                rows.add(lang.ranked, enc.type_id(t), rank, enc.type_id(full))


def _perm_tables(rows: Rows, enc: Encoding) -> None:
    frontier = list(enc.perms)
    while frontier and len(enc.perms) < MAX_PERMS:
        new = []
        for p, q in itertools.product(list(enc.perms), frontier):
            for first, then in ((p, q), (q, p)):
                if len(first) == len(then):
                    composed = tuple(first[i] for i in then)
                    if composed not in enc.perm_ids:
                        new.append(composed)
                    enc.perm_id(composed)
            inverse = tuple(int(i) for i in np.argsort(q))
            if inverse not in enc.perm_ids:
                new.append(inverse)
            enc.perm_id(inverse)
        frontier = new
    for pid, perm in enumerate(enc.perms):
        inverse = tuple(int(i) for i in np.argsort(perm))
        if inverse in enc.perm_ids:
            rows.add(lang.perm_inverse, pid, enc.perm_ids[inverse])
        if perm == tuple(range(len(perm))):
            rows.add(lang.perm_identity, pid)
        n = len(perm)
        if n >= 2 and perm == (*range(n - 2), n - 1, n - 2):
            rows.add(lang.perm_swaps_last_two, pid)
        for qid, other in enumerate(enc.perms):
            composed = tuple(perm[i] for i in other) if len(other) == n else None
            if composed in enc.perm_ids:
                rows.add(lang.perm_compose, pid, qid, enc.perm_ids[composed])


def _infer(op: str, types: Iterable[TensorType]) -> TensorType | None:
    try:
        return infer_types(get_op(op), list(types), Attrs())[0]
    except TilefuseError:  # a pair the op rejects simply gets no table entry
        return None


def _matmul_tables(rows: Rows, enc: Encoding, graph: Graph) -> None:
    """Scale, re-association and merge types for the constant operands of this graph."""
    constants = [enc.leaves[i].type for i in enc.constant_leaves
                 if enc.leaves[i].type.rank in (0, 2)]
    for w, c in itertools.product(set(constants), repeat=2):
        if c.rank == 0 and w.rank == 2 and _infer("mul", [w, c]) == w:
            rows.add(lang.scale_type, enc.type_id(w), enc.type_id(c))
        if w.rank == 2 and c.rank == 2 and (ab := _infer("matmul", [w, c])) is not None:
            rows.add(lang.matmul_type, enc.type_id(w), enc.type_id(c), enc.type_id(ab))
    position = 0
    for x, weights in _parallel_matmuls(graph, enc).items():
        if merge_pays(x.type, [w.type for w in weights]) and \
                _merge_types(rows, enc, x, [w.type for w in weights]):
            _group_facts(rows, enc, weights, position)
            position += len(weights)


def merge_pays(x: TensorType, weights: list[TensorType]) -> bool:
    """Whether one matmul of ``x`` with the concatenated weights, read through one slice per
    result, moves fewer bytes than a matmul per weight: it reads ``x`` once instead of once per
    weight, but each slice is a memory pass over its result (read + write).

    The merge is a decision taken here with the cost model's prices rather than left to
    extraction: a per-e-class extractor cannot see that the slices share one matmul.

    Checked against the measured kernels (``benchmarks/qkv_merge.py``, BERT-base's Q/K/V,
    768 -> 3 x 768): the FLOPs are the same and the matmul kernel runs N = 768 as fast as
    N = 2304, so x read once saves nothing measurable (it stays in cache across the three
    matmuls), while the three slices are real movement kernels (~15 µs each at M = 128).
    Merged / separate over repeated runs: 0.97-1.04 at M = 128 on one thread, 1.05-1.08 on
    two, 1.04-1.07 at M = 1024: no gain to take, so declining (2·x saved against 6·x added)
    is the right call, not an artefact of the prices."""
    outs = [_infer("matmul", [x, w]) for w in weights]
    if any(o is None or not o.is_static for o in outs) or not x.is_static:
        return False
    saved = (len(weights) - 1) * x.nbytes
    added = sum(2 * o.nbytes for o in outs if o is not None)
    return saved > added


def _parallel_matmuls(graph: Graph, enc: Encoding) -> dict[Value, list[Value]]:
    """Constant 2-D weights of matmuls that share their left operand, per operand, in graph
    order; a weight read by matmuls of several operands joins none."""
    constant_values = {enc.leaves[i] for i in enc.constant_leaves}
    groups: dict[Value, list[Value]] = {}
    for node in graph.nodes:
        w = node.inputs[1] if node.op.name == "matmul" else None
        if w in constant_values and w.type.rank == 2 and isinstance(w.shape[1], int):
            groups.setdefault(node.inputs[0], []).append(w)
    owners: dict[Value, int] = {}
    for weights in groups.values():
        for w in set(weights):
            owners[w] = owners.get(w, 0) + 1
    return {x: ws[:MAX_MERGE_GROUP] for x, ws in groups.items()
            if len(ws) > 1 and len(set(ws)) == len(ws) and all(owners[w] == 1 for w in ws)}


def _group_facts(rows: Rows, enc: Encoding, weights: list[Value], first: int) -> None:
    rows.add(lang.group_head, first)
    for i, w in enumerate(weights):
        rows.add(lang.group_row, enc.terms[w], first + i)
        if i:
            rows.add(lang.group_next, first + i - 1, first + i)


def _merge_types(rows: Rows, enc: Encoding, x: Value, weights: list[TensorType]) -> bool:
    """concat_last_type for every pair of sub-sums of the group's widths, for the weights
    ``[K, n]`` and the matmul results ``[..., M, n]``."""
    widths = [w.shape[1] for w in weights]
    sums = {sum(c) for r in range(1, len(widths) + 1) for c in itertools.combinations(widths, r)}
    out = _infer("matmul", [x.type, weights[0]])
    if out is None or len({(w.shape[0], w.dtype) for w in weights}) != 1:
        return False
    bias = TensorType((weights[0].shape[1],), weights[0].dtype)
    for base in (weights[0], out, bias):
        def with_last(n: int, base: TensorType = base) -> int:
            return enc.type_id(TensorType((*base.shape[:-1], n), base.dtype))
        for s1, s2 in itertools.product(sums, repeat=2):
            if s1 + s2 <= sum(widths):
                rows.add(lang.concat_last_type, with_last(s1), with_last(s2), with_last(s1 + s2))
    return True


__all__ = ["Encoding", "Rows", "elementwise_key", "encode", "is_modelled"]
