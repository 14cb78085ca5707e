"""The op set. Each module defines its ops as OpDefs and exports them in ``DEFINITIONS``; this
package gathers them into one read-only name → OpDef mapping."""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from tilefuse.errors import UnknownOpError
from tilefuse.ops import (
    attention,
    collective,
    composite,
    contraction,
    elementwise,
    foreign,
    indexing,
    movement,
    nn,
    quant,
    quant_gpu,
    reduction,
    scan,
)
from tilefuse.ops.registry import AttrSpec, AttrType, OpDef, OpKind, Trait

_MODULES = (elementwise, reduction, composite, contraction, movement, nn, attention, indexing,
            foreign, quant, quant_gpu, scan, collective)


def _gather() -> Mapping[str, OpDef]:
    table: dict[str, OpDef] = {}
    for module in _MODULES:
        for op in module.DEFINITIONS:
            if op.name in table:
                raise RuntimeError(f"op {op.name!r} is defined twice")
            table[op.name] = op
    return MappingProxyType(table)


OPS: Mapping[str, OpDef] = _gather()


def get_op(name: str) -> OpDef:
    """The OpDef called ``name``; UnknownOpError if there is none."""
    try:
        return OPS[name]
    except KeyError:
        raise UnknownOpError(f"unknown op {name!r}") from None


__all__ = ["OPS", "AttrSpec", "AttrType", "OpDef", "OpKind", "Trait", "get_op"]
