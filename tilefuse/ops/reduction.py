"""Reductions over axes: sum, mean, max, min, prod, var, argmax, argmin.

``axes`` is a tuple of axes or None (every axis); an empty tuple reduces nothing. Result dtypes
follow NumPy: sum and prod of bools and integers narrower than i64 give i64 (u8 too: tilefuse has
no u64), mean and var of integers give f64. f16/bf16 inputs are accumulated in f32 and rounded
once. max, min, argmax and argmin have no identity, so reducing an empty axis is a ShapeError.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import numpy as np

from tilefuse.dtypes import ALL_TYPES, DType
from tilefuse.errors import ShapeError
from tilefuse.graph.ir import Attrs
from tilefuse.graph.types import Shape, normalize_axes, normalize_axis
from tilefuse.ops.registry import AttrSpec, AttrType, OpDef, OpKind, attr
from tilefuse.ops.rules import as_dtype, dtype_of, quiet, reduce_shape, same_dtype, work_dtype

# ---- dtype rules -----------------------------------------------------------------------------


def _sum_dtype(dtypes: tuple[DType, ...], attrs: Attrs) -> tuple[DType, ...]:
    """Bools and integers accumulate in i64, floats in their own type (NumPy's rule)."""
    t = dtypes[0]
    return (t if t.is_float else DType.i64,)


def _mean_dtype(dtypes: tuple[DType, ...], attrs: Attrs) -> tuple[DType, ...]:
    t = dtypes[0]
    return (t if t.is_float else DType.f64,)


def _index_dtype(dtypes: tuple[DType, ...], attrs: Attrs) -> tuple[DType, ...]:
    return (DType.i64,)


# ---- shape rules -----------------------------------------------------------------------------


def _reduce_rule(shapes: tuple[Shape, ...], attrs: Attrs) -> tuple[Shape, ...]:
    return (reduce_shape(shapes[0], attrs["axes"], attrs["keepdims"]),)


def _check_nonempty(shape: Shape, axes: tuple[int, ...]) -> None:
    for a in axes:
        if shape[a] == 0:
            raise ShapeError(f"cannot reduce the empty axis {a}: the op has no identity")


def _nonempty_reduce_rule(shapes: tuple[Shape, ...], attrs: Attrs) -> tuple[Shape, ...]:
    _check_nonempty(shapes[0], normalize_axes(attrs["axes"], len(shapes[0])))
    return _reduce_rule(shapes, attrs)


def _arg_rule(shapes: tuple[Shape, ...], attrs: Attrs) -> tuple[Shape, ...]:
    shape, axis, keepdims = shapes[0], attrs["axis"], attrs["keepdims"]
    if axis is None:
        _check_nonempty(shape, tuple(range(len(shape))))
        return ((1,) * len(shape) if keepdims else (),)
    a = normalize_axis(axis, len(shape))
    _check_nonempty(shape, (a,))
    return (reduce_shape(shape, (a,), keepdims),)


# ---- references ------------------------------------------------------------------------------


def _reference(np_fn: Callable[..., Any], dtype_rule: Callable[..., tuple[DType, ...]],
               nonempty: bool) -> Callable[..., np.ndarray]:
    """Casts to the accumulation dtype (f32 for f16/bf16), reduces with np_fn, rounds once."""

    def reference(x: np.ndarray, axes: tuple[int, ...] | None, keepdims: bool,
                  **extra: Any) -> np.ndarray:
        (out,) = dtype_rule((dtype_of(x),), {})
        if nonempty:
            _check_nonempty(x.shape, normalize_axes(axes, x.ndim))
        wide = x.astype(work_dtype(out), copy=False)
        with warnings.catch_warnings():  # var with ddof >= N: NaN/Inf like NumPy, no warning
            warnings.simplefilter("ignore", RuntimeWarning)
            result = np_fn(wide, axis=axes, keepdims=keepdims, **extra)
        return as_dtype(result, out)

    reference.__name__ = np_fn.__name__
    return quiet(reference)


def _arg_reference(np_fn: Callable[..., Any]) -> Callable[..., np.ndarray]:
    def reference(x: np.ndarray, axis: int | None, keepdims: bool) -> np.ndarray:
        _check_nonempty(x.shape, tuple(range(x.ndim)) if axis is None else (axis % x.ndim,))
        wide = x.astype(work_dtype(dtype_of(x)), copy=False)
        return as_dtype(np_fn(wide, axis=axis, keepdims=keepdims), DType.i64)

    reference.__name__ = np_fn.__name__
    return reference


# ---- definitions -----------------------------------------------------------------------------

_AXES_ATTRS: tuple[AttrSpec, ...] = (attr("axes", AttrType.OPT_INTS, None),
                                     attr("keepdims", AttrType.BOOL, False))


def _reduction(name: str, np_fn: Callable[..., Any], dtype_rule: Callable[..., Any], *,
               nonempty: bool = False, extra_attrs: tuple[AttrSpec, ...] = (),
               doc: str = "", vjp: Callable[..., Any] | None = None) -> OpDef:
    shape_rule = _nonempty_reduce_rule if nonempty else _reduce_rule
    return OpDef(name, OpKind.REDUCTION, 1, shape_rule, dtype_rule,
                 _reference(np_fn, dtype_rule, nonempty), attrs=_AXES_ATTRS + extra_attrs,
                 accepts=ALL_TYPES, doc=doc, vjp=vjp)


def _spread(d: Any, x: Any, g: Any, axes: tuple[int, ...] | None, keepdims: bool) -> Any:
    """The gradient of a reduction's output spread back over the reduced axes of ``x``."""
    reduced = normalize_axes(axes, x.type.rank)
    if not keepdims and reduced:
        g = d.op("expand_dims", g, axes=reduced)
    return d.op("broadcast_to", g, shape=x.type.shape)


def _sum_vjp(d: Any, ins: Any, out: Any, g: Any, axes: Any, keepdims: bool) -> tuple[Any, ...]:
    return (_spread(d, ins[0], g, axes, keepdims),)


def _mean_vjp(d: Any, ins: Any, out: Any, g: Any, axes: Any, keepdims: bool) -> tuple[Any, ...]:
    x = ins[0]
    dims = [x.type.shape[a] for a in normalize_axes(axes, x.type.rank)]
    if not all(isinstance(n, int) for n in dims):
        raise ShapeError("the gradient of a mean over symbolic dims is not supported")
    count = 1
    for n in dims:
        count *= n
    return (d.op("div", _spread(d, x, g, axes, keepdims), d.scalar(max(count, 1), g)),)


def _count(x: Any, axes: Any) -> int:
    dims = [x.type.shape[a] for a in normalize_axes(axes, x.type.rank)]
    if not all(isinstance(n, int) for n in dims):
        raise ShapeError("the gradient of a reduction over symbolic dims is not supported")
    return int(np.prod(dims, dtype=np.int64)) if dims else 1


def _extreme_vjp(d: Any, ins: Any, out: Any, g: Any, axes: Any, keepdims: bool
                 ) -> tuple[Any, ...]:
    """max/min: the gradient is shared equally by the elements equal to the result (as JAX
    does on ties)."""
    x = ins[0]
    hit = d.op("eq", x, _spread(d, x, out, axes, keepdims))
    ones = d.op("cast", hit, dtype=x.type.dtype)
    count = d.op("sum", ones, axes=axes, keepdims=True)
    share = d.op("div", _spread(d, x, g, axes, keepdims), d.op("broadcast_to", count,
                                                                  shape=x.type.shape))
    return (d.select(hit, share),)


def _prod_vjp(d: Any, ins: Any, out: Any, g: Any, axes: Any, keepdims: bool
              ) -> tuple[Any, ...]:
    """prod(x)/x per element (so not defined where x is 0, which this rule does not handle)."""
    x = ins[0]
    return (d.op("div", d.op("mul", _spread(d, x, g, axes, keepdims),
                             _spread(d, x, out, axes, keepdims)), x),)


def _var_vjp(d: Any, ins: Any, out: Any, g: Any, axes: Any, keepdims: bool, ddof: int
             ) -> tuple[Any, ...]:
    x = ins[0]
    n = _count(x, axes)
    centred = d.op("sub", x, d.op("mean", x, axes=axes, keepdims=True))
    scale = d.scalar(2.0 / max(n - ddof, 1), x)
    return (d.op("mul", _spread(d, x, g, axes, keepdims), d.op("mul", scale, centred)),)


SUM = _reduction("sum", np.sum, _sum_dtype, doc="sum over axes (i64 for bools and integers)",
                 vjp=_sum_vjp)
PROD = _reduction("prod", np.prod, _sum_dtype, doc="product over axes (integers wrap)",
                  vjp=_prod_vjp)
MEAN = _reduction("mean", np.mean, _mean_dtype, doc="arithmetic mean (f64 for integers)",
                  vjp=_mean_vjp)
MAX = _reduction("max", np.max, same_dtype, nonempty=True, doc="NaN-propagating maximum",
                 vjp=_extreme_vjp)
MIN = _reduction("min", np.min, same_dtype, nonempty=True, doc="NaN-propagating minimum",
                 vjp=_extreme_vjp)
VAR = _reduction("var", np.var, _mean_dtype, extra_attrs=(attr("ddof", AttrType.INT, 0),),
                 doc="variance, divided by N - ddof (f64 for integers)", vjp=_var_vjp)

_ARG_ATTRS: tuple[AttrSpec, ...] = (attr("axis", AttrType.OPT_INT, None),
                                    attr("keepdims", AttrType.BOOL, False))
ARGMAX = OpDef("argmax", OpKind.REDUCTION, 1, _arg_rule, _index_dtype,
               _arg_reference(np.argmax), attrs=_ARG_ATTRS, accepts=ALL_TYPES,
               doc="index of the first maximum (of the first NaN); axis None: flat index")
ARGMIN = OpDef("argmin", OpKind.REDUCTION, 1, _arg_rule, _index_dtype,
               _arg_reference(np.argmin), attrs=_ARG_ATTRS, accepts=ALL_TYPES,
               doc="index of the first minimum (of the first NaN); axis None: flat index")

DEFINITIONS: tuple[OpDef, ...] = (SUM, PROD, MEAN, MAX, MIN, VAR, ARGMAX, ARGMIN)
