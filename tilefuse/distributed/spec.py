"""How one value is laid out over the ranks: replicated, split along an axis, or partial sums.

A :class:`Spec` is the sharding pass's per-value fact (GSPMD's "sharding", Megatron's column /
row split written as data):

- ``REP``: every rank holds the whole value;
- ``Spec.split(axis, outer)``: rank ``r`` holds block ``r`` of ``world`` equal blocks of
  ``axis``. With ``outer > 1`` the axis is read as ``[outer, dim / outer]`` and the block is
  taken in the inner part, so a rank holds a strided set of rows: that is how the heads of a
  merged ``[batch * heads]`` axis, or the q/k/v thirds of a fused QKV projection, stay split;
- ``PARTIAL``: every rank holds a full-shape addend; the value is their sum (what a row-parallel
  matrix product leaves before its all-reduce).

The functions here map a split through the movement ops (reshape, transpose, broadcast, ...)
and say what a rank's local shape is; they know nothing of graphs.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Spec:
    """The layout of one value over the ranks (see the module docstring)."""

    kind: str                    # "rep", "split" or "partial"
    axis: int = -1
    outer: int = 1

    @staticmethod
    def split(axis: int, outer: int = 1) -> Spec:
        return Spec("split", axis, outer)

    @property
    def is_split(self) -> bool:
        return self.kind == "split"

    def __str__(self) -> str:
        if self.kind == "split":
            return f"split(axis={self.axis}" + (f", outer={self.outer})" if self.outer > 1 else ")")
        return "replicated" if self.kind == "rep" else "partial-sum"


REP = Spec("rep")
PARTIAL = Spec("partial")


def splittable(shape: Sequence[int], axis: int, outer: int, world: int) -> bool:
    """Whether ``shape``'s ``axis`` splits into ``world`` equal blocks under ``outer``."""
    if not 0 <= axis < len(shape) or not isinstance(shape[axis], int):
        return False
    dim = shape[axis]
    return dim % outer == 0 and (dim // outer) % world == 0 and dim // outer >= world


def local_shape(shape: Sequence[int], spec: Spec, world: int) -> tuple[int, ...]:
    """The shape one rank holds of a value of ``shape`` laid out as ``spec``."""
    out = list(shape)
    if spec.is_split:
        out[spec.axis] //= world
    return tuple(out)


def block(array: np.ndarray, spec: Spec, world: int, rank: int) -> np.ndarray:
    """Rank ``rank``'s block of the full ``array`` (a constant sliced at plan time)."""
    if not spec.is_split:
        return array
    a, shape = spec.axis, array.shape
    inner = shape[a] // spec.outer
    view = array.reshape((*shape[:a], spec.outer, inner, *shape[a + 1:]))
    step = inner // world
    part = np.take(view, np.arange(rank * step, (rank + 1) * step), axis=a + 1)
    return np.ascontiguousarray(part.reshape((*shape[:a], spec.outer * step, *shape[a + 1:])))


def through_reshape(src: Sequence[int], spec: Spec, dst: Sequence[int], world: int
                    ) -> Spec | None:
    """The split of a reshape's result from its input's, or None when the blocks stop being
    blocks of one axis. The block structure is fixed by the number of elements before the
    split part (``prod(src[:axis]) * outer``); the result axis whose prefix, times an outer
    factor that divides it, equals that number carries the split."""
    if not spec.is_split:
        return spec
    prefix = math.prod(src[:spec.axis]) * spec.outer
    before = 1
    for b, dim in enumerate(dst):
        if before <= prefix < before * dim and prefix % before == 0:
            outer = prefix // before
            if dim % outer == 0 and splittable(dst, b, outer, world):
                return Spec.split(b, outer)
            return None
        if before == prefix and splittable(dst, b, 1, world):
            return Spec.split(b, 1)
        before *= dim
    return None


def through_transpose(spec: Spec, perm: Sequence[int]) -> Spec:
    return Spec.split(list(perm).index(spec.axis), spec.outer) if spec.is_split else spec


def right_aligned(axis: int, rank_from: int, rank_to: int) -> int:
    """``axis`` of an operand of rank ``rank_from`` broadcast against rank ``rank_to``."""
    return axis + rank_to - rank_from


def through_expand(spec: Spec, axes: Sequence[int], rank_out: int) -> Spec:
    """``expand_dims(axes)``: the split axis moves past the inserted ones."""
    if not spec.is_split:
        return spec
    inserted = sorted(a % rank_out for a in axes)
    old = [i for i in range(rank_out) if i not in inserted]
    return Spec.split(old[spec.axis], spec.outer)


def through_squeeze(spec: Spec, removed: Sequence[int]) -> Spec:
    if not spec.is_split:
        return spec
    return Spec.split(spec.axis - sum(1 for a in removed if a < spec.axis), spec.outer)


def through_reduce(spec: Spec, axes: Sequence[int], keepdims: bool) -> Spec | None:
    """A reduction over ``axes`` keeps a split of another axis; None when it reduces the split
    axis itself (the caller decides: partial sums or a gather)."""
    if not spec.is_split:
        return spec
    if spec.axis in axes:
        return None
    if keepdims:
        return spec
    return Spec.split(spec.axis - sum(1 for a in axes if a < spec.axis), spec.outer)
