"""Implicit-GEMM A operands: a convolution's im2col matrix read in place from its NHWC source.

The convolution lowering pass writes a convolution as ``matmul(reshape(window_patches(P)), W)``
with ``P`` the (padded) NHWC input ``[N, Hp, Wp, C]`` and A's rows ``N·OH·OW`` by columns
``KH·KW·C``. Element ``(i, k)`` of A is ``P[n, oh·sh + kh·dh, ow·sw + kw·dw, c]``, whose flat
address splits into a part that depends only on the row and a part that depends only on the
column::

    address(i, k) = row_offset(i) + kh · (dh·Wp·C) + (kw·C + c)      (dw = 1)

so with unit dilation along W the ``KW·C`` columns of one kernel row are one contiguous run of
P. The matmul micro-kernel then loads its A broadcasts straight from P (a k loop nested as
kernel rows × run) instead of from a materialised ``[M, K]`` matrix: a 3x3 convolution no
longer writes and rereads nine copies of its input, and a 7x7 stem over 3 channels reads runs
of 21 floats instead of gathering every element through a transpose and a pad.

:func:`window_operand` recognises the pattern; :class:`WindowA` holds the index arithmetic.
"""

from __future__ import annotations

from dataclasses import dataclass

from tilefuse.graph.ir import Value
from tilefuse.kernel.access import is_extent, unflatten
from tilefuse.kernel.fusion import KernelGroup
from tilefuse.loop.ir import Expr, const


@dataclass(frozen=True)
class WindowA:
    """A ``[N·OH·OW, KH·KW·C]`` operand read from the row-major ``[N, Hp, Wp, C]`` tensor
    ``source``. ``rows`` = (N, OH, OW) and ``row_strides`` their element strides in the
    source; each of the ``kernel_rows`` kernel rows is a run of ``run = KW·C`` contiguous
    elements, ``kernel_row_stride`` apart."""

    source: Value
    rows: tuple[int, int, int]
    row_strides: tuple[int, int, int]
    kernel_rows: int
    kernel_row_stride: int
    run: int

    @property
    def k(self) -> int:
        return self.kernel_rows * self.run

    @property
    def pixel_stride(self) -> int:
        """The source stride between A rows that are adjacent pixels of one output row."""
        return self.row_strides[2]

    def tiles_stay_in_row(self, mr: int) -> bool:
        """True when register tiles of ``mr`` rows starting at multiples of ``mr`` never cross
        an output row (``mr`` divides OW), so a tile's rows are ``pixel_stride`` apart."""
        return mr > 0 and self.rows[2] % mr == 0

    def row_offset(self, i: Expr) -> Expr:
        """The source offset of A's row ``i`` (its window's first element)."""
        offset: Expr = const(0)
        for index, stride in zip(unflatten(i, self.rows), self.row_strides):
            offset = offset + index * stride
        return offset


def window_operand(group: KernelGroup, a: Value) -> WindowA | None:
    """The :class:`WindowA` for matmul operand ``a`` when the group computes it as the row
    flattening of a ``window_patches`` with unit dilation along W over static shapes; else
    None (A is then materialised as before)."""
    producers = {v: n for n in group.nodes for v in n.outputs}
    flatten = producers.get(a)
    if flatten is None or flatten.op.name != "reshape":
        return None
    window = producers.get(flatten.inputs[0])
    if window is None or window.op.name != "window_patches":
        return None
    source = window.inputs[0]
    shape = tuple(source.shape)
    out = tuple(window.output.shape)
    if any(is_extent(d) or not isinstance(d, int) for d in (*shape, *out, *a.shape)):
        return None
    n, oh, ow, kh, kw, c = out
    if tuple(a.shape) != (n * oh * ow, kh * kw * c):
        return None
    (sh, sw), (dh, dw) = window.attrs["strides"], window.attrs["dilations"]
    if dw != 1:
        return None
    _, hp, wp, _ = shape
    return WindowA(source, (n, oh, ow), (hp * wp * c, sh * wp * c, sw * c),
                   kh, dh * wp * c, kw * c)


def view_of_input(group: KernelGroup, value: Value) -> Value | None:
    """The group input whose buffer holds ``value`` element for element (``value`` itself,
    or a chain of reshapes of it: a row-major reshape moves nothing), else None."""
    producers = {v: n for n in group.nodes for v in n.outputs}
    while value not in group.inputs:
        node = producers.get(value)
        if node is None or node.op.name != "reshape":
            return None
        value = node.inputs[0]
    return value
