"""ONNX graph → tilefuse graph, for one signature of concrete input types.

Each node goes to the converter its op type and the model's opset select
(:mod:`tilefuse.onnx.converters`); initializers are constants; an op without a converter runs
in onnx's reference implementation where it has one (:mod:`tilefuse.onnx.fallback`, logged on
the ``fallback`` topic), else is an :class:`OnnxError` naming the op type, node, domain and
opset. Every tilefuse node carries the
ONNX node it came from as its source location (``onnx:<index> in <OpType> <name>``). The graph
outputs are checked against the element types and static dims the model declares.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from tilefuse.errors import SourceLoc, TilefuseError
from tilefuse.graph.builder import GraphBuilder
from tilefuse.graph.ir import Graph, Node
from tilefuse.graph.printer import is_identifier
from tilefuse.graph.types import TensorType
from tilefuse.onnx.context import Emitter, NodeContext, Tensor
from tilefuse.onnx.converters import CONVERTERS, find_converter
from tilefuse.onnx.fallback import convert_by_reference, has_reference
from tilefuse.onnx.model import ModelInfo, NodeSpec, TensorSpec
from tilefuse.onnx.tensors import NeedsReference, OnnxError

_RULE_ERRORS = (ValueError, TypeError, IndexError, KeyError, ZeroDivisionError, OverflowError,
                AttributeError)


def unsupported(node: NodeSpec, info: ModelInfo) -> OnnxError:
    domain = node.domain or "ai.onnx"
    opset = info.domains.get(node.domain)
    message = (f"unsupported ONNX op {node.op_type} (node {node.name!r}, domain {domain}, "
               f"opset {opset if opset is not None else 'not imported'})")
    versions = CONVERTERS.get(node.op_type) if not node.domain else None
    if versions:
        message += f"; tilefuse converts it from opset {versions[0][0]}"
    return OnnxError(message)


def check_supported(info: ModelInfo) -> None:
    """OnnxError for the first node that no converter handles (checked once, at load)."""
    for node in info.nodes:
        if node.domain and node.domain not in info.domains:
            raise OnnxError(f"node {node.label} uses domain {node.domain!r}, which the model "
                            "does not import")
        opset = info.domains.get(node.domain, info.opset)
        if find_converter(node.op_type, node.domain, opset) is None and not has_reference(
                node, opset):
            raise unsupported(node, info)


def import_graph(info: ModelInfo, types: Sequence[TensorType],
                 values: Mapping[str, np.ndarray] | None = None) -> Graph:
    """The tilefuse graph of the model with inputs of ``types`` (concrete shapes), specialised
    on the ``values`` of the graph inputs they name (inputs a converter needs as constants).
    :class:`InputValueNeeded` names an input that a converter needs the value of."""
    builder = GraphBuilder(info.name)
    env: dict[str, Tensor] = {name: Tensor.constant(arr)
                              for name, arr in info.initializers.items()}
    values = values or {}
    for spec, type_ in zip(info.inputs, types):
        # ONNX names such as "0" or "input:0" are not graph identifiers; those go unnamed
        name = spec.name if is_identifier(spec.name) else None
        env[spec.name] = Tensor(type_, value=builder.input(type_, name),
                                const=values.get(spec.name), input_name=spec.name)
    em = Emitter(builder)
    for index in range(len(info.nodes)):
        _convert_node(info, index, env, em)
    outputs = []
    for spec in info.outputs:
        tensor = env[spec.name]
        if not isinstance(tensor, Tensor):
            raise OnnxError(f"graph output {spec.name!r} is a sequence; sequence outputs are "
                            "not supported (tilefuse returns tensors)")
        _check_output(spec, tensor.type)
        outputs.append(em.value(tensor))
    return builder.build(outputs)


def _convert_node(info: ModelInfo, index: int, env: dict[str, Tensor], em: Emitter) -> None:
    """Converts node ``index`` of the model, binding its outputs' names in ``env``."""
    node = info.nodes[index]
    opset = info.domains.get(node.domain, info.opset)
    fn = find_converter(node.op_type, node.domain, opset)
    if fn is None and has_reference(node, opset):
        def fn(ctx: NodeContext) -> list[Tensor | None]:
            return convert_by_reference(ctx, info)
    if fn is None:
        raise unsupported(node, info)
    em.loc = SourceLoc("onnx", index, f"{node.op_type} {node.name}")
    ctx = NodeContext(node, opset, [env[n] if n else None for n in node.inputs], em,
                      reconvert=lambda target, bindings: _reconvert(info, index, env, em,
                                                                     target, bindings))
    try:
        try:
            outs = fn(ctx)
        except NeedsReference as err:
            if not has_reference(node, opset):
                raise
            outs = convert_by_reference(ctx, info, reason=err.message)
    except OnnxError as err:
        if err.op is not None:
            raise
        raise OnnxError(err.message, op=ctx.label, inputs=ctx.shapes()) from None
    except TilefuseError as err:
        raise OnnxError(str(err), op=ctx.label, inputs=ctx.shapes()) from None
    except _RULE_ERRORS as err:
        raise OnnxError(f"cannot convert ({type(err).__name__}: {err})", op=ctx.label,
                        inputs=ctx.shapes()) from None
    for i, name in enumerate(node.outputs):
        if not name:
            continue
        if i >= len(outs):
            raise OnnxError(f"output {i} ({name!r}) is not supported", op=ctx.label,
                            inputs=ctx.shapes())
        env[name] = outs[i]


def _reconvert(info: ModelInfo, before: int, env: dict[str, Tensor], em: Emitter, target: str,
               bindings: Mapping[str, Tensor]) -> tuple[Tensor, tuple[Node, ...]]:
    """Converts again the nodes before node ``before`` that compute ``target``, with the names
    in ``bindings`` bound to those tensors as graph values (so nothing that depends on them folds
    at import time). Returns ``target``'s tensor and the graph nodes built for it: the forward
    graph that ONNX's Gradient differentiates, evaluated at the Gradient node's inputs."""
    producer = {out: i for i, node in enumerate(info.nodes[:before]) for out in node.outputs
                if out}
    needed: set[int] = set()
    pending = [target]
    while pending:
        name = pending.pop()
        i = producer.get(name)
        if name in bindings or i is None or i in needed:
            continue
        needed.add(i)
        pending.extend(n for n in info.nodes[i].inputs if n)
    local = dict(env)
    for name, tensor in bindings.items():
        local[name] = Tensor(tensor.type, value=em.value(tensor))
    start, loc = len(em.builder.nodes), em.loc
    for i in sorted(needed):
        _convert_node(info, i, local, em)
    em.loc = loc
    if target not in local:
        raise OnnxError(f"{target!r} is not computed before this node")
    return local[target], em.builder.nodes[start:]


def _check_output(spec: TensorSpec, got: TensorType) -> None:
    dims_ok = spec.dims is None or (len(spec.dims) == got.rank and all(
        not isinstance(d, int) or d == g for d, g in zip(spec.dims, got.shape)))
    if (spec.dtype is not None and spec.dtype is not got.dtype) or not dims_ok:
        declared = "?" if spec.dtype is None else spec.dtype.value
        shown = "?" if spec.dims is None else ",".join("?" if d is None else str(d)
                                                       for d in spec.dims)
        raise OnnxError(f"graph output {spec.name!r}: the model declares {declared}[{shown}] "
                        f"but the import computes {got}")
