"""Tensor types: a shape of dims (ints or named symbols) and a dtype.

A dim is an ``int`` or a :class:`Sym` (``batch``, ``seq``). Shape rules are written against dims,
so they work with symbols from the start; where a rule needs a number it asks :func:`static_dim`,
which raises a ShapeError naming the symbol. Element counts of symbolic shapes are kept as
:class:`SymProduct` monomials (``768*batch*seq``) so that reshape can check them exactly.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass

from tilefuse.dtypes import DType
from tilefuse.errors import ShapeError


@dataclass(frozen=True, order=True)
class Sym:
    """A named symbolic dimension. Two syms with the same name are the same size."""

    name: str

    def __str__(self) -> str:
        return self.name

    def __repr__(self) -> str:
        return f"Sym({self.name!r})"


Dim = int | Sym
Shape = tuple[Dim, ...]


def is_static(shape: Shape) -> bool:
    return all(isinstance(d, int) for d in shape)


def static_dim(d: Dim, what: str = "dimension") -> int:
    """The int value of ``d``; ShapeError if it is symbolic."""
    if isinstance(d, Sym):
        raise ShapeError(f"{what} must be a static size here, got symbol {d.name!r}")
    return d


def static_shape(shape: Shape, what: str = "shape") -> tuple[int, ...]:
    return tuple(static_dim(d, what) for d in shape)


@dataclass(frozen=True)
class SymProduct:
    """coefficient × product of symbols: the element count of a possibly symbolic shape."""

    coeff: int
    syms: tuple[str, ...]  # sorted, with repetition

    @staticmethod
    def of(dims: Shape | list[Dim]) -> SymProduct:
        coeff = 1
        names: list[str] = []
        for d in dims:
            if isinstance(d, Sym):
                names.append(d.name)
            else:
                coeff *= d
        return SymProduct(coeff, tuple(sorted(names)))

    def divide(self, other: SymProduct) -> SymProduct | None:
        """self / other when it is again a monomial with integer coefficient, else None."""
        if other.coeff == 0 or self.coeff % other.coeff:
            return None
        have = Counter(self.syms)
        have.subtract(Counter(other.syms))
        if any(v < 0 for v in have.values()):
            return None
        return SymProduct(self.coeff // other.coeff, tuple(sorted(have.elements())))

    def as_dim(self) -> Dim | None:
        """The single dim equal to this product, if there is one."""
        if not self.syms:
            return self.coeff
        if len(self.syms) == 1 and self.coeff == 1:
            return Sym(self.syms[0])
        return None

    def __str__(self) -> str:
        parts = ([str(self.coeff)] if self.coeff != 1 or not self.syms else []) + list(self.syms)
        return "*".join(parts)


def num_elements(shape: Shape) -> int:
    """The element count of a static shape."""
    return math.prod(static_shape(shape))


@dataclass(frozen=True)
class TensorType:
    """The type of an SSA value: shape and dtype."""

    shape: Shape
    dtype: DType

    def __post_init__(self) -> None:
        for d in self.shape:
            if isinstance(d, bool) or not isinstance(d, (int, Sym)):
                raise ShapeError(f"a dim must be an int or a Sym, got {d!r}")
            if isinstance(d, int) and d < 0:
                raise ShapeError(f"negative dim {d} in shape {list(self.shape)}")

    @property
    def rank(self) -> int:
        return len(self.shape)

    @property
    def is_static(self) -> bool:
        return is_static(self.shape)

    @property
    def nbytes(self) -> int:
        return num_elements(self.shape) * self.dtype.itemsize

    def __str__(self) -> str:
        return f"{self.dtype.value}[{','.join(str(d) for d in self.shape)}]"


def format_shape(shape: Shape) -> str:
    return "[" + ",".join(str(d) for d in shape) + "]"


def broadcast_dims(a: Dim, b: Dim) -> Dim:
    """NumPy broadcasting of two dims. A symbol against an int n > 1 gives n (the symbol must be
    1 or n at run time; guards check that)."""
    if a == b:
        return a
    if a == 1:
        return b
    if b == 1:
        return a
    if isinstance(a, Sym) and isinstance(b, int):
        return b
    if isinstance(b, Sym) and isinstance(a, int):
        return a
    raise ShapeError(f"cannot broadcast dims {a} and {b}")


def broadcast_shapes(*shapes: Shape) -> Shape:
    """NumPy broadcasting of any number of shapes; ShapeError when they are incompatible."""
    rank = max((len(s) for s in shapes), default=0)
    result: list[Dim] = []
    for i in range(rank):
        dim: Dim = 1
        for s in shapes:
            j = i - (rank - len(s))
            if j >= 0:
                try:
                    dim = broadcast_dims(dim, s[j])
                except ShapeError:
                    raise ShapeError("shapes " + ", ".join(format_shape(x) for x in shapes)
                                     + " do not broadcast") from None
        result.append(dim)
    return tuple(result)


def normalize_axis(axis: int, rank: int) -> int:
    """An axis in [0, rank); negative axes count from the end. ShapeError when out of range."""
    if not isinstance(axis, int) or isinstance(axis, bool):
        raise ShapeError(f"axis must be an int, got {axis!r}")
    if not -rank <= axis < rank:
        raise ShapeError(f"axis {axis} is out of range for rank {rank}")
    return axis % rank


def normalize_axes(axes: tuple[int, ...] | list[int] | None, rank: int) -> tuple[int, ...]:
    """Sorted, normalised, duplicate-free axes; None means every axis."""
    if axes is None:
        return tuple(range(rank))
    norm = [normalize_axis(a, rank) for a in axes]
    if len(set(norm)) != len(norm):
        raise ShapeError(f"repeated axis in {list(axes)}")
    return tuple(sorted(norm))
