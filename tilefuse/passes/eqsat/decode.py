"""Chosen e-nodes -> graph IR.

Nodes the e-graph did not model are rebuilt in their original order, each reading the extracted
term of its inputs; a term's nodes are emitted when first read (constants too, so a constant a rule
moved is defined before its first reader). Every rebuilt node's type, inferred by the builder, must
equal its e-class's type: a rule that built an ill-typed term fails here, loudly.

Locations: a rebuilt node takes the ``# file:line`` of an original node of its e-class (the node it
replaces); a node of a new e-class (``A @ B`` of re-association) takes its first reader's, so the
dump still points at the user's line.
"""

from __future__ import annotations

from tilefuse.errors import SourceLoc, VerifyError
from tilefuse.graph.builder import GraphBuilder
from tilefuse.graph.ir import Graph, Node, Value
from tilefuse.passes.eqsat.encode import Encoding, is_modelled
from tilefuse.passes.eqsat.extract import EGraphView, ENode

_TO_END = 2**62


class _Decoder:
    def __init__(self, graph: Graph, enc: Encoding, view: EGraphView, choice: dict[str, ENode]):
        self.enc, self.view, self.choice = enc, view, choice
        self.builder = GraphBuilder(graph.name)
        self.values: dict[Value, Value] = {}      # original leaf value -> rebuilt value
        self.built: dict[str, Value] = {}          # e-class -> rebuilt value
        self.producers = graph.producers()
        self.locs: dict[str, SourceLoc] = {}       # e-class -> location of an original node
        for cid, vids in view.refs.items():
            for vid in vids:
                node = self.producers.get(enc.leaves[vid])
                if node is not None and node.loc is not None:
                    self.locs[cid] = node.loc
                    break
        for v in graph.inputs:
            self.values[v] = self.builder.input(v.type, v.name)

    def term(self, cid: str, reader_loc: SourceLoc | None = None) -> Value:
        if cid in self.built:
            return self.built[cid]
        stack = [(cid, self.locs.get(cid, reader_loc))]
        while stack:
            top, loc = stack[-1]
            pending = [c for c in self.choice[top].children if c not in self.built]
            if pending:
                stack.extend((c, self.locs.get(c, loc)) for c in reversed(pending))
                continue
            stack.pop()
            if top not in self.built:
                self.built[top] = self._emit(top, self.choice[top], loc)
        return self.built[cid]

    def _leaf(self, original: Value) -> Value:
        if original not in self.values:
            node = self.producers.get(original)
            if node is None or node.op.name != "constant":
                raise VerifyError(f"eqsat: value {original} is read before it is defined")
            self.builder.append(node)
            self.values[original] = original
        return self.values[original]

    def _emit(self, cid: str, node: ENode, loc: SourceLoc | None) -> Value:
        expected = self.enc.types[self.view.types[cid]]
        if node.op == "leaf":
            return self._leaf(self.enc.leaves[node.params[0]])
        args = [self.built[c] for c in node.children]
        if node.op in ("transpose", "reshape", "cast", "broadcast") and args[0].type == expected \
                and (node.op != "transpose" or self._identity(node.params[0])):
            return args[0]      # an identity the run stopped before removing
        op, attrs = self._op_attrs(node, expected, args)
        value = self.builder.add1(op, args, attrs, loc)
        if value.type != expected:
            raise VerifyError(f"eqsat: {node.op} rebuilt as {value.type}, its e-class has type "
                              f"{expected}", op=op, inputs=tuple(str(a.type) for a in args))
        return value

    def _identity(self, perm_id: int) -> bool:
        perm = self.enc.perms[perm_id]
        return perm == tuple(range(len(perm)))

    def _op_attrs(self, node: ENode, expected, args: list[Value]) -> tuple[object, dict]:
        op = node.op
        if op in ("unary", "binary"):
            opdef, attrs = self.enc.ops[node.params[0]]
            return opdef, dict(attrs)
        if op == "transpose":
            return "transpose", {"perm": list(self.enc.perms[node.params[0]])}
        if op == "reshape":
            return "reshape", {"shape": list(expected.shape)}
        if op == "broadcast":
            return "broadcast_to", {"shape": list(expected.shape)}
        if op == "cast":
            return "cast", {"dtype": expected.dtype}
        if op == "matmul":
            return "matmul", {}
        if op == "concat_last":
            return "concat", {"axis": expected.rank - 1}
        if op == "slice_last":
            rank = args[0].type.rank
            return "slice", {"starts": [0] * (rank - 1) + [node.params[0]],
                             "stops": [_TO_END] * (rank - 1) + [node.params[1]],
                             "steps": [1] * rank}
        raise VerifyError(f"eqsat: no decoding for e-node {op}")

    def rebuild_node(self, node: Node, root_classes: list[str]) -> None:
        if node.op.name == "constant":
            self._leaf(node.outputs[0])             # unless a rule read it earlier
            return
        inputs = tuple(self.term(cid, node.loc) for cid in root_classes)
        new = node if inputs == node.inputs else Node(node.op, inputs, node.attrs,
                                                      node.outputs, node.loc)
        self.builder.append(new)
        for v in node.outputs:
            self.values[v] = v


def decode(graph: Graph, enc: Encoding, view: EGraphView, choice: dict[str, ENode]) -> Graph:
    """The graph the choice describes (inputs, output order and unmodelled nodes as before)."""
    decoder = _Decoder(graph, enc, view, choice)
    root_classes = [view.roots[i] for i in range(len(enc.roots))]
    position = 0
    for node in graph.nodes:
        if is_modelled(node):
            continue
        count = len(node.inputs)
        decoder.rebuild_node(node, root_classes[position:position + count])
        position += count
    outputs = [decoder.term(cid) for cid in root_classes[position:]]
    return decoder.builder.build(outputs)


__all__ = ["decode"]
