"""Extraction: the cheapest e-node of every e-class, by a cost model of bytes moved and FLOPs.

egglog's own extractor calls a Python cost model once per e-node through its expression layer
and extracts one root at a time; we need one consistent choice for many roots and costs that
depend on the type tables, so we extract ourselves from the serialized e-graph
(``EGraph._serialize()``: e-nodes with their e-class and children).

Cost of an e-node (in bytes; one FLOP counts 1/8 of a byte, roughly a CPU's FLOP-per-byte
balance), plus 1 per node so that fewer nodes win ties:

- a leaf, or any e-class computable from constants alone: 0 (folded at compile time);
- reshape: a view / index remap that fusion folds into its reader: 1;
- transpose, slice, concat: read + write of the tensor, a real memory pass (kernel formation
  makes a slice its own movement kernel); broadcast: its write;
- cast, unary, binary: one operation per element (they fuse, so no memory pass);
- matmul: operands and result bytes + 2·M·N·K / 8.

The cost of an e-class is its tree cost (own cost plus its children's). Tree cost counts a shared
value once per reader, which is why the merges of parallel matmuls are decisions (subsumption,
see ``rules_matmul``) rather than cost-model choices.
"""

from __future__ import annotations

import functools
import heapq
import json
import math
from dataclasses import dataclass, field

from tilefuse.graph.types import TensorType
from tilefuse.passes.eqsat.encode import Encoding

FLOP_BYTES = 1 / 8
_SYM_GUESS = 64   # a symbolic dim's size, for costs only


@dataclass(frozen=True)
class ENode:
    """One e-node: constructor name (``leaf``, ``binary``, ...), its primitive arguments in
    order, and its tensor children (e-class ids) in order."""

    op: str
    params: tuple[int | str, ...]
    children: tuple[str, ...]


@dataclass
class EGraphView:
    """The serialized e-graph, reduced to tensor e-classes."""

    classes: dict[str, list[ENode]]
    types: dict[str, int]
    roots: dict[int, str]
    refs: dict[str, list[int]] = field(default_factory=dict)   # e-class -> graph value ids


def read_serialized(serialized_json: str) -> EGraphView:
    data = json.loads(serialized_json)
    nodes = data["nodes"]
    primitive = {nid: n["op"] for nid, n in nodes.items() if nid.startswith("primitive-")}
    class_value = {nodes[nid]["eclass"]: op for nid, op in primitive.items()}
    classes: dict[str, list[ENode]] = {}
    types: dict[str, int] = {}
    roots: dict[int, str] = {}
    refs: dict[str, list[int]] = {}
    for node in nodes.values():
        op = node["op"]
        if op.startswith("Term.") and not node.get("subsumed", False):
            params, kids = [], []
            for child in node["children"]:
                if child in primitive:
                    params.append(_primitive(primitive[child]))
                else:
                    kids.append(nodes[child]["eclass"])
            classes.setdefault(node["eclass"], []).append(
                ENode(op[5:], tuple(params), tuple(kids)))
        elif op == "ty":
            types[nodes[node["children"][0]]["eclass"]] = int(class_value[node["eclass"]])
        elif op == "root":
            roots[int(primitive[node["children"][0]])] = node["eclass"]
        elif op == "ref":
            refs.setdefault(node["eclass"], []).append(int(primitive[node["children"][0]]))
    return EGraphView(classes, types, roots, refs)


def _primitive(text: str) -> int | str:
    return json.loads(text) if text.startswith('"') else int(text)


@functools.lru_cache(maxsize=4096)
def _numel(t: TensorType) -> int:
    return math.prod(d if isinstance(d, int) else _SYM_GUESS for d in t.shape)


def _bytes(t: TensorType) -> int:
    return _numel(t) * t.dtype.itemsize


def node_cost(node: ENode, out: TensorType, child_types: list[TensorType]) -> float:
    """The cost of ``node`` alone (see the module docstring)."""
    op = node.op
    if op == "leaf":
        return 0.0
    if op == "reshape":
        return 1.0
    if op in ("transpose", "slice_last", "concat_last"):
        return 1.0 + 2 * _bytes(out)
    if op == "broadcast":
        return 1.0 + _bytes(out)
    if op == "matmul":
        k = child_types[0].shape[-1] if child_types[0].rank else 1
        k = k if isinstance(k, int) else _SYM_GUESS
        moved = sum(_bytes(t) for t in child_types) + _bytes(out)
        return 1.0 + moved + 2 * _numel(out) * k * FLOP_BYTES
    return 1.0 + _numel(out)


def constant_classes(view: EGraphView, enc: Encoding) -> set[str]:
    """E-classes computable from constant leaves alone."""
    constant: set[str] = set()
    changed = True
    while changed:
        changed = False
        for cid, nodes in view.classes.items():
            if cid in constant:
                continue
            for node in nodes:
                if (node.op == "leaf" and node.params[0] in enc.constant_leaves) or \
                        (node.op != "leaf" and node.children and \
                        all(c in constant for c in node.children)):
                    constant.add(cid)
                    changed = True
                    break
    return constant


def choose(view: EGraphView, enc: Encoding) -> dict[str, ENode]:
    """The cheapest e-node per e-class by tree cost, with Knuth's generalisation of Dijkstra:
    an e-node's cost is at least each of its children's, so e-classes can be settled in order
    of cost, each once. Each e-node is priced once all its children are settled; the choice is
    acyclic because a node is only ever priced from already-settled children."""
    constant = constant_classes(view, enc)
    readers: dict[str, list[tuple[str, ENode]]] = {}
    waiting: dict[tuple[str, ENode], int] = {}
    heap: list[tuple[float, int, str, ENode]] = []
    order = 0
    for cid, nodes in view.classes.items():
        out = enc.types[view.types[cid]]
        for node in nodes:
            kids = set(node.children)
            waiting[cid, node] = len(kids)
            for child in kids:
                readers.setdefault(child, []).append((cid, node))
            if not kids:
                heapq.heappush(heap, (_own(node, cid, out, constant, view, enc), order, cid, node))
                order += 1
    cost: dict[str, float] = {}
    choice: dict[str, ENode] = {}
    while heap:
        total, _, cid, node = heapq.heappop(heap)
        if cid in cost:
            continue
        cost[cid], choice[cid] = total, node
        for reader, reader_node in readers.get(cid, ()):
            waiting[reader, reader_node] -= 1
            if waiting[reader, reader_node] == 0 and reader not in cost:
                out = enc.types[view.types[reader]]
                price = _own(reader_node, reader, out, constant, view, enc) + sum(
                    cost[c] for c in reader_node.children)
                heapq.heappush(heap, (price, order, reader, reader_node))
                order += 1
    return choice


def _own(node: ENode, cid: str, out: TensorType, constant: set[str], view: EGraphView,
         enc: Encoding) -> float:
    if cid in constant:
        return 0.0
    return node_cost(node, out, [enc.types[view.types[c]] for c in node.children])


__all__ = ["EGraphView", "ENode", "choose", "node_cost", "read_serialized"]
