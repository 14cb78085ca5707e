"""Index arithmetic for kernel lowerings: static shapes, C-order flat offsets and their inverse,
the default load of a group input, lane-run rules through broadcasting and movement, and unique
names for buffers and generated variables.

An *index* of a value is a tuple of ``i64`` expressions, one per axis of the value's own shape
(an axis of size 1 is indexed by the constant 0). :func:`unflatten` turns a flat C-order position
into such an index, and :func:`flatten` turns it back: when the index is exactly what
:func:`unflatten` made (possibly a run of axes per call), ``flatten`` returns the flat position
itself, with no division left. That is what lets a kernel walk a whole tensor (or a whole row)
with one loop variable while movement ops such as reshape remap indices through flat positions.

*Lane runs.* A request for ``lanes > 1`` elements of a value at ``index`` means the elements at
the C-order positions ``flatten(index) + 0 .. lanes-1`` of that value, all inside its trailing
*block* of axes (the caller keeps runs from crossing a block's end). ``block == 1`` is the
common case: lanes along the last axis. The rule functions below say how a run maps through one
op onto an operand: to a run over the operand's trailing ``n`` axes, to a single element
(:data:`UNIFORM`), or to nothing contiguous (:class:`NotVectorizable`).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from tilefuse.errors import CompileError
from tilefuse.graph.ir import Node, Value
from tilefuse.graph.types import Shape, Sym
from tilefuse.loop.ir import BufferParam, Expr, XOp, broadcast, const, var
from tilefuse.ops.registry import OpKind

LoadInput = Callable[[Value, tuple[Expr, ...], int], Expr]
"""``load_input(value, index, lanes)``: the load of a group input (see :func:`load_contiguous`)."""

UNIFORM = 0
"""A lane run that maps to one operand element (computed once, then broadcast)."""


class NotVectorizable(CompileError):
    """A lane run that is not contiguous in some operand; the lowering retries with a smaller
    block or with scalars."""


def dims(shape: Shape, what: str = "kernel shape") -> tuple[int, ...]:
    """``shape`` with each symbolic dim as its runtime extent (:func:`extent_of`, an ``i64``
    scalar parameter of the kernel); a static shape comes back as its ints, unchanged.

    Lowerings that support symbolic extents compute with the mixed tuple (Exprs take part in
    ``*``, ``+``, ``//``, ``%``); a Python decision that needs a number must not compare an
    Expr (that raises TypeError, which :func:`symbolic_lowering` turns into a CompileError)."""
    if all(isinstance(d, int) for d in shape):
        return tuple(shape)  # type: ignore[arg-type]
    return tuple(d if isinstance(d, int) else extent_of(d) for d in shape)  # type: ignore


SCALAR_PREFIX = "dim_"
"""Kernel scalar parameters holding a symbol's runtime size are named ``dim_<symbol>``."""


def extent_of(sym: Sym) -> Expr:
    """The runtime size of ``sym`` inside a kernel: the scalar parameter ``dim_<sym>``."""
    return var(SCALAR_PREFIX + sym.name)


def symbol_scalars(values: Iterable[Value]) -> tuple[str, ...]:
    """The scalar parameters a kernel over ``values`` takes: one per symbol in their shapes,
    sorted by name (so the launcher passes them in a known order)."""
    found = {d.name for v in values for d in v.shape if isinstance(d, Sym)}
    return tuple(SCALAR_PREFIX + name for name in sorted(found))


def symbol_broadcast(nodes: Iterable[Node]) -> str | None:
    """Why ``nodes`` cannot be lowered with runtime extents, when a symbolic dim of some
    operand is broadcast against another dim (``f32[b] + f32[5]``: ``b`` is 1 or 5, and only
    the size says whether the operand is stretched); None when no symbol is."""
    for node in nodes:
        if node.op.kind is not OpKind.ELEMENTWISE and node.op.name != "broadcast_to":
            continue
        out = node.outputs[0].shape
        for value in node.inputs:
            shape = value.shape
            for d, o in zip(reversed(shape), reversed(out)):
                if isinstance(d, Sym) and d != o:
                    return (f"{node.op.name} broadcasts symbol {d} of {value.type} against "
                            f"{o} (1 or {o} is known only per size)")
    return None


def extent_value(size: int | Expr, sizes: Mapping[str, int]) -> int:
    """A size that may be a runtime extent (an ``i64`` expression over ``dim_<symbol>``
    scalars: products, sums, quotients) evaluated for one binding (``sizes`` by scalar name)."""
    if isinstance(size, int):
        return size
    if size.op is XOp.CONST:
        return int(size.arg)  # type: ignore[arg-type]
    if size.op is XOp.VAR:
        return sizes[size.arg]  # type: ignore[index]
    a, b = (extent_value(x, sizes) for x in size.args)
    ops = {XOp.ADD: lambda: a + b, XOp.SUB: lambda: a - b, XOp.MUL: lambda: a * b,
           XOp.FLOORDIV: lambda: a // b if b else 0, XOp.MOD: lambda: a % b if b else 0,
           XOp.MIN: lambda: min(a, b), XOp.MAX: lambda: max(a, b)}
    if size.op not in ops:
        raise CompileError(f"a size {size} that is not integer arithmetic")
    return ops[size.op]()


def is_extent(d: object) -> bool:
    """True for a runtime extent (an Expr dim), False for a static one."""
    return isinstance(d, Expr)


def as_extent(d: int | Expr) -> Expr:
    """A dim (static or runtime) as an ``i64`` expression."""
    return d if isinstance(d, Expr) else const(d)


def c_strides(shape: Sequence[int]) -> tuple[int, ...]:
    """Element strides of a C-contiguous array of ``shape``."""
    strides = [1] * len(shape)
    for a in range(len(shape) - 2, -1, -1):
        strides[a] = strides[a + 1] * shape[a + 1]
    return tuple(strides)


def zeros(rank: int) -> tuple[Expr, ...]:
    return (const(0),) * rank


def unflatten(flat: Expr, shape: Sequence[int]) -> tuple[Expr, ...]:
    """The index of C-order position ``flat`` (``0 <= flat < prod(shape)``) in ``shape``."""
    index = list(zeros(len(shape)))
    axes = [a for a, d in enumerate(shape) if d != 1]
    inner = 1
    for a in reversed(axes):
        q = flat if inner == 1 else flat // inner
        index[a] = q if a == axes[0] else q % shape[a]
        inner *= shape[a]
    return tuple(index)


def squeezed(shape: Sequence[int]) -> tuple[int, ...]:
    """``shape`` without its size-1 axes (shapes with equal squeezed forms list the same
    elements in the same C order)."""
    return tuple(d for d in shape if d != 1)


def reindex(index: Sequence[Expr], shape: Sequence[int], target: Sequence[int]
            ) -> tuple[Expr, ...]:
    """``index`` (over ``shape``) as an index over ``target``, a shape with the same squeezed
    form: the same element."""
    entries = iter([i for i, d in zip(index, shape) if d != 1])
    return tuple(const(0) if d == 1 else next(entries) for d in target)


def flatten(index: Sequence[Expr], shape: Sequence[int]) -> Expr:
    """The C-order position of ``index`` in ``shape``; runs of axes made by :func:`unflatten`
    collapse back to the flat position they came from."""
    axes = [a for a, d in enumerate(shape) if d != 1]
    terms: list[Expr] = []
    stride = 1
    k = len(axes) - 1
    while k >= 0:
        run = _unflattened_run(index, shape, axes, k)
        if run is None:
            flat, first = index[axes[k]], k
        else:
            flat, first = run
        terms.append(flat if stride == 1 else flat * stride)
        stride *= math.prod(shape[a] for a in axes[first:k + 1])
        k = first - 1
    if not terms:
        return const(0)
    total = terms[-1]
    for term in reversed(terms[:-1]):
        total = total + term
    return total


def _unflattened_run(index: Sequence[Expr], shape: Sequence[int], axes: list[int],
                     k: int) -> tuple[Expr, int] | None:
    """``(flat, j)`` when the indices of ``axes[j..k]`` are ``unflatten(flat, ...)``."""
    last = index[axes[k]]
    if last.op is not XOp.MOD or last.args[1] != as_extent(shape[axes[k]]):
        return None
    flat = last.args[0]
    inner = shape[axes[k]]
    for j in range(k - 1, -1, -1):
        a = axes[j]
        q = flat // inner
        if index[a] == q:
            return flat, j
        if index[a] != q % shape[a]:
            return None
        inner *= shape[a]
    return None


# ----------------------------------------------------------------------------- lane runs


def broadcast_run(operand: Sequence[int], out: Sequence[int], block: int) -> int:
    """How a run over ``out``'s trailing ``block`` axes maps onto an operand that NumPy
    broadcasting stretches to ``out``: :data:`UNIFORM`, or the operand's block size."""
    offset = len(out) - len(operand)
    aligned = [operand[a - offset] if a >= offset else 1 for a in range(len(out) - block,
                                                                           len(out))]
    if all(d == 1 for d in aligned):
        return UNIFORM
    if tuple(aligned) == tuple(out[len(out) - block:]):
        return min(block, len(operand))
    raise NotVectorizable(f"a run over {list(out[len(out) - block:])} is not contiguous in "
                          f"the broadcast operand {list(operand)}")


def reshaped_run(operand: Sequence[int], out: Sequence[int], block: int, lanes: int = 1) -> int:
    """The operand block of a run through an op that keeps C order (reshape, expand_dims,
    squeeze): its trailing axes holding exactly the run's block of elements; failing that (a
    reshape that splits an axis inside the run, as a group norm's [N, C, H, W] → [N, G, C/G·H·W]
    does), the fewest trailing axes holding a multiple of ``lanes`` elements. That is exact
    because a run of a multiple of ``lanes`` elements starts at a multiple of its size and its
    vectors at multiples of ``lanes`` from there (:func:`run_loops`, the row passes), so no
    vector crosses a block of those axes: in C order the vector's elements are then contiguous
    in the operand too."""
    size = math.prod(out[len(out) - block:])
    total = 1
    for a in range(len(operand) - 1, -1, -1):
        total *= operand[a]
        if total == size and size > 1:
            return len(operand) - a
    whole = whole_vector_run(operand, out, block, lanes)
    if whole is not None:
        return whole
    raise NotVectorizable(f"a run over {size} elements does not map to trailing axes of "
                          f"{list(operand)}")


def whole_vector_run(operand: Sequence[int], out: Sequence[int], block: int,
                     lanes: int) -> int | None:
    """The fewest trailing axes of ``operand`` holding a multiple of ``lanes`` elements, when
    the run's block holds whole vectors (None otherwise): the block :func:`reshaped_run` falls
    back to, and what an exact block is narrowed to when a later remap (a transpose of the
    split axes, as attention's [S, H·D] ← [H, S, D] is) keeps only the vectors contiguous."""
    if lanes <= 1 or math.prod(out[len(out) - block:]) % lanes:
        return None
    total = 1
    for a in range(len(operand) - 1, -1, -1):
        total *= operand[a]
        if total % lanes == 0:
            return len(operand) - a
    return None


def transposed_run(operand: Sequence[int], perm: Sequence[int], block: int) -> int:
    """The operand block of a run through ``transpose(perm)``: legal when the block's axes
    are the operand's trailing axes, in order (size-1 axes aside)."""
    rank = len(perm)
    sources = [perm[a] for a in range(rank - block, rank) if operand[perm[a]] != 1]
    nonunit = [a for a in range(rank) if operand[a] != 1]
    if not sources or nonunit[len(nonunit) - len(sources):] != sources:
        raise NotVectorizable(f"transpose {list(perm)} moves the lane axis of {list(operand)}")
    return rank - sources[0]


def sliced_run(operand: Sequence[int], out: Sequence[int], ranges: Sequence[range],
               block: int) -> int:
    """The operand block of a run through a slice: the block's first axis must step by 1 and
    every later block axis must be whole."""
    axes = [a for a in range(len(out) - block, len(out)) if out[a] != 1]
    for pos, a in enumerate(axes):
        whole = ranges[a].step == 1 and len(ranges[a]) == operand[a]
        if ranges[a].step != 1 or (pos > 0 and not whole):
            raise NotVectorizable(f"slice {ranges[a]} of axis {a} breaks the lane run")
    return block


# ----------------------------------------------------------------------------- buffers, names


class Namer:
    """Unique names within one kernel: ``fresh("c")`` gives ``c``, then ``c1``, ``c2`` ..."""

    def __init__(self, taken: Iterable[str] = ()):
        self.taken = set(taken)

    def fresh(self, prefix: str) -> str:
        name, n = prefix, 0
        while name in self.taken:
            n += 1
            name = f"{prefix}{n}"
        self.taken.add(name)
        return name

    def fork(self) -> Namer:
        """A namer that starts from this one's names (for a trial that may be thrown away)."""
        return Namer(self.taken)

    def adopt(self, other: Namer) -> None:
        """Takes the names ``other`` (a fork) handed out."""
        self.taken |= other.taken


def identifier(text: str, fallback: str = "kernel") -> str:
    """``text`` made into an identifier (other characters become ``_``)."""
    name = "".join(ch if ch.isalnum() or ch == "_" else "_" for ch in text) or fallback
    return name if name.isidentifier() else f"{fallback}_{name}"


@dataclass(frozen=True)
class KernelBuffers:
    """The buffer arguments of a kernel: group inputs (readonly) then group outputs."""

    inputs: Mapping[Value, BufferParam]
    outputs: Mapping[Value, BufferParam]

    @property
    def params(self) -> tuple[BufferParam, ...]:
        return (*self.inputs.values(), *self.outputs.values())

    def names(self) -> set[str]:
        return {b.name for b in self.params}


def _user_name(name: str) -> str:
    """A buffer name for the user's value ``name`` that no lowering's own names take: those
    are letters then digits (``w1``, ``k0``, ``acc0_0``), so such a user name gets a trailing
    ``_`` (an argument ``w1`` read in place beside the write-back loop ``w1``)."""
    return f"{name}_" if re.fullmatch(r"[A-Za-z]+[0-9]+(_[0-9]+)?", name) else name


def kernel_buffers(inputs: Sequence[Value], outputs: Sequence[Value]) -> KernelBuffers:
    """Buffers named after the inputs' names where those are identifiers (else ``in0``, ...)
    and ``out0, out1, ...`` for the outputs (an output listed twice gets one buffer)."""
    namer = Namer()
    ins: dict[Value, BufferParam] = {}
    for pos, v in enumerate(inputs):
        if v in ins:
            continue
        hint = _user_name(v.name) if v.name and v.name.isidentifier() else f"in{pos}"
        ins[v] = BufferParam(namer.fresh(hint), v.dtype, readonly=True)
    outs: dict[Value, BufferParam] = {}
    for v in outputs:
        if v not in outs:
            outs[v] = BufferParam(namer.fresh(f"out{len(outs)}"), v.dtype)
    return KernelBuffers(ins, outs)


def load_contiguous(buffers: Mapping[Value, BufferParam]) -> LoadInput:
    """The default ``load_input``: each input is a C-contiguous buffer of its own shape.

    ``index`` has one entry per axis of the value, or more (a consumer's index: NumPy
    broadcasting aligns it on the right and size-1 axes are not indexed). With ``lanes > 1``
    a last axis of size 1 is a stride-0 axis (one scalar load, broadcast); otherwise the lanes
    are contiguous from ``index`` (one vector load).
    """

    def load_input(value: Value, index: tuple[Expr, ...], lanes: int) -> Expr:
        buf = buffers.get(value)
        if buf is None:
            raise CompileError(f"{value.type} is not an input buffer of this kernel")
        shape = dims(value.shape)
        if len(index) < len(shape):
            raise CompileError(f"index of rank {len(index)} for input {value.type}")
        offset = flatten(index[len(index) - len(shape):], shape)
        if lanes == 1:
            return buf.load(offset)
        if not shape or shape[-1] == 1:
            return broadcast(buf.load(offset), lanes)
        return buf.load(offset, lanes)

    return load_input
