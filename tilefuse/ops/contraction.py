"""Contractions: matmul (np.matmul semantics) and einsum.

Contracted dims must be the same size: equal ints or the same symbol (a symbol against an int is
rejected rather than guessed). Batch dims broadcast like NumPy, symbols included. Integer
contractions run in the promoted integer type and wrap like NumPy; f16/bf16 accumulate in f32 and
round once.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from tilefuse.dtypes import NUMERIC_TYPES, promote_all
from tilefuse.errors import AttrError, ShapeError
from tilefuse.graph.ir import Attrs
from tilefuse.graph.types import Dim, Shape, broadcast_dims, broadcast_shapes, format_shape
from tilefuse.ops import vjp
from tilefuse.ops.registry import AttrType, OpDef, OpKind, attr
from tilefuse.ops.rules import as_dtype, dtype_of, promoted, quiet, work_dtype

# ---- matmul ----------------------------------------------------------------------------------


def _matmul_rule(shapes: tuple[Shape, ...], attrs: Attrs) -> tuple[Shape, ...]:
    a, b = shapes
    if not a or not b:
        raise ShapeError("matmul needs operands of rank >= 1")
    a2 = (1, *a) if len(a) == 1 else a
    b2 = (*b, 1) if len(b) == 1 else b
    if a2[-1] != b2[-2]:
        raise ShapeError(f"contraction dims differ: {a2[-1]} (last of {format_shape(a)}) vs "
                         f"{b2[-2]} ({'only' if len(b) == 1 else 'second-to-last'} of "
                         f"{format_shape(b)})")
    try:
        batch = broadcast_shapes(a2[:-2], b2[:-2])
    except ShapeError:
        raise ShapeError(f"batch dims of {format_shape(a)} and {format_shape(b)} do not "
                         "broadcast") from None
    out = (*batch, *((a2[-2],) if len(a) > 1 else ()), *((b2[-1],) if len(b) > 1 else ()))
    return (out,)


def _contract_ref(fn: Any) -> Any:
    """Runs ``fn`` on operands cast to the computation dtype and rounds once to the result."""

    def reference(*arrays: np.ndarray, **attrs: Any) -> np.ndarray:
        out = promote_all(tuple(dtype_of(a) for a in arrays))
        work = work_dtype(out)
        return as_dtype(fn(*(a.astype(work, copy=False) for a in arrays), **attrs), out)

    return quiet(reference)


def _swap_last(d: Any, v: Any) -> Any:
    rank = v.type.rank
    return d.op("transpose", v, perm=(*range(rank - 2), rank - 1, rank - 2))


def _matmul_vjp(d: Any, ins: Any, out: Any, g: Any) -> tuple[Any, ...]:
    """dA = g·Bᵀ and dB = Aᵀ·g, with 1-D operands promoted as np.matmul does and batch dims
    that were broadcast summed away."""
    a, b = ins
    a2 = d.op("expand_dims", a, axes=(0,)) if a.type.rank == 1 else a
    b2 = d.op("expand_dims", b, axes=(1,)) if b.type.rank == 1 else b
    g2 = d.op("expand_dims", g, axes=(-2,)) if a.type.rank == 1 else g
    g2 = d.op("expand_dims", g2, axes=(-1,)) if b.type.rank == 1 else g2
    ga = d.sum_to(d.op("matmul", g2, _swap_last(d, b2)), a2)
    gb = d.sum_to(d.op("matmul", _swap_last(d, a2), g2), b2)
    return (d.op("reshape", ga, shape=a.type.shape) if a is not a2 else ga,
            d.op("reshape", gb, shape=b.type.shape) if b is not b2 else gb)


MATMUL = OpDef("matmul", OpKind.CONTRACTION, 2, _matmul_rule, promoted, _contract_ref(np.matmul),
               accepts=NUMERIC_TYPES, vjp=_matmul_vjp,
               doc="np.matmul: 1-D operands are promoted and their dim removed; batch dims "
                   "broadcast")

# ---- einsum ----------------------------------------------------------------------------------

_ELLIPSIS = "..."


@dataclass(frozen=True)
class EinsumSpec:
    """A parsed equation. Ellipsis dims get labels "...0", "...1" (right-aligned, broadcast)."""

    inputs: tuple[tuple[str, ...], ...]
    output: tuple[str, ...]


def _split_term(term: str, equation: str) -> tuple[list[str], bool]:
    """The letters of one term and whether it holds an ellipsis."""
    if term.count(_ELLIPSIS) > 1:
        raise AttrError(f"einsum equation {equation!r}: more than one ellipsis in {term!r}")
    has_ellipsis = _ELLIPSIS in term
    letters = list(term.replace(_ELLIPSIS, "", 1))
    bad = [c for c in letters if not (c.isascii() and c.isalpha())]
    if bad:
        raise AttrError(f"einsum equation {equation!r}: subscripts must be letters, got {bad[0]!r}")
    return letters, has_ellipsis


def _expand(term: str, equation: str, n: int, total: int) -> tuple[str, ...]:
    """The labels of a term whose ellipsis covers ``n`` dims, right-aligned among ``total``
    ellipsis labels like NumPy broadcasting."""
    letters, has_ellipsis = _split_term(term, equation)
    if not has_ellipsis:
        return tuple(letters)
    head = term.index(_ELLIPSIS)
    return (*letters[:head], *(f"...{i}" for i in range(total - n, total)), *letters[head:])


def parse_einsum(equation: str, ranks: tuple[int, ...]) -> EinsumSpec:
    """Parses and validates ``equation`` for operands of ``ranks`` (NumPy's einsum rules)."""
    eq = equation.replace(" ", "")
    if eq.count("->") > 1:
        raise AttrError(f"einsum equation {equation!r} has more than one '->'")
    lhs, arrow, rhs = eq.partition("->")
    terms = lhs.split(",")
    if len(terms) != len(ranks):
        raise ShapeError(f"einsum equation {equation!r} names {len(terms)} operands, "
                         f"got {len(ranks)}")
    ell_ranks = []
    for term, rank in zip(terms, ranks):
        letters, has_ellipsis = _split_term(term, equation)
        if len(letters) > rank or (len(letters) != rank and not has_ellipsis):
            raise ShapeError(f"einsum term {term!r} has {len(letters)} subscripts for an "
                             f"operand of rank {rank}")
        ell_ranks.append(rank - len(letters) if has_ellipsis else 0)
    total = max(ell_ranks, default=0)
    inputs = tuple(_expand(t, equation, n, total) for t, n in zip(terms, ell_ranks))
    ell_labels = tuple(f"...{i}" for i in range(total))
    if arrow:
        return EinsumSpec(inputs, _explicit_output(rhs, equation, inputs, ell_labels))
    counts: dict[str, int] = {}
    for labs in inputs:
        for lab in labs:
            counts[lab] = counts.get(lab, 0) + 1
    once = sorted(lab for lab, c in counts.items() if c == 1 and not lab.startswith("."))
    return EinsumSpec(inputs, (*ell_labels, *once))


def _explicit_output(rhs: str, equation: str, inputs: tuple[tuple[str, ...], ...],
                     ell_labels: tuple[str, ...]) -> tuple[str, ...]:
    letters, has_ellipsis = _split_term(rhs, equation)
    if len(set(letters)) != len(letters):
        raise AttrError(f"einsum equation {equation!r}: repeated output subscript")
    seen = {lab for labs in inputs for lab in labs}
    missing = [c for c in letters if c not in seen]
    if missing:
        raise AttrError(f"einsum equation {equation!r}: output subscript {missing[0]!r} does not "
                        "appear in the inputs")
    if ell_labels and not has_ellipsis:
        raise ShapeError(f"einsum equation {equation!r}: the ellipsis dims need an '...' in the "
                         "output")
    if not has_ellipsis:
        return tuple(letters)
    head = rhs.index(_ELLIPSIS)
    return (*letters[:head], *ell_labels, *letters[head:])


def _label_dims(spec: EinsumSpec, shapes: tuple[Shape, ...]) -> dict[str, Dim]:
    """The size of each label; a label repeated in one operand must have equal dims there, and
    across operands dims broadcast (as np.einsum allows)."""
    sizes: dict[str, Dim] = {}
    for labs, shape in zip(spec.inputs, shapes):
        local: dict[str, Dim] = {}
        for lab, dim in zip(labs, shape):
            if lab in local and local[lab] != dim:
                raise ShapeError(f"subscript {lab!r} repeated in one operand with dims "
                                 f"{local[lab]} and {dim}")
            local[lab] = dim
        for lab, dim in local.items():
            try:
                sizes[lab] = broadcast_dims(sizes.get(lab, 1), dim)
            except ShapeError:
                raise ShapeError(f"subscript {lab!r} has dims {sizes[lab]} and {dim}") from None
    return sizes


def _einsum_rule(shapes: tuple[Shape, ...], attrs: Attrs) -> tuple[Shape, ...]:
    if not shapes:
        raise ShapeError("einsum needs at least one operand")
    equation = attrs["equation"]
    spec = parse_einsum(equation, tuple(len(s) for s in shapes))
    sizes = _label_dims(spec, shapes)
    return (tuple(sizes[lab] for lab in spec.output),)


def _einsum(*arrays: np.ndarray, equation: str) -> np.ndarray:
    return np.einsum(equation, *arrays, optimize=len(arrays) > 1)


EINSUM = OpDef("einsum", OpKind.CONTRACTION, None, _einsum_rule, promoted,
               _contract_ref(_einsum), attrs=(attr("equation", AttrType.STR),),
               accepts=NUMERIC_TYPES, vjp=vjp.einsum_vjp,
               doc="np.einsum on operands promoted to one dtype")

DEFINITIONS: tuple[OpDef, ...] = (MATMUL, EINSUM)
