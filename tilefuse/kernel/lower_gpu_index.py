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
so kernels holding a gather run one element a thread.
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


def has_gather(group: KernelGroupLike) -> bool:
    return any(n.op.name in GATHERS for n in group.nodes)


class GatherBuilder(ElementBuilder):
    """:class:`ElementBuilder` with ``take`` and ``take_along_axis`` (module docstring)."""

    def _movement(self, node: Node, v: Value, index: tuple[Expr, ...], lanes: int,
                  block: int) -> Expr:
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


__all__ = ["GATHERS", "GatherBuilder", "GatherContext", "has_gather"]
