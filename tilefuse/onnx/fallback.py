"""The per-node fallback: an ONNX op that tilefuse has no converter for runs in onnx's reference
implementation (``onnx.reference``), one node at a time, on the host.

The importer asks :func:`has_reference` when it finds no converter, or when the converter raises
:class:`~tilefuse.onnx.tensors.NeedsReference` (attribute values or outputs it does not compile:
MaxPool's Indices, a dilated AveragePool, Pad's wrap mode); if onnx's reference knows
the op at the model's opset, :func:`convert_by_reference` keeps the node whole as one
``onnx_node`` (:mod:`tilefuse.ops.foreign`) and says so on the ``fallback`` log topic. The node's
output types are those the model declares where the output is a graph output, else onnx's
shape inference on the node alone, with the input types this import has (always concrete
shapes) and the constant inputs' values. Where that is not enough (an output whose shape
depends on the input values: Unique, NonMaxSuppression) or an output's element type is one
tilefuse lacks, there is no fallback and the error names the op, the opset and why; random ops
(:data:`RANDOM_OPS`) get none either. A node whose inputs are all constants is computed at
import, as every op is (:meth:`Emitter.ops`). Nodes with subgraph attributes never get here:
the model reader refuses control flow first.
"""

from __future__ import annotations

import base64
from typing import Any

from tilefuse.dtypes import DType
from tilefuse.graph.types import is_static
from tilefuse.log import get_logger
from tilefuse.onnx.context import NodeContext, Tensor
from tilefuse.onnx.model import ModelInfo, NodeSpec
from tilefuse.onnx.tensors import elem_type_of, to_dtype

RANDOM_OPS = frozenset({"Bernoulli", "Multinomial", "RandomNormal", "RandomNormalLike",
                        "RandomUniform", "RandomUniformLike"})
"""Ops that draw random numbers get no fallback: a node with constant inputs would fold at
import into one draw that every call returns."""


def has_reference(node: NodeSpec, opset: int) -> bool:
    """Whether onnx's reference implementation has ``node``'s op at ``opset`` (and it is
    deterministic)."""
    if not node.proto or node.op_type in RANDOM_OPS or opset < 1:  # 0: domain not imported
        return False
    try:
        from onnx.reference.ops import load_op

        load_op(node.domain, node.op_type, opset)
    except Exception:
        return False
    return True


def _opsets(info: ModelInfo) -> tuple[tuple[str, int], ...]:
    return tuple(sorted({**info.domains, "": info.opset}.items()))


def _renamed(node: NodeSpec) -> Any:
    """The node's NodeProto with inputs ``i0``.. and outputs ``o0``.. (omitted ones stay "",
    trailing omitted inputs go)."""
    from onnx import NodeProto

    proto = NodeProto()
    proto.ParseFromString(node.proto)
    inputs = [f"i{i}" if name else "" for i, name in enumerate(proto.input)]
    while inputs and not inputs[-1]:
        inputs.pop()   # a trailing omitted input is the same as none (and onnx's DFT needs it)
    outputs = [f"o{i}" if name else "" for i, name in enumerate(proto.output)]
    del proto.input[:]
    del proto.output[:]
    proto.input.extend(inputs)
    proto.output.extend(outputs)
    proto.name = node.name
    return proto


def _declared(info: ModelInfo, name: str) -> tuple[str, tuple[int, ...]] | None:
    """The type the model declares for graph output ``name``, if it is complete and static."""
    for spec in info.outputs:
        if spec.name == name and spec.dtype is not None and spec.dims is not None \
                and all(isinstance(d, int) for d in spec.dims):
            return spec.dtype.value, tuple(int(d) for d in spec.dims)  # type: ignore[arg-type]
    return None


def _output_types(ctx: NodeContext, proto: Any, info: ModelInfo,
                  opsets: tuple[tuple[str, int], ...]
                  ) -> list[tuple[str, tuple[int, ...]] | None]:
    """(dtype name, shape) of each output: what the model declares where the output is a
    graph output with a complete static type (onnx's inference gets some wrong: STFT's
    onesided frames), else onnx's shape inference; None where the output is not requested."""
    declared = [_declared(info, name) if name else None for name in ctx.spec.outputs]
    if all(d is not None for d, name in zip(declared, ctx.spec.outputs) if name):
        return declared
    inferred = _inferred_outputs(ctx, proto, opsets)
    return [d if d is not None else t for d, t in zip(declared, inferred)]


def _inferred_outputs(ctx: NodeContext, proto: Any, opsets: tuple[tuple[str, int], ...]
                      ) -> list[tuple[str, tuple[int, ...]] | None]:
    """(dtype name, shape) of each output of ``proto`` by onnx's shape inference (None where
    the output is not requested); OnnxError where an output's type stays unknown."""
    from onnx import helper, numpy_helper, shape_inference

    inputs, initializers = [], []
    for name, tensor in zip(proto.input, ctx.inputs):
        if not name or tensor is None:
            continue
        inputs.append(helper.make_tensor_value_info(name, elem_type_of(tensor.dtype),
                                                    list(tensor.shape)))
        if tensor.const is not None:
            initializers.append(numpy_helper.from_array(tensor.const, name))
    outputs = [helper.make_empty_tensor_value_info(n) for n in proto.output if n]
    graph = helper.make_graph([proto], "fallback", inputs, outputs, initializer=initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid(d, v) for d, v in opsets])
    try:
        inferred = shape_inference.infer_shapes(model, strict_mode=True, data_prop=True)
    except Exception as exc:
        raise ctx.error(f"tilefuse does not support it: no converter, and onnx's shape "
                        f"inference rejects the node ({type(exc).__name__}: "
                        f"{str(exc)[:300]})") from None
    found = {v.name: v for v in (*inferred.graph.output, *inferred.graph.value_info)}
    types: list[tuple[str, tuple[int, ...]] | None] = []
    for i, name in enumerate(proto.output):
        if not name:
            types.append(None)
            continue
        tt = found[name].type.tensor_type if name in found else None
        if tt is None or not tt.elem_type or not tt.HasField("shape") or any(
                not d.HasField("dim_value") for d in tt.shape.dim):
            _need_values(ctx)
            raise ctx.error(f"tilefuse does not support it: no converter, and the shape of "
                            f"output {i} depends on the input values (onnx's shape inference "
                            "cannot tell it), so onnx's reference cannot stand in")
        dtype = to_dtype(tt.elem_type, f"output {i} of {ctx.label}")
        types.append((dtype.value, tuple(int(d.dim_value) for d in tt.shape.dim)))
    return types


def _need_values(ctx: NodeContext) -> None:
    """Asks for the value of the first small integer graph input of the node (a length, an
    axis): the import runs again per value of it (:class:`InputValueNeeded`), and shape
    inference then sees it as a constant."""
    for i, t in enumerate(ctx.inputs):
        if t is not None and t.const is None and t.input_name is not None \
                and t.dtype in (DType.i64, DType.i32):
            ctx.const_input(i, "an integer input of an op run by onnx's reference")


def convert_by_reference(ctx: NodeContext, info: ModelInfo,
                         reason: str = "no tilefuse converter") -> list[Tensor | None]:
    """``ctx``'s node as one ``onnx_node`` run by onnx's reference (module docstring);
    ``reason`` says why on the ``fallback`` log topic (a converter's
    :class:`~tilefuse.onnx.tensors.NeedsReference` message, for attribute values it does not
    compile)."""
    present = [t for name, t in zip(ctx.spec.inputs, ctx.inputs) if name]
    if any(t is None for t in present):
        raise ctx.error("tilefuse does not support it: no converter, and an input of the node "
                        "is not a tensor")
    if any(not is_static(t.shape) for t in present):  # type: ignore[union-attr]
        raise ctx.error("tilefuse does not support it: no converter, and onnx's reference needs "
                        "static input shapes")
    proto = _renamed(ctx.spec)
    opsets = _opsets(info)
    types = _output_types(ctx, proto, info, opsets)
    wanted = [t for t in types if t is not None]
    attrs = {"node": base64.b64encode(proto.SerializeToString(deterministic=True)).decode(),
             "opsets": opsets, "out_dtypes": tuple(d for d, _ in wanted),
             "out_shapes": tuple(s for _, s in wanted)}
    get_logger("fallback").info(
        "%s: %s; it runs in onnx's reference implementation on the host", ctx.label, reason)
    outs = iter(ctx.em.ops("onnx_node", present, attrs))  # type: ignore[arg-type]
    return [None if t is None else next(outs) for t in types]


__all__ = ["convert_by_reference", "has_reference"]
