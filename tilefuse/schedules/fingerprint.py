"""What a tuned schedule is keyed by: the kernel's fingerprint and the target string.

Both are computed by builds on every kernel they look up (:mod:`tilefuse.runtime.schedules`),
so this module is light: no lowering, no graph rebuilt, no constant's bytes read.

:func:`group_fingerprint` is the sha256 of a canonical text of one kernel group: its kind, its
inputs (type, and whether the value is known at build time: a constant B is packed once, which
changes the kernel), its nodes (op, attributes with array values reduced to their type, operand
positions, result types) and its outputs. Values of constants are left out: a schedule depends
on shapes and dtypes, not on weights, so the same kernel in another model finds its schedule.

:func:`target_string` says what a measurement is valid for: triple, CPU, a digest of the
feature string and the core count.
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Collection

from tilefuse.codegen.target import CpuTarget, host_target
from tilefuse.graph.ir import Value
from tilefuse.graph.printer import format_attrs, format_type
from tilefuse.kernel.fusion import KernelGroup

_DIGEST = re.compile(r'elided\("[0-9a-f]+"\)')


def group_text(group: KernelGroup, known: Collection[Value]) -> str:
    """The canonical text :func:`group_fingerprint` hashes (names and values left out)."""
    ids: dict[Value, int] = {}
    lines = [group.kind.value]
    for v in group.inputs:
        ids[v] = len(ids)
        lines.append(f"in {format_type(v.type)}{' known' if v in known else ''}")
    for node in group.nodes:
        args = ",".join(str(ids[v]) if v in ids else "?" for v in node.inputs)
        attrs = _DIGEST.sub("elided", format_attrs(node.attrs, elide_constants_over=0))
        types = ",".join(format_type(o.type) for o in node.outputs)
        lines.append(f"{node.op.name}({args}){attrs} -> {types}")
        for out in node.outputs:
            ids.setdefault(out, len(ids))
    lines.append("out " + ",".join(str(ids.get(v, "?")) for v in group.outputs))
    return "\n".join(lines)


def group_fingerprint(group: KernelGroup, known: Collection[Value]) -> str:
    """sha256 of :func:`group_text`; ``known`` holds the group inputs known at build time."""
    return hashlib.sha256(group_text(group, known).encode()).hexdigest()


def target_string(target: CpuTarget | None = None) -> str:
    """What a measurement is valid for: triple, CPU, a digest of its features, core count."""
    t = target or host_target()
    digest = hashlib.sha256(t.features.encode()).hexdigest()[:12]
    return f"{t.triple}/{t.cpu}/{digest}/cores={os.cpu_count() or 1}"


__all__ = ["group_fingerprint", "group_text", "target_string"]
