"""Graphs that update state in place: compiled optimizer steps (``torch.compile(opt.step)``).

Dynamo gives an optimizer step as a graph whose parameters and optimizer state (``exp_avg``,
``step``...) are module attributes (``get_attr`` nodes) updated in place (``mul_``, ``lerp_``,
``addcdiv_``). :func:`compile_stateful` lifts those attributes to runtime inputs (they change at
every step, so nothing is frozen) and compiles the graph like any other
(:class:`~tilefuse.frontend.torch.backend.SpecializedGraph`): ``functionalize`` turns the
in-place updates into pure ops plus one ``copy_`` write-back per updated tensor, so the
arithmetic of every parameter of a group becomes one tilefuse graph (fused elementwise kernels:
one per parameter, computing the new parameter and moments together). The write-backs are then
removed where :mod:`~tilefuse.frontend.torch.inplace` proves it safe: the kernels write the new
state straight into the parameter and state tensors, so a step is one pass over the state
(``write_backs.txt`` in the dump says how many copies are left; those run in torch, which is
not a fallback: nothing is computed there).
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import fx

_IN_PLACE_OPERATORS = {operator.iadd, operator.isub, operator.imul, operator.itruediv}


def _target_name(node: fx.Node) -> str:
    target = node.target
    if isinstance(target, str):
        return target
    return getattr(target, "__name__", "") or str(target)


def _updates_in_place(node: fx.Node) -> bool:
    if node.op == "call_function" and node.target in _IN_PLACE_OPERATORS:
        return True
    if node.op not in ("call_method", "call_function"):
        return False
    name = _target_name(node).split(".")[0]
    return name.endswith("_") and not name.startswith("_")


def _attribute(gm: fx.GraphModule, target: str) -> Any:
    value: Any = gm
    for part in target.split("."):
        value = getattr(value, part)
    return value


def stateful_attributes(gm: fx.GraphModule) -> list[fx.Node]:
    """The tensor ``get_attr`` nodes of a graph that updates some tensor in place (empty when
    the graph is not such a graph)."""
    attrs = [n for n in gm.graph.nodes if n.op == "get_attr"
             and isinstance(_attribute(gm, str(n.target)), torch.Tensor)]
    if not attrs or not any(_updates_in_place(n) for n in gm.graph.nodes):
        return []
    return attrs


def _expand_fma(graph: fx.Graph) -> None:
    """``prims.fma(a, b, c)`` (Dynamo's form of ``addcmul_``; the op is registered only once
    Inductor's prims are imported, so no converter can name it) as ``a * b + c``."""
    for node in list(graph.nodes):
        if node.op == "call_function" and str(node.target) == "prims.fma.default":
            a, b, c = node.args
            with graph.inserting_before(node):
                product = graph.call_function(torch.mul, (a, b))
                total = graph.call_function(torch.add, (product, c))
            node.replace_all_uses_with(total)
            graph.erase_node(node)


def compile_stateful(gm: fx.GraphModule, attrs: Sequence[fx.Node], options: Any
                     ) -> Callable[..., Any]:
    """``gm`` with the tensors of ``attrs`` as trailing runtime inputs, compiled; the result
    takes Dynamo's inputs and passes the (live) attribute tensors itself."""
    from tilefuse.frontend.torch.inplace import StepGraph

    tensors = [_attribute(gm, str(n.target)) for n in attrs]
    graph = fx.Graph()   # a copy: Dynamo still owns gm's graph
    copies: dict[fx.Node, fx.Node] = {}
    out = graph.graph_copy(gm.graph, copies)
    graph.output(out)
    attrs = [copies[n] for n in attrs]
    _expand_fma(graph)
    last = [n for n in graph.nodes if n.op == "placeholder"]
    anchor = last[-1] if last else None
    for i, node in enumerate(attrs):
        if anchor is None:
            with graph.inserting_before(next(iter(graph.nodes))):
                new = graph.placeholder(f"state_{i}")
        else:
            with graph.inserting_after(anchor):
                new = graph.placeholder(f"state_{i}")
        anchor = new
        new.meta.update(node.meta)
        node.replace_all_uses_with(new)
        graph.erase_node(node)
    graph.lint()
    lifted = fx.GraphModule(gm, graph)
    compiled = StepGraph(lifted, {}, options)

    def step(*args: Any) -> Any:
        with torch.no_grad():  # the write-backs update leaves that require grad
            return compiled(*args, *tensors)

    step.graph = compiled  # type: ignore[attr-defined]
    return step


__all__ = ["compile_stateful", "stateful_attributes"]
