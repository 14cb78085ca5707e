"""The converter table: for each ONNX op type of the default domain, its converters by the
opset version they apply from. :func:`find_converter` picks the newest one a model's opset
covers. The table is built once, from the converter modules' ``CONVERTERS`` rows, and is
read-only. Other domains have tables of their own (``DOMAIN_CONVERTERS``: today the
``ai.onnx.preview.training`` domain's Gradient and ``com.microsoft``'s MatMulNBits), versioned
by the model's opset of that domain."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from types import MappingProxyType

from tilefuse.onnx import (
    converters_attention,
    converters_index,
    converters_legacy,
    converters_loss,
    converters_math,
    converters_microsoft,
    converters_misc,
    converters_nn,
    converters_quant,
    converters_recurrent,
    converters_resize,
    converters_sequence,
    converters_shape,
    converters_training,
)
from tilefuse.onnx.context import NodeContext, Tensor

Converter = Callable[[NodeContext], list[Tensor]]


Table = Mapping[str, tuple[tuple[int, Converter], ...]]


def _build(modules: tuple = (converters_legacy, converters_math, converters_shape, converters_nn,
                             converters_sequence, converters_attention,
                             converters_loss, converters_resize, converters_index,
                             converters_recurrent, converters_quant,
                             converters_misc)) -> Table:
    table: dict[str, list[tuple[int, Converter]]] = {}
    for module in modules:
        for op_type, since, fn in module.CONVERTERS:
            versions = table.setdefault(op_type, [])
            if any(v == since for v, _ in versions):
                raise RuntimeError(f"two converters for {op_type} since opset {since}")
            versions.append((since, fn))
    return MappingProxyType({k: tuple(sorted(v, key=lambda e: e[0])) for k, v in table.items()})


CONVERTERS: Table = _build()
DOMAIN_CONVERTERS: Mapping[str, Table] = MappingProxyType({
    converters_training.DOMAIN: _build((converters_training,)),
    converters_microsoft.DOMAIN: _build((converters_microsoft,)),
})


def find_converter(op_type: str, domain: str, opset: int) -> Converter | None:
    """The converter of ``op_type`` of ``domain`` ("" for the default one) for a model
    importing ``opset`` of that domain; None for unknown ops and ops newer than the opset."""
    table = DOMAIN_CONVERTERS.get(domain) if domain else CONVERTERS
    chosen = None
    for since, fn in (table or {}).get(op_type, ()):
        if since <= opset:
            chosen = fn
    return chosen


def supported_ops() -> tuple[str, ...]:
    return tuple(sorted(CONVERTERS))
