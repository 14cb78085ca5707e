"""Recognise scaled dot-product attention and rewrite it into one ``attention`` node.

The pattern, on dataflow values (where q, k and v come from does not matter)::

    s = matmul(q, kt) [· c | / c]...  [+ mask]          kt: [..., D, Sk]
    p = softmax(s, axis=-1)   or   e = exp(s - max(s, -1, keepdims)); e / sum(e, -1, keepdims)
    o = matmul(p, v)

becomes ``o = attention(q, k, v[, mask]) {scale}``. Spellings covered: NumPy (``q @
k.swapaxes(-1, -2) * s`` or ``/ sqrt(d)``, softmax by hand or as the op), torch's core ATen
(the batch dims flattened around ``bmm`` by reshapes, ``div`` by sqrt(d), mask ``[B,1,1,S]``)
and ONNX (MatMul, Transpose, Div/Mul, Add, Softmax, MatMul); a scale on q (``(q · c) @ kt``)
folds into ``scale`` too. ``kt`` may be a transpose (any permutation whose last two axes can
be swapped back) or a tensor already laid out ``[..., D, Sk]`` (a transpose is added).
Reshapes that change only the batch dims are looked through: the node is built in the shape
the softmax sees (where a mask broadcasts) and its operands are viewed into it.

Only exact rewrites: one float dtype throughout, no broadcasting hidden in the scale, mask or
either matmul, scale factors that are one-element constants, and every interior value (scores,
exp, probabilities) read only inside the pattern, so the ``Sq × Sk`` values die. The result
is the same math up to float reassociation (the scale is applied as one factor).

It runs on the decomposed graph, after CSE (see ``pipeline.py``); an undecomposed ``softmax``
is recognised as well, so the pass also works on its own.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from dataclasses import dataclass

from tilefuse.graph.analysis import users as value_users
from tilefuse.graph.builder import GraphBuilder
from tilefuse.graph.ir import Graph, Literal, Node, Value
from tilefuse.graph.types import Shape, SymProduct, broadcast_shapes, normalize_axes
from tilefuse.log import get_logger

_LOG = get_logger("passes")
DISABLE_ENV = "TILEFUSE_NO_FUSED_ATTENTION"
"""Set to 1 to leave attention unfused (how ``benchmarks/attention.py`` measures the
unfused graph)."""
MAX_MATCHES = 4096
"""A bound on rewrites per run (each removes a matmul, so a graph has far fewer)."""


@dataclass(frozen=True)
class AttentionMatch:
    """One recognised attention: ``anchor`` (the matmul by v) is replaced by
    ``attention(q, k, v, mask)`` built in ``shape`` (the scores' shape); ``k_t`` is the
    ``[..., D, Sk]`` operand of the scores' matmul."""

    anchor: Node
    q: Value
    k_t: Value
    v: Value
    mask: Value | None
    scale: float
    scores_shape: Shape


class _Graph:
    """Producers and users of one graph's values."""

    def __init__(self, graph: Graph):
        self.producer = graph.producers()
        self.users = value_users(graph)
        self.returned = set(graph.outputs)

    def node(self, value: Value, *names: str) -> Node | None:
        """The producer of ``value`` if it is one of ``names``."""
        node = self.producer.get(value)
        return node if node is not None and node.op.name in names else None

    def only_read_by(self, value: Value, readers: set[Node]) -> bool:
        """Whether ``value`` is not returned and every reader is in ``readers``."""
        return value not in self.returned and all(u in readers
                                                  for u in self.users.get(value, ()))


def _batch_view(node: Node) -> bool:
    """A reshape that keeps the last two dims (so it only regroups batch dims), or a
    broadcast_to that changes nothing."""
    x, out = node.inputs[0].type.shape, node.outputs[0].type.shape
    if node.op.name == "broadcast_to":
        return x == out
    return node.op.name == "reshape" and len(x) >= 2 and len(out) >= 2 and x[-2:] == out[-2:]


def _views_back(g: _Graph, value: Value, single_use: bool) -> list[Value]:
    """``value`` and the values it is a batch view of (reshape chains), nearest first. With
    ``single_use`` the chain stops at a view read by anyone else."""
    chain = [value]
    while (node := g.node(chain[-1], "reshape", "broadcast_to")) is not None \
            and _batch_view(node):
        if single_use and not g.only_read_by(node.inputs[0], {node}):
            break
        chain.append(node.inputs[0])
    return chain


def _scalar(g: _Graph, value: Value) -> float | None:
    """The value of a one-element constant or a ``full``; None for anything else."""
    node = g.producer.get(value)
    if node is None or (value.type.shape and math.prod(value.type.shape) != 1):
        return None
    if node.op.name == "constant":
        literal = node.attrs["value"]
        return float(literal.array.reshape(())) if isinstance(literal, Literal) else None
    if node.op.name == "full" and isinstance(node.attrs["value"], (int, float)):
        return float(node.attrs["value"])
    return None


def _last_axis(node: Node, name: str) -> bool:
    """A keepdims ``max``/``sum`` folding exactly the last axis of its input."""
    if node.op.name != name or not node.attrs["keepdims"]:
        return False
    rank = node.inputs[0].type.rank
    return normalize_axes(node.attrs["axes"], rank) == (rank - 1,)


def _softmax_input(g: _Graph, p: Value) -> Value | None:
    """``s`` when ``p`` is softmax(s) over the last axis (one op or its decomposition) whose
    interior values are read only inside it."""
    node = g.producer.get(p)
    if node is None:
        return None
    if node.op.name == "softmax":
        rank = p.type.rank
        return node.inputs[0] if node.attrs["axis"] in (-1, rank - 1) else None
    if node.op.name != "div":
        return None
    e, total = node.inputs
    sum_node, exp_node = g.node(total, "sum"), g.node(e, "exp")
    if sum_node is None or exp_node is None or sum_node.inputs[0] is not e \
            or not _last_axis(sum_node, "sum"):
        return None
    sub = g.node(exp_node.inputs[0], "sub")
    if sub is None or (mx := g.node(sub.inputs[1], "max")) is None or not _last_axis(mx, "max"):
        return None
    s = sub.inputs[0]
    if mx.inputs[0] is not s or len({v.type for v in (s, sub.outputs[0], e, p)}) != 1:
        return None
    interior = ((e, {sum_node, node}), (total, {node}), (exp_node.inputs[0], {exp_node}),
                (sub.inputs[1], {sub}), (s, {mx, sub}))
    return s if all(g.only_read_by(v, readers) for v, readers in interior) else None


def _unscaled(g: _Graph, value: Value, interior: bool = True) -> tuple[Value, float]:
    """``value`` with multiplications and divisions by scalar constants peeled off (those that
    keep its type; with ``interior``, only while what they read is read by them alone), and
    the factor they applied."""
    scale = 1.0
    while (node := g.node(value, "mul", "div")) is not None:
        for pos in ((0, 1) if node.op.name == "mul" else (0,)):
            x, c = node.inputs[pos], _scalar(g, node.inputs[1 - pos])
            if c is not None and x.type == node.outputs[0].type and c != 0.0 \
                    and (not interior or g.only_read_by(x, {node})):
                scale = scale * c if node.op.name == "mul" else scale / c
                value = x
                break
        else:
            break
    return value, scale


def _scores_matmul(g: _Graph, s: Value) -> tuple[Node, Value | None, float] | None:
    """(the q·kt matmul, the mask or None, the scale) of the scores ``s``."""
    candidates: list[tuple[Value, Value | None]] = [(s, None)]
    add = g.node(s, "add")
    if add is not None:
        a, b = add.inputs
        candidates = [(a, b), (b, a)]
    for scaled, mask in candidates:
        if mask is not None and (scaled.type != s.type or mask.dtype != s.dtype
                                 or not g.only_read_by(scaled, {add})):
            continue
        unscaled, scale = _unscaled(g, scaled)
        for view in _views_back(g, unscaled, single_use=True):
            matmul = g.node(view, "matmul")
            if matmul is not None:
                return matmul, mask, scale
    return None


def _same_batch(*shapes: Shape) -> bool:
    return all(len(s) >= 2 for s in shapes) and len({s[:-2] for s in shapes}) == 1


def match_attention(g: _Graph, anchor: Node) -> AttentionMatch | None:
    """The attention ``anchor`` (a matmul) finishes, or None."""
    if anchor.op.name != "matmul":
        return None
    p_m, v = anchor.inputs
    if not g.only_read_by(p_m, {anchor}):
        return None
    for p in _views_back(g, p_m, single_use=True):
        s = _softmax_input(g, p)
        if s is None or p.type.rank < 2:
            continue
        found = _scores_matmul(g, s)
        if found is None:
            return None
        matmul, mask, scale = found
        q, k_t = matmul.inputs
        q, q_scale = _unscaled(g, q, interior=False) if g.node(q, "mul") else (q, 1.0)
        shapes = (q.type.shape, k_t.type.shape, matmul.outputs[0].type.shape)
        if not (_same_batch(*shapes) and _same_batch(p_m.type.shape, v.type.shape)):
            return None
        dtypes = {x.dtype for x in (q, k_t, v, s, p_m, anchor.outputs[0])}
        if len(dtypes) != 1 or not next(iter(dtypes)).is_float:
            return None
        if SymProduct.of(shapes[2][:-2]) != SymProduct.of(s.type.shape[:-2]) or \
                SymProduct.of(p_m.type.shape[:-2]) != SymProduct.of(s.type.shape[:-2]):
            return None
        if mask is not None and broadcast_shapes(mask.type.shape, s.type.shape) != s.type.shape:
            return None
        return AttentionMatch(anchor, q, k_t, v, mask, scale * q_scale, s.type.shape)
    return None


Resolve = Callable[[Value], Value]
"""Maps a value of the matched graph to its value in the graph being built."""


def _view(g: _Graph, builder: GraphBuilder, value: Value, shape: Shape, loc: object,
          get: Resolve) -> Value:
    """``value`` regrouped to ``shape`` (same trailing dims): an existing value of that
    shape in its reshape chain, else a new reshape."""
    for candidate in _views_back(g, value, single_use=False):
        if candidate.type.shape == tuple(shape):
            return get(candidate)
    return builder.add1("reshape", [get(value)], {"shape": tuple(shape)},
                        loc)  # type: ignore[arg-type]


def _untransposed(g: _Graph, builder: GraphBuilder, k_t: Value, loc: object,
                  get: Resolve) -> Value:
    """A value equal to ``k_t`` with its last two axes swapped, up to batch regrouping: the
    input of a transpose in ``k_t``'s reshape chain with the swap folded into its permutation
    (no node when that leaves the identity), else a new transpose of ``k_t``."""
    for candidate in _views_back(g, k_t, single_use=False):
        node = g.node(candidate, "transpose")
        if node is None:
            continue
        perm = tuple(node.attrs["perm"])
        swapped = (*perm[:-2], perm[-1], perm[-2])
        if swapped == tuple(range(len(perm))):
            return get(node.inputs[0])
        return builder.add1("transpose", [get(node.inputs[0])], {"perm": swapped},
                            loc)  # type: ignore[arg-type]
    rank = k_t.type.rank
    return builder.add1("transpose", [get(k_t)], {"perm": (*range(rank - 2), rank - 1, rank - 2)},
                        loc)  # type: ignore[arg-type]


def _emit(g: _Graph, builder: GraphBuilder, match: AttentionMatch, get: Resolve) -> Value:
    """Appends the attention node (and the views and transpose it needs) for ``match``;
    returns the value that replaces the anchor's output."""
    loc = match.anchor.loc
    batch = match.scores_shape[:-2]
    sq, d = match.q.type.shape[-2:]
    sk, dv = match.v.type.shape[-2:]
    q = _view(g, builder, match.q, (*batch, sq, d), loc, get)
    k_swapped = _untransposed(g, builder, match.k_t, loc, get)
    k = builder.add1("reshape", [k_swapped], {"shape": (*batch, sk, d)}, loc) \
        if k_swapped.type.shape != (*batch, sk, d) else k_swapped  # type: ignore[arg-type]
    v = _view(g, builder, match.v, (*batch, sk, dv), loc, get)
    operands = [q, k, v] if match.mask is None else [q, k, v, get(match.mask)]
    out = builder.add1("attention", operands, {"scale": match.scale}, loc)  # type: ignore[arg-type]
    shape = match.anchor.outputs[0].type.shape
    return out if out.type.shape == shape else \
        builder.add1("reshape", [out], {"shape": shape}, loc)  # type: ignore[arg-type]


def _rewrite(graph: Graph, g: _Graph, match: AttentionMatch) -> Graph:
    """``graph`` with ``match.anchor`` replaced by the attention node; the nodes it leaves
    unread stay for DCE."""
    builder = GraphBuilder(graph.name)
    mapping: dict[Value, Value] = {v: builder.input(v.type, v.name) for v in graph.inputs}

    def get(v: Value) -> Value:
        return mapping.get(v, v)

    for node in graph.nodes:
        if node is match.anchor:
            mapping[node.outputs[0]] = _emit(g, builder, match, get)
            continue
        inputs = tuple(get(v) for v in node.inputs)
        builder.append(node if inputs == node.inputs else
                       Node(node.op, inputs, node.attrs, node.outputs, node.loc))
    return builder.build([get(v) for v in graph.outputs])


def find_attention(graph: Graph) -> list[AttentionMatch]:
    """Every attention in ``graph`` (matched on the graph as it is)."""
    g = _Graph(graph)
    return [m for node in graph.nodes if (m := match_attention(g, node)) is not None]


def fuse_attention(graph: Graph) -> tuple[Graph, bool]:
    """``graph`` with each recognised attention replaced by an ``attention`` node (the
    replaced nodes are left for DCE); changed when any was found. Nothing changes when
    ``$TILEFUSE_NO_FUSED_ATTENTION`` is 1."""
    if os.environ.get(DISABLE_ENV, "") == "1":
        return graph, False
    changed = False
    for _ in range(MAX_MATCHES):
        g = _Graph(graph)
        match = next((m for node in graph.nodes if (m := match_attention(g, node))), None)
        if match is None:
            break
        graph = _rewrite(graph, g, match)
        _LOG.debug("attention: %s -> attention (scale %g, scores %s)", match.anchor.op.name,
                   match.scale, list(match.scores_shape))
        changed = True
    return graph, changed


__all__ = ["AttentionMatch", "find_attention", "fuse_attention", "match_attention"]
