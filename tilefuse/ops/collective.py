"""Collectives between the ranks of a sharded graph: ``all_reduce`` and ``all_gather``.

They appear in a rank's graph after the sharding pass (:mod:`tilefuse.distributed.shard`) like
any op, so dumps and the plan show where data crosses devices. Their result depends on what the
other ranks hold, so there is no single-process reference: the distributed executable
(:mod:`tilefuse.distributed.executable`) runs them through a communicator (torch.distributed's
gloo or NCCL, or the in-process simulation of N ranks), and the reference raises naming that.
Both are opaque: they end a kernel group and are never fused or folded.
"""

from __future__ import annotations

from typing import Any

from tilefuse.dtypes import DType
from tilefuse.errors import ShapeError, TilefuseError
from tilefuse.graph.ir import Attrs
from tilefuse.graph.types import Shape, normalize_axis
from tilefuse.ops.registry import AttrType, OpDef, OpKind, attr


def _reduce_shape(shapes: tuple[Shape, ...], attrs: Attrs) -> tuple[Shape, ...]:
    if attrs["world"] < 2:
        raise ShapeError(f"a collective needs at least 2 ranks, got world={attrs['world']}")
    return (shapes[0],)


def _gather_shape(shapes: tuple[Shape, ...], attrs: Attrs) -> tuple[Shape, ...]:
    (shape,) = _reduce_shape(shapes, attrs)
    axis = normalize_axis(attrs["axis"], len(shape))
    dim = shape[axis]
    if not isinstance(dim, int):
        raise ShapeError(f"all_gather along a symbolic dim {dim}")
    return ((*tuple(shape[:axis]), dim * attrs["world"], *tuple(shape[axis + 1:])),)


def _same_dtype(dtypes: tuple[DType, ...], attrs: Attrs) -> tuple[DType, ...]:
    return (dtypes[0],)


def _no_reference(name: str) -> Any:
    def reference(*arrays: Any, **attrs: Any) -> Any:
        raise TilefuseError(f"{name} combines the arrays of {attrs.get('world')} ranks: it runs "
                            f"in a distributed executable (devices=N), not in one process",
                            op=name)
    reference.__name__ = name
    return reference


ALL_REDUCE = OpDef(
    "all_reduce", OpKind.OPAQUE, 1, _reduce_shape, _same_dtype, _no_reference("all_reduce"),
    attrs=(attr("world", AttrType.INT), attr("reduce", AttrType.STR, "sum", choices=("sum",))),
    doc="the elementwise sum of this value over all ranks, on every rank")

ALL_GATHER = OpDef(
    "all_gather", OpKind.OPAQUE, 1, _gather_shape, _same_dtype, _no_reference("all_gather"),
    attrs=(attr("world", AttrType.INT), attr("axis", AttrType.INT)),
    doc="the ranks' values concatenated along axis in rank order, on every rank")

DEFINITIONS: tuple[OpDef, ...] = (ALL_REDUCE, ALL_GATHER)
