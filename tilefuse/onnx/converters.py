"""The converter table: for each ONNX op type of the default domain, its converters by the
opset version they apply from. :func:`find_converter` picks the newest one a model's opset
covers. The table is built once, from the converter modules' ``CONVERTERS`` rows, and is
read-only."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from types import MappingProxyType

from tilefuse.onnx import (
    converters_legacy,
    converters_math,
    converters_nn,
    converters_sequence,
    converters_shape,
)
from tilefuse.onnx.context import NodeContext, Tensor

Converter = Callable[[NodeContext], list[Tensor]]


def _build() -> Mapping[str, tuple[tuple[int, Converter], ...]]:
    table: dict[str, list[tuple[int, Converter]]] = {}
    for module in (converters_legacy, converters_math, converters_shape, converters_nn,
                   converters_sequence):
        for op_type, since, fn in module.CONVERTERS:
            versions = table.setdefault(op_type, [])
            if any(v == since for v, _ in versions):
                raise RuntimeError(f"two converters for {op_type} since opset {since}")
            versions.append((since, fn))
    return MappingProxyType({k: tuple(sorted(v, key=lambda e: e[0])) for k, v in table.items()})


CONVERTERS: Mapping[str, tuple[tuple[int, Converter], ...]] = _build()


def find_converter(op_type: str, domain: str, opset: int) -> Converter | None:
    """The converter of ``op_type`` for a model importing ``opset`` of the default domain;
    None for other domains, unknown ops and ops newer than the opset."""
    if domain:
        return None
    chosen = None
    for since, fn in CONVERTERS.get(op_type, ()):
        if since <= opset:
            chosen = fn
    return chosen


def supported_ops() -> tuple[str, ...]:
    return tuple(sorted(CONVERTERS))
