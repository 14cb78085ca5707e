"""What kernel formation (:mod:`tilefuse.kernel.fusion`) asks of one node or value, apart from
any group: whether it is a constant or pointwise (rule 2), whether a contraction or reduction
reads it through at any size (a remap, slice or constant pad), what it costs per element
(rule 8), which axes a reduction folds and whether that is a row reduction; and element and
byte counts of values. The op-name sets the answers come from are here too."""

from __future__ import annotations

from collections.abc import Iterable

from tilefuse.graph.ir import Node, Value
from tilefuse.graph.types import SymProduct, normalize_axes, normalize_axis
from tilefuse.ops.registry import OpKind

__all__ = ["ARG_REDUCTIONS", "AXIS_REDUCTIONS", "CHEAP_MOVEMENT", "TRANSCENDENTAL",
           "bytes_at_most", "gathered", "is_constant", "is_pointwise", "numel", "op_cost",
           "reduced_axes", "row_width"]

CHEAP_MOVEMENT = frozenset({"broadcast_to", "expand_dims", "squeeze", "reshape", "transpose",
                            "window_patches"})
TRANSCENDENTAL = frozenset({"exp", "log", "log1p", "expm1", "tanh", "sigmoid", "erf", "gelu",
                            "silu", "softplus", "sin", "cos", "pow"})
AXIS_REDUCTIONS = frozenset({"sum", "mean", "max", "min", "var", "prod"})
ARG_REDUCTIONS = frozenset({"argmax", "argmin"})


def is_constant(node: Node) -> bool:
    """A ``constant`` node: data, not a kernel."""
    return node.op.name == "constant"


def is_pointwise(node: Node) -> bool:
    """Elementwise ops, fills and the index-remapping movement ops (rule 2)."""
    return (node.op.kind is OpKind.ELEMENTWISE or node.op.name in CHEAP_MOVEMENT
            or node.op.name == "full")


def gathered(node: Node) -> bool:
    """A remap, slice or constant pad leaving the last axis alone: read through at any size."""
    if node.op.name == "pad":
        return node.attrs["mode"] == "constant" and not any(node.attrs["pads"][-2:])
    return node.op.name in CHEAP_MOVEMENT or node.op.name == "slice"


def moves_lane_axis(node: Node) -> bool:
    """Whether ``node`` is a transpose whose output's last axis (size-1 axes aside) is not its
    input's last: a kernel reading through it along that axis, where its vectors run, loads
    one element at a time (ShuffleNet's channel shuffle in channels-last layout)."""
    if node.op.name != "transpose":
        return False
    shape = node.inputs[0].type.shape
    perm = [normalize_axis(p, len(shape)) for p in node.attrs["perm"]]
    kept = [a for a in perm if shape[a] != 1]
    inner = [a for a in range(len(shape)) if shape[a] != 1]
    return bool(kept) and kept[-1] != inner[-1]


def op_cost(node: Node) -> int:
    """Scalar ops per element of a pointwise node: 0 remap/fill, 4 transcendental, else 1."""
    if node.op.name in CHEAP_MOVEMENT or node.op.name == "full":
        return 0
    return 4 if node.op.name in TRANSCENDENTAL else 1


def reduced_axes(node: Node) -> tuple[int, ...] | None:
    """The input axes a reduction (or composite) folds, normalised and sorted; None otherwise."""
    name = node.op.name
    rank = node.inputs[0].type.rank if node.inputs else 0
    if name in AXIS_REDUCTIONS:
        return normalize_axes(node.attrs["axes"], rank)
    if name in ARG_REDUCTIONS:
        axis = node.attrs["axis"]
        return tuple(range(rank)) if axis is None else (normalize_axis(axis, rank),)
    if name in ("softmax", "log_softmax"):
        return (normalize_axis(node.attrs["axis"], rank),)
    if name in ("layer_norm", "rms_norm"):
        k = node.inputs[1].type.rank
        return tuple(range(rank - k, rank))
    return None


def row_width(node: Node) -> int | None:
    """k when ``node`` folds exactly the trailing k >= 1 axes of its input (a row reduction)."""
    if node.op.name in ARG_REDUCTIONS:
        return None
    axes = reduced_axes(node)
    if not axes:
        return None
    rank = node.inputs[0].type.rank
    return len(axes) if axes == tuple(range(rank - len(axes), rank)) else None


def numel(value: Value) -> SymProduct:
    """The element count of ``value`` (a monomial in its symbols)."""
    return SymProduct.of(value.type.shape)


def bytes_at_most(values: Iterable[Value], bound: Value) -> bool:
    """Whether ``values`` together are no more bytes than ``bound`` (symbols taken >= 1)."""
    b = numel(bound)
    total = 0
    for v in values:
        n = numel(v)
        if any(n.syms.count(s) > b.syms.count(s) for s in set(n.syms)):
            return False
        total += n.coeff * v.dtype.itemsize
    return total <= b.coeff * bound.dtype.itemsize
