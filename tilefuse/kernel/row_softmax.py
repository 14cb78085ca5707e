"""Softmax-shaped row groups on the CPU: a cheaper max pass and a cheaper exp.

In ``exp(u - max(u))`` (softmax, log-softmax, and the same written out in NumPy) two
guarantees hold that the general ops cannot assume:

- the argument of the exp is ``<= 0`` or NaN, so the exp needs no overflow path
  (:func:`tilefuse.codegen.math_lib._exp_nonpos`, loop-IR op ``exp_nonpos``);
- if every output of the group is NaN whenever ``sum(exp(u - max(u)))`` is (the division by
  it, the subtraction of its log), the max need not propagate NaN: a NaN in a row makes that
  row's sum NaN through ``exp(NaN - m)`` whatever ``m`` is, so every output of the row is NaN
  as in NumPy. The max pass then combines with one ``vmaxps`` (``select(a > b, a, b)``)
  instead of a compare, an unordered compare, a mask or and a blend. Rows of infinities keep
  NumPy's results: ``inf - inf`` is NaN, a row of ``-inf`` has max ``-inf``.

:func:`softmax_rows` finds both in a decomposed row group and returns the group with those
exps replaced (same op, ``exp_nonpos`` lowering) and the max nodes that may ignore NaN.
"""

from __future__ import annotations

from dataclasses import replace

from tilefuse.graph.ir import Node, Value
from tilefuse.graph.types import normalize_axes
from tilefuse.kernel.access import dims
from tilefuse.kernel.scalar_expr import KernelGroupLike
from tilefuse.ops.registry import OpDef, OpKind

_PROPAGATE = frozenset({"add", "sub", "mul", "div", "log", "exp", "neg", "sqrt", "rsqrt",
                        "cast"})
"""Ops whose float result is NaN when any input is NaN."""


def _exp_nonpos(op: OpDef) -> OpDef:
    return replace(op, lowering=lambda ops, x: ops.unary("exp_nonpos", x))


def softmax_rows(group: KernelGroupLike, row_rank: int,
                 make_group: type) -> tuple[KernelGroupLike, frozenset[Node]]:
    """``group`` with each ``exp(u - max(u))`` lowered as ``exp_nonpos``, and the max nodes
    whose NaN propagation is redundant (see the module docstring). ``row_rank``: the number
    of trailing (row) axes; ``make_group(name, nodes, inputs, outputs)`` builds the result."""
    consumers: dict[Value, list[Node]] = {}
    for node in group.nodes:
        for v in node.inputs:
            consumers.setdefault(v, []).append(node)
    outputs = set(group.outputs)
    shifted: dict[Value, Node] = {}      # u - max(u) -> its max node
    only_shifted: set[Node] = set()      # maxes read by nothing else (and not returned)
    for m in group.nodes:
        if not _row_max(m, row_rank):
            continue
        (u,) = m.inputs
        users = consumers.get(m.output, [])
        subs = [n for n in users if n.op.name == "sub" and n.inputs == (u, m.output)]
        shifted.update((s.output, m) for s in subs)
        if subs and len(subs) == len(users) and m.output not in outputs:
            only_shifted.add(m)
    exps = {n: shifted[n.inputs[0]] for n in group.nodes
            if n.op.name == "exp" and n.inputs[0] in shifted and n.output.dtype.is_float}
    if not exps:
        return group, frozenset()
    nan_free = frozenset(m for m in only_shifted if _outputs_follow_sum(group, m, exps, outputs))
    nodes = tuple(Node(_exp_nonpos(n.op), n.inputs, n.attrs, n.outputs, n.loc) if n in exps
                  else n for n in group.nodes)
    return make_group(group.name, nodes, tuple(group.inputs), tuple(group.outputs)), nan_free


def _row_max(node: Node, row_rank: int) -> bool:
    """A float max over the trailing ``row_rank`` axes, kept as size-1 axes (so that
    ``u - max`` subtracts each row's own max)."""
    if node.op.name != "max" or node.op.kind is not OpKind.REDUCTION:
        return False
    (u,) = node.inputs
    full = dims(u.shape)
    if not u.dtype.is_float or len(full) < row_rank:
        return False
    axes = normalize_axes(node.attrs["axes"], len(full))
    keep = full[:len(full) - row_rank] + (1,) * row_rank
    return axes == tuple(range(len(full) - row_rank, len(full))) and \
        dims(node.output.shape) == keep


def _outputs_follow_sum(group: KernelGroupLike, m: Node, exps: dict[Node, Node],
                        outputs: set[Value]) -> bool:
    """Whether every output of ``group`` is NaN whenever a sum over the row of
    ``exp(u - m)`` is."""
    nan: set[Value] = set()
    for n in group.nodes:
        if n.op.name == "sum" and n.op.kind is OpKind.REDUCTION and n.inputs[0] in {
                e.output for e, mm in exps.items() if mm is m} and \
                dims(n.output.shape) == dims(m.output.shape):
            nan.add(n.output)
    if not nan:
        return False
    for n in group.nodes:  # topological order
        if n.op.name in _PROPAGATE and any(v in nan for v in n.inputs) and \
                all(v.dtype.is_float for v in n.outputs):
            nan.update(n.outputs)
    return all(v in nan for v in outputs)
