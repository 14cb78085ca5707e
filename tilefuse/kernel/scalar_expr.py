"""Scalar expressions of a fused kernel: what one element (or one lane run) of a group value is,
as a loop-IR expression over the group's inputs.

Two pieces:

* :class:`ExprOps`, the handle an op's ``lowering`` gets. A lowering is
  ``lowering(ops, *args, **attrs) -> Expr`` (see :mod:`tilefuse.ops.elementwise`): ``args`` are
  the operands' expressions in their graph dtypes, all with ``ops.lanes`` lanes; the result must
  have the node's output dtype. ``ops`` holds the node's output dtype and the recipe every
  elementwise reference follows (:meth:`ExprOps.map`: cast to the working dtype, compute, round
  once), plus the few algorithms that are not single loop-IR ops (float floor division and
  modulo, integer powers).
* :class:`ElementBuilder` (and the one-shot :func:`element_expr`), which walks a group's nodes
  back from a value to the group inputs: elementwise nodes through their lowering, movement
  nodes (broadcast_to, expand_dims, squeeze, reshape, transpose, slice, window_patches and
  constant pad) as index remappings,
  scalar sources as constants. Each (value, index, lanes) is built once. Given a
  :class:`~tilefuse.kernel.access.Namer`, the builder binds every computed value to a ``Let``
  (collected in :attr:`ElementBuilder.lets`, to be placed before the statements that use the
  result), so expressions stay small; without one it returns one shared expression DAG.

Lane runs follow :mod:`tilefuse.kernel.access`: ``lanes > 1`` elements starting at ``index``,
in C order, inside the value's trailing ``block`` axes. A run that is not contiguous in some
operand raises :class:`~tilefuse.kernel.access.NotVectorizable`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

import numpy as np

from tilefuse.dtypes import DType, promote_all
from tilefuse.errors import CompileError
from tilefuse.graph.ir import Node, Value
from tilefuse.graph.types import normalize_axes, normalize_axis
from tilefuse.kernel.access import (
    UNIFORM,
    LoadInput,
    Namer,
    NotVectorizable,
    broadcast_run,
    dims,
    flatten,
    reshaped_run,
    sliced_run,
    transposed_run,
    unflatten,
    whole_vector_run,
)
from tilefuse.loop.ir import (
    BINARY,
    COMPARE,
    Expr,
    Let,
    LType,
    XOp,
    binary,
    broadcast,
    cast,
    const,
    fma,
    select,
    unary,
    var,
)
from tilefuse.ops.registry import OpKind

Override = Expr | Callable[[tuple[Expr, ...], int], Expr]
"""A value computed elsewhere: an expression (used at any index; scalars are broadcast to the
requested lanes) or ``f(index, lanes) -> Expr``."""

_HALF = frozenset({DType.f16, DType.bf16})
_BOOL_ARITH = {"add": "or_", "max": "or_", "mul": "and_", "min": "and_"}


class KernelGroupLike(Protocol):
    """What the builder needs of a :class:`~tilefuse.kernel.fusion.KernelGroup`."""

    name: str
    nodes: tuple[Node, ...]
    inputs: tuple[Value, ...]
    outputs: tuple[Value, ...]


def work_dtype(dtype: DType) -> DType:
    """The dtype a value of ``dtype`` is computed in: f32 for f16/bf16, else itself."""
    return DType.f32 if dtype in _HALF else dtype


def typed_const(value: float | int | bool, dtype: DType, lanes: int = 1) -> Expr:
    """A constant holding ``value`` converted to ``dtype`` the way NumPy's ``astype`` does."""
    exact = np.array(value).astype(dtype.np).item()
    return const(exact if not isinstance(exact, float) else float(exact), dtype, lanes)


def xop(name: str) -> XOp:
    """The loop-IR op called ``name`` (``"add"``, ``"and"``/``"and_"``, ``"exp"``, ...)."""
    try:
        return XOp(name)
    except ValueError:
        try:
            return XOp(name + "_")
        except ValueError:
            raise CompileError(f"no loop-IR op {name!r}") from None


class ExprOps:
    """The handle an op lowering builds its expression with, for one node at ``lanes`` lanes.

    ``out`` is the node's output dtype; ``work`` the dtype its math runs in (f32 for f16/bf16
    outputs, as in the references). Expressions combine with Python operators (``a + 1``,
    ``0.5 * x``: plain numbers become constants of the other operand's type) and with
    :meth:`call` for every other loop-IR op.
    """

    def __init__(self, out: DType, lanes: int, share: Callable[[Expr], Expr] | None = None):
        self.out = out
        self.lanes = lanes
        self.work = work_dtype(out)
        self._share = share

    # ------------------------------------------------------------------ building blocks
    def cast(self, x: Expr, dtype: DType) -> Expr:
        """``x`` converted to ``dtype`` (itself when it already has it)."""
        return x if x.dtype is dtype else cast(x, dtype)

    def const(self, value: float | int | bool, dtype: DType | None = None) -> Expr:
        """A ``lanes``-wide constant of ``dtype`` (default: the working dtype)."""
        return typed_const(value, dtype or self.work, self.lanes)

    def call(self, name: str, *args: Expr | float | int) -> Expr:
        """The loop-IR op ``name`` on ``args`` (one type; numbers take the others' type)."""
        op = xop(name)
        if op in BINARY or op in COMPARE:
            return binary(op, *args)  # type: ignore[arg-type]
        if op is XOp.SELECT:
            return select(*args)  # type: ignore[arg-type]
        if op is XOp.FMA:
            return fma(*args)  # type: ignore[arg-type]
        return unary(op, args[0])  # type: ignore[arg-type]

    def share(self, x: Expr) -> Expr:
        """``x`` bound to a name when the builder keeps lets (for values used many times)."""
        return x if self._share is None else self._share(x)

    # ------------------------------------------------------------------ recipes
    def map(self, fn: Callable[..., Expr], *args: Expr, dtype: DType | None = None) -> Expr:
        """The elementwise reference recipe: ``args`` cast to the working dtype (or
        ``dtype``'s), ``fn`` applied, the result rounded once to the output dtype."""
        work = work_dtype(dtype) if dtype is not None else self.work
        return self.cast(fn(*(self.cast(a, work) for a in args)), self.out)

    def unary(self, name: str, x: Expr) -> Expr:
        """A one-op unary function under :meth:`map`."""
        return self.map(lambda v: self.call(name, v), x)

    def binary(self, name: str, a: Expr, b: Expr) -> Expr:
        """A one-op binary function under :meth:`map`; on bools add/max are ``or`` and
        mul/min are ``and`` (NumPy's bool arithmetic)."""
        if self.work is DType.bool:
            name = _BOOL_ARITH.get(name, name)
        return self.map(lambda u, v: self.call(name, u, v), a, b)

    def compare(self, name: str, a: Expr, b: Expr) -> Expr:
        """A comparison in the operands' promoted dtype."""
        return self.map(lambda u, v: self.call(name, u, v), a, b,
                        dtype=promote_all((a.dtype, b.dtype)))

    def logical(self, name: str, *args: Expr) -> Expr:
        """``and``/``or``/``xor``/``not`` of the operands' truth values (nonzero, NaN too)."""
        return self.call(name, *(self.cast(a, DType.bool) for a in args))

    # ------------------------------------------------------------------ algorithms
    def floordiv(self, a: Expr, b: Expr) -> Expr:
        """Python's ``a // b``: integers natively (0 for a zero divisor), floats by divmod."""
        return self.call("floordiv", a, b) if not a.dtype.is_float else self._divmod(a, b)[0]

    def mod(self, a: Expr, b: Expr) -> Expr:
        """Python's ``a % b``: the result has the divisor's sign."""
        return self.call("mod", a, b) if not a.dtype.is_float else self._divmod(a, b)[1]

    def _divmod(self, a: Expr, b: Expr) -> tuple[Expr, Expr]:
        """Float divmod, f32 in f64: exact (like NumPy's fmod-based one) while the quotient
        has at most 53 bits."""
        if a.dtype is DType.f64:
            return self._divmod_f64(a, b)
        q, r = self._divmod_f64(cast(a, DType.f64), cast(b, DType.f64))
        return cast(q, a.dtype), cast(r, a.dtype)

    def _divmod_f64(self, a: Expr, b: Expr) -> tuple[Expr, Expr]:
        """Float floor division and modulo as NumPy computes them: q = floor(a/b) corrected
        by one where the quotient's rounding crossed an integer, r = a - q*b (one rounding);
        a finite a over an infinite b leaves r = a."""
        a, b = self.share(a), self.share(b)
        q = self.share(self.call("floor", a / b))
        finite_a = self.call("lt", self.call("abs", a), float("inf"))
        inf_b = self.call("and", self.call("eq", self.call("abs", b), float("inf")), finite_a)
        r = self.share(self.call("select", inf_b, a, fma(-q, b, a)))
        sign_r, sign_b = self.call("lt", r, 0), self.call("lt", b, 0)
        below = self.call("and", self.call("ne", r, 0), self.call("ne", sign_r, sign_b))
        above = self.call("ge", self.call("abs", r), self.call("abs", b))
        q = self.share(self.call("select", below, q - 1, self.call("select", above, q + 1, q)))
        r = self.call("select", below, r + b, self.call("select", above, r - b, r))
        nan = self.call("and", self.call("isnan", r), self.call("ne", b, 0))  # inf // x: NaN
        return self.call("select", nan, r, q), r

    def ipow(self, base: Expr, exponent: Expr) -> Expr:
        """Integer ``base ** exponent`` by squaring (wrapping like NumPy); 0 for negative
        exponents, which the reference rejects."""
        bits = 1 if base.dtype is DType.bool else base.dtype.itemsize * 8
        result, b, e = self.const(1, base.dtype), self.share(base), self.share(exponent)
        for _ in range(bits):
            odd = self.call("ne", e % 2, 0)
            result = self.share(self.call("select", odd, result * b, result))
            b, e = self.share(b * b), self.share(e // 2)
        return self.call("select", self.call("lt", exponent, 0), 0, result)

    def pow(self, a: Expr, b: Expr) -> Expr:
        return self.call("pow", a, b) if a.dtype.is_float else self.ipow(a, b)


def _trivial(e: Expr, depth: int = 0) -> bool:
    """Cheap to repeat: leaves, loads, and casts/broadcasts of those."""
    if e.op in (XOp.CONST, XOp.VAR, XOp.THREAD_ID, XOp.LOAD):
        return True
    return e.op in (XOp.BROADCAST, XOp.CAST) and depth < 2 and _trivial(e.args[0], depth + 1)


class ElementBuilder:
    """Builds group values at indices, sharing work within one loop body.

    ``names``: when given, every computed value becomes a ``Let`` in :attr:`lets` (in
    dependency order) and expressions refer to it by name; build one builder per loop body.
    """

    def __init__(self, group: KernelGroupLike, load_input: LoadInput,
                 overrides: Mapping[Value, Override] | None = None, *,
                 names: Namer | None = None):
        self.group = group
        self.producers = {v: n for n in group.nodes for v in n.outputs}
        self.inputs = frozenset(group.inputs)
        self.load_input = load_input
        self.overrides = dict(overrides or {})
        self.names = names
        self.lets: list[Let] = []
        self._memo: dict[tuple[Value, tuple[Expr, ...], int], Expr] = {}

    def value(self, v: Value, index: Sequence[Expr], lanes: int = 1, block: int = 1) -> Expr:
        """``v`` at ``index`` (one i64 expression per axis of v); ``lanes > 1``: the run of
        that many elements in C order within v's trailing ``block`` axes."""
        key = (v, tuple(index), lanes)
        found = self._memo.get(key)
        if found is None:
            found = self._compute(v, tuple(index), lanes, block)
            self._memo[key] = found
        return found

    def share(self, e: Expr) -> Expr:
        if self.names is None or _trivial(e):
            return e
        name = self.names.fresh("t")
        self.lets.append(Let(name, e))
        return var(name, e.type)

    def fail(self, message: str) -> CompileError:
        return CompileError(f"kernel {self.group.name}: {message}")

    # ------------------------------------------------------------------ dispatch
    def _compute(self, v: Value, index: tuple[Expr, ...], lanes: int, block: int) -> Expr:
        if v in self.overrides:
            return self._override(v, index, lanes)
        node = self.producers.get(v)
        if node is None:
            if v not in self.inputs:
                raise self.fail(f"{v.type} is neither computed in the group nor an input")
            shape = dims(v.shape)
            if lanes > 1 and (not shape or shape[-1] == 1):
                raise NotVectorizable(f"lane run along a size-1 last axis of {v.type}")
            return self.load_input(v, index, lanes)
        kind = node.op.kind
        if kind is OpKind.ELEMENTWISE:
            return self._elementwise(node, v, index, lanes, block)
        if kind is OpKind.MOVEMENT:
            return self._movement(node, v, index, lanes, block)
        if kind is OpKind.SOURCE:
            return self._source(node, v, index, lanes)
        raise self.fail(f"{node.op.name} ({kind.value}) is not computed elementwise; its "
                        "result must be an input or an override")

    def _override(self, v: Value, index: tuple[Expr, ...], lanes: int) -> Expr:
        given = self.overrides[v]
        e = given(index, lanes) if callable(given) else given
        if e.lanes == lanes:
            return e
        if e.lanes == 1:
            return broadcast(e, lanes)
        raise self.fail(f"override for {v.type} has {e.lanes} lanes, {lanes} requested")

    def _elementwise(self, node: Node, v: Value, index: tuple[Expr, ...], lanes: int,
                     block: int) -> Expr:
        if node.op.lowering is None:
            raise self.fail(f"op {node.op.name} has no lowering")
        shape = dims(v.shape)
        args = [self._operand(u, shape, index, lanes, block) for u in node.inputs]
        ops = ExprOps(v.dtype, lanes, self.share if self.names is not None else None)
        e = node.op.lowering(ops, *args, **dict(node.attrs))
        if e.type != LType(v.dtype, lanes):
            raise self.fail(f"the lowering of {node.op.name} gave {e.type}, expected "
                            f"{LType(v.dtype, lanes)}")
        return self.share(e)

    def _operand(self, u: Value, out: tuple[int, ...], index: tuple[Expr, ...], lanes: int,
                 block: int) -> Expr:
        """Operand ``u`` of a node of shape ``out``, NumPy-broadcast to it."""
        shape = dims(u.shape)
        offset = len(out) - len(shape)
        u_index = tuple(const(0) if d == 1 else index[offset + a] for a, d in enumerate(shape))
        run = broadcast_run(shape, out, block) if lanes > 1 else UNIFORM
        if run == UNIFORM:
            scalar = self.value(u, u_index)
            return scalar if lanes == 1 else broadcast(scalar, lanes)
        return self.value(u, u_index, lanes, run)

    # ------------------------------------------------------------------ movement
    def _movement(self, node: Node, v: Value, index: tuple[Expr, ...], lanes: int,
                  block: int) -> Expr:
        name, attrs = node.op.name, node.attrs
        (u,) = node.inputs
        out, shape = dims(v.shape), dims(u.shape)
        if name == "broadcast_to":
            return self._operand(u, out, index, lanes, block)
        if name == "transpose":
            perm = tuple(normalize_axis(p, len(out)) for p in attrs["perm"])
            u_index = [const(0)] * len(shape)
            for a, p in enumerate(perm):
                u_index[p] = index[a]
            run = transposed_run(shape, perm, block) if lanes > 1 else 1
            return self.value(u, u_index, lanes, run)
        if name == "slice":
            ranges = [range(d)[slice(s, e, st)] for d, s, e, st in
                      zip(shape, attrs["starts"], attrs["stops"], attrs["steps"])]
            u_index = [i if r.step == 1 and r.start == 0 else r.start + i * r.step
                       for i, r in zip(index, ranges)]
            run = sliced_run(shape, out, ranges, block) if lanes > 1 else 1
            return self.value(u, u_index, lanes, run)
        if name in ("reshape", "expand_dims", "squeeze"):
            u_index = self._reindex(name, attrs, index, shape, out)
            run = reshaped_run(shape, out, block, lanes) if lanes > 1 else 1
            try:
                return self.value(u, u_index, lanes, run)
            except NotVectorizable:
                narrow = whole_vector_run(shape, out, block, lanes)
                if narrow is None or narrow == run:
                    raise
                return self.value(u, u_index, lanes, narrow)
        if name == "window_patches":
            return self._window(attrs, u, index, lanes, block)
        if name == "pad" and attrs["mode"] == "constant":
            return self._pad(attrs, u, index, lanes, block)
        raise self.fail(f"movement op {name} is not an index remapping the kernel lowering "
                        "supports (it must be its own kernel)")

    def _window(self, attrs: Mapping[str, Any], u: Value, index: tuple[Expr, ...], lanes: int,
                block: int) -> Expr:
        """im2col as a remap: ``out[n, i, j, a, b, c] = u[n, i·sh + a·dh, j·sw + b·dw, c]``;
        lanes may run along C only (the one axis both share contiguously)."""
        if lanes > 1 and block > 1 and dims(u.shape)[-1] % lanes:
            # a lane-aligned run stays inside one C row only when C is a multiple of the lanes
            raise NotVectorizable("window_patches runs vectors along C only")
        n, i, j, a, b, c = index
        (sh, sw), (dh, dw) = attrs["strides"], attrs["dilations"]
        return self.value(u, (n, i * sh + a * dh, j * sw + b * dw, c), lanes, 1)

    def _pad(self, attrs: Mapping[str, Any], u: Value, index: tuple[Expr, ...], lanes: int,
             block: int) -> Expr:
        """Constant padding as a remap: ``u`` at the shifted index (clamped inside ``u``) where
        every padded axis is in range, else the fill; lanes may run along an unpadded last axis
        only (the bounds test is then one per run)."""
        pads, shape = attrs["pads"], dims(u.shape)
        if lanes > 1 and (pads[-2] or pads[-1] or (block > 1 and shape[-1] % lanes)):
            raise NotVectorizable("pad runs vectors along an unpadded last axis only")
        inside: Expr | None = None
        at: list[Expr] = []
        for axis, i in enumerate(index):
            before, after = pads[2 * axis], pads[2 * axis + 1]
            if not before and not after:
                at.append(i)
                continue
            j = i - before
            ok = binary(XOp.AND, binary(XOp.GE, j, const(0)), binary(XOp.LT, j, const(shape[axis])))
            inside = ok if inside is None else binary(XOp.AND, inside, ok)
            at.append(binary(XOp.MIN, binary(XOp.MAX, j, const(0)), const(shape[axis] - 1)))
        value = self.value(u, tuple(at), lanes, 1)
        if inside is None:
            return value
        fill = typed_const(attrs["value"], u.dtype, lanes)
        return self.share(select(inside if lanes == 1 else broadcast(inside, lanes), value, fill))

    @staticmethod
    def _reindex(name: str, attrs: Mapping[str, Any], index: tuple[Expr, ...],
                 shape: tuple[int, ...], out: tuple[int, ...]) -> tuple[Expr, ...]:
        """The operand index of a C-order-preserving movement op."""
        if name == "expand_dims":
            added = set(normalize_axes(attrs["axes"], len(out)))
            return tuple(i for a, i in enumerate(index) if a not in added)
        if name == "squeeze":
            axes = attrs["axes"]
            dropped = (set(normalize_axes(axes, len(shape))) if axes is not None
                       else {a for a, d in enumerate(shape) if d == 1})
            rest = iter(index)
            return tuple(const(0) if a in dropped else next(rest) for a in range(len(shape)))
        return _regrouped(index, out, shape)

    # ------------------------------------------------------------------ sources
    def _source(self, node: Node, v: Value, index: tuple[Expr, ...], lanes: int) -> Expr:
        attrs = node.attrs
        if node.op.name == "full":
            return typed_const(attrs["value"], v.dtype, lanes)
        if node.op.name == "constant" and attrs["value"].array.size == 1:
            return typed_const(attrs["value"].array.reshape(-1)[0].item(), v.dtype, lanes)
        if node.op.name == "arange":
            if lanes > 1:
                raise NotVectorizable("arange varies along the lanes")
            position = cast(index[0], DType.f64)
            wide = attrs["start"] + position * attrs["step"]
            return self.share(cast(wide, v.dtype))
        raise self.fail(f"{node.op.name} with {v.type} inside a kernel: make it a kernel input")


def _regrouped(index: tuple[Expr, ...], out: tuple[int, ...], shape: tuple[int, ...]
               ) -> tuple[Expr, ...]:
    """The operand index of a reshape from ``shape`` to ``out``, group by group: consecutive
    axes of each side whose sizes multiply to the same number map through each other alone
    (a merge of [N, OH, OW] into M is ``unflatten(m, (N, OH, OW))``, not a division of the
    whole flat position). Runtime sizes (Exprs) map through a common leading run of equal
    axes one to one ([B,S,768] -> [B,S,12,64]: B and S stay, 768 splits with constant
    divisors); past that run they take the flat position of what is left."""
    if not all(isinstance(d, int) for d in (*out, *shape)):
        lead = 0
        while lead < min(len(out), len(shape)) and out[lead] == shape[lead] \
                and not (isinstance(out[lead], int) and out[lead] == 1):
            lead += 1
        if lead == 0:
            return unflatten(flatten(index, out), shape)
        return (*index[:lead], *_regrouped(index[lead:], out[lead:], shape[lead:]))
    result: list[Expr] = []
    i = j = 0
    while i < len(out) or j < len(shape):
        o_axes, s_axes = [], []
        o_size = s_size = 1
        while True:
            if o_size <= s_size and i < len(out) and (o_size < s_size or not o_axes):
                o_axes.append(i)
                o_size *= out[i]
                i += 1
            elif j < len(shape) and (s_size < o_size or not s_axes):
                s_axes.append(j)
                s_size *= shape[j]
                j += 1
            else:
                break
        if o_size != s_size:  # the sizes never meet: one group of everything left
            return unflatten(flatten(index, out), shape)
        flat = flatten([index[a] for a in o_axes], [out[a] for a in o_axes])
        result.extend(unflatten(flat, [shape[b] for b in s_axes]))
    return tuple(result)


def element_expr(group: KernelGroupLike, value: Value, index: Sequence[Expr], lanes: int,
                 load_input: LoadInput, overrides: Mapping[Value, Override] | None = None, *,
                 names: Namer | None = None, lets: list[Let] | None = None) -> Expr:
    """The expression of group value ``value`` at ``index`` (one i64 expression per axis of its
    shape; with ``lanes > 1`` the last index is lane 0 and the lanes run along the last axis).

    ``load_input(v, index, lanes)`` loads group inputs (``index`` over the input's own shape;
    ``lanes > 1`` only when its last axis is longer than 1, lanes contiguous from ``index``);
    ``overrides`` gives values computed elsewhere (matmul accumulators, per-row reductions).
    Repeated sub-values are one shared node, so the result is a DAG; with ``names`` and
    ``lets`` every computed value is instead bound to a ``Let`` appended to ``lets`` (place
    them before the statement using the result), which keeps long chains small. Raises
    :class:`~tilefuse.kernel.access.NotVectorizable` when a run is not contiguous somewhere.
    """
    if (names is None) != (lets is None):
        raise CompileError("element_expr needs both names and lets, or neither")
    builder = ElementBuilder(group, load_input, overrides, names=names)
    result = builder.value(value, tuple(index), lanes)
    if lets is not None:
        lets.extend(builder.lets)
    return result
