"""The text form of a kernel plan (the ``kernels.plan`` dump): per kernel its name, kind,
iteration domain, inputs, the node lines it holds (named ``%N`` exactly as in the graph dump,
each with its role), and outputs; on top a summary of how many kernels the graph became and how
many bytes travel through memory between kernels before and after fusion.

```
plan @ffn: 3 nodes -> 1 kernel
  written between kernels: 12582912 B (12.0 MiB) one kernel per op, 0 B fused
  written as graph outputs: 6291456 B (6.0 MiB)

k0 contraction over [512,3072], anchor %0
  in:  %x: f32[512,768], %w: f32[768,3072], %b: f32[3072]
  anchor      %0 = matmul(%x, %w) : f32[512,3072]
  epilogue    %1 = add(%0, %b) : f32[512,3072]
  epilogue    %2 = gelu(%1) {approximate="none"} : f32[512,3072]
  out: %2: f32[512,3072]
```
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from tilefuse.graph.analysis import users as value_users
from tilefuse.graph.ir import Graph, Node, Value
from tilefuse.graph.printer import format_attrs, format_type, input_names
from tilefuse.graph.types import SymProduct

if TYPE_CHECKING:
    from tilefuse.kernel.plan import KernelGroup, KernelPlan

ELIDE_OVER = 16
"""Array attributes with more elements print as their digest."""

Bytes = dict[tuple[str, ...], int]  # symbols -> coefficient: a sum of monomials


def value_names(graph: Graph) -> dict[Value, str]:
    """Every value of ``graph`` → its name in the graph dump (``%x``, ``%3``)."""
    names = {v: f"%{n}" for v, n in zip(graph.inputs, input_names(graph.inputs))}
    counter = 0
    for node in graph.nodes:
        for v in node.outputs:
            if v not in names:
                names[v] = f"%{counter}"
                counter += 1
    return names


def format_node(node: Node, names: dict[Value, str]) -> str:
    """``%3 = exp(%2) : f32[4,8]``, as the graph dump writes the node (without its location)."""
    lhs = ", ".join(names.get(v, "%?") for v in node.outputs)
    args = ", ".join(names.get(v, "%?") for v in node.inputs)
    types = ", ".join(format_type(v.type) for v in node.outputs) or "()"
    text = f"{node.op.name}({args}){format_attrs(node.attrs, elide_constants_over=ELIDE_OVER)}"
    return f"{lhs} = {text} : {types}" if lhs else f"{text} : {types}"


def node_label(node: Node, names: dict[Value, str]) -> str:
    """``%3 = exp``: a node named in one breath, for logs and messages."""
    lhs = ", ".join(names.get(v, "%?") for v in node.outputs)
    return f"{lhs} = {node.op.name}" if lhs else node.op.name


def _typed(values: Iterable[Value], names: dict[Value, str]) -> str:
    return ", ".join(f"{names[v]}: {format_type(v.type)}" for v in values) or "-"


def _add_bytes(total: Bytes, value: Value) -> None:
    n = SymProduct.of(value.type.shape)
    total[n.syms] = total.get(n.syms, 0) + n.coeff * value.dtype.itemsize


def format_bytes(total: Bytes) -> str:
    """``384 B``, ``12582912 B (12.0 MiB)``, or ``3072*batch + 64 B`` for symbolic sizes."""
    terms = [(syms, c) for syms, c in sorted(total.items(), key=lambda t: (-len(t[0]), t[0]))
             if c]
    if not terms:
        return "0 B"
    if len(terms) == 1 and not terms[0][0]:
        n = terms[0][1]
        for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
            if n >= scale:
                return f"{n} B ({n / scale:.1f} {unit})"
        return f"{n} B"
    text = " + ".join(str(SymProduct(c, syms)) for syms, c in terms)
    return f"{text} B"


def traffic(plan: KernelPlan) -> tuple[Bytes, Bytes, Bytes]:
    """Bytes written between kernels with one kernel per op, the same with this plan, and bytes
    written as graph outputs (the same in both)."""
    graph = plan.graph
    in_plan = {n for k in plan.groups for n in k.nodes}
    returned = set(graph.outputs)
    users = value_users(graph)
    before: Bytes = {}
    after: Bytes = {}
    outputs: Bytes = {}
    for node in (n for n in graph.nodes if n in in_plan):
        for v in node.outputs:
            if v in returned:
                _add_bytes(outputs, v)
            elif any(u in in_plan for u in users.get(v, ())):
                _add_bytes(before, v)
    for k in plan.groups:
        for v in k.outputs:
            if v not in returned:
                _add_bytes(after, v)
    return before, after, outputs


def print_plan(plan: KernelPlan) -> str:
    """The plan as text: a summary, then each kernel in launch order."""
    graph = plan.graph
    names = value_names(graph)
    count = len({n for k in plan.groups for n in k.nodes})
    before, after, outputs = traffic(plan)
    kernels = len(plan.groups)
    lines = [f"plan @{graph.name}: {count} node{'s' * (count != 1)} -> {kernels} "
             f"kernel{'s' * (kernels != 1)}",
             f"  written between kernels: {format_bytes(before)} one kernel per op, "
             f"{format_bytes(after)} fused",
             f"  written as graph outputs: {format_bytes(outputs)}"]
    constants = [v for n in graph.nodes if n.op.name == "constant" for v in n.outputs]
    used = {v for k in plan.groups for v in k.inputs} | set(graph.outputs)
    constants = [v for v in constants if v in used]
    if constants:
        lines.append(f"  constants: {_typed(constants, names)}")
    recomputed = plan.recomputed()
    for k in plan.groups:
        lines.append("")
        lines.extend(_kernel_lines(k, names, recomputed))
    return "\n".join(lines) + "\n"


def _kernel_lines(k: KernelGroup, names: dict[Value, str],
                  recomputed: dict[Node, tuple[KernelGroup, ...]]) -> list[str]:
    domain = "[" + ",".join(str(d) for d in k.domain) + "]"
    head = f"{k.name} {k.kind.value} over {domain}"
    if k.anchor is not None:
        head += f", anchor {node_label(k.anchor, names).split(' = ')[0]}"
    lines = [head, f"  in:  {_typed(k.inputs, names)}"]
    roles = [r.value for r in k.roles] if len(k.roles) == len(k.nodes) else ["-"] * len(k.nodes)
    for node, role in zip(k.nodes, roles):
        line = f"  {role:<11} {format_node(node, names)}"
        others = [g.name for g in recomputed.get(node, ()) if g is not k]
        if others:
            line += f"  (recomputed, also in {', '.join(others)})"
        lines.append(line)
    lines.append(f"  out: {_typed(k.outputs, names)}")
    return lines
