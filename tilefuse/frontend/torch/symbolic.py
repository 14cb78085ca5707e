"""Dynamo's symbolic sizes as tilefuse symbols: ``torch.compile(dynamic=True)`` / ``mark_dynamic``.

When Dynamo makes a graph dynamic, its placeholders' example values are fake tensors whose
sizes are ``SymInt``s of Dynamo's shape environment (``s33``), and the sizes themselves arrive
as ``SymInt`` placeholders. :func:`trace_symbolic` re-traces such a graph once to core ATen on
those very fakes (``make_fx(tracing_mode="symbolic")`` under dispatcher functionalisation, so
in-place ops become functional and no size is specialised), and :func:`sym_dim` maps each size
to a tilefuse dim: an integer stays one, a plain symbol ``s33`` becomes ``Sym("s33")``. A
compound size (``s33*s50``, the flattened rows of a 3-D ``linear``) has no graph-IR form; the
common source of them, ``view → mm/addmm → view`` around a linear layer, is folded back into one
broadcasting ``matmul`` on the unflattened operand by :func:`unflatten_matmuls`; a node that
still has one runs in torch (logged on ``fallback``), the rest stays one symbolic build.
"""

from __future__ import annotations

from typing import Any

import sympy
import torch
from torch import fx
from torch._decomp import core_aten_decompositions
from torch._subclasses.functional_tensor import FunctionalTensorMode, dispatch_functionalize
from torch.fx.experimental.proxy_tensor import make_fx

from tilefuse.graph.types import Dim, Sym

aten = torch.ops.aten
_VIEWS = (aten.view.default, aten._unsafe_view.default, aten.reshape.default)
_DECOMPOSITIONS = core_aten_decompositions()


class CompoundSize(TypeError):
    """A size that is an expression of symbols (``s0*s1``), which the graph IR cannot hold."""


def expr(d: Any) -> Any:
    """The sympy expression (or int) of a size, without evaluating (so without guarding) it."""
    return d.node.expr if isinstance(d, torch.SymInt) else d


def sym_dim(d: Any) -> Dim:
    """A torch size as a tilefuse dim; CompoundSize for an expression of symbols."""
    e = expr(d)
    if isinstance(e, (int, sympy.Integer)):
        return int(e)
    if isinstance(e, sympy.Symbol):
        return Sym(str(e))
    raise CompoundSize(f"size {e} is an expression of symbols")


def is_symbolic_graph(gm: fx.GraphModule) -> bool:
    """Whether Dynamo gave ``gm`` symbolic sizes (a SymInt placeholder or dim)."""
    for node in gm.graph.nodes:
        if node.op != "placeholder":
            continue
        val = node.meta.get("example_value")
        if isinstance(val, torch.SymInt) and not isinstance(expr(val), sympy.Integer):
            return True
        if isinstance(val, torch.Tensor) and any(
                not isinstance(expr(d), (int, sympy.Integer)) for d in val.shape):
            return True
    return False


def trace_symbolic(gm: fx.GraphModule) -> fx.GraphModule:
    """``gm`` traced once into a functional core-ATen FX graph on Dynamo's symbolic fakes (its
    placeholders are gm's in order, sizes as SymInt placeholders), with matmuls unflattened."""
    fakes = [n.meta["example_value"] for n in gm.graph.nodes if n.op == "placeholder"]
    functional = dispatch_functionalize(gm, FunctionalTensorMode())
    with torch.no_grad():
        traced = make_fx(functional, decomposition_table=_DECOMPOSITIONS,
                         tracing_mode="symbolic")(*fakes)
    unflatten_matmuls(traced)
    traced.graph.eliminate_dead_code()
    traced.recompile()
    return traced


def _shape(node: Any) -> tuple[Any, ...] | None:
    val = node.meta.get("val") if isinstance(node, fx.Node) else None
    return tuple(expr(d) for d in val.shape) if isinstance(val, torch.Tensor) else None


def _unflattened(node: fx.Node) -> fx.Node | None:
    """The view-chain ancestor ``[*B, K]`` of a ``[prod(B), K]`` matmul operand."""
    shape = _shape(node)
    if shape is None or len(shape) != 2:
        return None
    source = node
    while isinstance(source, fx.Node) and source.target in _VIEWS:
        source = source.args[0]
        have = _shape(source)
        if have is not None and len(have) > 2 and have[-1] == shape[1] \
                and sympy.simplify(sympy.Mul(*have[:-1]) - shape[0]) == 0:
            return source
    return None


def _new_node(graph: fx.Graph, before: fx.Node, target: Any, args: tuple[Any, ...],
              val: torch.Tensor) -> fx.Node:
    with graph.inserting_before(before):
        node = graph.call_function(target, args)
    node.meta["val"] = val
    return node


def unflatten_matmuls(gm: fx.GraphModule) -> int:
    """``mm(view(x, [a*b, K]), w)`` (and ``addmm`` with unit alpha and beta) becomes
    ``view(matmul(x, w) [+ bias], [a*b, N])``, and chains of views collapse, so a linear layer
    on ``[a, b, K]`` is one matmul with symbolic dims. Returns how many were rewritten."""
    graph, rewritten = gm.graph, 0
    for node in list(graph.nodes):
        if node.target not in (aten.mm.default, aten.addmm.default) or node.kwargs:
            continue
        a, w = node.args[-2:]
        source = _unflattened(a)
        if source is None:
            continue
        flat, n = node.meta["val"], expr(node.meta["val"].shape[1])
        if not isinstance(n, (int, sympy.Integer)):
            continue
        x_val = source.meta["val"]
        val = x_val.new_empty((*x_val.shape[:-1], flat.shape[1]))   # a fake of its own mode
        out = _new_node(graph, node, aten.matmul.default, (source, w), val)
        if node.target is aten.addmm.default:
            out = _new_node(graph, node, aten.add.Tensor, (out, node.args[0]), val)
        rows = a.args[1][:-1]   # the flattened row count, as a's view computed it (an fx node)
        back = _new_node(graph, node, aten.view.default, (out, [*rows, int(n)]), flat)
        node.replace_all_uses_with(back)
        graph.erase_node(node)
        rewritten += 1
    if rewritten:
        _collapse_views(graph)
    return rewritten


def _collapse_views(graph: fx.Graph) -> None:
    """view(view(x, s1), s2) → view(x, s2); a view to its input's own shape → its input."""
    for node in list(graph.nodes):
        if node.target not in _VIEWS:
            continue
        inner = node.args[0]
        while isinstance(inner, fx.Node) and inner.target in _VIEWS:
            inner = inner.args[0]
        if _shape(inner) == _shape(node):
            node.replace_all_uses_with(inner)
            graph.erase_node(node)
        elif inner is not node.args[0]:
            node.args = (inner, *node.args[1:])


__all__ = ["CompoundSize", "expr", "is_symbolic_graph", "sym_dim", "trace_symbolic",
           "unflatten_matmuls"]
