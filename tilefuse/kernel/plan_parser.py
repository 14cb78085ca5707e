"""The kernel plan's text (``kernels.plan``, :mod:`tilefuse.kernel.plan_printer`) back to a
:class:`~tilefuse.kernel.fusion.KernelPlan`.

A plan names the values and nodes of its graph (``%x``, ``%3``) rather than repeating them, so
it parses against that graph: the decomposed graph the plan was formed on (``plan.graph``, which
the graph dump and :func:`tilefuse.graph.parser.parse_graph` carry). Every kernel's header,
inputs, node lines (role, and the node exactly as the graph prints it) and outputs are checked
against the graph; the summary lines on top are recomputed by the printer, not read.
``print_plan(parse_plan(print_plan(plan), plan.graph)) == print_plan(plan)``.

A text that does not match the graph, or is malformed, is a
:class:`~tilefuse.errors.ParseError` naming the line.
"""

from __future__ import annotations

import re

from tilefuse.errors import ParseError
from tilefuse.graph.ir import Graph, Node, Value
from tilefuse.graph.printer import format_type
from tilefuse.graph.types import Sym
from tilefuse.kernel.plan import KernelGroup, KernelKind, KernelPlan, Role
from tilefuse.kernel.plan_printer import format_node, value_names

_HEAD = re.compile(r"(?P<name>\S+) (?P<kind>\w+) over \[(?P<domain>[^\]]*)\]"
                   r"(?:, anchor (?P<anchor>%.+))?")
_NODE = re.compile(r"  (?P<role>[\w-]+) +(?P<node>.*?)(?:  \(recomputed, also in [^)]*\))?")
_KINDS = {k.value: k for k in KernelKind}
_ROLES = {r.value: r for r in Role}


class _Context:
    def __init__(self, graph: Graph):
        self.graph = graph
        self.names = value_names(graph)
        self.values = {name: v for v, name in self.names.items()}
        self.nodes: dict[str, Node] = {}
        for node in graph.nodes:
            self.nodes.setdefault(format_node(node, self.names), node)
        self.symbols = {d.name: d for v in self.names for d in v.shape if isinstance(d, Sym)}


def _fail(number: int, line: str, message: str) -> ParseError:
    return ParseError(f"kernel plan line {number}: {message}: {line.strip()!r}")


def _typed(ctx: _Context, text: str, number: int, line: str) -> tuple[Value, ...]:
    """``%x: f32[4,8], %3: f32[8]`` (or ``-``) as the graph's values."""
    if text == "-":
        return ()
    found = []
    for part in re.split(r", (?=%)", text):
        name, _, type_text = part.partition(": ")
        value = ctx.values.get(name)
        if value is None:
            raise _fail(number, line, f"no value {name} in graph @{ctx.graph.name}")
        if format_type(value.type) != type_text:
            raise _fail(number, line, f"{name} is {format_type(value.type)} in the graph, "
                                      f"not {type_text}")
        found.append(value)
    return tuple(found)


def _domain(ctx: _Context, text: str, number: int, line: str) -> tuple[int | Sym, ...]:
    dims: list[int | Sym] = []
    for part in filter(None, text.split(",")):
        if part.isdigit():
            dims.append(int(part))
        elif part in ctx.symbols:
            dims.append(ctx.symbols[part])
        else:
            raise _fail(number, line, f"domain dim {part!r} is neither a size nor a symbol "
                                      "of the graph")
    return tuple(dims)


def _kernel(ctx: _Context, lines: list[tuple[int, str]]) -> KernelGroup:
    number, head = lines[0]
    match = _HEAD.fullmatch(head)
    if match is None or match["kind"] not in _KINDS:
        raise _fail(number, head, "expected 'NAME KIND over [DOMAIN][, anchor %N]'")
    if len(lines) < 3 or not lines[1][1].startswith("  in:  ") \
            or not lines[-1][1].startswith("  out: "):
        raise _fail(number, head, "a kernel is its header, '  in:  ...', node lines and "
                                  "'  out: ...'")
    inputs = _typed(ctx, lines[1][1][len("  in:  "):], *lines[1])
    outputs = _typed(ctx, lines[-1][1][len("  out: "):], *lines[-1])
    nodes: list[Node] = []
    roles: list[str] = []
    for n, line in lines[2:-1]:
        found = _NODE.fullmatch(line)
        if found is None or (found["role"] != "-" and found["role"] not in _ROLES):
            raise _fail(n, line, "expected '  ROLE  %N = op(...) : type'")
        node = ctx.nodes.get(found["node"])
        if node is None:
            raise _fail(n, line, f"no such node in graph @{ctx.graph.name}")
        nodes.append(node)
        roles.append(found["role"])
    if "-" in roles and set(roles) != {"-"}:
        raise _fail(number, head, "either every node of a kernel has a role or none has")
    anchor = None
    if match["anchor"] is not None:
        value = ctx.values.get(match["anchor"].split(", ")[0])
        anchor = next((nd for nd in nodes if value is not None and value in nd.outputs), None)
        if anchor is None:
            raise _fail(number, head, f"anchor {match['anchor']} is no node of this kernel")
    return KernelGroup(match["name"], _KINDS[match["kind"]], tuple(nodes), inputs, outputs,
                       anchor, _domain(ctx, match["domain"], number, head),
                       () if roles and roles[0] == "-" else tuple(_ROLES[r] for r in roles))


def parse_plan(text: str, graph: Graph) -> KernelPlan:
    """The plan ``text`` (the printer's format) describes, over ``graph``."""
    if not isinstance(text, str):
        raise ParseError(f"kernel plan text must be a str, got {type(text).__name__}")
    lines = list(enumerate(text.splitlines(), 1))
    if not lines or not lines[0][1].startswith("plan @"):
        raise ParseError("kernel plan line 1: expected 'plan @NAME: ...'")
    name = lines[0][1][len("plan @"):].split(":", 1)[0]
    if name != graph.name:
        raise _fail(1, lines[0][1], f"the plan is of @{name}, the graph is @{graph.name}")
    ctx = _Context(graph)
    blocks: list[list[tuple[int, str]]] = []
    for number, line in lines[1:]:
        if not line.strip():
            blocks.append([])
        elif blocks:
            blocks[-1].append((number, line))
        elif not line.startswith("  "):
            raise _fail(number, line, "expected a summary line or a blank line")
    return KernelPlan(graph, tuple(_kernel(ctx, b) for b in blocks if b))


__all__ = ["parse_plan"]
