"""Kernel formation: the stage transition from a graph to a kernel plan.

:func:`form_kernels` partitions the live nodes of a graph into :class:`KernelGroup` s. Each
becomes one kernel: one pass that reads its ``inputs`` from memory and writes its ``outputs``;
all else stays in registers or cache. ``constant`` nodes are data, not kernels; dead nodes are
left out. Run :func:`tilefuse.passes.decompose.decompose_composites` first, so that a softmax
written as one op and one written by hand reach these rules as the same nodes (an undecomposed
composite still works: it is a one-node row reduction).

The rules (they are the design; the tests hold the code to them):

0. **Constant-only computations stay apart**: a node computed from constants alone (the
   transpose of a weight) never joins nodes that depend on graph inputs. Its kernels run once at
   build time (or constant folding removes them). Fills and broadcasts (``full``,
   ``broadcast_to``) are exempt: they make a large tensor from next to nothing.
1. **Anchors first, in graph order.** A ``matmul`` anchors a CONTRACTION group; a sum, mean, max,
   min, var or prod (or a composite) folding exactly the trailing k >= 1 axes of its input
   anchors a ROW_REDUCTION group; any other reduction (other axes, argmax, argmin) a REDUCTION
   group. A group grows from its anchor to neighbouring nodes, both ways, until nothing fits.
2. **Pointwise nodes** (elementwise ops, ``full``, and the movement ops that only remap indices:
   broadcast_to, expand_dims, squeeze, reshape, transpose) are the only ones that join a group,
   with further row reductions in a row group. Each member gets a :class:`Role` saying where the
   lowering evaluates it, and may only read members whose role its own can read (below). A LEAF
   reads only group inputs and other leaves and is evaluated where it is read, so anyone may
   read it and it may have any shape: remaps and fills are free loads, and a small cheap
   computation on an input (the cast of a norm's weight, exp of a bias) is recomputed per read
   while every leaf cone costs at most :data:`MAX_RECOMPUTE_OPS` ops per element (see 8).
3. **ROW_REDUCTION** over the domain F = [R..., N...] (the anchor's input; N its k reduced axes):
   DOMAIN members have shape F, ROW members [R..., 1...] or [R...] (one value per row), REDUCE
   members fold an F-shaped member over the same N axes. A member reads only its own row: ROW
   never reads DOMAIN except through a reduction, broadcasting operands have the reader's rank
   (so [R, 1] lines up with [R, N]; a bare [R] is reshaped first), transposes read only inputs.
   Softmax (max, sub, exp, sum, div), log_softmax, layer_norm (mean, sub, mul, mean, add eps,
   rsqrt, mul, mul weight, add bias) and rms_norm are one kernel each, however written.
4. **CONTRACTION** over the matmul's output D: EPILOGUE members are elementwise ops of shape
   exactly D reading the anchor or the epilogue (bias, activation, residual, scale: ``gelu(x @ w
   + b)`` is one kernel); PROLOGUE / PROLOGUE_B members compute operand A / B element by element
   (the operand's element count), evaluated while packing; remaps, slices and constant pads
   of any size (``gathered``) join A's too, so im2col gathers from the unpadded activations.
5. **REDUCTION**: the anchor and a PROLOGUE computing its input element by element (as in 4);
   its leaves are remaps and fills only (a pool's taps would recompute arithmetic per window).
6. **ELEMENTWISE**: the remaining pointwise nodes, seeded from the last backwards. DOMAIN members
   have the seed's element count |D| (reshape and transpose keep it, so they fuse); inputs of
   other shapes broadcast into it. A smaller producer would be evaluated per element of D that
   reads it, so it joins only as a cheap LEAF; a costlier one is a kernel of its own.
7. **Sharing.** A value read outside its group, or returned, becomes a group output (written).
   Prologue and leaf members must be single-consumer (packing writes nothing; a leaf is not
   evaluated per element of anything written); the other roles may be shared. A merge that
   would make the kernel graph cyclic (a group both before and after another) is refused.
8. **Recompute instead of materialise.** A pointwise value read by other groups is recomputed in
   each of them instead (its home group stops writing it) when it is not returned; its cone (it
   and its ancestors in its group, up to returned values) is all pointwise and costs at most
   MAX_RECOMPUTE_OPS = 8 scalar ops per element (arithmetic 1, transcendental 4, remap or fill
   0); each reader can hold the cone under its own role rules (a broadcast read only as a cheap
   leaf); and the cone's inputs a reader does not read already weigh no more bytes than the
   value. Why: an f32 written and read back costs 8 bytes per element per reader, worth ~50
   flops at ~100 GFLOP/s against ~15 GB/s per core; recompute adds at most 8 ops per element per
   reader and reads no more bytes than the read it replaces, so it wins whenever allowed.
9. Everything else (concat, slice, pad, take, split, stack, conv2d, pooling, einsum, arange) is a
   one-node MOVEMENT (movement ops) or OPAQUE group for now; an ``attention`` node is a one-node
   ATTENTION group.

Groups launch in a topological order of the kernel graph (ties: earliest node first), named
``k0, k1, ...`` in that order. Decisions are logged on the ``fusion`` topic. What these rules
ask of a single node (pointwise or not, its cost, the axes it folds) is answered in
:mod:`tilefuse.kernel.classify`.
"""

from __future__ import annotations

import heapq
import logging
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass

from tilefuse.graph.analysis import users as value_users
from tilefuse.graph.ir import Graph, Node, Value
from tilefuse.graph.types import Shape, SymProduct
from tilefuse.kernel.classify import (
    ARG_REDUCTIONS,  # noqa: F401  (the four sets are re-exported: this was their home)
    AXIS_REDUCTIONS,  # noqa: F401
    CHEAP_MOVEMENT,  # noqa: F401
    TRANSCENDENTAL,  # noqa: F401
    bytes_at_most,
    gathered,
    is_constant,
    is_pointwise,
    moves_lane_axis,
    numel,
    op_cost,
    reduced_axes,
    row_width,
)
from tilefuse.kernel.plan import KernelGroup, KernelKind, KernelPlan, Role
from tilefuse.kernel.plan_printer import node_label, print_plan, value_names
from tilefuse.log import get_logger
from tilefuse.ops.registry import OpKind, Trait

__all__ = ["MAX_RECOMPUTE_OPS", "KernelGroup", "KernelKind", "KernelPlan", "Role", "anchor_kind",
           "form_kernels", "is_pointwise", "op_cost", "print_plan", "reduced_axes", "row_width"]

MAX_KERNEL_NODES = 64
"""The most nodes one kernel holds: lowering walks a kernel's expression recursively, so a chain
of thousands of elementwise ops (a hostile model) would exhaust Python's stack."""
MAX_RECOMPUTE_OPS = 8
"""The most scalar ops per element a value's cone may cost for it to be recomputed in each
reader instead of being written and read back (rule 8)."""

ORDER_PRESERVING = frozenset({"reshape", "expand_dims", "squeeze"})  # row-major order kept
FREE_CONSTANT_OPS = frozenset({"full", "broadcast_to"})  # make data from next to nothing


# ---- node classification (the rest is in tilefuse.kernel.classify) ---------------------------


def anchor_kind(node: Node) -> KernelKind | None:
    """The kind of group ``node`` anchors, or None for nodes that anchor nothing."""
    if node.op.name == "matmul":
        return KernelKind.CONTRACTION
    if reduced_axes(node) is None:
        return None
    return KernelKind.ROW_REDUCTION if row_width(node) else KernelKind.REDUCTION


# ---- spaces: what a group may hold -----------------------------------------------------------


class _Space:
    """The role rules of one group kind."""

    shared_roles = frozenset({Role.DOMAIN, Role.ROW, Role.ANCHOR, Role.REDUCE})  # may be written

    def candidates(self, node: Node) -> list[Role]:
        """The roles ``node`` could take, best first: the space's own, then LEAF."""
        return [*self._roles(node), Role.LEAF] if is_pointwise(node) else self._roles(node)

    def _roles(self, node: Node) -> list[Role]:
        return []

    def edge_ok(self, consumer: Node, c_role: Role, pos: int, producer: Node,
                p_role: Role) -> bool:
        """Whether ``consumer`` (as ``c_role``) may read ``producer`` (as ``p_role``) at operand
        position ``pos`` inside the group."""
        if p_role is Role.LEAF:
            return True
        if c_role is Role.LEAF:
            return False
        return self._edge(consumer, c_role, pos, producer, p_role)

    def _edge(self, consumer: Node, c_role: Role, pos: int, producer: Node,
              p_role: Role) -> bool:
        return False


class _SingleSpace(_Space):
    """A movement or opaque kernel: its one node and nothing else."""

    def candidates(self, node: Node) -> list[Role]:
        return []


class _ElementwiseSpace(_Space):
    def __init__(self, size: SymProduct):
        self.size = size

    def _roles(self, node: Node) -> list[Role]:
        return [Role.DOMAIN] if is_pointwise(node) and numel(node.outputs[0]) == self.size \
            else []

    def edge_ok(self, consumer: Node, c_role: Role, pos: int, producer: Node,
                p_role: Role) -> bool:
        if moves_lane_axis(consumer) and op_cost(producer) > 1:
            # a transpose that moves the lane axis makes the kernel read it one element at a
            # time: a transcendental behind it would run scalar (the LRN's pow behind the
            # NCHW -> NHWC transpose in AlexNet: 16 cycles an element), so it is computed
            # vectorised in a kernel of its own and the transpose reads its result
            return False
        return super().edge_ok(consumer, c_role, pos, producer, p_role)

    def _edge(self, consumer: Node, c_role: Role, pos: int, producer: Node,
              p_role: Role) -> bool:
        return c_role is Role.DOMAIN and p_role is Role.DOMAIN


class _RowSpace(_Space):
    def __init__(self, full: Shape, k: int):
        self.full, self.k = tuple(full), k
        rows = self.full[:len(self.full) - k]
        self.row_shapes = {(*rows, *(1,) * k), rows}

    def _roles(self, node: Node) -> list[Role]:
        if anchor_kind(node) is KernelKind.ROW_REDUCTION:
            ok = node.inputs[0].type.shape == self.full and row_width(node) == self.k
            return [Role.REDUCE] if ok else []
        shape = node.outputs[0].type.shape if is_pointwise(node) else None
        return [Role.DOMAIN] if shape == self.full else \
            [Role.ROW] if shape in self.row_shapes else []

    @staticmethod
    def level(node: Node, role: Role) -> Role:
        """What a member's value is per: a reduction's result is per row, a composite's (softmax,
        layer_norm) per element."""
        if role in (Role.ANCHOR, Role.REDUCE):
            return Role.DOMAIN if node.op.has(Trait.COMPOSITE) else Role.ROW
        return role

    def _edge(self, consumer: Node, c_role: Role, pos: int, producer: Node,
              p_role: Role) -> bool:
        level = self.level(producer, p_role)
        if c_role in (Role.ANCHOR, Role.REDUCE):
            return pos == 0 and level is Role.DOMAIN
        if c_role is Role.ROW and level is Role.DOMAIN:
            return False
        if consumer.op.name == "transpose":
            return False
        if consumer.op.name in ORDER_PRESERVING:
            return True
        return producer.outputs[0].type.rank == consumer.outputs[0].type.rank


class _ContractionSpace(_Space):
    shared_roles = frozenset({Role.ANCHOR, Role.EPILOGUE})

    def __init__(self, anchor: Node):
        self.domain = anchor.outputs[0].type.shape
        self.operands = tuple(SymProduct.of(v.type.shape) for v in anchor.inputs)

    def candidates(self, node: Node) -> list[Role]:
        if moves_lane_axis(node):
            # not a leaf: the epilogue's vector reads cannot go through it (GPT-2's tied
            # embedding gradient: a transposed weight gradient added to the one-hot product)
            return self._roles(node)
        return super().candidates(node)

    def _roles(self, node: Node) -> list[Role]:
        if not is_pointwise(node):
            return [Role.PROLOGUE] if gathered(node) else []
        out = node.outputs[0]
        epilogue = node.op.kind is OpKind.ELEMENTWISE and out.type.shape == self.domain
        return [role for role, ok in ((Role.EPILOGUE, epilogue),
                                      (Role.PROLOGUE, gathered(node) or
                                       numel(out) == self.operands[0]),
                                      (Role.PROLOGUE_B, numel(out) == self.operands[1])) if ok]

    def _edge(self, consumer: Node, c_role: Role, pos: int, producer: Node,
              p_role: Role) -> bool:
        if c_role is Role.EPILOGUE:
            return p_role in (Role.ANCHOR, Role.EPILOGUE)
        if c_role is Role.ANCHOR:
            return p_role is (Role.PROLOGUE, Role.PROLOGUE_B)[pos]
        return c_role in (Role.PROLOGUE, Role.PROLOGUE_B) and p_role is c_role


class _ReductionSpace(_Space):
    shared_roles = frozenset({Role.ANCHOR})

    def candidates(self, node: Node) -> list[Role]:
        if moves_lane_axis(node):
            return []  # its reads would be scalar in every tap of the window: materialised
        roles = self._roles(node)
        return [*roles, Role.LEAF] if is_pointwise(node) and op_cost(node) == 0 else roles

    def __init__(self, anchor: Node):
        self.size = SymProduct.of(anchor.inputs[0].type.shape)

    def _roles(self, node: Node) -> list[Role]:
        ok = gathered(node) or (is_pointwise(node) and numel(node.outputs[0]) == self.size)
        return [Role.PROLOGUE] if ok else []

    def _edge(self, consumer: Node, c_role: Role, pos: int, producer: Node,
              p_role: Role) -> bool:
        if c_role is Role.ANCHOR:
            return pos == 0 and p_role is Role.PROLOGUE
        return c_role is Role.PROLOGUE and p_role is Role.PROLOGUE


@dataclass
class _Group:
    gid: int
    kind: KernelKind
    space: _Space
    anchor: Node | None
    members: dict[Node, Role]
    constant: bool = False  # a group of constant-only computations (rule 0)


Unit = tuple[str, int]  # ("g", group id) or ("n", node index): a group or an unassigned node


# ---- formation -------------------------------------------------------------------------------


def form_kernels(graph: Graph) -> KernelPlan:
    """Partitions ``graph``'s live non-constant nodes into kernels by the rules above."""
    return _Former(graph).run()


class _Former:
    """The state of one kernel formation: groups, each node's home group, and every group that
    holds a node (its home plus recompute copies)."""

    def __init__(self, graph: Graph):
        self.graph = graph
        self.log = get_logger("fusion")
        self.index = {n: i for i, n in enumerate(graph.nodes)}
        self.live = live_nodes(graph)
        live = set(self.live)
        self.producer = graph.producers()
        self.users = {v: [u for u in us if u in live] for v, us in value_users(graph).items()}
        self.graph_outputs = set(graph.outputs)
        self.groups: dict[int, _Group] = {}
        self.home: dict[Node, int] = {}
        self.instances: dict[Node, set[int]] = {n: set() for n in self.live}
        self.names = value_names(graph)
        self._said: set[tuple[int, Node, str]] = set()
        self._next_gid = 0
        self.const_only = _constant_only(self.live, self.producer)
        self.pinned = {n for n in self.const_only if n.op.name not in FREE_CONSTANT_OPS}

    def run(self) -> KernelPlan:
        work = [n for n in self.live if not is_constant(n)]
        for node in work:
            kind = anchor_kind(node)
            if kind is not None and node not in self.home:
                self._grow(self._seed(kind, node))
        for node in reversed(work):
            if node not in self.home and is_pointwise(node):
                self._grow(self._seed(KernelKind.ELEMENTWISE, node))
        for node in work:
            if node not in self.home:
                kind = KernelKind.MOVEMENT if node.op.kind is OpKind.MOVEMENT \
                    else KernelKind.ATTENTION if node.op.name == "attention" \
                    else KernelKind.OPAQUE
                self._seed(kind, node)
        self._recompute_cheap_values()
        return self._finish()

    # ---- seeding and growth ------------------------------------------------------------------

    def _seed(self, kind: KernelKind, node: Node) -> _Group:
        space: _Space = _SingleSpace()
        role, anchor = Role.ANCHOR, node
        if kind is KernelKind.CONTRACTION:
            space = _ContractionSpace(node)
        elif kind is KernelKind.ROW_REDUCTION:
            space = _RowSpace(node.inputs[0].type.shape, row_width(node) or 0)
        elif kind is KernelKind.REDUCTION:
            space = _ReductionSpace(node)
        elif kind is KernelKind.ELEMENTWISE:
            space, role, anchor = _ElementwiseSpace(numel(node.outputs[0])), Role.DOMAIN, None
        else:
            role, anchor = Role.SINGLE, None
        group = self.groups[self._next_gid] = _Group(self._next_gid, kind, space, anchor, {},
                                                     node in self.pinned)
        self._next_gid += 1
        self._add(group, node, role)
        self.log.debug("g%d: %s group seeded at %s", group.gid, kind.value, self._label(node))
        return group

    def _add(self, group: _Group, node: Node, role: Role) -> None:
        group.members[node] = role
        self.home[node] = group.gid
        self.instances[node].add(group.gid)

    def _grow(self, group: _Group) -> None:
        heap: list[int] = []
        queued: set[int] = set()

        def push_neighbours(node: Node) -> None:
            near = [self.producer.get(v) for v in node.inputs]
            near += [u for v in node.outputs for u in self.users[v]]
            for n in near:
                if n is not None and n not in self.home and not is_constant(n) \
                        and self.index[n] not in queued:
                    queued.add(self.index[n])
                    heapq.heappush(heap, self.index[n])

        for member in list(group.members):
            push_neighbours(member)
        while heap:
            i = heapq.heappop(heap)
            queued.discard(i)
            node = self.graph.nodes[i]
            if node in self.home:
                continue
            role = self._admission(group, node)
            if role is not None:
                self._add(group, node, role)
                self.log.debug("g%d: %s joins as %s", group.gid, self._label(node), role.value)
                push_neighbours(node)

    def _admission(self, group: _Group, node: Node) -> Role | None:
        """The role ``node`` can take in ``group``, or None (with the reason logged)."""
        if len(group.members) >= MAX_KERNEL_NODES:
            return self._refuse(group, node, f"the kernel holds {MAX_KERNEL_NODES} nodes")
        fit = self._fit(group, node, group.members, private=False)
        if isinstance(fit, str):
            return self._refuse(group, node, fit)
        if self._creates_cycle(group, node):
            return self._refuse(group, node, "the kernel graph would have a cycle")
        return fit

    def _fit(self, group: _Group, node: Node, roles: dict[Node, Role], private: bool
             ) -> Role | str:
        """The first role ``node`` can take next to ``roles`` (the members, maybe with planned
        copies), or why none fits. A ``private`` copy is read only inside the group."""
        if not self._constness_ok(group, node):
            return "constant-only computations stay apart (rule 0)"
        ins = [(pos, p) for pos, v in enumerate(node.inputs)
               if (p := self.producer.get(v)) is not None and p in roles]
        users_in = self._users_in(node, roles)
        outside = not private and (any(v in self.graph_outputs for v in node.outputs) or any(
            u not in roles for v in node.outputs for u in self.users[v]))
        candidates = group.space.candidates(node)
        if not candidates:
            return "its shape or op does not fit the group"
        for role in candidates:
            if (not outside or role in group.space.shared_roles) and \
                    self._edges_ok(group.space, node, role, ins, users_in, roles):
                if role is Role.LEAF and not _leaves_cheap({**roles, node: role}):
                    return f"a leaf cone would cost more than {MAX_RECOMPUTE_OPS} ops per element"
                return role
        return "it is also read elsewhere and the roles it could take must be single-consumer" \
            if outside else "it would read or feed another row / domain"

    def _constness_ok(self, group: _Group, node: Node) -> bool:
        """Rule 0: a constant group takes constant-only nodes, other groups no pinned ones."""
        return node in self.const_only if group.constant else node not in self.pinned

    def _users_in(self, node: Node, members: dict[Node, Role]) -> list[tuple[Node, int]]:
        return [(u, pos) for v in node.outputs for u in self.users[v] if u in members
                for pos, w in enumerate(u.inputs) if w is v]

    @staticmethod
    def _edges_ok(space: _Space, node: Node, role: Role, ins: list[tuple[int, Node]],
                  users_in: list[tuple[Node, int]], roles: dict[Node, Role]) -> bool:
        return (all(space.edge_ok(node, role, pos, p, roles[p]) for pos, p in ins)
                and all(space.edge_ok(u, roles[u], pos, node, role) for u, pos in users_in))

    def _refuse(self, group: _Group, node: Node, why: str) -> None:
        if self.log.isEnabledFor(logging.DEBUG) and (group.gid, node, why) not in self._said:
            self._said.add((group.gid, node, why))
            self.log.debug("g%d: %s stays out: %s", group.gid, self._label(node), why)
        return None

    # ---- cycles ------------------------------------------------------------------------------

    def _unit(self, node: Node) -> Unit:
        gid = self.home.get(node)
        return ("g", gid) if gid is not None else ("n", self.index[node])

    def _members(self, unit: Unit) -> Iterable[Node]:
        kind, key = unit
        return self.groups[key].members if kind == "g" else (self.graph.nodes[key],)

    def _successors(self, node: Node) -> Iterable[Unit]:
        return (self._unit(u) for v in node.outputs for u in self.users[v])

    def _creates_cycle(self, group: _Group, node: Node) -> bool:
        """Whether putting ``node`` into ``group`` would make a path from the group out through
        other kernels and back in."""
        g, n = ("g", group.gid), ("n", self.index[node])
        return self._path(g, n) or self._path(n, g)

    def _path(self, src: Unit, dst: Unit) -> bool:
        """Whether a path leads from ``src`` to ``dst`` through at least one other unit. Only
        nodes before ``dst``'s last node can lie on it (they must be its ancestors)."""
        limit = max(self.index[m] for m in self._members(dst))
        start = {u for m in self._members(src) for u in self._successors(m)} - {src, dst}
        seen, queue = set(start), deque(start)
        while queue:
            for m in self._members(queue.popleft()):
                if self.index[m] >= limit:
                    continue
                for u in self._successors(m):
                    if u == dst:
                        return True
                    if u != src and u not in seen:
                        seen.add(u)
                        queue.append(u)
        return False

    # ---- rule 8: recompute cheap values instead of writing them ------------------------------

    def _recompute_cheap_values(self) -> None:
        """Visits home members last to first, so every reader of a value (copies included)
        exists when the value is decided; drops members nothing needs any more."""
        for node in reversed(self.live):
            gid = self.home.get(node)
            if gid is None or not is_pointwise(node):
                continue
            group = self.groups[gid]
            value = node.outputs[0]
            readers = self._readers(value, gid)
            returned = value in self.graph_outputs
            if readers and not returned:
                copies = self._recompute_plan(node, group, readers)
                if copies is not None:
                    for hid, roles in copies.items():
                        for n, role in roles:
                            self.groups[hid].members[n] = role
                            self.instances[n].add(hid)
                    readers = {}
            if not readers and not returned and not self._users_in(node, group.members):
                del group.members[node]
                del self.home[node]
                self.instances[node].discard(gid)

    def _readers(self, value: Value, gid: int) -> dict[int, list[Node]]:
        """Groups other than ``gid`` that read ``value`` from memory, with their reading nodes."""
        node = self.producer[value]
        out: dict[int, list[Node]] = {}
        for u in self.users[value]:
            for hid in self.instances[u]:
                if hid != gid and node not in self.groups[hid].members:
                    out.setdefault(hid, []).append(u)
        return out

    def _recompute_plan(self, node: Node, group: _Group, readers: dict[int, list[Node]]
                        ) -> dict[int, list[tuple[Node, Role]]] | None:
        """The copies (node, role) each reader would take, or None when ``node`` must be
        written (the reason logged)."""
        cone = self._cone(node, group)
        plan: dict[int, list[tuple[Node, Role]]] = {}
        if cone is None:
            why: str | None = "its cone holds a reduction or contraction"
        elif (cost := sum(op_cost(n) for n in cone)) > MAX_RECOMPUTE_OPS:
            why = f"recomputing costs {cost} ops per element > {MAX_RECOMPUTE_OPS}"
        else:
            why = self._fit_readers(node, cone, readers, plan)
        if why is not None or cone is None:
            self.log.debug("materialise %s: %s", self._label(node), why)
            return None
        self.log.debug("recompute %s (%d nodes, %d ops per element) in %s instead of writing "
                       "it", self._label(node), len(cone), cost, ", ".join(f"g{h}" for h in plan))
        return plan

    def _fit_readers(self, node: Node, cone: list[Node], readers: dict[int, list[Node]],
                     plan: dict[int, list[tuple[Node, Role]]]) -> str | None:
        """Fills ``plan`` with each reader's copies of ``cone``; the reason when one cannot."""
        inside = set(cone)
        leaves = [v for n in cone for v in n.inputs if self.producer.get(v) not in inside]
        for hid in sorted(readers):
            reader = self.groups[hid]
            if not self._cheap_reads(reader, leaves, node.outputs[0]):
                return f"g{hid} would read more bytes than it saves"
            roles = self._simulate(reader, cone)
            if isinstance(roles, str):
                return f"it does not fit g{hid}: {roles}"
            plan[hid] = roles
        return None

    def _cone(self, node: Node, group: _Group) -> list[Node] | None:
        """``node`` and its ancestors inside ``group`` up to values returned (written anyway),
        in graph order; None unless all are pointwise."""
        cone, stack = {node}, [node]
        while stack:
            for v in stack.pop().inputs:
                p = self.producer.get(v)
                if p is not None and p in group.members and p not in cone \
                        and v not in self.graph_outputs:
                    cone.add(p)
                    stack.append(p)
        if not all(is_pointwise(n) for n in cone):
            return None
        return sorted(cone, key=self.index.__getitem__)

    def _cheap_reads(self, group: _Group, leaves: list[Value], value: Value) -> bool:
        """Whether the leaves ``group`` does not read already weigh no more than ``value``."""
        members = group.members
        reads = {v for m in members for v in m.inputs if self.producer.get(v) not in members}
        return bytes_at_most((v for v in leaves if v not in reads
                              and self.producer.get(v) not in members), value)

    def _simulate(self, group: _Group, cone: list[Node]) -> list[tuple[Node, Role]] | str:
        """Roles for private copies of ``cone`` in ``group`` (users first), or why not."""
        roles = dict(group.members)
        for node in reversed(cone):
            fit = self._fit(group, node, roles, private=True)
            if isinstance(fit, str):
                return fit
            roles[node] = fit
        return [(n, roles[n]) for n in reversed(cone)]

    # ---- the plan ----------------------------------------------------------------------------

    def _finish(self) -> KernelPlan:
        groups = [g for g in self.groups.values() if g.members]
        writer: dict[Value, int] = {}
        io: dict[int, tuple[tuple[Value, ...], tuple[Value, ...]]] = {}
        for g in groups:
            outs = tuple(v for n in self._sorted(g.members) if self.home.get(n) == g.gid
                         for v in n.outputs
                         if v in self.graph_outputs or self._readers(v, g.gid))
            ins = tuple(dict.fromkeys(v for n in self._sorted(g.members) for v in n.inputs
                                      if self.producer.get(v) not in g.members))
            writer.update(dict.fromkeys(outs, g.gid))
            io[g.gid] = (ins, outs)
        order = self._launch_order(groups, io, writer)
        kernels = tuple(self._record(f"k{i}", g, *io[g.gid]) for i, g in enumerate(order))
        plan = KernelPlan(self.graph, kernels)
        for g, k in zip(order, kernels):
            self.log.debug("g%d -> %s: %s over %s, %d nodes, %d in, %d out", g.gid, k.name,
                           k.kind.value, list(k.domain), len(k.nodes), len(k.inputs),
                           len(k.outputs))
        from tilefuse.kernel.plan_check import verify_plan  # it imports this module's records
        verify_plan(plan)
        return plan

    def _sorted(self, nodes: Iterable[Node]) -> list[Node]:
        return sorted(nodes, key=self.index.__getitem__)

    def _launch_order(self, groups: list[_Group], io: dict, writer: dict[Value, int]
                      ) -> list[_Group]:
        """Kahn's algorithm on the kernel graph; among ready kernels the earliest node first."""
        deps = {g.gid: {writer[v] for v in io[g.gid][0] if v in writer} - {g.gid}
                for g in groups}
        first = {g.gid: min(self.index[n] for n in g.members) for g in groups}
        by_id = {g.gid: g for g in groups}
        ready = [(first[gid], gid) for gid, d in deps.items() if not d]
        heapq.heapify(ready)
        order: list[_Group] = []
        while ready:
            _, gid = heapq.heappop(ready)
            order.append(by_id[gid])
            for other, d in deps.items():
                if gid in d:
                    d.discard(gid)
                    if not d:
                        heapq.heappush(ready, (first[other], other))
        if len(order) != len(groups):  # verify_plan names what is wrong
            order += [g for g in groups if g not in order]
        return order

    def _record(self, name: str, g: _Group, ins: tuple[Value, ...],
                outs: tuple[Value, ...]) -> KernelGroup:
        nodes = tuple(self._sorted(g.members))
        kind = g.kind
        if kind is KernelKind.ELEMENTWISE and all(n.op.kind is OpKind.MOVEMENT for n in nodes):
            kind = KernelKind.MOVEMENT
        return KernelGroup(name, kind, nodes, ins, outs, g.anchor, self._domain(g, nodes),
                           tuple(g.members[n] for n in nodes))

    @staticmethod
    def _domain(g: _Group, nodes: tuple[Node, ...]) -> Shape:
        if isinstance(g.space, _RowSpace):
            return g.space.full
        if g.kind is KernelKind.CONTRACTION:
            return g.space.domain  # type: ignore[attr-defined]
        if g.kind is KernelKind.REDUCTION and g.anchor is not None:
            return g.anchor.inputs[0].type.shape
        domain = [n for n in nodes if g.members[n] is Role.DOMAIN] or list(nodes)
        outs = domain[-1].outputs
        return outs[0].type.shape if outs else ()

    def _label(self, node: Node) -> str:
        return node_label(node, self.names)


def _leaves_cheap(roles: dict[Node, Role]) -> bool:
    """Whether every LEAF's cone of leaves costs at most MAX_RECOMPUTE_OPS per element."""
    cost: dict[Node, int] = {}
    producer = {v: n for n in roles for v in n.outputs}

    def cone_cost(node: Node) -> int:
        if node not in cost:
            ins = (producer.get(v) for v in node.inputs)
            cost[node] = op_cost(node) + sum(cone_cost(p) for p in ins
                                             if p is not None and roles[p] is Role.LEAF)
        return cost[node]

    return all(cone_cost(n) <= MAX_RECOMPUTE_OPS for n, r in roles.items() if r is Role.LEAF)


def _constant_only(live: list[Node], producer: dict[Value, Node]) -> set[Node]:
    """The non-constant nodes whose value depends on constants (and attributes) alone."""
    out: set[Node] = set()
    for node in live:
        if not is_constant(node) and all(
                (p := producer.get(v)) is not None and (is_constant(p) or p in out)
                for v in node.inputs):
            out.add(node)
    return out


def live_nodes(graph: Graph) -> list[Node]:
    """The nodes some graph output depends on, in graph order."""
    producer = graph.producers()
    live: set[Node] = set()
    stack = [producer[v] for v in graph.outputs if v in producer]
    while stack:
        node = stack.pop()
        if node not in live:
            live.add(node)
            stack.extend(producer[v] for v in node.inputs if v in producer)
    return [n for n in graph.nodes if n in live]
