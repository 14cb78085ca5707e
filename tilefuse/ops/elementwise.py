"""Elementwise ops: unary math, binary arithmetic and comparisons with broadcasting, where, cast."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import scipy.special

from tilefuse.dtypes import FLOAT_TYPES, NUMERIC_TYPES, DType
from tilefuse.ops.registry import AttrType, OpDef, OpKind, Trait, attr
from tilefuse.ops.rules import (
    as_dtype,
    boolean,
    broadcast,
    float_promoted,
    in_f32,
    promoted,
    same_dtype,
    same_shape,
)

# ---- unary -----------------------------------------------------------------------------------


def _unary(name: str, ref: Callable[..., np.ndarray], *, accepts: frozenset[DType] = FLOAT_TYPES,
           dtype_rule: Callable = same_dtype, traits: frozenset[Trait] = frozenset(),
           attrs: tuple = (), doc: str = "") -> OpDef:
    return OpDef(name, OpKind.ELEMENTWISE, 1, same_shape, dtype_rule, ref, attrs=attrs,
                 traits=traits, accepts=accepts, doc=doc)


def _gelu(x: np.ndarray, approximate: str) -> np.ndarray:
    if approximate == "tanh":
        c = np.sqrt(2.0 / np.pi).astype(x.dtype)
        return 0.5 * x * (1.0 + np.tanh(c * (x + 0.044715 * x * x * x)))
    return 0.5 * x * (1.0 + scipy.special.erf(x / np.sqrt(2.0).astype(x.dtype)))


NEG = _unary("neg", lambda x: np.negative(x), accepts=NUMERIC_TYPES,
             traits=frozenset({Trait.INVOLUTION}), doc="-x")
EXP = _unary("exp", in_f32(np.exp))
TANH = _unary("tanh", in_f32(np.tanh))
GELU = _unary("gelu", in_f32(_gelu),
              attrs=(attr("approximate", AttrType.STR, "none", choices=("none", "tanh")),),
              doc="x·Φ(x), exactly (erf) or with the tanh approximation")

# ---- binary ----------------------------------------------------------------------------------


def _binary(name: str, ref: Callable[..., np.ndarray], *, accepts: frozenset[DType] = NUMERIC_TYPES,
            dtype_rule: Callable = promoted, traits: frozenset[Trait] = frozenset(),
            doc: str = "") -> OpDef:
    def reference(a: np.ndarray, b: np.ndarray) -> np.ndarray:
        (out,) = dtype_rule((_dt(a), _dt(b)), {})
        return as_dtype(ref(a, b), out)
    return OpDef(name, OpKind.ELEMENTWISE, 2, broadcast, dtype_rule, reference, traits=traits,
                 accepts=accepts, doc=doc)


def _dt(a: np.ndarray) -> DType:
    from tilefuse.dtypes import from_numpy
    return from_numpy(a.dtype)


_CA = frozenset({Trait.COMMUTATIVE, Trait.ASSOCIATIVE})

ADD = _binary("add", in_f32(np.add), traits=_CA)
MUL = _binary("mul", in_f32(np.multiply), traits=_CA)
DIV = _binary("div", in_f32(np.true_divide), dtype_rule=float_promoted)
LT = _binary("lt", np.less, dtype_rule=boolean)

# ---- where, cast -----------------------------------------------------------------------------


def _where_dtype(dtypes: tuple[DType, ...], attrs: object) -> tuple[DType, ...]:
    return promoted(dtypes[1:], attrs)  # type: ignore[arg-type]


def _where_ref(c: np.ndarray, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    (out,) = _where_dtype((_dt(c), _dt(a), _dt(b)), {})
    return as_dtype(np.where(c.astype(bool), a.astype(out.np), b.astype(out.np)), out)


WHERE = OpDef("where", OpKind.ELEMENTWISE, 3, broadcast, _where_dtype, _where_ref,
              doc="cond ? a : b, broadcasting all three")

CAST = OpDef("cast", OpKind.ELEMENTWISE, 1, same_shape,
             lambda dtypes, attrs: (attrs["dtype"],),
             lambda x, dtype: x.astype(dtype.np),
             attrs=(attr("dtype", AttrType.DTYPE),), doc="converts the element type (C casts)")


DEFINITIONS: tuple[OpDef, ...] = (NEG, EXP, TANH, GELU, ADD, MUL, DIV, LT, WHERE, CAST)
