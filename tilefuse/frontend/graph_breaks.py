"""Graph breaks: a jitted function that needs a traced value in Python runs as a sequence of
compiled regions.

A *break* is a point where tracing cannot go on without a value: ``bool()``, ``int()``,
``float()``, ``.item()``, ``.tolist()``, ``str()``/``repr()``/``format()`` or NumPy conversion of
a traced array (a *guard*: Python goes on with the value, and later calls must see the same one),
``print`` (its arguments are shown, nothing is decided), or a NumPy function without a rule (a
*host call*: NumPy runs it on the values, its results are inputs of what follows).

At a break the region traced so far is compiled and run. Its outputs are the values the break
needs and every traced array still alive in Python (CPython frees the others at once, so the
weak references the trace keeps tell which ones later code can still use). Those live arrays
become inputs of the next region (constants are recorded again instead). The cached program of
one argument signature is a tree of regions: a guard's children are keyed by the value it saw.

A later call *replays* the tree without running the Python function: region, plain prints of
that region, the break (print again, run the host call, or compute the guard's value and pick
the child), next region. A value no child was traced for (a failed guard, logged on
``guards``) traces the function again from the start; the regions before that point are found
in the tree (same graph) and are not compiled again, and the prints replay already showed are
not shown twice.

Semantics: NumPy's. Prints happen at every call, in order. Other Python side effects of the
function (appending to a list, a counter) happen only while it is traced: replay does not run
Python code. Breaks are logged on ``graph_breaks`` with the user's file:line and reason; a host
call also logs a WARNING once per function and callable (work leaving tilefuse).
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tilefuse.dtypes import from_numpy
from tilefuse.errors import SourceLoc, TraceError
from tilefuse.frontend.arguments import ArgumentNames, KeyPart, is_array_part, tensor_type
from tilefuse.frontend.capture import Packer, definition, flatten, graph_name
from tilefuse.frontend.source import user_loc
from tilefuse.frontend.tracer import (
    TraceContext,
    Tracer,
    intercepting_print,
    real_print,
)
from tilefuse.graph.builder import GraphBuilder
from tilefuse.graph.ir import Graph, Value
from tilefuse.graph.printer import print_graph
from tilefuse.graph.types import TensorType
from tilefuse.log import get_logger

Source = tuple[str, int]
"""Where a value comes from during replay: ``("in", j)`` the region's input j, ``("out", i)``
its output i, ``("host", i)`` result i of the break's host call, ``("const", i)`` a constant
recorded by the region."""

CompileRegion = Callable[[Graph, int], tuple[Graph, Any, Any]]
"""(captured graph, region number) -> (optimised graph, pass report, executable)."""

_log = get_logger("graph_breaks")
_guard_log = get_logger("guards")
_warned: set[tuple[str, str]] = set()
_warned_lock = threading.Lock()


class _Slot:
    """A placeholder for break value ``index`` inside recorded call arguments."""

    __slots__ = ("index",)

    def __init__(self, index: int):
        self.index = index


@dataclass
class Break:
    """What ends a region: ``kind`` is ``guard``, ``print`` or ``host``."""

    kind: str
    what: str                       # "bool()", "print", "np.linalg.svd", ...
    loc: SourceLoc | None
    sources: list[Source]           # the values it reads, in slot order
    convert: Callable[[Any], Any] | None = None       # guard: value -> what Python saw
    call: Callable[..., Any] | None = None            # host: the NumPy callable
    args: tuple[Any, ...] = ()      # print / host: arguments with _Slot placeholders
    kwargs: dict[str, Any] = field(default_factory=dict)
    seen: list[str] = field(default_factory=list)     # guard: the values seen, as shown

    def describe(self) -> str:
        where = f" at {self.loc}" if self.loc else ""
        kind = {"guard": "guard on ", "host": "NumPy runs "}.get(self.kind, "")
        return f"{kind}{self.what}{where}"


@dataclass
class Region:
    """One compiled region of a program: its graphs and executable, the plain prints that ran
    in it, and what follows (a break and the region after it, or the function's result)."""

    number: int
    captured: Graph
    optimized: Graph | None
    report: Any
    executable: Any                 # None when the region computes nothing
    constants: list[np.ndarray]
    effects: list[tuple[tuple[Any, ...], dict[str, Any]]] = field(default_factory=list)
    brk: Break | None = None
    carry: list[Source] = field(default_factory=list)
    children: dict[object, Region] = field(default_factory=dict)
    result: list[Source] | None = None
    pack: Packer | None = None

    def run(self, inputs: list[np.ndarray]) -> list[np.ndarray]:
        return [] if self.executable is None else self.executable.run_trusted(inputs)


def _outcome_key(value: Any) -> object:
    """A hashable key for what a guard saw (nan equals nan, -0.0 differs from 0.0)."""
    if isinstance(value, np.ndarray):
        return ("array", value.dtype.str, value.shape, value.tobytes())
    if isinstance(value, (list, tuple)):
        return (type(value).__name__, tuple(_outcome_key(v) for v in value))
    if isinstance(value, float):
        return ("float", repr(value))
    return (type(value).__name__, value)


def _as_numpy(array: np.ndarray) -> Any:
    """What NumPy would hand Python: a 0-d result is a NumPy scalar (``x.sum()``)."""
    return array[()] if isinstance(array, np.ndarray) and array.ndim == 0 else array


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _substitute(obj: Any, values: list[Any]) -> Any:
    if isinstance(obj, _Slot):
        return values[obj.index]
    if isinstance(obj, (list, tuple)) and any(isinstance(v, _Slot) for v in obj):
        return type(obj)(values[v.index] if isinstance(v, _Slot) else v for v in obj)
    return obj


def _value(src: Source, outs: list[np.ndarray], inputs: list[np.ndarray], node: Region,
           host: list[np.ndarray] | None = None) -> np.ndarray:
    kind, i = src
    if kind == "out":
        return outs[i]
    if kind == "in":
        return inputs[i]
    if kind == "const":
        return node.constants[i]
    assert host is not None
    return host[i]


class Program:
    """The regions of one argument signature, replayed by :meth:`run`."""

    def __init__(self, name: str, positions: tuple[int, ...], keywords: tuple[str, ...],
                 retrace: Callable[[Program, tuple[Any, ...], dict[str, Any], int], Any]):
        self.name = name
        self.positions = positions
        self.keywords = keywords
        self.root: Region | None = None
        self.regions = 0            # regions compiled so far (numbers them)
        self.retraces = 0
        self._retrace = retrace
        self._pending: tuple[int, Any] | None = None
        self.built: dict[str, tuple[Graph | None, Any, Any]] = {}
        """Compiled regions by graph text: a region that recurs at another point of the tree
        (a loop body, code after an if/else) is compiled once."""

    def hand_over(self, result: Any) -> None:
        """The result of the call that traced: its next :meth:`run` in this thread returns it
        (that call's prints and host calls already happened while tracing)."""
        self._pending = (threading.get_ident(), result)

    # the attributes of a plain cache entry, for lower() and cache_info()
    @property
    def captured(self) -> Graph:
        assert self.root is not None
        return self.root.captured

    @property
    def optimized(self) -> Graph | None:
        return None if self.root is None else self.root.optimized

    @property
    def report(self) -> Any:
        return None if self.root is None else self.root.report

    @property
    def executable(self) -> Any:
        return None if self.root is None else self.root.executable

    def arrays(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[np.ndarray]:
        arrays = [np.ascontiguousarray(args[i]) for i in self.positions]
        return arrays + [np.ascontiguousarray(kwargs[k]) for k in self.keywords]

    def run(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """Replays the regions; a guard value no region was traced for traces again."""
        pending = self._pending
        if pending is not None and pending[0] == threading.get_ident():
            self._pending = None
            return pending[1]
        inputs = self.arrays(args, kwargs)
        node = self.root
        printed = 0
        while node is not None:
            outs = node.run(inputs)
            for effect_args, effect_kwargs in node.effects:
                real_print(*effect_args, **effect_kwargs)
                printed += 1
            if node.result is not None:
                assert node.pack is not None
                return node.pack([_value(s, outs, inputs, node) for s in node.result])
            brk = node.brk
            assert brk is not None
            values = [_value(s, outs, inputs, node) for s in brk.sources]
            host: list[np.ndarray] = []
            if brk.kind == "guard":
                assert brk.convert is not None
                seen = brk.convert(_as_numpy(values[0]))
                child = node.children.get(_outcome_key(seen))
                if child is None:
                    _guard_log.debug("%s: %s saw %s (traced for: %s); tracing again from "
                                     "there", self.name, brk.describe(), _shown(seen),
                                     ", ".join(brk.seen))
                    return self._retrace(self, args, kwargs, printed)
            elif brk.kind == "print":
                shown = [_as_numpy(v) for v in values]
                real_print(*_substitute(brk.args, shown),
                           **{k: _substitute(v, shown) for k, v in brk.kwargs.items()})
                printed += 1
                child = node.children.get(None)
            else:
                assert brk.call is not None
                result = brk.call(*[_substitute(a, values) for a in brk.args],
                                  **{k: _substitute(v, values) for k, v in brk.kwargs.items()})
                host = [np.ascontiguousarray(a) for a in _host_arrays(result)]
                child = node.children.get(None)
            if child is None:   # a trace that stopped there (an exception): trace again
                return self._retrace(self, args, kwargs, printed)
            inputs = [_value(s, outs, inputs, node, host) for s in node.carry]
            node = child
        return self._retrace(self, args, kwargs, printed)

    # ---- introspection ---------------------------------------------------------------------

    def walk(self) -> Iterator[tuple[int, object, Region]]:
        """(depth, key it was reached by, region), depth first."""
        stack: list[tuple[int, object, Region]] = [] if self.root is None else \
            [(0, None, self.root)]
        while stack:
            depth, key, node = stack.pop()
            yield depth, key, node
            for child_key, child in reversed(list(node.children.items())):
                stack.append((depth + 1, child_key, child))

    def counts(self) -> tuple[int, int, int]:
        """Regions, breaks and guards in the tree."""
        regions = breaks = guards = 0
        for _, _, node in self.walk():
            regions += 1
            if node.brk is not None:
                breaks += 1
                guards += node.brk.kind == "guard"
        return regions, breaks, guards

    def explain(self) -> str:
        lines = []
        for depth, _, node in self.walk():
            pad = "  " * depth
            nodes = 0 if node.optimized is None else len(node.optimized.nodes)
            lines.append(f"{pad}region {node.number}: {len(node.captured.nodes)} nodes traced, "
                         f"{nodes} after the passes"
                         + (f", {len(node.effects)} print(s) replayed" if node.effects else ""))
            if node.brk is not None:
                lines.append(f"{pad}  break: {node.brk.describe()}")
                if node.brk.kind == "guard":
                    lines.append(f"{pad}  guard on the value, traced for: "
                                 f"{', '.join(node.brk.seen)}")
            elif node.result is not None:
                lines.append(f"{pad}  returns {len(node.result)} array(s)")
        return "\n".join(lines)


def _host_arrays(result: Any) -> list[np.ndarray]:
    """The arrays of a host call's result (an array, a scalar, or tuples/lists of those)."""
    if isinstance(result, (np.ndarray, np.generic)):
        return [np.asarray(result)]
    if isinstance(result, (bool, int, float)):
        return [np.asarray(result)]
    if isinstance(result, (tuple, list)):
        return [a for item in result for a in _host_arrays(item)]
    raise TraceError(f"a NumPy function without a tilefuse rule returned a "
                     f"{type(result).__name__}; only arrays, scalars and tuples of them can go "
                     "on in a traced function", loc=user_loc())


def _rebuild(result: Any, tracers: Iterator[Tracer]) -> Any:
    """``result`` with each array replaced by the next tracer (same structure)."""
    if isinstance(result, (np.ndarray, np.generic, bool, int, float)):
        return next(tracers)
    if hasattr(result, "_fields"):
        return type(result)(*(_rebuild(r, tracers) for r in result))
    return type(result)(_rebuild(r, tracers) for r in result)


class BreakingTrace:
    """The trace of one call in pieces: ``ctx.breaks`` while the function runs. Walks the
    program's tree alongside (regions already compiled are reused when their graph is the
    same), compiles new regions, runs each to get the values Python asks for."""

    def __init__(self, program: Program, ctx: TraceContext, compile_region: CompileRegion,
                 inputs: list[np.ndarray], input_values: list[Value], suppress: int):
        self.program = program
        self.ctx = ctx
        self.compile_region = compile_region
        self.inputs = inputs                    # concrete arrays of this region's inputs
        self.input_index = {v: j for j, v in enumerate(input_values)}
        self.tracked: list[weakref.ref[Tracer]] = []
        self.effects: list[tuple[tuple[Any, ...], dict[str, Any]]] = []
        self.expected: Region | None = program.root    # the cached region at this point
        self.parent: tuple[Region, object] | None = None
        self.suppress = suppress                # prints replay already showed
        self.compiled = 0

    # ---- called by the tracer --------------------------------------------------------------

    def track(self, tracer: Tracer) -> None:
        self.tracked.append(weakref.ref(tracer))

    def concrete(self, tracer: Tracer, what: str, convert: Callable[[Any], Any]) -> Any:
        loc = user_loc()
        (array,) = self._close([tracer], Break("guard", what, loc, [], convert=convert))
        seen = convert(_as_numpy(array))
        key = _outcome_key(seen)
        if key not in self._region.children and self._region.brk is not None:
            self._region.brk.seen.append(_shown(seen))
        self._next(key)
        return seen

    def print_call(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        tracers = [a for a in args if isinstance(a, Tracer)]
        if not tracers:             # nothing traced: a plain print of this region, replayed
            self.effects.append((args, dict(kwargs)))
            self._print(args, kwargs)
            return
        slots: list[Tracer] = []
        recorded = tuple(self._slot(a, slots) for a in args)
        arrays = self._close(slots, Break("print", "print", user_loc(), [], args=recorded,
                                          kwargs=dict(kwargs)))
        self._next(None)
        shown = [_as_numpy(a) for a in arrays]
        self._print(tuple(_substitute(a, shown) for a in recorded), kwargs)

    def host_call(self, call: Callable[..., Any], what: str, args: tuple[Any, ...],
                  kwargs: dict[str, Any]) -> Any:
        loc = user_loc()
        key = (self.program.name, what)
        with _warned_lock:
            first = key not in _warned
            _warned.add(key)
        if first:
            _log.warning("%s: %s has no tilefuse rule: NumPy runs it between compiled regions "
                         "(graph break at %s)", self.program.name, what, loc)
        slots: list[Tracer] = []
        rec_args = tuple(self._slot_deep(a, slots) for a in args)
        rec_kwargs = {k: self._slot_deep(v, slots) for k, v in kwargs.items()}
        arrays = self._close(slots, Break("host", what, loc, [], call=call, args=rec_args,
                                          kwargs=rec_kwargs))
        result = call(*[_substitute(a, arrays) for a in rec_args],
                      **{k: _substitute(v, arrays) for k, v in rec_kwargs.items()})
        host = [np.ascontiguousarray(a) for a in _host_arrays(result)]
        tracers = self._next(None, host)
        return _rebuild(result, iter(tracers))

    # ---- the end of the function -----------------------------------------------------------

    def finish(self, fn: Callable[..., Any], result: Any) -> Any:
        outputs: list[Tracer] = []
        pack = flatten(self.ctx, result, outputs, definition(fn))
        region, env = self._region_for([t.value for t in outputs], [], final=True)
        region.pack = pack
        return pack([env[t.value] for t in outputs])

    # ---- regions ---------------------------------------------------------------------------

    def _print(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        if self.suppress > 0:
            self.suppress -= 1
        else:
            real_print(*args, **kwargs)

    @staticmethod
    def _slot(obj: Any, slots: list[Tracer]) -> Any:
        if isinstance(obj, Tracer):
            slots.append(obj)
            return _Slot(len(slots) - 1)
        return obj

    def _slot_deep(self, obj: Any, slots: list[Tracer]) -> Any:
        if isinstance(obj, (list, tuple)) and any(isinstance(v, Tracer) for v in obj):
            return type(obj)(self._slot(v, slots) for v in obj)
        return self._slot(obj, slots)

    def _live(self) -> list[Tracer]:
        live, seen = [], set()
        for ref in self.tracked:
            tracer = ref()
            if tracer is not None and tracer.ctx is self.ctx and id(tracer) not in seen:
                seen.add(id(tracer))
                live.append(tracer)
        return live

    def _close(self, needed: list[Tracer], brk: Break) -> list[np.ndarray]:
        """Compiles (or finds) the region ending at ``brk`` and runs it; returns the arrays of
        ``needed``. The live tracers and their sources are kept for :meth:`_next`."""
        self.ctx._scalars.clear()   # cached scalar constants must not count as live
        live = self._live()
        region, env = self._region_for([t.value for t in needed], [t.value for t in live],
                                       brk=brk)
        self._live_tracers = live
        self._env = env
        self._region = region
        _log.debug("%s: graph break at %s: %s; region %d (%d nodes, %d live arrays carried) %s",
                   self.program.name, brk.loc, brk.what, region.number,
                   len(region.captured.nodes), len(live),
                   "compiled" if self._compiled_last else "found in the cache")
        return [env[t.value] for t in needed]

    def _region_for(self, needed: list[Value], live: list[Value], *, brk: Break | None = None,
                    final: bool = False) -> tuple[Region, dict[Value, np.ndarray]]:
        """The region of the nodes traced since the last break, with outputs ``needed`` (the
        break's values or the function's results) and ``live``; compiled or found, and run."""
        builder = self.ctx.builder
        constants = {n.outputs[0]: n for n in builder.nodes if n.op.name == "constant"}
        sources: dict[Value, Source] = {}
        outputs: list[Value] = []
        const_arrays: list[np.ndarray] = []
        for v in [*needed, *live]:
            if v in sources:
                continue
            if final:
                sources[v] = ("out", len(outputs))
                outputs.append(v)
            elif v in self.input_index:
                sources[v] = ("in", self.input_index[v])
            elif v in constants:
                sources[v] = ("const", len(const_arrays))
                const_arrays.append(constants[v].attrs["value"].array)
            else:
                sources[v] = ("out", len(outputs))
                outputs.append(v)
        region = self._find_or_compile(builder.build(outputs), const_arrays)
        if brk is not None:
            brk.sources = [sources[v] for v in needed]
            old = region.brk
            if old is None or (old.kind, old.what, old.loc) != (brk.kind, brk.what, brk.loc):
                region.brk = brk
                region.children.clear()
            else:   # the same break again: keep the guard values seen so far
                brk.seen = old.seen
                region.brk = brk
        if final:
            region.result = [sources[v] for v in needed]
        region.effects = self.effects
        outs = region.run(self.inputs)
        env: dict[Value, np.ndarray] = {}
        for v, (kind, i) in sources.items():
            env[v] = outs[i] if kind == "out" else self.inputs[i] if kind == "in" \
                else const_arrays[i]
        self._sources = sources
        self._constant_nodes = constants
        return region, env

    def _find_or_compile(self, graph: Graph, constants: list[np.ndarray]) -> Region:
        expected = self.expected
        self._compiled_last = False
        if expected is not None and len(expected.captured.nodes) == len(graph.nodes) and \
                print_graph(expected.captured) == print_graph(graph):
            expected.constants = constants
            return expected
        self._compiled_last = True
        number = self.program.regions
        self.program.regions += 1
        self.compiled += 1
        text = print_graph(graph)
        if text in self.program.built:
            optimized, report, executable = self.program.built[text]
        elif graph.nodes or graph.outputs:
            optimized, report, executable = self.compile_region(graph, number)
            self.program.built[text] = (optimized, report, executable)
        else:
            optimized, report, executable = None, None, None
        region = Region(number, graph, optimized, report, executable, constants)
        if self.parent is None:
            self.program.root = region
        else:
            parent, key = self.parent
            parent.children[key] = region
        return region

    def _next(self, key: object, host: list[np.ndarray] | None = None) -> list[Tracer]:
        """Starts the region after the current break (reached with guard value ``key``): live
        tracers become its inputs (constants are recorded again), then host results."""
        region = self._region
        builder = GraphBuilder(self.ctx.builder.name)
        self.ctx.builder = builder
        self.ctx._scalars.clear()
        inputs: list[np.ndarray] = []
        input_values: list[Value] = []
        carry: list[Source] = []
        moved: dict[Value, Value] = {}
        for tracer in self._live_tracers:
            old = tracer.value
            if old not in moved:
                kind, i = self._sources[old]
                if kind == "const":
                    node = self._constant_nodes[old]
                    moved[old] = builder.add1("constant", [], node.attrs, node.loc)
                else:
                    moved[old] = builder.input(old.type, f"c{len(input_values)}")
                    input_values.append(moved[old])
                    carry.append((kind, i))
                    inputs.append(self._env[old])
            tracer.value = moved[old]
        made = []
        for i, array in enumerate(host or []):
            try:
                dtype = from_numpy(array.dtype)
            except Exception as err:
                raise TraceError(f"a NumPy function without a tilefuse rule returned a "
                                 f"{array.dtype} array, which tilefuse cannot trace ({err})",
                                 loc=user_loc()) from None
            value = builder.input(TensorType(tuple(array.shape), dtype), f"h{i}")
            input_values.append(value)
            carry.append(("host", i))
            inputs.append(array)
            made.append(Tracer(value, self.ctx))
        region.carry = carry
        self.inputs = inputs
        self.input_index = {v: j for j, v in enumerate(input_values)}
        self.tracked = [weakref.ref(t) for t in self._live_tracers] + \
            [weakref.ref(t) for t in made]
        self.effects = []
        self.parent = (region, key)
        self.expected = region.children.get(key)
        self._live_tracers = []
        return made


def trace_program(fn: Callable[..., Any], names: ArgumentNames, args: tuple[Any, ...],
                  kwargs: dict[str, Any], arg_parts: tuple[KeyPart, ...],
                  kw_parts: tuple[tuple[str, KeyPart], ...], program: Program | None,
                  compile_region: CompileRegion,
                  retrace: Callable[[Program, tuple[Any, ...], dict[str, Any], int], Any],
                  suppress: int = 0) -> tuple[Program, Any]:
    """Runs ``fn`` once with graph breaks, compiling the regions ``program`` (None: a new one)
    does not have yet; returns the program and the call's result."""
    ctx = TraceContext(GraphBuilder(graph_name(fn)), getattr(fn, "__name__", repr(fn)),
                       fullgraph=False)
    traced_args = list(args)
    traced_kwargs = dict(kwargs)
    positions, keywords, tracers = [], [], []
    for i, part in enumerate(arg_parts):
        if is_array_part(part):
            traced_args[i] = ctx.input(tensor_type(part, names.label(i)), names.name(i))
            positions.append(i)
            tracers.append(traced_args[i])
    for key, part in kw_parts:
        if is_array_part(part):
            traced_kwargs[key] = ctx.input(tensor_type(part, names.label(key)), key)
            keywords.append(key)
            tracers.append(traced_kwargs[key])
    if program is None:
        program = Program(getattr(fn, "__qualname__", ctx.function), tuple(positions),
                          tuple(keywords), retrace)
    trace = BreakingTrace(program, ctx, compile_region, program.arrays(args, kwargs),
                          [t.value for t in tracers], suppress)
    for tracer in tracers:
        trace.track(tracer)
    ctx.breaks = trace
    del tracers
    try:
        with intercepting_print(ctx):
            result = fn(*traced_args, **traced_kwargs)
        del traced_args, traced_kwargs
        out = trace.finish(fn, result)
    finally:
        ctx.active = False
    return program, out


__all__ = ["Break", "BreakingTrace", "Program", "Region", "trace_program"]
