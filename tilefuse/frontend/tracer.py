"""Tracers: stand-ins for NumPy arrays that record every operation into a graph.

A :class:`Tracer` wraps one SSA :class:`~tilefuse.graph.ir.Value` and the
:class:`TraceContext` it belongs to (the builder being filled and the function being traced);
there is no global "current trace". Python operators are routed through the NumPy ufuncs
(``x + y`` is ``np.add(x, y)``), and NumPy hands ufunc and function calls back through
``__array_ufunc__`` / ``__array_function__`` to :mod:`tilefuse.frontend.numpy_api`, so there is
one mapping from NumPy semantics to tilefuse ops. Every recorded node carries the user's line.
"""

from __future__ import annotations

import builtins
import contextlib
import math
import operator
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from tilefuse.dtypes import DType, from_numpy, weak_scalar_dtype
from tilefuse.errors import DTypeError, SourceLoc, TraceError
from tilefuse.frontend.source import user_loc
from tilefuse.graph.builder import GraphBuilder
from tilefuse.graph.ir import Literal, Value
from tilefuse.graph.types import TensorType

DATA_DEPENDENT = ("data-dependent Python control flow: the value of a traced array is not known "
                  "at trace time")


class GraphBreakError(TraceError):
    """Tracing needs a value it does not have (``bool()``, ``.item()``, ``print``, a NumPy
    function without a rule). ``tilefuse.jit`` catches it and traces the function again in
    pieces (:mod:`tilefuse.frontend.graph_breaks`), unless ``fullgraph=True``, where it is the
    error the user sees."""


class TraceContext:
    """The state of one trace: the graph builder, the traced function's name, the constants
    recorded so far. ``active`` turns False when the trace ends, so escaped tracers are caught."""

    def __init__(self, builder: GraphBuilder, function: str, *, fullgraph: bool = True):
        self.builder = builder
        self.function = function
        self.active = True
        self.fullgraph = fullgraph
        self.breaks: Any = None   # a graph_breaks.BreakingTrace: breaks run instead of raising
        self._scalars: dict[tuple[DType, str], Tracer] = {}

    def __repr__(self) -> str:
        state = "active" if self.active else "finished"
        return f"TraceContext({self.function}, {state})"

    def input(self, type_: TensorType, name: str) -> Tracer:
        tracer = Tracer(self.builder.input(type_, name), self)
        if self.breaks is not None:
            self.breaks.track(tracer)
        return tracer

    def emit(self, op: str, inputs: Sequence[Tracer], attrs: Mapping[str, Any] | None = None,
             loc: SourceLoc | None = None) -> tuple[Tracer, ...]:
        """Records ``op(inputs) {attrs}`` at the user's line and returns tracers of its outputs."""
        for t in inputs:
            self.check(t)
        outs = self.builder.add(op, [t.value for t in inputs], attrs, loc or user_loc())
        tracers = tuple(Tracer(v, self) for v in outs)
        if self.breaks is not None:
            for tracer in tracers:
                self.breaks.track(tracer)
        return tracers

    def emit1(self, op: str, inputs: Sequence[Tracer],
              attrs: Mapping[str, Any] | None = None) -> Tracer:
        (out,) = self.emit(op, inputs, attrs)
        return out

    def constant(self, array: np.ndarray) -> Tracer:
        """A ``constant`` node holding a copy of ``array`` as it is now. (Not cached per array
        object: the array may change between two uses; CSE merges equal constants.)"""
        try:
            literal = Literal(array)
        except DTypeError as err:
            raise err.with_context(op="constant", loc=user_loc()) from None
        return self.emit1("constant", [], {"value": literal})

    def scalar(self, value: bool | int | float, dtype: DType) -> Tracer:
        """A 0-d constant of ``dtype`` (recorded once per value and dtype)."""
        key = (dtype, repr(value))
        found = self._scalars.get(key)
        if found is None:
            literal = Literal(np.asarray(value, dtype=dtype.np))
            found = self._scalars[key] = self.emit1("constant", [], {"value": literal})
        return found


    def check(self, tracer: Tracer) -> None:
        """TraceError unless ``tracer`` belongs to this (still running) trace."""
        if not tracer.ctx.active:
            raise TraceError(f"a traced array of {tracer.ctx.function} was used after its "
                             "trace ended (was it stored outside the jitted function?)",
                             loc=user_loc())
        if tracer.ctx is not self:
            raise TraceError(f"mixing tracers of two different traces ({tracer.ctx.function} "
                             f"and {self.function}): a traced array of one jitted function was "
                             "used inside another; pass it as an argument instead",
                             loc=user_loc())
        if not self.active:
            raise TraceError(f"the trace of {self.function} has ended", loc=user_loc())


_PRINT = builtins.print
_print_lock = threading.Lock()
_print_users = 0
_tracing = threading.local()   # .ctx: the trace this thread is running, if any


def _traced_print(*args: Any, **kwargs: Any) -> None:
    """``print`` while some thread traces: a print of that thread's trace is a graph break
    (or, with ``fullgraph=True``, printed as today unless it shows a traced array)."""
    ctx = getattr(_tracing, "ctx", None)
    if ctx is None or not ctx.active:
        return _PRINT(*args, **kwargs)
    if ctx.breaks is not None:
        return ctx.breaks.print_call(args, kwargs)  # type: ignore[no-any-return]
    shows = any(isinstance(a, Tracer) for a in args)
    if ctx.fullgraph and not shows:
        return _PRINT(*args, **kwargs)
    raise GraphBreakError(f"print{' of a traced array' if shows else ''} inside a traced "
                          "function: it would run once, while tracing, not at every call",
                          loc=user_loc())


@contextlib.contextmanager
def intercepting_print(ctx: TraceContext) -> Iterator[None]:
    """While tracing ``ctx`` in this thread, ``print`` calls of this thread go to
    :func:`_traced_print` (``builtins.print`` is swapped while any thread traces; other
    threads' prints pass straight through)."""
    global _print_users
    outer = getattr(_tracing, "ctx", None)
    with _print_lock:
        if _print_users == 0:
            builtins.print = _traced_print
        _print_users += 1
    _tracing.ctx = ctx
    try:
        yield
    finally:
        _tracing.ctx = outer
        with _print_lock:
            _print_users -= 1
            if _print_users == 0:
                builtins.print = _PRINT


def real_print(*args: Any, **kwargs: Any) -> None:
    """The ``print`` of the interpreter, whatever is intercepted."""
    _PRINT(*args, **kwargs)


def find_context(*objs: Any) -> TraceContext:
    """The one trace that the tracers among ``objs`` (searched one list/tuple deep) belong to."""
    found: TraceContext | None = None
    for obj in objs:
        items = obj if isinstance(obj, (list, tuple)) else (obj,)
        for item in items:
            if isinstance(item, Tracer):
                if found is None:
                    found = item.ctx
                found.check(item)
    if found is None:
        raise TraceError("no traced array among the arguments", loc=user_loc())
    return found


def scalar_dtype(value: bool | int | float, partner: DType | None) -> DType:
    """NEP 50: a Python scalar takes the dtype of the array it meets (weak promotion)."""
    if partner is None:
        return from_numpy(np.asarray(value).dtype)
    dtype = weak_scalar_dtype(value, partner)
    if dtype.is_int and not isinstance(value, bool):
        info = np.iinfo(dtype.np)
        if not info.min <= value <= info.max:
            raise DTypeError(f"Python integer {value} is out of bounds for {dtype.value}",
                             loc=user_loc())
    return dtype


def to_tracer(ctx: TraceContext, value: Any, partner: DType | None = None) -> Tracer:
    """``value`` as a tracer of ``ctx``: tracers pass through, Python scalars become 0-d
    constants typed by weak promotion against ``partner``, arrays become constants."""
    if isinstance(value, Tracer):
        ctx.check(value)
        return value
    if isinstance(value, (bool, int, float)) and not isinstance(value, np.generic):
        return ctx.scalar(value, scalar_dtype(value, partner))
    if isinstance(value, (list, tuple)) and any(isinstance(v, Tracer) for v in value):
        raise TraceError("a list or tuple holding traced arrays cannot be used as an array; "
                         "combine them with np.stack or np.concatenate", loc=user_loc())
    if isinstance(value, (np.ndarray, np.generic, list, tuple)):
        array = value if type(value) is np.ndarray else np.asarray(value)
        if array.dtype == np.float64 and isinstance(value, (list, tuple)) and array.size == 0:
            array = array.astype(np.intp)
        return ctx.constant(array)
    raise TraceError(f"cannot use a {type(value).__name__} in a traced computation",
                     loc=user_loc())


def _api() -> Any:
    from tilefuse.frontend import numpy_api
    return numpy_api


def _binary(ufunc: np.ufunc) -> tuple[Any, Any]:
    def forward(self: Tracer, other: Any) -> Any:
        return ufunc(self, other)

    def reflected(self: Tracer, other: Any) -> Any:
        return ufunc(other, self)

    return forward, reflected


def _method(function: Any) -> Any:
    def method(self: Tracer, *args: Any, **kwargs: Any) -> Any:
        return function(self, *args, **kwargs)
    method.__name__ = function.__name__
    method.__doc__ = f"Same as ``np.{function.__name__}(self, ...)``."
    return method


class Tracer:
    """A traced array: shape and dtype are known, values are not."""

    __slots__ = ("__weakref__", "ctx", "value")
    __array_priority__ = 1000.0   # ndarray ⊕ tracer defers to the tracer
    __hash__ = None  # type: ignore[assignment]  # like ndarray; == builds a graph node

    def __init__(self, value: Value, ctx: TraceContext):
        self.value = value
        self.ctx = ctx

    def __repr__(self) -> str:
        if self.ctx.active and not self.ctx.fullgraph:
            return self._data_dependent("repr()", repr)
        return f"Tracer({self.value.type}, tracing {self.ctx.function})"

    def __str__(self) -> str:
        if self.ctx.active:
            return self._data_dependent("str()", str)
        return repr(self)

    def __format__(self, spec: str) -> str:
        return self._data_dependent("format()", lambda a: format(a, spec))

    # ---- static metadata -------------------------------------------------------------------

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.value.type.shape)  # type: ignore[arg-type]

    @property
    def ndim(self) -> int:
        return self.value.type.rank

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    @property
    def dtype(self) -> np.dtype:
        return self.value.dtype.np

    @property
    def itemsize(self) -> int:
        return self.value.dtype.itemsize

    @property
    def nbytes(self) -> int:
        return self.size * self.itemsize

    @property
    def T(self) -> Tracer:
        return np.transpose(self)  # type: ignore[return-value]

    def __len__(self) -> int:
        if self.ndim == 0:
            raise TraceError("len() of a 0-d traced array", loc=user_loc())
        return self.shape[0]

    def __iter__(self) -> Iterator[Tracer]:
        for i in range(len(self)):
            yield self[i]

    # ---- NumPy protocols -------------------------------------------------------------------

    def __array_ufunc__(self, ufunc: np.ufunc, method: str, *inputs: Any, **kwargs: Any) -> Any:
        return _api().apply_ufunc(ufunc, method, inputs, kwargs)

    def __array_function__(self, func: Any, types: Any, args: Any, kwargs: Any) -> Any:
        if not all(issubclass(t, (Tracer, np.ndarray)) for t in types):
            return NotImplemented
        return _api().apply_function(func, args, kwargs)

    # ---- values that are not known at trace time -------------------------------------------

    def _data_dependent(self, what: str, concrete: Callable[[Any], Any]) -> Any:
        """A value Python needs now: a graph break (the region so far runs, Python goes on with
        ``concrete(value)``, guarded) or, without one, the TraceError of data-dependent flow."""
        if self.ctx.breaks is not None:
            return self.ctx.breaks.concrete(self, what, concrete)
        raise GraphBreakError(f"{DATA_DEPENDENT} ({what} of a traced {self.value.type}); use "
                              "np.where for elementwise choices, or pass the value as a static "
                              "argument", loc=user_loc())

    def __bool__(self) -> bool:
        return self._data_dependent("bool()", bool)  # type: ignore[no-any-return]

    def __int__(self) -> int:
        return self._data_dependent("int()", int)  # type: ignore[no-any-return]

    def __float__(self) -> float:
        return self._data_dependent("float()", float)  # type: ignore[no-any-return]

    def __complex__(self) -> complex:
        return self._data_dependent("complex()", complex)  # type: ignore[no-any-return]

    def __index__(self) -> int:
        return self._data_dependent("use as an index", operator.index)  # type: ignore[no-any-return]

    def item(self, *args: Any) -> Any:
        return self._data_dependent("item()", lambda a: a.item(*args))

    def tolist(self) -> Any:
        return self._data_dependent("tolist()", lambda a: a.tolist())

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        return self._data_dependent(  # type: ignore[no-any-return]
            "conversion to a NumPy array", lambda a: np.array(a, dtype=dtype))

    def __setitem__(self, key: Any, value: Any) -> None:
        raise TraceError("in-place assignment to a traced array is not supported; build a new "
                         "array (np.where, np.concatenate, np.pad)", loc=user_loc())

    # ---- operators -------------------------------------------------------------------------

    __add__, __radd__ = _binary(np.add)
    __sub__, __rsub__ = _binary(np.subtract)
    __mul__, __rmul__ = _binary(np.multiply)
    __truediv__, __rtruediv__ = _binary(np.true_divide)
    __floordiv__, __rfloordiv__ = _binary(np.floor_divide)
    __mod__, __rmod__ = _binary(np.remainder)
    __pow__, __rpow__ = _binary(np.power)
    __matmul__, __rmatmul__ = _binary(np.matmul)
    __and__, __rand__ = _binary(np.bitwise_and)
    __or__, __ror__ = _binary(np.bitwise_or)
    __xor__, __rxor__ = _binary(np.bitwise_xor)
    __lt__, __gt__ = _binary(np.less)[0], _binary(np.greater)[0]
    __le__, __ge__ = _binary(np.less_equal)[0], _binary(np.greater_equal)[0]
    __eq__, __ne__ = _binary(np.equal)[0], _binary(np.not_equal)[0]  # type: ignore[assignment]

    def __neg__(self) -> Tracer:
        return np.negative(self)  # type: ignore[no-any-return]

    def __pos__(self) -> Tracer:
        return np.positive(self)  # type: ignore[no-any-return]

    def __abs__(self) -> Tracer:
        return np.absolute(self)  # type: ignore[no-any-return]

    def __round__(self, ndigits: int | None = None) -> Tracer:
        return np.round(self, ndigits or 0)  # type: ignore[no-any-return]

    def __invert__(self) -> Tracer:
        return np.invert(self)  # type: ignore[no-any-return]

    def __getitem__(self, key: Any) -> Tracer:
        from tilefuse.frontend.indexing import getitem
        return getitem(self, key)

    # ---- methods ---------------------------------------------------------------------------

    def reshape(self, *shape: Any, order: str = "C") -> Tracer:
        if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
            shape = tuple(shape[0])
        return np.reshape(self, shape, order=order)  # type: ignore[no-any-return]

    def transpose(self, *axes: Any) -> Tracer:
        if len(axes) == 1 and (axes[0] is None or isinstance(axes[0], (tuple, list))):
            axes = axes[0]
        return np.transpose(self, axes or None)  # type: ignore[no-any-return]

    def astype(self, dtype: Any, order: str = "K", casting: str = "unsafe",
               subok: bool = True, copy: bool = True) -> Tracer:
        return _api().astype(self, dtype)  # type: ignore[no-any-return]

    def flatten(self, order: str = "C") -> Tracer:
        return np.ravel(self, order=order)  # type: ignore[no-any-return]

    def copy(self, order: str = "C") -> Tracer:
        return self

    sum = _method(np.sum)
    mean = _method(np.mean)
    max = _method(np.max)
    min = _method(np.min)
    prod = _method(np.prod)
    var = _method(np.var)
    std = _method(np.std)
    argmax = _method(np.argmax)
    argmin = _method(np.argmin)
    clip = _method(np.clip)
    squeeze = _method(np.squeeze)
    ravel = _method(np.ravel)
    swapaxes = _method(np.swapaxes)
    dot = _method(np.dot)
    take = _method(np.take)
