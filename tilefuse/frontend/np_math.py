"""NumPy arithmetic on tracers: ufuncs, reductions, where, clip, round, matmul, dot, einsum.

Result dtypes follow NumPy exactly: operands are first cast to the dtypes of the loop NumPy would
pick (``ufunc.resolve_dtypes``), and a result whose registry dtype differs from NumPy's is cast.
Python scalars are weak (NEP 50, see :func:`tilefuse.frontend.tracer.to_tracer`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from tilefuse.dtypes import DType, from_numpy, promote_all
from tilefuse.errors import DTypeError, TraceError
from tilefuse.frontend.source import user_loc
from tilefuse.frontend.tracer import TraceContext, Tracer, scalar_dtype, to_tracer
from tilefuse.graph.types import normalize_axes, normalize_axis

UNSET: Any = object()  # marks a NumPy parameter the caller did not pass


def _is_weak(value: Any) -> bool:
    return isinstance(value, (bool, int, float)) and not isinstance(value, np.generic)


def _dtype_of(value: Any) -> DType:
    if isinstance(value, Tracer):
        return value.value.dtype
    return from_numpy(np.asarray(value).dtype)


def coerce(ctx: TraceContext, operands: Sequence[Any]) -> list[Tracer]:
    """Tracers for ``operands``; Python scalars take the promoted dtype of the others (NEP 50)."""
    strong = [_dtype_of(v) for v in operands if not _is_weak(v)]
    partner = promote_all(strong) if strong else None
    return [to_tracer(ctx, v, partner) for v in operands]


def cast(x: Tracer, dtype: DType) -> Tracer:
    """``x`` converted to ``dtype`` (no node when it already has it)."""
    if x.value.dtype is dtype:
        return x
    return x.ctx.emit1("cast", [x], {"dtype": dtype})


def astype(x: Tracer, dtype: Any) -> Tracer:
    """``x.astype(dtype)``: C casts, as NumPy's default casting='unsafe'."""
    try:
        target = from_numpy(dtype)
    except DTypeError as err:
        raise err.with_context(op="astype", loc=user_loc()) from None
    return cast(x, target)


def _input_types(tracers: Sequence[Tracer]) -> tuple[str, ...]:
    return tuple(str(t.value.type) for t in tracers)


# ---- ufuncs ----------------------------------------------------------------------------------


def numpy_loop(name: str, ufunc: np.ufunc, tracers: Sequence[Tracer]) -> list[DType] | None:
    """The dtypes (inputs, then outputs) of the loop NumPy picks for these operands; None when
    NumPy cannot say (the registry's rules then decide). DTypeError when NumPy has no loop."""
    given = tuple(t.value.dtype.np for t in tracers) + (None,) * ufunc.nout
    try:
        resolved = ufunc.resolve_dtypes(given)
    except TypeError:
        raise DTypeError("does not support " + ", ".join(t.value.dtype.value for t in tracers)
                         + " operands", op=name, inputs=_input_types(tracers),
                         loc=user_loc()) from None
    except Exception:
        return None
    try:
        return [from_numpy(d) for d in resolved]
    except DTypeError:
        return None


def elementwise(ctx: TraceContext, name: str, ufunc: np.ufunc, op: str,
                operands: Sequence[Any], *, bool_inputs: bool = False,
                dtype: Any = None) -> Tracer:
    """``op`` applied to ``operands`` with the dtypes NumPy's ``ufunc`` would give."""
    tracers = coerce(ctx, operands)
    if bool_inputs:  # logical ops test truthiness: x != 0
        tracers = [cast(t, DType.bool) for t in tracers]
    if dtype is not None:
        tracers = [astype(t, dtype) for t in tracers]
    loop = numpy_loop(name, ufunc, tracers)
    if loop is not None and not bool_inputs:
        tracers = [cast(t, d) for t, d in zip(tracers, loop)]
    out = ctx.emit1(op, tracers)
    if loop is not None:
        out = cast(out, loop[len(tracers)])
    return out


def square(ctx: TraceContext, x: Any) -> Tracer:
    (t,) = coerce(ctx, [x])
    loop = numpy_loop("np.square", np.square, [t])
    if loop is not None:
        t = cast(t, loop[0])
    return ctx.emit1("mul", [t, t])


def positive(ctx: TraceContext, x: Any) -> Tracer:
    (t,) = coerce(ctx, [x])
    numpy_loop("np.positive", np.positive, [t])  # rejects bool, as NumPy does
    return t


def _bitwise(name: str, ufunc: np.ufunc, op: str) -> Any:
    def build(ctx: TraceContext, *operands: Any) -> Tracer:
        tracers = coerce(ctx, operands)
        if any(t.value.dtype is not DType.bool for t in tracers):
            raise TraceError(f"{name} is supported on bool arrays only (as a logical op), got "
                             + ", ".join(t.value.dtype.value for t in tracers),
                             inputs=_input_types(tracers), loc=user_loc())
        return ctx.emit1(op, tracers)
    return build


bitwise_and = _bitwise("np.bitwise_and (&)", np.bitwise_and, "logical_and")
bitwise_or = _bitwise("np.bitwise_or (|)", np.bitwise_or, "logical_or")
bitwise_xor = _bitwise("np.bitwise_xor (^)", np.bitwise_xor, "logical_xor")
invert = _bitwise("np.invert (~)", np.invert, "logical_not")


# ---- reductions ------------------------------------------------------------------------------


def _axes_attr(x: Tracer, axis: Any) -> tuple[int, ...] | None:
    if axis is None:
        return None
    axes = tuple(axis) if isinstance(axis, (tuple, list)) else (axis,)
    return normalize_axes(axes, x.ndim)


def _expected_dtype(np_fn: Any, x: Tracer, **kwargs: Any) -> DType | None:
    """The dtype NumPy's reduction gives for x's dtype (found on a one-element array)."""
    try:
        probe = np.ones((1,) * x.ndim, dtype=x.dtype)
        return from_numpy(np.asarray(np_fn(probe, **kwargs)).dtype)
    except Exception:
        return None


def _check_unsupported(name: str, **given: Any) -> None:
    for key, value in given.items():
        if value is not UNSET and value is not None and not (key == "where" and value is True):
            raise TraceError(f"{name}(..., {key}=...) is not supported", loc=user_loc())


def _reduce(ctx: TraceContext, op: str, np_fn: Any, a: Any, axis: Any, keepdims: Any,
            attrs: dict[str, Any] | None = None, **numpy_kwargs: Any) -> Tracer:
    """Emits ``op``. When NumPy's result dtype differs from the input's (i32 sums give i64, int
    means f64, dtype=...) the input is cast first: NumPy accumulates in the result dtype."""
    (x,) = coerce(ctx, [a])
    expected = _expected_dtype(np_fn, x, **numpy_kwargs)
    if expected is not None:
        x = cast(x, expected)
    all_attrs = {"axes": _axes_attr(x, axis), "keepdims": bool(keepdims), **(attrs or {})}
    result = ctx.emit1(op, [x], all_attrs)
    return result if expected is None else cast(result, expected)


def accumulation(op: str, np_fn: Any) -> Any:
    """A handler for np.sum, np.prod, np.mean (which take a dtype)."""

    def handler(ctx: TraceContext, a: Any, axis: Any = None, dtype: Any = None,
                out: Any = None, keepdims: Any = False, *, initial: Any = UNSET,
                where: Any = UNSET) -> Tracer:
        _check_unsupported(f"np.{np_fn.__name__}", out=out, initial=initial, where=where)
        return _reduce(ctx, op, np_fn, a, axis, keepdims, dtype=dtype)

    handler.__name__ = op
    return handler


def extremum(op: str, np_fn: Any) -> Any:
    """A handler for np.max and np.min (no dtype parameter)."""

    def handler(ctx: TraceContext, a: Any, axis: Any = None, out: Any = None,
                keepdims: Any = False, *, initial: Any = UNSET, where: Any = UNSET) -> Tracer:
        _check_unsupported(f"np.{np_fn.__name__}", out=out, initial=initial, where=where)
        return _reduce(ctx, op, np_fn, a, axis, keepdims)

    handler.__name__ = op
    return handler


def var(ctx: TraceContext, a: Any, axis: Any = None, dtype: Any = None, out: Any = None,
        ddof: Any = 0, keepdims: Any = False, *, where: Any = UNSET, mean: Any = UNSET,
        correction: Any = UNSET) -> Tracer:
    _check_unsupported("np.var", out=out, where=where, mean=mean)
    if correction is not UNSET:
        ddof = correction
    if isinstance(ddof, float) and ddof.is_integer():
        ddof = int(ddof)
    return _reduce(ctx, "var", np.var, a, axis, keepdims, {"ddof": ddof}, dtype=dtype)


def std(ctx: TraceContext, a: Any, *args: Any, **kwargs: Any) -> Tracer:
    return elementwise(ctx, "np.std", np.sqrt, "sqrt", [var(ctx, a, *args, **kwargs)])


def arg_reduction(op: str) -> Any:
    def handler(ctx: TraceContext, a: Any, axis: Any = None, out: Any = None, *,
                keepdims: Any = False) -> Tracer:
        _check_unsupported(f"np.{op}", out=out)
        (x,) = coerce(ctx, [a])
        if axis is not None:
            axis = normalize_axis(axis, x.ndim)
        return ctx.emit1(op, [x], {"axis": axis, "keepdims": bool(keepdims)})

    handler.__name__ = op
    return handler


def cumulative(op: str, np_fn: Any) -> Any:
    """A handler for np.cumsum and np.cumprod: axis None scans the flattened array."""

    def handler(ctx: TraceContext, a: Any, axis: Any = None, dtype: Any = None,
                out: Any = None) -> Tracer:
        _check_unsupported(f"np.{np_fn.__name__}", dtype=dtype, out=out)
        (x,) = coerce(ctx, [a])
        if axis is None or x.ndim == 0:
            x = x if x.ndim == 1 else ctx.emit1("reshape", [x], {"shape": (-1,)})
            axis = 0
        return ctx.emit1(op, [x], {"axis": normalize_axis(axis, x.ndim)})

    handler.__name__ = op
    return handler


UFUNC_REDUCTIONS = {np.add: "sum", np.multiply: "prod", np.maximum: "max", np.minimum: "min"}


# ---- where, clip, round ----------------------------------------------------------------------


def where(ctx: TraceContext, condition: Any, x: Any = UNSET, y: Any = UNSET) -> Tracer:
    if x is UNSET or y is UNSET:
        raise TraceError("np.where with one argument (np.nonzero) has a data-dependent shape and "
                         "cannot be traced; pass both x and y", loc=user_loc())
    (cond,) = coerce(ctx, [condition])
    cond = cast(cond, DType.bool)
    a, b = coerce(ctx, [x, y])
    common = promote_all([a.value.dtype, b.value.dtype])
    return ctx.emit1("where", [cond, cast(a, common), cast(b, common)])


def _scalar_bound(value: Any) -> bool:
    return value is None or _is_weak(value) or isinstance(value, np.generic) or (
        isinstance(value, np.ndarray) and value.ndim == 0)


def clip(ctx: TraceContext, a: Any, a_min: Any = UNSET, a_max: Any = UNSET, out: Any = None, *,
         min: Any = UNSET, max: Any = UNSET) -> Tracer:
    _check_unsupported("np.clip", out=out)
    lo = a_min if a_min is not UNSET else (None if min is UNSET else min)
    hi = a_max if a_max is not UNSET else (None if max is UNSET else max)
    (x,) = coerce(ctx, [a])
    if not (_scalar_bound(lo) and _scalar_bound(hi)):  # array bounds: maximum, then minimum
        if lo is not None:
            x = elementwise(ctx, "np.clip", np.maximum, "maximum", [x, lo])
        if hi is not None:
            x = elementwise(ctx, "np.clip", np.minimum, "minimum", [x, hi])
        return x
    bounds = [b for b in (lo, hi) if b is not None]
    strong = [_dtype_of(b) for b in bounds if not _is_weak(b)]
    weak = [scalar_dtype(b, x.value.dtype) for b in bounds if _is_weak(b)]
    x = cast(x, promote_all([x.value.dtype, *strong, *weak]))

    def number(b: Any) -> int | float | None:
        if b is None:
            return None
        item = np.asarray(b).item()
        return float(item) if isinstance(item, (bool, float)) else int(item)

    return ctx.emit1("clip", [x], {"min": number(lo), "max": number(hi)})


def round_(ctx: TraceContext, a: Any, decimals: Any = 0, out: Any = None) -> Tracer:
    """np.round / np.around: half to even; with ``decimals`` NumPy's own x·10^d, rint, /10^d."""
    _check_unsupported("np.round", out=out)
    (x,) = coerce(ctx, [a])
    if not x.value.dtype.is_float:
        if decimals >= 0:
            return x
        raise TraceError("np.round of integers with negative decimals is not supported",
                         loc=user_loc())
    if decimals == 0:
        return ctx.emit1("round", [x])
    scale = 10.0 ** abs(int(decimals))
    first, last = (np.multiply, np.true_divide) if decimals > 0 else (np.true_divide,
                                                                        np.multiply)
    scaled = first(x, scale)
    return last(ctx.emit1("round", [scaled]), scale)  # type: ignore[no-any-return]


# ---- contractions ----------------------------------------------------------------------------


def _common(tracers: list[Tracer]) -> list[Tracer]:
    common = promote_all([t.value.dtype for t in tracers])
    return [cast(t, common) for t in tracers]


def matmul(ctx: TraceContext, a: Any, b: Any) -> Tracer:
    """np.matmul (1-D operands included: the op has NumPy's semantics)."""
    return ctx.emit1("matmul", _common(coerce(ctx, [a, b])))


def dot(ctx: TraceContext, a: Any, b: Any, out: Any = None) -> Tracer:
    _check_unsupported("np.dot", out=out)
    x, y = (to_tracer(ctx, np.asarray(v) if _is_weak(v) else v) for v in (a, b))  # not weak
    if x.ndim == 0 or y.ndim == 0:
        return elementwise(ctx, "np.dot", np.multiply, "mul", [x, y])
    if x.ndim > 2 or y.ndim > 2:
        raise TraceError("np.dot of arrays with more than 2 dims is not supported; use "
                         "np.matmul or np.einsum", inputs=_input_types([x, y]), loc=user_loc())
    return matmul(ctx, x, y)


def einsum(ctx: TraceContext, subscripts: Any, *operands: Any, out: Any = None,
           dtype: Any = None, order: Any = UNSET, casting: Any = UNSET,
           optimize: Any = False) -> Tracer:
    _check_unsupported("np.einsum", out=out, order=order, casting=casting)
    if not isinstance(subscripts, str):
        raise TraceError("np.einsum is supported with a subscripts string only",
                         loc=user_loc())
    tracers = coerce(ctx, operands)
    if dtype is not None:
        tracers = [astype(t, dtype) for t in tracers]
    equation = subscripts.replace(" ", "")
    return ctx.emit1("einsum", _common(tracers), {"equation": equation})
