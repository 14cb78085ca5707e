"""Reading an ONNX model safely and checking its structure once, before any conversion.

:func:`read_model` parses the protobuf itself (the equivalent of ``onnx.load`` with
``load_external_data=False``) and resolves external data through
:mod:`tilefuse.onnx.external_data`. :func:`check_model` turns the proto into a
:class:`ModelInfo`: the default-domain opset, typed inputs (dims are ints, ``dim_param`` names or
None), outputs, decoded initializers and the nodes in a topological order with their attributes
parsed. Every defect (not protobuf, truncated, no graph, a node input that names no value, a
cycle, a duplicate output, a negative or huge dim, an initializer whose payload does not match
its dims) is an :class:`OnnxError`.
"""

from __future__ import annotations

import heapq
import os
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

import numpy as np
import onnx
from google.protobuf.message import DecodeError
from onnx import ModelProto, TensorProto, ValueInfoProto

from tilefuse.dtypes import DType
from tilefuse.onnx.external_data import load_external
from tilefuse.onnx.tensors import MAX_DIM, OnnxError, attribute_values, tensor_to_array, to_dtype

MIN_OPSET = 1
TRAINING_DOMAIN = "ai.onnx.preview.training"
DOMAINS_ALONE = frozenset({TRAINING_DOMAIN})
"""Domains a model may import without the default one (its default-domain opset is then 0:
no default-domain op converts)."""
MAX_MODEL_BYTES = 2**31 - 1   # protobuf's own limit
DEFAULT_DOMAINS = ("", "ai.onnx")

InputDim = int | str | None   # a size, a dim_param name, or unknown


@dataclass(frozen=True)
class TensorSpec:
    """A graph input or output as declared: dtype (None if undeclared) and dims (None if the
    rank is undeclared)."""

    name: str
    dtype: DType | None
    dims: tuple[InputDim, ...] | None


@dataclass(frozen=True)
class NodeSpec:
    op_type: str
    domain: str
    name: str
    inputs: tuple[str, ...]     # "" marks an omitted optional input
    outputs: tuple[str, ...]    # "" marks an unrequested optional output
    attrs: Mapping[str, Any]
    proto: bytes = b""          # the NodeProto as read (for the reference fallback)

    @property
    def label(self) -> str:
        return f"{self.op_type} {self.name!r}"


@dataclass(frozen=True)
class ModelInfo:
    name: str
    opset: int
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    initializers: Mapping[str, np.ndarray]
    nodes: tuple[NodeSpec, ...]
    domains: Mapping[str, int]


def read_model(source: Any, base_dir: str | os.PathLike[str] | None = None
               ) -> tuple[ModelProto, str | None]:
    """The ModelProto of a path, bytes or ModelProto (copied, never modified), and the folder
    external data is read from (the model file's folder, or ``base_dir``)."""
    if isinstance(source, ModelProto):
        model = ModelProto()
        model.CopyFrom(source)
        return model, None if base_dir is None else os.fspath(base_dir)
    if isinstance(source, (bytes, bytearray, memoryview)):
        return _parse(bytes(source), "the given bytes"), (
            None if base_dir is None else os.fspath(base_dir))
    if not isinstance(source, (str, os.PathLike)):
        raise OnnxError(f"tilefuse.onnx.load needs a path, bytes or onnx.ModelProto, got "
                        f"{type(source).__name__}")
    path = os.fspath(source)
    if not os.path.isfile(path):
        raise OnnxError(f"{path!r} is not a file")
    size = os.path.getsize(path)
    if size > MAX_MODEL_BYTES:
        raise OnnxError(f"{path!r} is {size} bytes, over protobuf's 2 GiB limit")
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as err:
        raise OnnxError(f"cannot read {path!r}: {err.strerror}") from None
    folder = os.path.dirname(os.path.realpath(path)) if base_dir is None else os.fspath(base_dir)
    return _parse(data, repr(path)), folder


def _parse(data: bytes, what: str) -> ModelProto:
    if not data:
        raise OnnxError(f"{what} is empty, not an ONNX model")
    try:
        return ModelProto.FromString(data)
    except (DecodeError, RuntimeError, ValueError) as err:
        raise OnnxError(f"{what} is not a valid ONNX protobuf (truncated or not ONNX): "
                        f"{err}") from None


def check_model(model: ModelProto, base_dir: str | None) -> ModelInfo:
    """The checked, decoded form of ``model`` (see the module docstring)."""
    if not model.HasField("graph"):
        raise OnnxError("the model has no graph (not an ONNX model, or truncated)")
    graph = model.graph
    domains = _opsets(model)
    if graph.sparse_initializer:
        raise OnnxError("sparse initializers are not supported")
    initializers = _initializers(graph.initializer, base_dir)
    inputs = tuple(_spec(v, "input") for v in graph.input if v.name not in initializers)
    _unique([v.name for v in graph.input], "graph input")
    nodes = _nodes(graph.node)
    defined = set(initializers) | {v.name for v in inputs}
    ordered = _topological(nodes, defined)
    outputs = tuple(_spec(v, "output", need_type=False) for v in graph.output)
    _unique([o.name for o in outputs], "graph output")
    known = defined | {o for n in nodes for o in n.outputs if o}
    for o in outputs:
        if o.name not in known:
            raise OnnxError(f"graph output {o.name!r} names no value")
    name = _text(graph.name, "the graph name") or "onnx_model"
    return ModelInfo(name, domains[""], inputs, outputs, MappingProxyType(initializers), ordered,
                     MappingProxyType(domains))


def _text(value: Any, what: str) -> str:
    """A string field; protobuf hands back bytes when it is not valid UTF-8."""
    if not isinstance(value, str):
        raise OnnxError(f"{what} is not valid UTF-8 text")
    return value


def _opsets(model: ModelProto) -> dict[str, int]:
    domains: dict[str, int] = {}
    for entry in model.opset_import:
        domain = _text(entry.domain, "an opset domain")
        domain = "" if domain in DEFAULT_DOMAINS else domain
        domains[domain] = int(entry.version)
    if "" not in domains:
        if domains and set(domains) <= DOMAINS_ALONE:
            return {**domains, "": 0}
        others = ", ".join(sorted(domains)) or "none"
        raise OnnxError("the model imports no opset of the default ONNX domain (it imports "
                        f"{others}; tilefuse does not support other domains alone)")
    newest = onnx.defs.onnx_opset_version()
    if not MIN_OPSET <= domains[""] <= newest:
        raise OnnxError(f"the model's opset {domains['']} is outside what tilefuse imports "
                        f"({MIN_OPSET} to {newest}, the installed onnx's newest)")
    return domains


def _unique(names: list[str], what: str) -> None:
    seen: set[str] = set()
    for n in names:
        if not n:
            raise OnnxError(f"a {what} has an empty name")
        if n in seen:
            raise OnnxError(f"{what} {n!r} is defined twice")
        seen.add(n)


def _initializers(tensors: Any, base_dir: str | None) -> dict[str, np.ndarray]:
    out: dict[str, np.ndarray] = {}
    for t in tensors:
        what = f"initializer {_text(t.name, 'an initializer name')!r}"
        if not t.name:
            raise OnnxError("an initializer has an empty name")
        if t.name in out:
            raise OnnxError(f"{what} is defined twice")
        if t.data_location == TensorProto.EXTERNAL:
            load_external(t, base_dir, what)
        arr = tensor_to_array(t, what)
        arr.setflags(write=False)
        out[t.name] = arr
    return out


def _spec(v: ValueInfoProto, kind: str, need_type: bool = True) -> TensorSpec:
    what = f"graph {kind} {_text(v.name, f'a graph {kind} name')!r}"
    if not v.name:
        raise OnnxError(f"a graph {kind} has an empty name")
    if not v.type.HasField("tensor_type"):
        if need_type:
            raise OnnxError(f"{what} is not a tensor (sequences, maps and optionals are not "
                            "supported)")
        return TensorSpec(v.name, None, None)
    tt = v.type.tensor_type
    dtype = to_dtype(tt.elem_type, what) if (need_type or tt.elem_type) else None
    if not tt.HasField("shape"):
        return TensorSpec(v.name, dtype, None)
    dims: list[InputDim] = []
    for d in tt.shape.dim:
        if d.HasField("dim_value"):
            if not 0 <= d.dim_value <= MAX_DIM:
                raise OnnxError(f"{what} has an invalid dim {d.dim_value}")
            dims.append(int(d.dim_value))
        else:
            dims.append(d.dim_param if d.HasField("dim_param") and d.dim_param else None)
    return TensorSpec(v.name, dtype, tuple(dims))


def _nodes(protos: Any) -> list[NodeSpec]:
    nodes = []
    for i, n in enumerate(protos):
        texts = [n.name, n.op_type, n.domain, *n.input, *n.output]
        for t in texts:
            _text(t, f"a name in node #{i}")
        name = n.name or f"#{i}"
        label = f"{n.op_type or '?'} {name!r}"
        if not n.op_type:
            raise OnnxError(f"node {name!r} has no op type")
        attrs = attribute_values(n.attribute, f"node {label}")
        nodes.append(NodeSpec(n.op_type, "" if n.domain in DEFAULT_DOMAINS else n.domain,
                              name, tuple(n.input), tuple(n.output), MappingProxyType(attrs),
                              n.SerializeToString(deterministic=True)))
    return nodes


def _topological(nodes: list[NodeSpec], defined: set[str]) -> tuple[NodeSpec, ...]:
    """The nodes in a topological order (the file's order where it is one already)."""
    producer: dict[str, int] = {}
    for i, n in enumerate(nodes):
        for o in n.outputs:
            if not o:
                continue
            if o in producer or o in defined:
                raise OnnxError(f"node {n.label} defines {o!r}, which is already defined")
            producer[o] = i
    waiting = [0] * len(nodes)
    users: list[list[int]] = [[] for _ in nodes]
    for i, n in enumerate(nodes):
        for name in set(n.inputs) - {""}:
            if name in producer:
                waiting[i] += 1
                users[producer[name]].append(i)
            elif name not in defined:
                raise OnnxError(f"node {n.label} reads {name!r}, which names no value")
    ready = [i for i, w in enumerate(waiting) if w == 0]
    heapq.heapify(ready)
    order: list[int] = []
    while ready:
        i = heapq.heappop(ready)
        order.append(i)
        for u in users[i]:
            waiting[u] -= 1
            if waiting[u] == 0:
                heapq.heappush(ready, u)
    if len(order) != len(nodes):
        stuck = next(n for i, n in enumerate(nodes) if waiting[i])
        raise OnnxError(f"the graph has a cycle through node {stuck.label}")
    return tuple(nodes[i] for i in order)
