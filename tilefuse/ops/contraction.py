"""Contractions: matmul (np.matmul semantics) and einsum.

Contracted dims must be the same size: equal ints or the same symbol (a symbol against an int is
rejected rather than guessed). Batch dims broadcast like NumPy, symbols included. Integer
contractions run in the promoted integer type and wrap like NumPy; f16/bf16 accumulate in f32 and
round once.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from tilefuse.dtypes import NUMERIC_TYPES, DType, promote_all
from tilefuse.errors import AttrError, ShapeError
from tilefuse.graph.ir import Attrs
from tilefuse.graph.types import Dim, Shape, broadcast_dims, broadcast_shapes, format_shape
from tilefuse.ops import vjp
from tilefuse.ops.registry import AttrType, OpDef, OpKind, Trait, attr
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


class _Labelled:
    """An operand during the einsum decomposition: a value and the label of each dim."""

    def __init__(self, em: Any, value: Any, labels: tuple[str, ...]):
        self.em, self.value, self.labels = em, value, labels

    def summed(self, keep: set[str]) -> _Labelled:
        axes = tuple(i for i, lab in enumerate(self.labels) if lab not in keep)
        if not axes:
            return self
        value = self.em("sum", self.value, axes=axes, keepdims=False)
        return _Labelled(self.em, value, tuple(lab for lab in self.labels if lab in keep))

    def ordered(self, labels: tuple[str, ...]) -> Any:
        """The value with its dims in the order of ``labels`` (all of its own)."""
        perm = tuple(self.labels.index(lab) for lab in labels)
        if perm == tuple(range(len(perm))):
            return self.value
        return self.em("transpose", self.value, perm=perm)


def _einsum_decompose(builder: Any, inputs: Any, attrs: Attrs, loc: Any = None
                      ) -> tuple[Any, ...]:
    """einsum as the ops kernel formation knows: a diagonal (a label repeated in one operand)
    is a ``where`` with an identity mask summed over one of its axes; a label no later operand
    or the output needs is summed away first; each pair of operands is then one ``matmul``
    over its shared labels (transposed and reshaped to [batch, M, K] @ [batch, K, N]) when the
    shapes are static and the type a float, else a broadcast ``mul`` and ``sum`` (one fused
    reduction kernel);
    a last transpose gives the output order. f16/bf16 operands are computed in f32 and
    rounded once, as the reference does."""
    def em(op: str, *values: Any, **kw: Any) -> Any:
        return builder.add1(op, list(values), kw, loc)

    spec = parse_einsum(attrs["equation"], tuple(v.type.rank for v in inputs))
    sizes = _label_dims(spec, tuple(v.type.shape for v in inputs))
    out = promote_all(tuple(v.dtype for v in inputs))
    work = DType.f32 if out in (DType.f16, DType.bf16) else out
    operands = []
    for v, labels in zip(inputs, spec.inputs):
        v = v if v.dtype is work else em("cast", v, dtype=work)
        operands.append(_diagonal(em, _Labelled(em, v, labels), sizes))
    for op in operands:  # dims of size 1 broadcast against the label's size
        full = tuple(sizes[lab] for lab in op.labels)
        if tuple(op.value.type.shape) != full:
            op.value = em("broadcast_to", op.value, shape=full)
    acc = operands[0]
    for pos in range(1, len(operands)):
        other = operands[pos]
        later = {lab for o in operands[pos + 1:] for lab in o.labels} | set(spec.output)
        acc = _pair(em, acc.summed(later | set(other.labels)),
                    other.summed(later | set(acc.labels)), later, sizes)
    result = acc.summed(set(spec.output)).ordered(spec.output)
    return (result if result.dtype is out else em("cast", result, dtype=out),)


def _diagonal(em: Any, op: _Labelled, sizes: dict[str, Dim]) -> _Labelled:
    """``op`` with each repeated label kept once (its diagonal)."""
    while len(set(op.labels)) != len(op.labels):
        lab = next(x for x in op.labels if op.labels.count(x) > 1)
        p = op.labels.index(lab)
        q = op.labels.index(lab, p + 1)
        n = op.value.type.shape[p]
        if not isinstance(n, int):
            raise ShapeError(f"einsum: the repeated subscript {lab!r} needs a static dim")
        shape = [1] * len(op.labels)
        shape[p] = shape[q] = n
        mask = em("constant", value=np.eye(n, dtype=bool).reshape(shape))
        zero = em("full", shape=(), value=0, dtype=op.value.dtype)
        picked = em("where", mask, op.value, zero)
        value = em("sum", picked, axes=(q,), keepdims=False)
        if value.dtype is not op.value.dtype:  # sum of ints widens: back to the working type
            value = em("cast", value, dtype=op.value.dtype)
        op = _Labelled(em, value, op.labels[:q] + op.labels[q + 1:])
    return op


def _pair(em: Any, a: _Labelled, b: _Labelled, keep: set[str], sizes: dict[str, Dim]
          ) -> _Labelled:
    """The contraction of two operands over their shared labels that ``keep`` lacks."""
    batch = tuple(lab for lab in a.labels if lab in b.labels and lab in keep)
    inner = tuple(lab for lab in a.labels if lab in b.labels and lab not in keep)
    a_only = tuple(lab for lab in a.labels if lab not in b.labels)
    b_only = tuple(lab for lab in b.labels if lab not in a.labels)
    labels = (*batch, *a_only, *b_only)
    dims_of = {lab: sizes[lab] for lab in (*labels, *inner)}
    if not inner or not all(isinstance(d, int) for d in dims_of.values()) or \
            not a.value.dtype.is_float:
        # an outer product, symbolic dims, or integers (the matmul kernel is f32/f64):
        # broadcast multiply and sum the shared labels (one fused reduction kernel)
        full = (*labels, *inner)
        x = em("reshape", a.ordered(tuple(lab for lab in full if lab in a.labels)),
               shape=tuple(dims_of[lab] if lab in a.labels else 1 for lab in full))
        y = em("reshape", b.ordered(tuple(lab for lab in full if lab in b.labels)),
               shape=tuple(dims_of[lab] if lab in b.labels else 1 for lab in full))
        value = em("mul", x, y)
        if inner:
            value = em("sum", value, axes=tuple(range(len(labels), len(full))), keepdims=False)
            if value.dtype is not x.dtype:
                value = em("cast", value, dtype=x.dtype)
        return _Labelled(em, value, labels)
    prod = math.prod
    bt = [dims_of[lab] for lab in batch]
    m, k, n = (prod(dims_of[lab] for lab in g) for g in (a_only, inner, b_only))
    lead = (prod(bt),) if batch else ()
    x = em("reshape", a.ordered((*batch, *a_only, *inner)), shape=(*lead, m, k))
    y = em("reshape", b.ordered((*batch, *inner, *b_only)), shape=(*lead, k, n))
    value = em("matmul", x, y)
    value = em("reshape", value, shape=tuple(dims_of[lab] for lab in labels))
    return _Labelled(em, value, labels)


EINSUM = OpDef("einsum", OpKind.CONTRACTION, None, _einsum_rule, promoted,
               _contract_ref(_einsum), attrs=(attr("equation", AttrType.STR),),
               accepts=NUMERIC_TYPES, traits=frozenset({Trait.COMPOSITE}),
               decompose=_einsum_decompose, vjp=vjp.einsum_vjp,
               doc="np.einsum on operands promoted to one dtype; decomposed into matmul, "
                   "transpose, reshape, mul and sum (its contractions run as matmul kernels)")

DEFINITIONS: tuple[OpDef, ...] = (MATMUL, EINSUM)
