"""The one table from NumPy callables to the builders that emit tilefuse ops.

Tracers hand every ufunc call (``__array_ufunc__``) and every NumPy function call
(``__array_function__``) to :func:`apply_ufunc` / :func:`apply_function`, which look the callable
up here. Ufuncs are keyed by identity (``np.add``, ``scipy.special.erf``). Anything not in the
tables, and any keyword a builder does not take (``out=``, ``where=``), is a TraceError naming the
callable and the user's line.
"""

from __future__ import annotations

import inspect
import sys
from collections.abc import Callable, Iterator, Mapping
from types import MappingProxyType
from typing import Any

import numpy as np

from tilefuse.errors import TilefuseError, TraceError
from tilefuse.frontend import np_math as m
from tilefuse.frontend import np_shape as s
from tilefuse.frontend.source import user_loc
from tilefuse.frontend.tracer import GraphBreakError, TraceContext, Tracer, find_context

# ---- ufuncs ----------------------------------------------------------------------------------

# Ufuncs that are one tilefuse op (operands cast to NumPy's loop dtypes, result cast back).
_NUMPY_UFUNC_OPS: Mapping[np.ufunc, str] = MappingProxyType({
    np.add: "add", np.subtract: "sub", np.multiply: "mul", np.true_divide: "div",
    np.floor_divide: "floordiv", np.remainder: "mod", np.power: "pow",
    np.maximum: "maximum", np.minimum: "minimum",
    np.equal: "eq", np.not_equal: "ne", np.less: "lt", np.less_equal: "le",
    np.greater: "gt", np.greater_equal: "ge",
    np.negative: "neg", np.absolute: "abs", np.sign: "sign",
    np.exp: "exp", np.log: "log", np.log1p: "log1p", np.expm1: "expm1", np.sqrt: "sqrt",
    np.reciprocal: "reciprocal", np.tanh: "tanh", np.sin: "sin", np.cos: "cos",
    np.floor: "floor", np.ceil: "ceil", np.rint: "round", np.isnan: "isnan",
})
_SCIPY_UFUNC_OPS = {"erf": "erf", "expit": "sigmoid"}  # scipy.special name -> op


def _scipy_ufuncs() -> dict[np.ufunc, str]:
    """scipy.special's ufuncs, once the process has imported scipy.special (a caller can only
    hand a tracer one of them after importing it; ``import tilefuse`` does not load SciPy)."""
    special = sys.modules.get("scipy.special")
    if special is None:
        return {}
    return {getattr(special, name): op for name, op in _SCIPY_UFUNC_OPS.items()}


class _UfuncOps(Mapping[np.ufunc, str]):
    """NumPy's one-op ufuncs, then scipy.special's (:func:`_scipy_ufuncs`)."""

    def __getitem__(self, ufunc: np.ufunc) -> str:
        op = _NUMPY_UFUNC_OPS.get(ufunc)
        return op if op is not None else _scipy_ufuncs()[ufunc]

    def __iter__(self) -> Iterator[np.ufunc]:
        return iter({**_NUMPY_UFUNC_OPS, **_scipy_ufuncs()})

    def __len__(self) -> int:
        return len(_NUMPY_UFUNC_OPS) + len(_scipy_ufuncs())


UFUNC_OPS: Mapping[np.ufunc, str] = _UfuncOps()

# Logical ufuncs test their operands' truthiness (non-bool operands are cast to bool first).
LOGICAL_UFUNCS: Mapping[np.ufunc, str] = MappingProxyType({
    np.logical_and: "logical_and", np.logical_or: "logical_or", np.logical_xor: "logical_xor",
    np.logical_not: "logical_not",
})

# Ufuncs built from other ops: builder(ctx, *operands, **kwargs).
UFUNC_BUILDERS: Mapping[np.ufunc, Callable[..., Any]] = MappingProxyType({
    np.square: m.square, np.positive: m.positive, np.matmul: m.matmul,
    np.bitwise_and: m.bitwise_and, np.bitwise_or: m.bitwise_or, np.bitwise_xor: m.bitwise_xor,
    np.invert: m.invert,
})

# ufunc.reduce → the NumPy reduction it equals.
UFUNC_REDUCE: Mapping[np.ufunc, Any] = MappingProxyType({
    np.add: np.sum, np.multiply: np.prod, np.maximum: np.max, np.minimum: np.min,
})

# ---- functions -------------------------------------------------------------------------------

_sum, _prod, _mean = (m.accumulation("sum", np.sum), m.accumulation("prod", np.prod),
                      m.accumulation("mean", np.mean))
_max, _min = m.extremum("max", np.max), m.extremum("min", np.min)



def _np_astype(ctx: TraceContext, x: Any, dtype: Any, /, *, copy: Any = True,
               device: Any = None) -> Tracer:
    return m.astype(m.coerce(ctx, [x])[0], dtype)


_FUNCTIONS: dict[Callable[..., Any], Callable[..., Any]] = {
    np.sum: _sum, np.prod: _prod, np.mean: _mean, np.max: _max, np.amax: _max,
    np.min: _min, np.amin: _min, np.var: m.var, np.std: m.std,
    np.argmax: m.arg_reduction("argmax"), np.argmin: m.arg_reduction("argmin"),
    np.cumsum: m.cumulative("cumsum", np.cumsum), np.cumprod: m.cumulative("cumprod", np.cumprod),
    np.where: m.where, np.clip: m.clip, np.round: m.round_, np.around: m.round_,
    np.dot: m.dot, np.einsum: m.einsum,
    np.reshape: s.reshape, np.ravel: s.ravel, np.transpose: s.transpose,
    np.swapaxes: s.swapaxes, np.moveaxis: s.moveaxis, np.expand_dims: s.expand_dims,
    np.squeeze: s.squeeze, np.broadcast_to: s.broadcast_to,
    np.concatenate: s.concatenate, np.stack: s.stack, np.split: s.split,
    np.array_split: s.array_split, np.pad: s.pad, np.take: s.take,
    np.take_along_axis: s.take_along_axis,
    np.zeros_like: s.zeros_like, np.ones_like: s.ones_like, np.full_like: s.full_like,
    np.shape: s.static_shape, np.ndim: s.static_ndim, np.size: s.static_size,
    np.copy: s.copy, np.result_type: s.result_type,
}
if hasattr(np, "astype"):  # NumPy >= 2.1
    _FUNCTIONS[np.astype] = _np_astype
FUNCTIONS: Mapping[Callable[..., Any], Callable[..., Any]] = MappingProxyType(_FUNCTIONS)

# Ufunc keywords that are accepted at their default value only.
_UFUNC_DEFAULTS: Mapping[str, Any] = MappingProxyType({
    "out": None, "where": True, "casting": "same_kind", "order": "K", "subok": True,
    "signature": None,
})


def describe(func: Any) -> str:
    """The name users know a callable by: ``np.add``, ``np.linalg.svd``, ``scipy.special.erf``."""
    name = getattr(func, "__name__", repr(func))
    if isinstance(func, np.ufunc):
        special = sys.modules.get("scipy.special")
        if special is not None and getattr(special, name, None) is func:
            return f"scipy.special.{name}"
        return f"np.{name}"
    module = getattr(func, "__module__", None) or "numpy"
    if module == "numpy" or module.startswith("numpy."):
        module = "np" + module[len("numpy"):]
    return f"{module}.{name}"


def _input_types(objs: tuple[Any, ...]) -> tuple[str, ...]:
    found = []
    for obj in objs:
        for item in obj if isinstance(obj, (list, tuple)) else (obj,):
            if isinstance(item, Tracer):
                found.append(str(item.value.type))
    return tuple(found)


def _call(name: str, handler: Callable[..., Any], ctx: TraceContext, args: tuple[Any, ...],
          kwargs: Mapping[str, Any]) -> Any:
    """Calls ``handler(ctx, *args, **kwargs)``; unsupported keywords, bad arguments and
    context-free errors come back as TilefuseErrors naming ``name`` and the user's line."""
    signature = inspect.signature(handler)
    try:
        signature.bind(ctx, *args, **kwargs)
    except TypeError as err:
        unknown = [k for k in kwargs if k not in signature.parameters]
        message = (f"{name}(..., {unknown[0]}=...) is not supported" if unknown
                   else f"{name}: unsupported arguments ({err})")
        raise TraceError(message, loc=user_loc()) from None
    try:
        return handler(ctx, *args, **kwargs)
    except TilefuseError as err:
        op = None if isinstance(err, TraceError) or err.op else name
        raise err.with_context(op=op, inputs=_input_types(args), loc=user_loc()) from None
    except (TypeError, ValueError, IndexError, KeyError, OverflowError) as err:
        raise TraceError(f"{name}: invalid arguments ({type(err).__name__}: {err})",
                         inputs=_input_types(args), loc=user_loc()) from None


def _reduce_args(array: Any, axis: Any = 0, dtype: Any = None, out: Any = None,
                 keepdims: Any = False, initial: Any = m.UNSET,
                 where: Any = m.UNSET) -> dict[str, Any]:
    return {"array": array, "axis": axis, "dtype": dtype, "out": out, "keepdims": keepdims,
            "initial": initial, "where": where}


def _ufunc_reduce(ctx: TraceContext, ufunc: np.ufunc, *args: Any, **kwargs: Any) -> Any:
    a = _reduce_args(*args, **kwargs)
    np_fn = UFUNC_REDUCE[ufunc]
    handler = FUNCTIONS[np_fn]
    array = a["array"]
    if np_fn in (np.max, np.min):
        if a["dtype"] is not None:
            array = m.astype(m.coerce(ctx, [array])[0], a["dtype"])
        return handler(ctx, array, a["axis"], a["out"], a["keepdims"], initial=a["initial"],
                       where=a["where"])
    return handler(ctx, array, a["axis"], a["dtype"], a["out"], a["keepdims"],
                   initial=a["initial"], where=a["where"])


def _ufunc_call(ctx: TraceContext, name: str, ufunc: np.ufunc, inputs: tuple[Any, ...],
                kwargs: dict[str, Any]) -> Any:
    dtype = kwargs.pop("dtype", None)
    for key, value in kwargs.items():
        if key not in _UFUNC_DEFAULTS or value != _UFUNC_DEFAULTS[key]:
            raise TraceError(f"{name}(..., {key}=...) is not supported", loc=user_loc())
    op = UFUNC_OPS.get(ufunc)
    if op is not None:
        return m.elementwise(ctx, name, ufunc, op, inputs, dtype=dtype)
    op = LOGICAL_UFUNCS.get(ufunc)
    if op is not None:
        return m.elementwise(ctx, name, ufunc, op, inputs, bool_inputs=True, dtype=dtype)
    builder = UFUNC_BUILDERS.get(ufunc)
    if builder is None:
        raise TraceError(f"{name} is not supported", loc=user_loc())
    if dtype is not None:
        inputs = tuple(m.astype(t, dtype) for t in m.coerce(ctx, inputs))
    return builder(ctx, *inputs)


def apply_ufunc(ufunc: np.ufunc, method: str, inputs: tuple[Any, ...],
                kwargs: dict[str, Any]) -> Any:
    """Records ``ufunc.method(*inputs, **kwargs)`` where some input is a tracer."""
    name = describe(ufunc)
    ctx = find_context(*inputs, *kwargs.values())
    if method == "reduce" and ufunc in UFUNC_REDUCE:
        return _call(f"{name}.reduce", lambda c, *a, **k: _ufunc_reduce(c, ufunc, *a, **k),
                     ctx, inputs, kwargs)
    known = ufunc in UFUNC_OPS or ufunc in LOGICAL_UFUNCS or ufunc in UFUNC_BUILDERS
    if method != "__call__" or not known:
        what = name if method == "__call__" else f"{name}.{method}"
        if ctx.breaks is not None:   # a graph break: NumPy runs it on the values
            return ctx.breaks.host_call(getattr(ufunc, method), what, inputs, kwargs)
        raise GraphBreakError(f"{what} is not supported", loc=user_loc())
    return _call(name, lambda c, *a, **k: _ufunc_call(c, name, ufunc, a, k), ctx, inputs,
                 kwargs)


def apply_function(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """Records the NumPy function call ``func(*args, **kwargs)`` where some argument is a tracer."""
    handler = FUNCTIONS.get(func)
    if handler is None:
        ctx = find_context(*args, *kwargs.values())
        if ctx.breaks is not None:   # a graph break: NumPy runs it on the values
            return ctx.breaks.host_call(func, describe(func), args, kwargs)
        raise GraphBreakError(f"{describe(func)} is not supported", loc=user_loc())
    ctx = find_context(*args, *kwargs.values())
    return _call(describe(func), handler, ctx, args, kwargs)


def astype(x: Tracer, dtype: Any) -> Tracer:
    """``x.astype(dtype)``."""
    return _call("astype", lambda c, t, d: m.astype(t, d), x.ctx, (x, dtype), {})

