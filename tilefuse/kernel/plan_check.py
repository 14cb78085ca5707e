"""Checking a kernel plan: the invariants :func:`tilefuse.kernel.fusion.form_kernels` promises,
checked on every plan it makes (and usable on hand-built plans in tests)."""

from __future__ import annotations

from tilefuse.errors import VerifyError
from tilefuse.graph.ir import Node, Value
from tilefuse.kernel.fusion import KernelPlan, is_constant, is_pointwise, live_nodes
from tilefuse.kernel.plan_printer import node_label, value_names


def verify_plan(plan: KernelPlan) -> None:
    """Raises VerifyError unless ``plan`` is a valid partition of its graph: every live
    non-constant node is in some kernel (in more than one only if pointwise), constants in none;
    each kernel's inputs are graph inputs, constants or outputs of earlier kernels; each value is
    written by at most one kernel, by one that computes it; every returned node value is
    written."""
    graph = plan.graph
    producer = graph.producers()
    names = value_names(graph)
    held: dict[Node, int] = {}
    available = set(graph.inputs) | {v for n in graph.nodes if is_constant(n) for v in n.outputs}
    written: set[Value] = set()
    for k in plan.groups:
        inside = set(k.nodes)
        if len(k.roles) != len(k.nodes) or len(inside) != len(k.nodes):
            raise VerifyError(f"kernel {k.name} lists its nodes or roles inconsistently")
        for n in k.nodes:
            if is_constant(n):
                raise VerifyError(f"kernel {k.name} holds a constant")
            held[n] = held.get(n, 0) + 1
        reads = {v for n in k.nodes for v in n.inputs if producer.get(v) not in inside}
        if reads != set(k.inputs):
            raise VerifyError(f"kernel {k.name} declares inputs other than those it reads")
        missing = [names.get(v, '%?') for v in k.inputs if v not in available]
        if missing:
            raise VerifyError(f"kernel {k.name} reads {', '.join(missing)} before any earlier "
                              "kernel writes it")
        for v in k.outputs:
            if producer.get(v) not in inside or v in written:
                raise VerifyError(f"kernel {k.name} writes {names.get(v, '%?')}, which it does not "
                                  "compute or another kernel writes too")
            written.add(v)
        available |= set(k.outputs)
    for n in live_nodes(graph):
        count = held.get(n, 0)
        if not is_constant(n) and (count == 0 or (count > 1 and not is_pointwise(n))):
            raise VerifyError(f"{node_label(n, names)} is in {count} kernels")
    for v in graph.outputs:
        p = producer.get(v)
        if p is not None and not is_constant(p) and v not in written:
            raise VerifyError(f"graph output {names.get(v, '%?')} is written by no kernel")
