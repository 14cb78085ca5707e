"""Tracing one call of a Python function into a graph.

The traced arguments become graph inputs (positional ones first, then keywords by name), static
ones are passed through unchanged. The function's result (an array, or a tuple/list of arrays,
nested as it likes) becomes the graph's outputs plus a *packer* that rebuilds the same structure
from the executable's output list.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from tilefuse.errors import SourceLoc, TraceError
from tilefuse.frontend.arguments import ArgumentNames, KeyPart, is_array_part, tensor_type
from tilefuse.frontend.tracer import TraceContext, Tracer, intercepting_print
from tilefuse.graph.builder import GraphBuilder
from tilefuse.graph.ir import Graph

Packer = Callable[[list[np.ndarray]], Any]


@dataclass(frozen=True)
class Captured:
    """A traced call: the graph, which arguments feed its inputs, and the result packer."""

    graph: Graph
    positions: tuple[int, ...]   # positional arguments that are graph inputs, in input order
    keywords: tuple[str, ...]    # keyword arguments that are graph inputs, after the positions
    pack: Packer


def graph_name(fn: Callable[..., Any]) -> str:
    """A graph name made from the function's name (``<lambda>`` becomes ``_lambda_``)."""
    name = re.sub(r"\W", "_", getattr(fn, "__name__", "") or "main")
    return name if not name[0].isdigit() else f"_{name}"


def capture(fn: Callable[..., Any], names: ArgumentNames, args: tuple[Any, ...],
            kwargs: dict[str, Any], arg_parts: tuple[KeyPart, ...],
            kw_parts: tuple[tuple[str, KeyPart], ...], *, fullgraph: bool = True) -> Captured:
    """Traces ``fn(*args, **kwargs)``; the key parts say which arguments are traced. Without
    ``fullgraph``, ``repr()`` and any ``print`` of the function raise GraphBreakError too (the
    caller then traces in pieces, see :mod:`tilefuse.frontend.graph_breaks`)."""
    ctx = TraceContext(GraphBuilder(graph_name(fn)), getattr(fn, "__name__", repr(fn)),
                       fullgraph=fullgraph)
    traced_args = list(args)
    positions = []
    for i, part in enumerate(arg_parts):
        if is_array_part(part):
            traced_args[i] = ctx.input(tensor_type(part, names.label(i)), names.name(i))
            positions.append(i)
    traced_kwargs = dict(kwargs)
    keywords = []
    for key, part in kw_parts:
        if is_array_part(part):
            traced_kwargs[key] = ctx.input(tensor_type(part, names.label(key)), key)
            keywords.append(key)
    try:
        with intercepting_print(ctx):
            result = fn(*traced_args, **traced_kwargs)
        outputs: list[Tracer] = []
        pack = flatten(ctx, result, outputs, definition(fn))
    finally:
        ctx.active = False
    graph = ctx.builder.build([t.value for t in outputs])
    return Captured(graph, tuple(positions), tuple(keywords), pack)


def definition(fn: Callable[..., Any]) -> SourceLoc | None:
    """Where ``fn`` is defined (for errors about what it returned)."""
    code = getattr(fn, "__code__", None)
    return None if code is None else SourceLoc(code.co_filename, code.co_firstlineno,
                                                code.co_name)


def flatten(ctx: TraceContext, result: Any, outputs: list[Tracer],
             loc: SourceLoc | None) -> Packer:
    """Appends the result's arrays to ``outputs``; returns the packer for its structure."""
    if isinstance(result, (Tracer, np.ndarray, np.generic)):
        index = len(outputs)
        if isinstance(result, Tracer):
            ctx.check(result)
            outputs.append(result)
        else:  # an array that does not depend on the inputs: a constant output
            outputs.append(ctx.constant(np.asarray(result)))
        return lambda outs: outs[index]
    if isinstance(result, (tuple, list)):
        packers = [flatten(ctx, item, outputs, loc) for item in result]
        if hasattr(result, "_fields"):  # a namedtuple
            kind = type(result)
            return lambda outs: kind(*(p(outs) for p in packers))
        container: Callable[..., Any] = list if isinstance(result, list) else tuple
        return lambda outs: container([p(outs) for p in packers])
    raise TraceError(f"{ctx.function} returned a value of type {type(result).__name__}; a jitted "
                     "function must return an array or a tuple or list of arrays", loc=loc)
