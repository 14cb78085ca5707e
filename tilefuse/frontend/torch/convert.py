"""The conversion context: one ATen FX graph (or a part of one) becomes one tilefuse graph.

:class:`Lowering` holds the :class:`GraphBuilder` and the map from FX nodes to tilefuse values;
the converters of :mod:`tilefuse.frontend.torch.aten` read their operands through it. Types come
from each node's ``meta["val"]`` (the fake tensor the tracer recorded), so every converter knows
its operands' and its result's exact shape and dtype. A shape holds ints and, for a graph
Dynamo made dynamic, plain symbols (``s33`` becomes ``Sym("s33")``); a compound size such as
``s33*s50`` makes the node unsupported.

A converter that meets an argument it cannot express raises :class:`Unsupported` before it has
added anything; the partitioner then leaves that node to torch and logs the reason.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import fx

from tilefuse.dtypes import DType
from tilefuse.errors import SourceLoc, TilefuseError
from tilefuse.frontend.torch.symbolic import CompoundSize, sym_dim
from tilefuse.graph.builder import GraphBuilder
from tilefuse.graph.ir import Graph, Literal, Value
from tilefuse.graph.types import Sym, TensorType, is_static

TORCH_TO_DTYPE: Mapping[torch.dtype, DType] = {
    torch.float64: DType.f64, torch.float32: DType.f32, torch.float16: DType.f16,
    torch.bfloat16: DType.bf16, torch.int64: DType.i64, torch.int32: DType.i32,
    torch.int16: DType.i16, torch.int8: DType.i8, torch.uint8: DType.u8, torch.bool: DType.bool,
}
DTYPE_TO_TORCH: Mapping[DType, torch.dtype] = {v: k for k, v in TORCH_TO_DTYPE.items()}


class Unsupported(TilefuseError):
    """An ATen node that tilefuse cannot express (op, arguments or dtype); it runs in torch."""


Result = Value | tuple[Value | None, ...]
Converter = Callable[["Lowering", fx.Node], Result]


def op_name(node: fx.Node) -> str:
    """``aten.add.Tensor`` for an ATen overload, the qualified name otherwise."""
    target = node.target
    return str(target) if isinstance(target, torch._ops.OpOverload) else \
        getattr(target, "__name__", str(target))


def to_dtype(dtype: torch.dtype, op: str = "") -> DType:
    try:
        return TORCH_TO_DTYPE[dtype]
    except KeyError:
        raise Unsupported(f"dtype {dtype} has no tilefuse equivalent", op=op) from None


def meta_type(node: fx.Node) -> TensorType:
    """The tilefuse type of an FX tensor value: concrete shape, mapped dtype, CPU only."""
    return val_type(node.meta.get("val"), node.name, op_name(node))


_DEVICE: ContextVar[str] = ContextVar("tilefuse_torch_device", default="cpu")
"""The device type whose tensors convert (the target's: "cuda" for the cuda target)."""


@contextmanager
def tensors_on(device: str) -> Iterator[None]:
    """Within the block, values on ``device`` convert and values elsewhere stay in torch."""
    token = _DEVICE.set(device)
    try:
        yield
    finally:
        _DEVICE.reset(token)


def val_type(val: Any, name: str, op: str) -> TensorType:
    """The tilefuse type of a recorded (fake) tensor ``val`` (a plain symbolic size is a
    :class:`Sym`); Unsupported when it has none."""
    if not isinstance(val, torch.Tensor):
        raise Unsupported(f"value {name} is not a tensor ({type(val).__name__})", op=op)
    if val.device.type != _DEVICE.get():
        raise Unsupported(f"value {name} lives on {val.device}, not the target's "
                          f"{_DEVICE.get()}", op=op)
    try:
        shape = tuple(d if isinstance(d, int) else sym_dim(d) for d in val.shape)
    except CompoundSize as err:
        raise Unsupported(f"value {name} has shape {tuple(val.shape)}: {err}", op=op) from None
    return TensorType(shape, to_dtype(val.dtype, op))


_FRAME = re.compile(r'File "([^"]+)", line (\d+), in (\S+)')


def source_loc(node: fx.Node) -> SourceLoc | None:
    """The user's line that produced ``node`` (the last frame of its recorded stack trace)."""
    trace = node.meta.get("stack_trace")
    if not trace:
        return None
    frames = _FRAME.findall(trace)
    if not frames:
        return None
    file, line, function = frames[-1]
    return SourceLoc(file, int(line), function)


def arg(node: fx.Node, index: int, name: str, default: Any = None) -> Any:
    """Argument ``index`` (positional) or ``name`` (keyword) of ``node``, else ``default``."""
    if len(node.args) > index:
        return node.args[index]
    return node.kwargs.get(name, default)


class Lowering:
    """Builds one tilefuse graph from FX nodes.

    ``open_inputs`` makes any FX tensor node without a value so far a new graph input (used to
    try one node alone, when the partitioner asks whether it is supported).
    """

    def __init__(self, builder: GraphBuilder, open_inputs: bool = False):
        self.builder = builder
        self.env: dict[fx.Node, Result] = {}
        self.open_inputs = open_inputs
        self.node: fx.Node | None = None  # the node being converted (for locations, errors)

    # ---- operands ------------------------------------------------------------------------

    def tensor(self, a: Any) -> Value:
        """The tilefuse value of the FX tensor argument ``a``."""
        if not isinstance(a, fx.Node):
            raise Unsupported(f"expected a tensor argument, got {a!r}", op=self.op)
        value = self.env.get(a)
        if value is None and self.open_inputs:
            value = self.builder.input(meta_type(a), a.name)
            self.env[a] = value
        if not isinstance(value, Value):
            raise Unsupported(f"argument {a.name} is not a single tensor", op=self.op)
        return value

    def operand(self, a: Any, dtype: DType) -> Value:
        """A tensor argument cast to ``dtype``, or a Python number as a 0-d constant of it."""
        if isinstance(a, fx.Node):
            return self.cast(self.tensor(a), dtype)
        if isinstance(a, (bool, int, float)):
            return self.constant(np.array(a).astype(dtype.np))
        raise Unsupported(f"unsupported operand {a!r}", op=self.op)

    @property
    def op(self) -> str:
        return op_name(self.node) if self.node is not None else ""

    @property
    def out_type(self) -> TensorType:
        """The type of the current node's (first) result."""
        assert self.node is not None
        val = self.node.meta.get("val")
        if isinstance(val, (tuple, list)):
            val = val[0]
        return val_type(val, self.node.name, self.op)

    # ---- emitting --------------------------------------------------------------------------

    def add(self, op: str, inputs: Sequence[Value], **attrs: Any) -> Value:
        loc = source_loc(self.node) if self.node is not None else None
        return self.builder.add1(op, inputs, attrs, loc)

    def add_multi(self, op: str, inputs: Sequence[Value], **attrs: Any) -> tuple[Value, ...]:
        loc = source_loc(self.node) if self.node is not None else None
        return self.builder.add(op, inputs, attrs, loc)

    def constant(self, array: np.ndarray) -> Value:
        return self.builder.add1("constant", [], {"value": Literal(array)})

    def cast(self, value: Value, dtype: DType) -> Value:
        return value if value.dtype is dtype else self.add("cast", [value], dtype=dtype)

    def reshape(self, value: Value, shape: Sequence[int | Sym]) -> Value:
        shape = tuple(d if isinstance(d, Sym) else int(d) for d in shape)
        return value if value.shape == shape else self.add("reshape", [value], shape=shape)

    # ---- whole nodes -----------------------------------------------------------------------

    def convert(self, node: fx.Node, converter: Converter) -> Result:
        """Converts one call node; every error names the ATen op and its input types."""
        self.node = node
        try:
            result = converter(self, node)
        except Unsupported:
            raise
        except TypeError as err:   # int() of a Sym: a converter that needs a static size
            if all(is_static(meta_type(a).shape) for a in node.all_input_nodes
                   if isinstance(a.meta.get("val"), torch.Tensor)):
                raise
            raise Unsupported(f"needs static sizes here ({err})", op=op_name(node),
                              loc=source_loc(node)) from None
        except TilefuseError as err:
            shown = tuple(str(meta_type(a)) for a in node.all_input_nodes
                          if isinstance(a.meta.get("val"), torch.Tensor))
            raise Unsupported(f"{err.message} (in {err.op or 'conversion'})", op=op_name(node),
                              inputs=shown, loc=err.loc or source_loc(node)) from None
        self.env[node] = result
        return result


def used_outputs(node: fx.Node) -> set[int]:
    """Indices of a multi-output node's results that some ``getitem`` user reads."""
    import operator
    return {u.args[1] for u in node.users if u.target is operator.getitem and u.users}


@dataclass(frozen=True)
class Placeholder:
    """How one input of an FX (sub)graph reaches the tilefuse graph: as a runtime input (its FX
    node gives the type) or as a constant (the tensor's values, copied at compile time)."""

    node: fx.Node
    constant: torch.Tensor | None = None


def tensor_to_numpy(t: torch.Tensor) -> np.ndarray:
    """A C-contiguous NumPy view of a CPU tensor (a copy only for non-contiguous tensors);
    bf16 goes through an int16 view, as NumPy has no bf16 of its own."""
    if t.requires_grad:
        t = t.detach()
    if t.device.type != "cpu":   # a constant of a cuda-target graph: copied once
        t = t.cpu()
    if not t.is_contiguous():
        t = t.contiguous()
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(DType.bf16.np)
    return t.numpy()


def numpy_to_tensor(a: np.ndarray) -> torch.Tensor:
    """A tensor sharing ``a``'s memory (no copy)."""
    if a.dtype == DType.bf16.np:
        return torch.from_numpy(a.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(a)


def lower_graph(gm: fx.GraphModule, placeholders: Sequence[Placeholder], name: str,
                table: Mapping[Any, Converter]) -> Graph:
    """The tilefuse graph of ``gm`` (every call node must have a converter in ``table``).
    ``placeholders`` describe gm's placeholders in order; runtime inputs become graph inputs in
    that order."""
    builder = GraphBuilder(name)
    lowering = Lowering(builder)
    nodes = [n for n in gm.graph.nodes if n.op == "placeholder"]
    if len(nodes) != len(placeholders):
        raise TilefuseError(f"{name}: {len(nodes)} placeholders, {len(placeholders)} described")
    for node, spec in zip(nodes, placeholders):
        if spec.constant is not None:
            lowering.env[node] = lowering.constant(tensor_to_numpy(spec.constant).copy())
        else:
            lowering.env[node] = builder.input(meta_type(spec.node), spec.node.name)
    outputs: list[Value] = []
    for node in gm.graph.nodes:
        if node.op == "call_function":
            if node.target not in table:
                raise Unsupported(f"no tilefuse converter for {op_name(node)}")
            lowering.convert(node, table[node.target])
        elif node.op == "output":
            flat = node.args[0] if isinstance(node.args[0], (tuple, list)) else (node.args[0],)
            outputs = [lowering.tensor(a) for a in flat]
        elif node.op == "get_attr" and isinstance(getattr(gm, str(node.target), None),
                                                  torch.Tensor):
            # a tensor make_fx lifted out of the traced code (a mask, a table): a constant
            lowering.env[node] = lowering.constant(
                tensor_to_numpy(getattr(gm, str(node.target)).detach().cpu()).copy())
        elif node.op != "placeholder":
            raise Unsupported(f"FX node kind {node.op!r} ({node.name})")
    return builder.build(outputs)
