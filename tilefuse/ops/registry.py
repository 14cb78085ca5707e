"""How an op is defined: one :class:`OpDef` holds everything tilefuse knows about it.

An OpDef carries the attribute schema, the shape rule, the dtype rule, the NumPy reference
implementation (used by constant folding and by the reference interpreter that every test
compares against), the op's kind, and optionally a decomposition into simpler ops and a
tensor-expression lowering (the CPU backend fills that slot). Ops are defined in the modules of
this package, each exporting a tuple ``DEFINITIONS``; :mod:`tilefuse.ops` gathers them into one
read-only mapping. There is no mutable registration.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tilefuse.dtypes import ALL_TYPES, DType
from tilefuse.errors import AttrError, DTypeError
from tilefuse.graph.ir import Attrs, Literal, freeze_attr
from tilefuse.graph.types import Shape


class OpKind(enum.Enum):
    """What an op does, as far as fusion and scheduling care."""

    ELEMENTWISE = "elementwise"   # out[i] = f(in0[i], in1[i], ...) after broadcasting
    REDUCTION = "reduction"       # folds some axes (sum, max, softmax's row passes, pooling)
    CONTRACTION = "contraction"   # multiply-accumulate over shared axes (matmul, einsum, conv)
    MOVEMENT = "movement"         # rearranges elements without arithmetic (reshape, slice, ...)
    SOURCE = "source"             # makes a tensor from attributes alone (constant, arange, full)
    OPAQUE = "opaque"             # none of the above; never fused

    @property
    def fusible(self) -> bool:
        return self in FUSIBLE_KINDS


FUSIBLE_KINDS = frozenset({OpKind.ELEMENTWISE, OpKind.MOVEMENT, OpKind.SOURCE})


class Trait(enum.Enum):
    """Algebraic facts about an op that passes may rely on."""

    COMMUTATIVE = "commutative"
    ASSOCIATIVE = "associative"
    IDEMPOTENT = "idempotent"       # f(f(x)) == f(x)
    INVOLUTION = "involution"       # f(f(x)) == x
    COMPOSITE = "composite"         # has a decomposition into simpler ops
    MULTI_OUTPUT = "multi_output"


class AttrType(enum.Enum):
    INT = "int"
    FLOAT = "float"
    BOOL = "bool"
    STR = "str"
    INTS = "ints"          # tuple of ints
    FLOATS = "floats"      # tuple of floats
    OPT_INTS = "ints?"     # tuple of ints or None
    OPT_INT = "int?"       # int or None
    DTYPE = "dtype"
    LITERAL = "literal"    # an array payload
    ANY = "any"            # a tuple of anything hashable (einsum subscripts, slices)


_REQUIRED = object()


@dataclass(frozen=True)
class AttrSpec:
    """One attribute: its name, type, default (absent means required) and allowed values."""

    name: str
    type: AttrType
    default: Any = _REQUIRED
    choices: tuple[Any, ...] | None = None

    @property
    def required(self) -> bool:
        return self.default is _REQUIRED


def attr(name: str, type_: AttrType, default: Any = _REQUIRED,
         choices: tuple[Any, ...] | None = None) -> AttrSpec:
    return AttrSpec(name, type_, default, choices)


ShapeRule = Callable[[tuple[Shape, ...], Attrs], tuple[Shape, ...]]
DTypeRule = Callable[[tuple[DType, ...], Attrs], tuple[DType, ...]]
Reference = Callable[..., Any]


@dataclass(frozen=True, eq=False)
class OpDef:
    """Everything about one op. ``arity`` is the number of inputs, or None for variadic ops.

    ``shape_rule`` and ``dtype_rule`` get the input shapes / dtypes and the validated attrs and
    return one entry per output; they raise ShapeError / DTypeError with a plain message, and the
    caller adds the op name, input types and source line. ``reference(*arrays, **attrs)`` returns
    an array (or a tuple for multi-output ops) with exactly the inferred shape and dtype.
    ``vjp(d, inputs, output, grad, **attrs)`` gives the gradient of each input (None where an
    input has none) from the gradient of the single output, built with the
    :class:`tilefuse.graph.autodiff.GradEmitter` ``d``; ops without it are not differentiable.
    """

    name: str
    kind: OpKind
    arity: int | None
    shape_rule: ShapeRule
    dtype_rule: DTypeRule
    reference: Reference
    attrs: tuple[AttrSpec, ...] = ()
    traits: frozenset[Trait] = frozenset()
    accepts: frozenset[DType] = ALL_TYPES
    decompose: Callable[..., Any] | None = None   # (builder, inputs, attrs, loc) -> outputs
    lowering: Callable[..., Any] | None = None    # tensor-expression lowering (CPU backend)
    vjp: Callable[..., Any] | None = None         # reverse-mode rule, see graph/autodiff.py
    doc: str = ""
    _attr_index: Mapping[str, AttrSpec] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_attr_index", {a.name: a for a in self.attrs})

    def __repr__(self) -> str:
        return f"OpDef({self.name})"

    def has(self, trait: Trait) -> bool:
        return trait in self.traits

    def validate_attrs(self, given: Mapping[str, Any]) -> Attrs:
        """Fills defaults, rejects unknown or missing attributes and checks each one's type."""
        for name in given:
            if name not in self._attr_index:
                known = ", ".join(self._attr_index) or "none"
                raise AttrError(f"unknown attribute {name!r} (known: {known})", op=self.name)
        values: dict[str, Any] = {}
        for spec in self.attrs:
            if spec.name in given:
                values[spec.name] = _check_attr(self.name, spec, given[spec.name])
            elif spec.required:
                raise AttrError(f"missing required attribute {spec.name!r}", op=self.name)
            else:
                values[spec.name] = freeze_attr(spec.default)
        return Attrs(values)

    def check_dtypes(self, dtypes: tuple[DType, ...]) -> None:
        for dt in dtypes:
            if dt not in self.accepts:
                allowed = ", ".join(sorted(t.value for t in self.accepts))
                raise DTypeError(f"does not accept {dt.value} (accepts {allowed})", op=self.name)


def _is_int(v: Any) -> bool:
    return isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_))


def _check_attr(op: str, spec: AttrSpec, value: Any) -> Any:
    v = freeze_attr(value)
    t = spec.type
    ok = {
        AttrType.INT: lambda: _is_int(v),
        AttrType.OPT_INT: lambda: v is None or _is_int(v),
        AttrType.FLOAT: lambda: isinstance(v, (int, float)) and not isinstance(v, bool),
        AttrType.BOOL: lambda: isinstance(v, bool),
        AttrType.STR: lambda: isinstance(v, str),
        AttrType.INTS: lambda: isinstance(v, tuple) and all(_is_int(x) for x in v),
        AttrType.OPT_INTS: lambda: v is None or (isinstance(v, tuple)
                                                 and all(_is_int(x) for x in v)),
        AttrType.FLOATS: lambda: isinstance(v, tuple) and all(
            isinstance(x, (int, float)) and not isinstance(x, bool) for x in v),
        AttrType.DTYPE: lambda: isinstance(v, DType),
        AttrType.LITERAL: lambda: isinstance(v, Literal),
        AttrType.ANY: lambda: True,
    }[t]()
    if not ok:
        raise AttrError(f"attribute {spec.name!r} must be {t.value}, got {value!r}", op=op)
    if t is AttrType.FLOAT:
        v = float(v)
    if t is AttrType.FLOATS:
        v = tuple(float(x) for x in v)
    if t in (AttrType.INTS, AttrType.OPT_INTS) and v is not None:
        v = tuple(int(x) for x in v)
    if spec.choices is not None and v not in spec.choices:
        raise AttrError(f"attribute {spec.name!r} must be one of {list(spec.choices)}, "
                        f"got {value!r}", op=op)
    return v
