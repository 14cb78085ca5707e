"""The kernel plan's data types: a :class:`KernelPlan` of :class:`KernelGroup` s, each of a
:class:`KernelKind`, whose members have :class:`Role` s. The plan is the stage between the graph
and the lowerings: :mod:`tilefuse.kernel.fusion` forms it, :mod:`tilefuse.kernel.plan_printer`
and :mod:`tilefuse.kernel.plan_parser` print and parse it, :mod:`tilefuse.kernel.plan_check`
verifies it, and the ``lower_*`` modules lower its groups."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from tilefuse.errors import VerifyError
from tilefuse.graph.ir import Graph, Node, Value
from tilefuse.graph.types import Shape
from tilefuse.kernel.plan_printer import print_plan

__all__ = ["KernelGroup", "KernelKind", "KernelPlan", "Role"]


class KernelKind(enum.Enum):
    """What kind of loop nest a kernel is; picks its default schedule rule."""

    ELEMENTWISE = "elementwise"
    ROW_REDUCTION = "row_reduction"
    REDUCTION = "reduction"
    CONTRACTION = "contraction"
    MOVEMENT = "movement"
    OPAQUE = "opaque"
    ATTENTION = "attention"   # one attention node: the online-softmax kernel (lower_attention)


class Role(enum.Enum):
    """Where a member of a group is evaluated (see the module docstring)."""

    ANCHOR = "anchor"          # the reduction / contraction the group is built around
    REDUCE = "reduce"          # a further row reduction over the anchor's rows
    DOMAIN = "domain"          # once per element of the iteration domain
    ROW = "row"                # once per row of a row reduction
    PROLOGUE = "prologue"      # computes operand A (or a reduction's input) element by element
    PROLOGUE_B = "prologue_b"  # computes operand B of a contraction element by element
    EPILOGUE = "epilogue"      # once per element of a contraction's output
    LEAF = "leaf"              # reads group inputs only; evaluated where it is read
    SINGLE = "single"          # the one node of a movement or opaque kernel


@dataclass(frozen=True, eq=False)
class KernelGroup:
    """One kernel. ``nodes`` are in graph (topological) order with their ``roles``; ``inputs`` are
    the values it reads from memory (graph inputs, constants, other kernels' outputs);
    ``outputs`` the values it writes (read by another kernel or returned). ``anchor`` is the
    reduction / contraction it is built around, ``domain`` its iteration shape (F for a row
    reduction, the output for a contraction, the input for a reduction, |D| for elementwise).
    ``roles`` is empty only for a group assembled by hand (tests of a lowering)."""

    name: str
    kind: KernelKind
    nodes: tuple[Node, ...]
    inputs: tuple[Value, ...]
    outputs: tuple[Value, ...]
    anchor: Node | None
    domain: Shape
    roles: tuple[Role, ...] = field(default=())

    def role_of(self, node: Node) -> Role:
        for n, role in zip(self.nodes, self.roles):
            if n is node:
                return role
        raise VerifyError(f"{node.op.name} node is not in kernel {self.name}")


@dataclass(frozen=True, eq=False)
class KernelPlan:
    """The kernels of ``graph`` in a valid launch order."""

    graph: Graph
    groups: tuple[KernelGroup, ...]

    def __str__(self) -> str:
        return print_plan(self)

    def recomputed(self) -> dict[Node, tuple[KernelGroup, ...]]:
        """Nodes held by more than one kernel (rule 8) → those kernels."""
        holders: dict[Node, list[KernelGroup]] = {}
        for g in self.groups:
            for n in g.nodes:
                holders.setdefault(n, []).append(g)
        return {n: tuple(gs) for n, gs in holders.items() if len(gs) > 1}
