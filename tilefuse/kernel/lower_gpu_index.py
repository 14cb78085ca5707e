"""Gathers inside GPU elementwise kernels: ``take`` (embeddings, ``index_select``, ``aten.index``)
and ``take_along_axis`` (``aten.gather``) as data-dependent index arithmetic.

The CPU keeps gathers on the host because an out-of-range index raises in the reference and the
loop IR has no error channel. A GPU kernel has none either, and a host step there costs a
device round trip per call, so on the GPU an index is read, wrapped once when negative (NumPy's
and torch's rule) and **clamped** into the axis: an out-of-range index reads the nearest edge
element instead of raising (torch on CUDA stops the device with an assert; the reference raises).
This is the one place the cuda target is more lenient than the reference; it is documented in
docs/ARCHITECTURE.md.

:class:`GatherContext` is the elementwise lowering's :class:`KernelContext` with a builder that
knows the two gathers; every other node is lowered as before. The index is loaded as a scalar,
so kernels holding a gather run one element a thread. The builder also knows ``split`` (a piece
is the input at an offset) and ``concat`` (each input at its clamped index, the right one
selected), so every movement group of these ops is one flat kernel on the GPU.
"""

from __future__ import annotations

from collections.abc import Mapping

from tilefuse.dtypes import DType
from tilefuse.graph.ir import Node, Value
from tilefuse.graph.types import normalize_axis
from tilefuse.kernel.access import Namer, NotVectorizable, dims, kernel_buffers, load_contiguous
from tilefuse.kernel.lower_elementwise import KernelContext
from tilefuse.kernel.scalar_expr import ElementBuilder, KernelGroupLike, Override
from tilefuse.loop.ir import Expr, XOp, binary, cast, const, maximum, minimum, select

GATHERS = frozenset({"take", "take_along_axis"})
FLAT_MOVEMENT = frozenset({"split", "concat", "reshape", "expand_dims", "squeeze", "transpose",
                           "slice", "broadcast_to", "window_patches", *GATHERS})
"""Movement ops the GPU lowers as index arithmetic in one flat parallel loop (``pad`` too, in
its constant mode)."""


def has_gather(group: KernelGroupLike) -> bool:
    return any(n.op.name in GATHERS for n in group.nodes)


def flat_movement(group: KernelGroupLike) -> bool:
    """Whether every node of a movement group is index arithmetic here (a flat kernel over the
    output: every thread busy, where the CPU's piece loops may put a whole copy on one row)."""
    return all(n.op.name in FLAT_MOVEMENT or (n.op.name == "pad"
                                              and n.attrs["mode"] == "constant")
               or n.op.kind.value == "elementwise" for n in group.nodes)


class GatherBuilder(ElementBuilder):
    """:class:`ElementBuilder` with ``take`` and ``take_along_axis`` (module docstring)."""

    def _movement(self, node: Node, v: Value, index: tuple[Expr, ...], lanes: int,
                  block: int) -> Expr:
        if node.op.name == "split":
            return self._split(node, v, index)
        if node.op.name == "concat":
            return self._concat(node, v, index)
        if node.op.name not in GATHERS:
            return super()._movement(node, v, index, lanes, block)
        if lanes > 1:
            raise NotVectorizable(f"{node.op.name} reads a data-dependent index")
        x, idx = node.inputs
        shape = dims(x.shape)
        axis = normalize_axis(node.attrs["axis"], len(shape))
        if node.op.name == "take":
            rank = len(dims(idx.shape))
            position = self.value(idx, index[axis:axis + rank])
            at = (*index[:axis], self._clamped(position, shape[axis]),
                  *index[axis + rank:])
        else:
            out = dims(v.shape)
            idx_shape = dims(idx.shape)
            offset = len(out) - len(idx_shape)
            position = self.value(idx, tuple(const(0) if d == 1 else index[offset + a]
                                             for a, d in enumerate(idx_shape)))
            at = tuple(self._clamped(position, shape[a]) if a == axis
                       else const(0) if d == 1 else index[a] for a, d in enumerate(shape))
        return self.value(x, at)

    def _split(self, node: Node, v: Value, index: tuple[Expr, ...]) -> Expr:
        """Piece ``v`` of a split: the input at the piece's offset along the axis."""
        (u,) = node.inputs
        axis = normalize_axis(node.attrs["axis"], len(dims(u.shape)))
        offset = sum(node.attrs["sizes"][:node.outputs.index(v)])
        return self.value(u, tuple(i + offset if a == axis and offset else i
                                   for a, i in enumerate(index)))

    def _concat(self, node: Node, v: Value, index: tuple[Expr, ...]) -> Expr:
        """A concat: each input read at its clamped offset index, the one whose range holds
        the index selected (so every load is in bounds)."""
        axis = normalize_axis(node.attrs["axis"], len(dims(v.shape)))
        result: Expr | None = None
        start = 0
        for u in node.inputs:
            size = dims(u.shape)[axis]
            if size == 0:
                continue
            local = minimum(maximum(index[axis] - start, const(0)), const(size - 1))
            at = tuple(local if a == axis else i for a, i in enumerate(index))
            x = self.value(u, at)
            x = x if x.dtype is v.dtype else cast(x, v.dtype)
            result = x if result is None else select(
                binary(XOp.LT, index[axis], const(start)), result, x)
            start += size
        if result is None:
            raise self.fail("a concat of empty inputs")
        return self.share(result)

    def _clamped(self, position: Expr, size: int) -> Expr:
        """``position`` as i64, wrapped once if negative, clamped into ``[0, size)``."""
        i = self.share(cast(position, DType.i64)) if position.type.dtype is not DType.i64 \
            else position
        wrapped = select(binary(XOp.LT, i, const(0)), i + size, i)
        return self.share(minimum(maximum(wrapped, const(0)), const(size - 1)))


class GatherContext(KernelContext):
    """The elementwise lowering's context whose builders know the gathers."""

    @staticmethod
    def of(group: KernelGroupLike) -> GatherContext:
        buffers = kernel_buffers(group.inputs, group.outputs)
        return GatherContext(group, buffers, Namer(buffers.names()),
                             load_contiguous(buffers.inputs))

    def builder(self, overrides: Mapping[Value, Override] | None = None) -> ElementBuilder:
        return GatherBuilder(self.group, self.load, overrides, names=self.names)


__all__ = ["FLAT_MOVEMENT", "GATHERS", "GatherBuilder", "GatherContext", "flat_movement",
           "has_gather"]
