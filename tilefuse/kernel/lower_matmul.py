"""Contraction kernels: a (batched) matmul kernel group with its elementwise epilogue, lowered
to loop IR.

``C[..., M, N] = epilogue(A[..., M, K] @ B[..., K, N])``. :func:`lower_matmul` finds the group's
matmul, its operands (read in place, materialised, or packed into panels by kernels of their
own, evaluating any prologue: :mod:`tilefuse.kernel.packing`) and its epilogue (the group's
elementwise chain after the matmul, applied to the accumulators right before the store); the
loop nest itself (cache blocks, register tiles, the micro-kernel) is built by
:mod:`tilefuse.kernel.matmul_nest`, whose names are re-exported here.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, replace

import numpy as np

from tilefuse.errors import CompileError
from tilefuse.graph.ir import Node, Value
from tilefuse.kernel.access import (
    LoadInput,
    Namer,
    NotVectorizable,
    dims,
    identifier,
    is_extent,
    kernel_buffers,
    load_contiguous,
    symbol_scalars,
    unflatten,
)
from tilefuse.kernel.conv_window import view_of_input, window_operand
from tilefuse.kernel.fusion import KernelGroup, KernelKind
from tilefuse.kernel.matmul_nest import (  # re-exported: the matmul kernel's public names
    BLOCK_AXES,
    MATMUL_DTYPES,
    MatmulParams,
    MatmulShape,
    TileOutput,
    TileValue,
    assemble,
    b_panel_width,
    column_chunks,
    fma_tile_step,
    identity_value,
    loaded_buffers,
    matmul_body,
    matmul_function,
    params_from_schedule,
    small_m_rows,
)
from tilefuse.kernel.packing import pack_b, pack_kernel, packed_shape
from tilefuse.kernel.scalar_expr import element_expr
from tilefuse.kernel.schedule import SYMBOLIC_DIM_HINT, Schedule
from tilefuse.loop.ir import (
    BufferParam,
    Expr,
    If,
    LoopFunction,
    XOp,
    binary,
)


def matmul_node(group: KernelGroup) -> Node:
    """The group's anchor as a matmul node; CompileError when it is anything else."""
    anchor = group.anchor
    if group.kind is not KernelKind.CONTRACTION or anchor is None or \
            anchor.op.name != "matmul":
        what = anchor.op.name if anchor is not None else "none"
        raise CompileError(f"kernel {group.name}: the matmul lowering needs a contraction "
                           f"anchored on a matmul, got a {group.kind.value} with anchor {what}")
    return anchor


def matmul_shape(node: Node) -> MatmulShape:
    """The problem size of a matmul node: static dims, operands of rank >= 2 whose batch dims
    are the output's or absent (or all 1); CompileError otherwise."""
    a, b = node.inputs
    a_shape, b_shape = dims(a.shape), dims(b.shape)
    out_shape = dims(node.output.shape)
    if len(a_shape) < 2 or len(b_shape) < 2:
        raise CompileError("1-D matmul operands are not lowered natively (reshape them to 2-D "
                           "first)", op="matmul", inputs=(str(a.type), str(b.type)))
    batch = out_shape[:-2]
    a_batch, b_batch = a_shape[:-2], b_shape[:-2]
    for operand, dims_ in (("A", a_batch), ("B", b_batch)):
        if dims_ != batch and any(d != 1 for d in dims_):
            raise CompileError(f"operand {operand}'s batch dims {list(dims_)} are neither the "
                               f"output's {list(batch)} nor all 1", op="matmul")
    m, k = a_shape[-2:]
    n = b_shape[-1]
    return MatmulShape(batch, m, n, k, a_batch == batch and bool(batch),
                       b_batch == batch and bool(batch))


def operand_cone(group: KernelGroup, value: Value, stop: frozenset[Value] = frozenset()
                 ) -> tuple[tuple[Node, ...], tuple[Value, ...]]:
    """The group's nodes that compute ``value`` (its prologue, in group order) and the values
    they read from outside the cone: group inputs, or values in ``stop`` (treated as inputs).
    A group input itself has no nodes and is its own input."""
    producers = {v: n for n in group.nodes for v in n.outputs}
    cone: set[Node] = set()
    reads: dict[Value, None] = {}
    stack = [value]
    while stack:
        v = stack.pop()
        node = None if v in stop else producers.get(v)
        if node is None:
            reads[v] = None
        elif node not in cone:
            cone.add(node)
            stack.extend(node.inputs)
    return tuple(n for n in group.nodes if n in cone), tuple(reads)


@dataclass(frozen=True)
class LoweredMatmul:
    """What :func:`lower_matmul` makes of a group. ``functions`` run in this order (materialise
    A, pack B, the matmul; each present when needed). ``bindings`` maps buffer names to the
    graph values they hold; ``scratch`` names run-time buffers (bytes) that live only while the
    group runs; ``constant_b`` names the buffer that gets :meth:`prepare_b` of the constant B."""

    functions: tuple[LoopFunction, ...]
    bindings: Mapping[str, Value]
    scratch: Mapping[str, int | Expr]  # bytes; an Expr over runtime extents when symbolic
    constant_b: str | None
    params: MatmulParams
    shape: MatmulShape

    def prepare_b(self, b: np.ndarray) -> np.ndarray:
        """The constant operand B (``[..., K, N]``, the matmul's dtype) as the kernel reads
        it: packed when the schedule packs, else C-contiguous."""
        return pack_b(b, self.params.nr) if self.params.pack_b else np.require(b, requirements="C")


class _GroupLowering:
    """State of one :func:`lower_matmul`: names, buffers, the kernels made so far."""

    def __init__(self, group: KernelGroup, params: MatmulParams):
        self.group, self.params = group, params
        self.node = matmul_node(group)
        self.dtype = self.node.output.dtype
        a, b = self.node.inputs
        if self.dtype not in MATMUL_DTYPES or a.dtype is not self.dtype or \
                b.dtype is not self.dtype:
            raise CompileError(f"kernel {group.name}: native matmul needs f32 or f64 operands "
                               f"of one dtype", op="matmul", inputs=(str(a.type), str(b.type)))
        self.shape = matmul_shape(self.node)
        self.buffers = kernel_buffers(group.inputs, group.outputs)
        self.namer = Namer(self.buffers.names())
        self.load: LoadInput = load_contiguous(self.buffers.inputs)
        self.name = identifier(group.name, "matmul")
        self.functions: list[LoopFunction] = []
        self.scratch: dict[str, int | Expr] = {}
        self.scalars = symbol_scalars([*group.inputs, *group.outputs,
                                       *(o for n in group.nodes for o in n.outputs)])

    def operand(self, value: Value, hint: str, nr: int | None,
                wide: tuple[int, Expr, int] | None = None) -> BufferParam:
        """The buffer the matmul reads operand ``value`` from: the group input holding it
        (when no packing is asked and ``value`` is that input or a reshape of it), else a
        scratch buffer that a new kernel fills with the value (evaluating its prologue),
        packed into ``nr``-wide panels (``nr`` None: row-major).
        ``wide`` = (width, M, bound): when the runtime M is below the bound a second kernel
        packs it in panels that wide instead (the scratch is sized for the wider)."""
        held = view_of_input(self.group, value) if nr is None else None
        if held is not None:   # the input itself, or a reshape of it: read in place
            return self.buffers.inputs[held]
        shape = dims(value.shape)
        *batch, rows, cols = shape
        width = cols if nr is None else nr
        dst = BufferParam(self.namer.fresh(hint), self.dtype, align=64)
        largest = width if wide is None else max(width, wide[0])
        if self.scalars:  # a runtime size: an Expr over the kernel's scalars
            self.scratch[dst.name] = math.prod(packed_shape(tuple(shape), largest)) * \
                self.dtype.itemsize
        else:
            self.scratch[dst.name] = int(np.prod(packed_shape(tuple(shape), largest))) * \
                self.dtype.itemsize
        inputs = self.operand_inputs(value)

        def element(row: Expr, col: Expr, lanes: int) -> Expr:
            index = (*unflatten(row, (*batch, rows)), col)
            return element_expr(self.group, value, index, lanes, self.load)

        count = math.prod(shape[:-1]) if self.scalars else int(np.prod(shape[:-1]))

        def pack(name: str, panel: int) -> LoopFunction:
            try:
                return pack_kernel(name, count, rows, cols, panel, dst, element, inputs,
                                   self.params.lanes, self.scalars)
            except NotVectorizable:  # lanes strided in some input (a transposed weight)
                return pack_kernel(name, count, rows, cols, panel, dst, element, inputs, 1,
                                   self.scalars)
        name = f"{self.name}_{dst.name}"
        kernel = pack(name, width)
        if wide is None:
            self.functions.append(kernel)
        else:
            other = pack(f"{name}_wide", wide[0])
            _, m, mr = wide
            self.functions += [replace(kernel, body=If(_ge(m, mr), kernel.body)),
                               replace(other, body=If(binary(XOp.LT, m, mr), other.body))]
        return BufferParam(dst.name, self.dtype, readonly=True, align=64)

    def operand_inputs(self, value: Value) -> tuple[BufferParam, ...]:
        _, reads = operand_cone(self.group, value)
        return tuple(self.buffers.inputs[v] for v in reads)

    def outputs(self) -> list[TileOutput]:
        made = []
        for value in self.group.outputs:
            made.append(TileOutput(self.buffers.outputs[value], self.epilogue(value)))
        return made

    def epilogue(self, value: Value) -> TileValue:
        """The value stored for group output ``value``, computed from the accumulator."""
        node = self.node
        if value is node.output:
            return identity_value
        if tuple(value.shape) != tuple(node.output.shape):
            raise CompileError(f"kernel {self.group.name}: output {value.type} does not have "
                               f"the matmul's shape {node.output.type}")

        def compute(acc: Expr, index: tuple[Expr, ...], lanes: int) -> Expr:
            return element_expr(self.group, value, index, lanes, self.load,
                                overrides={node.output: acc})

        return compute


def lower_matmul(group: KernelGroup, schedule: Schedule, *,
                 constant_b: bool = False) -> LoweredMatmul:
    """The loop IR of a CONTRACTION group anchored on a matmul: the group's elementwise chain
    after the matmul is the epilogue; prologues computing A or B run in the kernels that
    materialise / pack the operand. ``constant_b``: B is known at build time; the caller binds
    :meth:`LoweredMatmul.prepare_b` of it to the buffer ``constant_b`` names (no packing kernel).

    CompileError for what is not lowered natively: dtypes other than f32/f64, 1-D operands,
    symbolic dims, batch broadcasting other than a shared 2-D operand, outputs of another shape,
    a schedule that is not a contraction's.
    """
    params = params_from_schedule(schedule)
    if not constant_b and reads_b_in_place(group, params):
        params = replace(params, pack_b=False, prefetch_b=0, prefetch_next=0)
    low = _GroupLowering(group, params)
    a_value, b_value = low.node.inputs
    window = None if low.shape.symbolic or low.shape.batch else window_operand(group, a_value)
    # a windowed A is read from its convolution's source (in place when that is an input)
    a = low.operand(a_value, "a_rows", None) if window is None else \
        low.operand(window.source, "a_src", None)
    panel = params.nr if constant_b else b_panel_width(low.shape, params)
    if constant_b:
        b = BufferParam(low.namer.fresh("b_const"), low.dtype, readonly=True,
                        align=64 if params.pack_b else 0)
    elif panel != params.nr:   # B packed per call: wide panels for the M with a nest
        rows = small_m_rows(replace(params, mr=min(params.mr, SYMBOLIC_DIM_HINT)), low.shape.n)
        b = low.operand(b_value, "b_panels", params.nr, wide=(panel, low.shape.m, rows[-1] + 1))
    else:
        b = low.operand(b_value, "b_panels", params.nr if params.pack_b else None)
    outputs = low.outputs()
    body = matmul_body(low.shape, low.dtype, params, outputs, a, b, small_panel=panel,
                       window=window)
    used = loaded_buffers(body)
    # by name: B read in place is the input's own buffer, possibly declared with other flags
    extra = tuple(p for p in low.buffers.inputs.values()
                  if p.name in used and p.name not in (a.name, b.name))
    main = assemble(low.name, body, a, b, outputs, extra, low.scalars)
    bindings = {p.name: v for v, p in low.buffers.inputs.items()}
    bindings.update({p.name: v for v, p in low.buffers.outputs.items()})
    functions = (*low.functions, main)
    names = {buf.name for fn in functions for buf in fn.buffers}
    return LoweredMatmul(functions, {n: v for n, v in bindings.items() if n in names},
                         low.scratch, b.name if constant_b else None, params, low.shape)


def reads_b_in_place(group: KernelGroup, params: MatmulParams) -> bool:
    """Whether a B given at run time is read where it lies instead of packed per call: when
    it is a group input (or a reshape of one), not batched, and M is static and at most one
    register block (``params.mr`` rows: a GEMV at batch 1). The nest then reads each element
    of B exactly once, so packing would only add a read and a write of all of B per call:
    W5 (256x256 weights as arguments, batch 1) spent ~90 % of its kernels' time packing."""
    node = matmul_node(group)
    b_value = node.inputs[1]
    shape = dims(node.inputs[0].shape)
    m = shape[-2] if len(shape) >= 2 else None
    return (params.pack_b and isinstance(m, int) and 0 < m <= params.mr
            and len(b_value.shape) == 2 and not any(is_extent(d) for d in dims(b_value.shape))
            and view_of_input(group, b_value) is not None)


def _ge(a: Expr, b: int) -> Expr:
    return binary(XOp.GE, a, b)


__all__ = [
    "BLOCK_AXES", "MATMUL_DTYPES", "LoweredMatmul", "MatmulParams", "MatmulShape", "TileOutput",
    "TileValue", "b_panel_width", "column_chunks", "fma_tile_step", "identity_value",
    "lower_matmul", "matmul_body", "matmul_function", "matmul_node", "matmul_shape",
    "operand_cone", "params_from_schedule", "reads_b_in_place",
]
