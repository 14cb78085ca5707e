"""Elementwise ops: unary math, binary arithmetic and comparisons with broadcasting, where, cast,
clip.

Every reference here follows one recipe (:func:`_mapped`): infer the output dtype with the op's
own dtype rule, cast the inputs to the dtype the computation runs in (the promoted input type for
comparisons, else the output type, with f16/bf16 widened to f32), apply the NumPy function, and
round once to the output dtype. Float math on integer or bool inputs follows NumPy's idea of the
result (f64), which the ``float_promoted`` dtype rule expresses.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from tilefuse.dtypes import ALL_TYPES, NUMERIC_TYPES, DType, promote_all
from tilefuse.errors import AttrError, DTypeError
from tilefuse.graph.ir import Attrs
from tilefuse.graph.types import Shape
from tilefuse.ops.registry import AttrType, OpDef, OpKind, Trait, attr
from tilefuse.ops.rules import (
    as_dtype,
    boolean,
    broadcast,
    dtype_of,
    float_promoted,
    promoted,
    quiet,
    same_dtype,
    same_shape,
    work_dtype,
)
from tilefuse.special import erf, expit

DTypeRule = Callable[[tuple[DType, ...], Any], tuple[DType, ...]]
Lowering = Callable[..., Any]
"""``lowering(ops, *args, **attrs) -> Expr``: the op as a loop-IR expression, written against
:class:`tilefuse.kernel.scalar_expr.ExprOps` (``ops``) and Python operators on the ``args``."""
Vjp = Callable[..., tuple[Any, ...]]
"""``vjp(d, inputs, out, g, **attrs)``: each input's gradient from the output's gradient ``g``,
built with :class:`tilefuse.graph.autodiff.GradEmitter` ``d``; None for an input without one."""


def _mapped(fn: Callable[..., Any], dtype_rule: DTypeRule) -> Callable[..., np.ndarray]:
    """The reference for an elementwise NumPy function under tilefuse's dtype rules."""

    def reference(*arrays: np.ndarray, **attrs: Any) -> np.ndarray:
        in_types = tuple(dtype_of(a) for a in arrays)
        (out,) = dtype_rule(in_types, attrs)
        computed_as = promote_all(in_types) if out is DType.bool and in_types else out
        work = work_dtype(computed_as)
        with np.errstate(all="ignore"):  # overflow to inf in the final rounding too
            result = fn(*(a.astype(work, copy=False) for a in arrays), **attrs)
            return as_dtype(result, out)

    reference.__name__ = getattr(fn, "__name__", "reference")
    return reference


# ---- unary -----------------------------------------------------------------------------------


def _unary(name: str, fn: Callable[..., Any], *, accepts: frozenset[DType] = ALL_TYPES,
           dtype_rule: DTypeRule = float_promoted, traits: frozenset[Trait] = frozenset(),
           attrs: tuple = (), doc: str = "", lowering: Lowering | None = None,
           vjp: Vjp | None = None) -> OpDef:
    """A unary op; by default float math that takes any input and gives f64 for ints/bools."""
    return OpDef(name, OpKind.ELEMENTWISE, 1, same_shape, dtype_rule, _mapped(fn, dtype_rule),
                 attrs=attrs, traits=traits, accepts=accepts, doc=doc, lowering=lowering,
                 vjp=vjp)


def _numeric(name: str, fn: Callable[..., Any], traits: frozenset[Trait] = frozenset(),
             doc: str = "", lowering: Lowering | None = None, vjp: Vjp | None = None) -> OpDef:
    """A unary op on numbers that keeps the input dtype."""
    return _unary(name, fn, accepts=NUMERIC_TYPES, dtype_rule=same_dtype, traits=traits, doc=doc,
                  lowering=lowering, vjp=vjp)


def _gelu(x: np.ndarray, approximate: str) -> np.ndarray:
    if approximate == "tanh":
        c = np.sqrt(2.0 / np.pi).astype(x.dtype)
        return 0.5 * x * (1.0 + np.tanh(c * (x + 0.044715 * x * x * x)))
    return 0.5 * x * (1.0 + erf(x / np.sqrt(2.0).astype(x.dtype)))


def _relu(x: np.ndarray) -> np.ndarray:
    return np.maximum(x, x.dtype.type(0))  # NaN stays NaN, like np.maximum


def _gelu_lowering(ops: Any, x: Any, approximate: str) -> Any:
    def gelu(v: Any) -> Any:
        if approximate == "tanh":
            inner = float(np.sqrt(2.0 / np.pi)) * (v + 0.044715 * v * v * v)
            return 0.5 * v * (1.0 + ops.call("tanh", inner))
        return 0.5 * v * (1.0 + ops.call("erf", v / float(np.sqrt(2.0))))

    return ops.map(gelu, x)


def _sign_lowering(ops: Any, x: Any) -> Any:
    def sign(v: Any) -> Any:
        positive = ops.call("select", ops.call("gt", v, 0), 1, v)  # NaN and ±0 pass through
        if v.dtype is DType.u8:
            return positive
        return ops.call("select", ops.call("lt", v, 0), -1, positive)

    return ops.map(sign, x)


def _rounding(name: str) -> Lowering:
    return lambda ops, x: ops.unary(name, x) if x.dtype.is_float else x


# ---- gradients (reverse-mode rules; see tilefuse.graph.autodiff) -------------------------------


def _chain(local: Callable[..., Any]) -> Vjp:
    """The rule of a unary op whose derivative is ``local(d, x, out)``: ``g · local``."""
    return lambda d, ins, out, g, **_: (d.op("mul", g, local(d, ins[0], out)),)


def _one_minus(d: Any, v: Any) -> Any:
    return d.op("sub", d.scalar(1, v), v)


def _relu_vjp(d: Any, ins: Any, out: Any, g: Any) -> tuple[Any, ...]:
    return (d.select(d.op("gt", ins[0], d.scalar(0, ins[0])), g),)


def _erf_derivative(d: Any, x: Any, out: Any) -> Any:
    gauss = d.op("exp", d.op("neg", d.op("mul", x, x)))
    return d.op("mul", gauss, d.scalar(2.0 / np.sqrt(np.pi), x))


def _silu_derivative(d: Any, x: Any, out: Any) -> Any:
    sig = d.op("sigmoid", x)
    return d.op("mul", sig, d.op("add", d.scalar(1, x), d.op("mul", x, _one_minus(d, sig))))


def _gelu_vjp(d: Any, ins: Any, out: Any, g: Any, approximate: str) -> tuple[Any, ...]:
    """d/dx x·Φ(x) = Φ(x) + x·φ(x); with the tanh form, the derivative of that form."""
    x = ins[0]
    if approximate == "tanh":
        c, k = np.sqrt(2.0 / np.pi), 0.044715
        x2 = d.op("mul", x, x)
        inner = d.op("mul", d.scalar(c, x), d.op("add", x, d.op("mul", d.scalar(k, x),
                                                                 d.op("mul", x2, x))))
        t = d.op("tanh", inner)
        du = d.op("mul", d.scalar(c, x), d.op("add", d.scalar(1, x),
                                              d.op("mul", d.scalar(3 * k, x), x2)))
        half_x = d.op("mul", d.scalar(0.5, x), x)
        local = d.op("add", d.op("mul", d.scalar(0.5, x), d.op("add", d.scalar(1, x), t)),
                     d.op("mul", half_x, d.op("mul", _one_minus(d, d.op("mul", t, t)), du)))
    else:
        cdf = d.op("mul", d.scalar(0.5, x), d.op("add", d.scalar(1, x), d.op(
            "erf", d.op("mul", x, d.scalar(1 / np.sqrt(2.0), x)))))
        pdf = d.op("mul", d.op("exp", d.op("mul", d.scalar(-0.5, x), d.op("mul", x, x))),
                   d.scalar(1 / np.sqrt(2 * np.pi), x))
        local = d.op("add", cdf, d.op("mul", x, pdf))
    return (d.op("mul", g, local),)


def _no_gradient(d: Any, ins: Any, out: Any, g: Any, **_: Any) -> tuple[Any, ...]:
    """Piecewise-constant ops (floor, sign...): the derivative is zero where it exists."""
    return (None,) * len(ins)


def _add_vjp(d: Any, ins: Any, out: Any, g: Any) -> tuple[Any, ...]:
    return d.sum_to(g, ins[0]), d.sum_to(g, ins[1])


def _sub_vjp(d: Any, ins: Any, out: Any, g: Any) -> tuple[Any, ...]:
    return d.sum_to(g, ins[0]), d.sum_to(d.op("neg", g), ins[1])


def _mul_vjp(d: Any, ins: Any, out: Any, g: Any) -> tuple[Any, ...]:
    a, b = ins
    return d.sum_to(d.op("mul", g, b), a), d.sum_to(d.op("mul", g, a), b)


def _div_vjp(d: Any, ins: Any, out: Any, g: Any) -> tuple[Any, ...]:
    a, b = ins
    ga = d.op("div", g, b)
    return d.sum_to(ga, a), d.sum_to(d.op("neg", d.op("mul", ga, out)), b)


def _pow_vjp(d: Any, ins: Any, out: Any, g: Any) -> tuple[Any, ...]:
    a, b = ins
    ga = d.op("mul", g, d.op("mul", b, d.op("pow", a, d.op("sub", b, d.scalar(1, b)))))
    gb = d.op("mul", g, d.op("mul", out, d.op("log", a)))
    return d.sum_to(ga, a), d.sum_to(gb, b)


def _pick_vjp(compare: str) -> Vjp:
    """maximum/minimum: the gradient goes to the operand that was picked (``a`` on ties)."""

    def vjp(d: Any, ins: Any, out: Any, g: Any) -> tuple[Any, ...]:
        a, b = ins
        took_a = d.op(compare, a, b)
        return (d.sum_to(d.select(took_a, g), a),
                d.sum_to(d.select(d.op("logical_not", took_a), g), b))

    return vjp


def _where_vjp(d: Any, ins: Any, out: Any, g: Any) -> tuple[Any, ...]:
    c, a, b = ins
    cond = d.op("cast", c, dtype=DType.bool)
    return (None, d.sum_to(d.select(cond, g), a),
            d.sum_to(d.select(d.op("logical_not", cond), g), b))


def _cast_vjp(d: Any, ins: Any, out: Any, g: Any, dtype: DType) -> tuple[Any, ...]:
    return (d.cast_like(g, ins[0]) if ins[0].type.dtype.is_float else None,)


def _clip_vjp(d: Any, ins: Any, out: Any, g: Any, min: float | None,
              max: float | None) -> tuple[Any, ...]:
    x = ins[0]
    inside = None
    for bound, compare in ((min, "ge"), (max, "le")):
        if bound is not None:
            test = d.op(compare, x, d.scalar(bound, x))
            inside = test if inside is None else d.op("logical_and", inside, test)
    return (g if inside is None else d.select(inside, g),)


_IDEMPOTENT = frozenset({Trait.IDEMPOTENT})
_INVOLUTION = frozenset({Trait.INVOLUTION})

NEG = _numeric("neg", np.negative, _INVOLUTION, "-x (integers wrap)",
               lowering=lambda ops, x: ops.unary("neg", x),
               vjp=lambda d, ins, out, g: (d.op("neg", g),))
ABS = _numeric("abs", np.abs, _IDEMPOTENT, "|x| (abs of the most negative integer wraps)",
               lowering=lambda ops, x: ops.unary("abs", x),
               vjp=_chain(lambda d, x, out: d.op("sign", x)))
RELU = _numeric("relu", _relu, _IDEMPOTENT, "max(x, 0), NaN-propagating",
                lowering=lambda ops, x: ops.map(lambda v: ops.call("max", v, 0), x),
                vjp=_relu_vjp)
SIGN = _numeric("sign", np.sign, doc="-1, 0 or 1 (NaN for NaN)", lowering=_sign_lowering,
               vjp=_no_gradient)
FLOOR = _numeric("floor", np.floor, _IDEMPOTENT, "rounds down; identity on integers",
                 lowering=_rounding("floor"), vjp=_no_gradient)
CEIL = _numeric("ceil", np.ceil, _IDEMPOTENT, "rounds up; identity on integers",
                lowering=_rounding("ceil"), vjp=_no_gradient)
ROUND = _numeric("round", np.round, _IDEMPOTENT, "rounds half to even, like np.round",
                 lowering=_rounding("round"), vjp=_no_gradient)

EXP = _unary("exp", np.exp, lowering=lambda ops, x: ops.unary("exp", x),
             vjp=_chain(lambda d, x, out: out))
LOG = _unary("log", np.log, lowering=lambda ops, x: ops.unary("log", x),
             vjp=_chain(lambda d, x, out: d.op("reciprocal", x)))
LOG1P = _unary("log1p", np.log1p, lowering=lambda ops, x: ops.unary("log1p", x),
               vjp=_chain(lambda d, x, out: d.op("reciprocal", d.op("add", x, d.scalar(1, x)))))
EXPM1 = _unary("expm1", np.expm1, lowering=lambda ops, x: ops.unary("expm1", x),
               vjp=_chain(lambda d, x, out: d.op("exp", x)))
SQRT = _unary("sqrt", np.sqrt, lowering=lambda ops, x: ops.unary("sqrt", x),
              vjp=_chain(lambda d, x, out: d.op("div", d.scalar(0.5, out), out)))
RSQRT = _unary("rsqrt", lambda x: 1.0 / np.sqrt(x), doc="1/sqrt(x)",
               lowering=lambda ops, x: ops.unary("rsqrt", x),
               vjp=_chain(lambda d, x, out: d.op("mul", d.scalar(-0.5, out),
                                                 d.op("div", out, x))))
RECIPROCAL = _unary("reciprocal", lambda x: 1.0 / x, doc="1/x (f64 for integer inputs)",
                    lowering=lambda ops, x: ops.map(lambda v: ops.call("div", 1.0, v), x),
                    vjp=_chain(lambda d, x, out: d.op("neg", d.op("mul", out, out))))
TANH = _unary("tanh", np.tanh, lowering=lambda ops, x: ops.unary("tanh", x),
              vjp=_chain(lambda d, x, out: _one_minus(d, d.op("mul", out, out))))
SIGMOID = _unary("sigmoid", expit, doc="1/(1+exp(-x))",
                 lowering=lambda ops, x: ops.unary("sigmoid", x),
                 vjp=_chain(lambda d, x, out: d.op("mul", out, _one_minus(d, out))))
ERF = _unary("erf", erf, lowering=lambda ops, x: ops.unary("erf", x),
             vjp=_chain(_erf_derivative))
GELU = _unary("gelu", _gelu,
              attrs=(attr("approximate", AttrType.STR, "none", choices=("none", "tanh")),),
              doc="x·Φ(x), exactly (erf) or with the tanh approximation", lowering=_gelu_lowering,
              vjp=_gelu_vjp)
SILU = _unary("silu", lambda x: x * expit(x), doc="x·sigmoid(x)",
              lowering=lambda ops, x: ops.map(lambda v: v * ops.call("sigmoid", v), x),
              vjp=_chain(_silu_derivative))
SOFTPLUS = _unary("softplus", lambda x: np.logaddexp(x.dtype.type(0), x), doc="log(1+exp(x))",
                  lowering=lambda ops, x: ops.map(lambda v: ops.call("max", v, 0) + ops.call(
                      "log1p", ops.call("exp", -ops.call("abs", v))), x),
                  vjp=_chain(lambda d, x, out: d.op("sigmoid", x)))
SIN = _unary("sin", np.sin, lowering=lambda ops, x: ops.unary("sin", x),
             vjp=_chain(lambda d, x, out: d.op("cos", x)))
COS = _unary("cos", np.cos, lowering=lambda ops, x: ops.unary("cos", x),
             vjp=_chain(lambda d, x, out: d.op("neg", d.op("sin", x))))

LOGICAL_NOT = _unary("logical_not", np.logical_not, dtype_rule=boolean, traits=_INVOLUTION,
                     doc="x == 0, for any input dtype",
                     lowering=lambda ops, x: ops.logical("not", x))
ISNAN = _unary("isnan", np.isnan, dtype_rule=boolean, doc="False everywhere for integers",
               lowering=lambda ops, x: ops.map(lambda v: ops.call("isnan", v), x, dtype=x.dtype)
               if x.dtype.is_float else ops.const(False, DType.bool))

# ---- binary ----------------------------------------------------------------------------------


def _binary(name: str, fn: Callable[..., Any], *, accepts: frozenset[DType] = ALL_TYPES,
            dtype_rule: DTypeRule = promoted, traits: frozenset[Trait] = frozenset(),
            doc: str = "", lowering: Lowering | None = None, vjp: Vjp | None = None) -> OpDef:
    return OpDef(name, OpKind.ELEMENTWISE, 2, broadcast, dtype_rule, _mapped(fn, dtype_rule),
                 traits=traits, accepts=accepts, doc=doc, lowering=lowering, vjp=vjp)


def _arith_promoted(dtypes: tuple[DType, ...], attrs: Attrs) -> tuple[DType, ...]:
    """Promotion for arithmetic that has no boolean meaning (sub, floordiv, mod, pow)."""
    (out,) = promoted(dtypes, attrs)
    if out is DType.bool:
        raise DTypeError("arithmetic on two bool operands is not defined; use a logical op or "
                         "cast first")
    return (out,)


def _power(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    if a.dtype.kind in "iu" and b.dtype.kind in "iu" and np.any(b < 0):
        raise DTypeError("integers to negative integer powers are not defined; use a float base")
    return np.power(a, b)


_CA = frozenset({Trait.COMMUTATIVE, Trait.ASSOCIATIVE})
_C = frozenset({Trait.COMMUTATIVE})

ADD = _binary("add", np.add, traits=_CA, lowering=lambda ops, a, b: ops.binary("add", a, b),
              vjp=_add_vjp)
SUB = _binary("sub", np.subtract, dtype_rule=_arith_promoted,
              lowering=lambda ops, a, b: ops.binary("sub", a, b), vjp=_sub_vjp)
MUL = _binary("mul", np.multiply, traits=_CA, lowering=lambda ops, a, b: ops.binary("mul", a, b),
              vjp=_mul_vjp)
DIV = _binary("div", np.true_divide, dtype_rule=float_promoted, doc="true division",
              lowering=lambda ops, a, b: ops.binary("div", a, b), vjp=_div_vjp)
FLOORDIV = _binary("floordiv", np.floor_divide, dtype_rule=_arith_promoted,
                   doc="floor(a/b) (integer division by zero gives 0, like NumPy)",
                   lowering=lambda ops, a, b: ops.map(ops.floordiv, a, b))
MOD = _binary("mod", np.mod, dtype_rule=_arith_promoted,
              doc="a - floor(a/b)·b: the result has the divisor's sign (Python semantics)",
              lowering=lambda ops, a, b: ops.map(ops.mod, a, b))
POW = _binary("pow", _power, dtype_rule=_arith_promoted, doc="a ** b",
              lowering=lambda ops, a, b: ops.map(ops.pow, a, b), vjp=_pow_vjp)
MAXIMUM = _binary("maximum", np.maximum, traits=_CA, doc="NaN-propagating, like np.maximum",
                  lowering=lambda ops, a, b: ops.binary("max", a, b), vjp=_pick_vjp("ge"))
MINIMUM = _binary("minimum", np.minimum, traits=_CA, doc="NaN-propagating, like np.minimum",
                  lowering=lambda ops, a, b: ops.binary("min", a, b), vjp=_pick_vjp("le"))

EQ = _binary("eq", np.equal, dtype_rule=boolean, traits=_C,
              lowering=lambda ops, a, b: ops.compare("eq", a, b))
NE = _binary("ne", np.not_equal, dtype_rule=boolean, traits=_C,
              lowering=lambda ops, a, b: ops.compare("ne", a, b))
LT = _binary("lt", np.less, dtype_rule=boolean,
              lowering=lambda ops, a, b: ops.compare("lt", a, b))
LE = _binary("le", np.less_equal, dtype_rule=boolean,
              lowering=lambda ops, a, b: ops.compare("le", a, b))
GT = _binary("gt", np.greater, dtype_rule=boolean,
              lowering=lambda ops, a, b: ops.compare("gt", a, b))
GE = _binary("ge", np.greater_equal, dtype_rule=boolean,
              lowering=lambda ops, a, b: ops.compare("ge", a, b))

LOGICAL_AND = _binary("logical_and", np.logical_and, dtype_rule=boolean, traits=_CA,
                       lowering=lambda ops, a, b: ops.logical("and", a, b))
LOGICAL_OR = _binary("logical_or", np.logical_or, dtype_rule=boolean, traits=_CA,
                      lowering=lambda ops, a, b: ops.logical("or", a, b))
LOGICAL_XOR = _binary("logical_xor", np.logical_xor, dtype_rule=boolean, traits=_CA,
                       lowering=lambda ops, a, b: ops.logical("xor", a, b))

# ---- where, cast, clip -----------------------------------------------------------------------


def _where_dtype(dtypes: tuple[DType, ...], attrs: object) -> tuple[DType, ...]:
    return promoted(dtypes[1:], attrs)  # type: ignore[arg-type]


def _where_ref(c: np.ndarray, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    (out,) = _where_dtype((dtype_of(c), dtype_of(a), dtype_of(b)), {})
    return as_dtype(np.where(c.astype(bool), a.astype(out.np), b.astype(out.np)), out)


WHERE = OpDef("where", OpKind.ELEMENTWISE, 3, broadcast, _where_dtype, _where_ref,
              doc="cond ? a : b, broadcasting all three (cond is nonzero-tested)",
              lowering=lambda ops, c, a, b: ops.call("select", ops.cast(c, DType.bool),
                                                     ops.cast(a, ops.out), ops.cast(b, ops.out)),
              vjp=_where_vjp)

CAST = OpDef("cast", OpKind.ELEMENTWISE, 1, same_shape,
             lambda dtypes, attrs: (attrs["dtype"],),
             quiet(lambda x, dtype: x.astype(dtype.np)),
             attrs=(attr("dtype", AttrType.DTYPE),), doc="converts the element type (C casts)",
             lowering=lambda ops, x, dtype: ops.cast(x, dtype), vjp=_cast_vjp)


def _check_bound(name: str, value: object) -> None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))):
        raise AttrError(f"attribute {name!r} must be a number or None, got {value!r}")


def _clip_shape(shapes: tuple[Shape, ...], attrs: Attrs) -> tuple[Shape, ...]:
    _check_bound("min", attrs["min"])
    _check_bound("max", attrs["max"])
    return (shapes[0],)


def _clip_ref(x: np.ndarray, min: float | None, max: float | None) -> np.ndarray:
    """Clamps to [min, max] in x's dtype. For integers the bounds round inwards (ceil of min,
    floor of max) and saturate at the dtype's range, so the result stays in x's dtype."""
    if x.dtype.kind in "iu":
        info = np.iinfo(x.dtype)
        lo = None if min is None else np.clip(np.ceil(min), info.min, info.max).astype(x.dtype)
        hi = None if max is None else np.clip(np.floor(max), info.min, info.max).astype(x.dtype)
        work = x
    else:
        work = x.astype(work_dtype(dtype_of(x)))
        lo = None if min is None else work.dtype.type(min)
        hi = None if max is None else work.dtype.type(max)
    result = work
    if lo is not None:
        result = np.maximum(result, lo)
    if hi is not None:
        result = np.minimum(result, hi)
    return as_dtype(result, dtype_of(x))


def _clip_lowering(ops: Any, x: Any, min: float | None, max: float | None) -> Any:
    if x.dtype.is_int:  # bounds rounded inwards and saturated, as in the reference
        info = np.iinfo(x.dtype.np)
        if min is not None:
            x = ops.call("max", x, int(np.clip(np.ceil(min), info.min, info.max)))
        if max is not None:
            x = ops.call("min", x, int(np.clip(np.floor(max), info.min, info.max)))
        return x

    def clip(v: Any) -> Any:
        if min is not None:
            v = ops.call("max", v, float(min))
        return v if max is None else ops.call("min", v, float(max))

    return ops.map(clip, x)


CLIP = OpDef("clip", OpKind.ELEMENTWISE, 1, _clip_shape, same_dtype, quiet(_clip_ref),
             attrs=(attr("min", AttrType.ANY, None), attr("max", AttrType.ANY, None)),
             accepts=NUMERIC_TYPES, lowering=_clip_lowering, vjp=_clip_vjp,
             doc="min(max(x, min), max) in x's dtype; a None bound is absent; NaN stays NaN")


DEFINITIONS: tuple[OpDef, ...] = (
    NEG, ABS, RELU, SIGN, FLOOR, CEIL, ROUND,
    EXP, LOG, LOG1P, EXPM1, SQRT, RSQRT, RECIPROCAL, TANH, SIGMOID, ERF, GELU, SILU, SOFTPLUS,
    SIN, COS, LOGICAL_NOT, ISNAN,
    ADD, SUB, MUL, DIV, FLOORDIV, MOD, POW, MAXIMUM, MINIMUM,
    EQ, NE, LT, LE, GT, GE, LOGICAL_AND, LOGICAL_OR, LOGICAL_XOR,
    WHERE, CAST, CLIP,
)
