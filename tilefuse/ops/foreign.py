"""Ops computed by another framework's reference: ``onnx_node``.

``onnx_node`` is one ONNX node that tilefuse has no converter for, kept whole and run by onnx's
reference implementation (``onnx.reference``) on the host: the ONNX importer's per-node fallback
(:mod:`tilefuse.onnx.fallback`). Its attributes carry everything it needs: the node itself (a
serialized ``NodeProto`` in base64, inputs renamed ``i0``, ``i1``, ..., outputs ``o0``, ...,
an omitted optional one as ``""``), the opsets the model imports, and the output types, which
the importer found by onnx's shape inference at import time. The shape and dtype rules return
those types; the reference checks that what onnx computed has them (an op whose output shape
depends on the data is refused at import, so this only fails on a wrong inference).
"""

from __future__ import annotations

import base64
import functools
from typing import Any

import numpy as np

from tilefuse.dtypes import DType, parse_dtype
from tilefuse.errors import ShapeError, TilefuseError
from tilefuse.graph.ir import Attrs
from tilefuse.graph.types import Shape, format_shape
from tilefuse.ops.registry import AttrType, OpDef, OpKind, Trait, attr


def _check_arity(count: int, attrs: Attrs) -> None:
    expected = sum(1 for name in _node(attrs["node"]).input if name)
    if count != expected:
        raise ShapeError(f"the ONNX node takes {expected} inputs, got {count}")


def _shape_rule(shapes: tuple[Shape, ...], attrs: Attrs) -> tuple[Shape, ...]:
    _check_arity(len(shapes), attrs)
    return tuple(tuple(s) for s in attrs["out_shapes"])


def _dtype_rule(dtypes: tuple[DType, ...], attrs: Attrs) -> tuple[DType, ...]:
    return tuple(parse_dtype(d) for d in attrs["out_dtypes"])


@functools.lru_cache(maxsize=64)
def _node(text: str) -> Any:
    from onnx import NodeProto

    node = NodeProto()
    node.ParseFromString(base64.b64decode(text))
    return node


@functools.lru_cache(maxsize=64)
def _evaluator(text: str, opsets: tuple[tuple[str, int], ...]) -> Any:
    """onnx's reference evaluator of a model holding just the node (built once per node)."""
    from onnx import helper
    from onnx.reference import ReferenceEvaluator

    node = _node(text)
    inputs = [helper.make_empty_tensor_value_info(n) for n in node.input if n]
    outputs = [helper.make_empty_tensor_value_info(n) for n in node.output if n]
    graph = helper.make_graph([node], "onnx_node", inputs, outputs)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid(d, v) for d, v in opsets])
    return ReferenceEvaluator(model)


def _reference(*arrays: np.ndarray, node: str, opsets: tuple[tuple[str, int], ...],
               out_dtypes: tuple[str, ...], out_shapes: tuple[Shape, ...]) -> Any:
    proto = _node(node)
    names = [n for n in proto.input if n]
    try:
        results = _evaluator(node, opsets).run(None, dict(zip(names, arrays)))
    except Exception as exc:  # onnx's reference raises anything; name the node
        raise TilefuseError(f"onnx's reference implementation of {proto.op_type} failed: "
                            f"{type(exc).__name__}: {exc}", op="onnx_node") from None
    outs = []
    for got, dtype, shape in zip(results, out_dtypes, out_shapes):
        got = np.asarray(got)
        if got.shape != tuple(shape):
            raise TilefuseError(f"onnx's reference implementation of {proto.op_type} returned "
                                f"shape {format_shape(got.shape)}, not the inferred "
                                f"{format_shape(tuple(shape))}", op="onnx_node")
        outs.append(got.astype(parse_dtype(dtype).np, copy=False))
    return tuple(outs) if len(outs) != 1 else outs[0]


ONNX_NODE = OpDef(
    "onnx_node", OpKind.OPAQUE, None, _shape_rule, _dtype_rule, _reference,
    attrs=(attr("node", AttrType.STR), attr("opsets", AttrType.ANY),
           attr("out_dtypes", AttrType.ANY), attr("out_shapes", AttrType.ANY)),
    traits=frozenset({Trait.MULTI_OUTPUT}),
    doc="one ONNX node run by onnx's reference implementation (the importer's fallback)")

DEFINITIONS: tuple[OpDef, ...] = (ONNX_NODE,)
