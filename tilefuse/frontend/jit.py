"""``tilefuse.jit``: trace a NumPy function once per argument signature, then run it compiled.

The cache key of a call is ``(target, array shapes and dtypes, static values)``, where a dim
marked dynamic (``dynamic=``, or automatically at its second size: see
:mod:`tilefuse.frontend.dynamic_dims`) is its symbol rather than its size. A call whose key
is cached (a *hit*) only computes the key, makes non-contiguous inputs contiguous and runs the
executable. A new key (a *miss*) traces the function, runs the graph pipeline and builds an
executable; when other entries exist, topic ``guards`` logs that none matched and topic
``recompiles`` logs what changed against the nearest one (``arg 0 (x): f32[4,8] -> f32[4,9]``).
An entry with symbolic dims holds a :class:`~tilefuse.runtime.dynamic.DynamicExecutable`, which
binds the symbols per call, guards them and runs the specialisation for those sizes.

More than ``max_recompiles`` recompiles of one function raise :class:`RecompileLimitError`,
which names the dims that kept changing and the ``dynamic=`` value that would stop it.

A value the function closes over is captured as a constant when the function is traced: changing
that array later does not change what a cached entry computes.
"""

from __future__ import annotations

import functools
import logging
import math
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, overload

import numpy as np

from tilefuse.driver import CompileOptions, compile_graph, optimize
from tilefuse.dump import resolve_dump_dir
from tilefuse.errors import CompileError, GuardError, TilefuseError, TraceError
from tilefuse.frontend.arguments import (
    ArgumentNames,
    InlineCall,
    KeyPart,
    describe_part,
    is_array_part,
    key_part,
)
from tilefuse.frontend.capture import Captured, Packer, capture
from tilefuse.frontend.dynamic_dims import DynamicDims, DynamicSpec, changed_dims
from tilefuse.frontend.graph_breaks import Program, trace_program
from tilefuse.frontend.tracer import GraphBreakError
from tilefuse.graph.ir import Graph
from tilefuse.graph.types import Sym
from tilefuse.log import get_logger
from tilefuse.passes.quantize import parse_quantize, pipeline_for
from tilefuse.runtime.device_arrays import device_standins, is_device_array
from tilefuse.runtime.dynamic import DynamicExecutable, SymbolConflict, SymbolGuardError
from tilefuse.runtime.executable import Executable
from tilefuse.target import Target

Key = tuple[Target, tuple[KeyPart, ...], tuple[tuple[str, KeyPart], ...]]

DEFAULT_MAX_RECOMPILES = 8
"""Recompiles of one jitted function (compiles after the first) before RecompileLimitError."""


class RecompileLimitError(CompileError):
    """A jitted function was recompiled more than its ``max_recompiles`` times."""


@dataclass(frozen=True)
class CacheInfo:
    """Counters of one jitted function: cache hits, misses, successful compiles (traces and
    graph pipelines), entries, and ``specializations``: the per-size builds that entries with
    symbolic dims made (see :mod:`tilefuse.runtime.dynamic`)."""

    hits: int
    misses: int
    compiles: int
    entries: int
    specializations: int = 0


@dataclass(frozen=True)
class Lowered:
    """The graphs of one specialisation: as captured from the function and after the pipeline.
    ``report`` is the pass manager's report."""

    captured: Graph
    optimized: Graph
    report: Any
    executable: Executable | None = None  # set when this specialisation is compiled already

    def __str__(self) -> str:
        return f"# captured\n{self.captured}\n# optimized\n{self.optimized}"


def _key_symbols(key: Key) -> set[Sym]:
    """The symbols in a key's array shapes."""
    parts = [*key[1], *(p for _, p in key[2])]
    return {d for p in parts if is_array_part(p) for d in p[0] if isinstance(d, Sym)}


def _contiguous(a: Any) -> np.ndarray:
    """The argument as a C-contiguous ndarray (a copy only when it is not one already)."""
    if type(a) is not np.ndarray:
        a = np.asarray(a)
    return a if a.flags.c_contiguous else np.ascontiguousarray(a)


class _Entry:
    """One compiled specialisation and how to feed it from a call's arguments. ``direct``:
    the executable's own call on the positional arguments as they are (every argument an
    input, in order, none by keyword), which checks contiguity itself
    (:meth:`~tilefuse.runtime.native.NativeExecutable.run_args`); None when it has none."""

    __slots__ = ("captured", "direct", "executable", "fast", "key", "keywords", "optimized",
                 "pack", "positions", "report")

    def __init__(self, key: Key, captured: Captured, optimized: Graph, report: Any,
                 executable: Executable):
        self.key = key
        self.captured = captured.graph
        self.positions = captured.positions
        self.keywords = captured.keywords
        self.pack: Packer = captured.pack
        self.optimized = optimized
        self.report = report
        self.executable = executable
        in_order = self.positions == tuple(range(len(key[1]))) and not self.keywords
        self.direct = getattr(executable, "run_args", None) if in_order else None
        self.fast: Any = None   # the native builtin for ``pack(direct(args))``: see fast_call

    def fast_call(self) -> Any:
        """``pack(direct(args))`` as one native builtin taking the arrays positionally
        (:meth:`~tilefuse.runtime.native.NativeExecutable.fast_call`), when the executable
        has one and ``pack`` returns its one output as it is; else False. Built on the
        entry's first fast-path hit (not at compile time: it costs an LLVM module)."""
        make = getattr(self.executable, "fast_call", None)
        outputs = getattr(getattr(self.executable, "graph", None), "outputs", ())
        if self.direct is None or make is None or len(outputs) != 1:
            return False
        sentinel = object()
        try:
            if self.pack([sentinel]) is not sentinel:
                return False
        except (IndexError, TypeError):
            return False
        return make() or False

    def run(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        arrays = [_contiguous(args[i]) for i in self.positions]
        if self.keywords:
            arrays += [_contiguous(kwargs[k]) for k in self.keywords]
        return self.pack(self.executable.run_trusted(arrays))

    def run_device(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """The call on device arrays (target cuda): results of the same library, on the device."""
        arrays = [args[i] for i in self.positions] + [kwargs[k] for k in self.keywords]
        return self.pack(self.executable.run_arrays(arrays))  # type: ignore[attr-defined]


class JitFunction:
    """A function compiled by :func:`jit`. Call it like the original function."""

    def __init__(self, fn: Callable[..., Any], *, target: str | Target = "cpu",
                 dump: str | Path | None = None, debug: bool = False,
                 static_argnames: Iterable[str] | str = (), dynamic: DynamicSpec = None,
                 max_recompiles: int = DEFAULT_MAX_RECOMPILES, reassociate: bool = False,
                 fullgraph: bool = False, quantize: Any = None):
        if not callable(fn):
            raise TraceError(f"jit needs a function, got {type(fn).__name__}")
        if isinstance(static_argnames, str):
            static_argnames = (static_argnames,)
        functools.update_wrapper(self, fn)
        self._fn = fn
        self._target = Target.parse(target)  # TargetError (a CompileError) naming it
        self._dump = dump
        self._debug = debug
        from tilefuse.passes.pipeline import graph_pipeline  # egglog: on first use

        self._pipeline = pipeline_for(parse_quantize(quantize),
                                      graph_pipeline(reassociate=reassociate))
        self._fullgraph = fullgraph
        self._names = ArgumentNames(fn, static_argnames)
        self._static_positions = self._names.static_positions
        self._static_names = self._names.static_names
        self._cache: dict[Key, _Entry | Program] = {}
        self._lock = threading.RLock()  # re-entrant: a traced function may call itself
        self._hits = self._misses = self._compiles = 0
        self._recompile_log = get_logger("recompiles")
        self._guard_log = get_logger("guards")
        self._dynamic = DynamicDims(dynamic, self._names)
        self._direct_calls = not self._static_positions and not self._target.is_cuda
        self._last_hit: tuple[tuple[Any, ...] | None, Any] = (None, None)
        self._device_calls = not self._static_positions and self._target.is_cuda
        self._last_device: tuple[tuple[Any, ...] | None, Any] = (None, None)
        self._max_recompiles = max(0, int(max_recompiles))

    def __repr__(self) -> str:
        return f"<tilefuse.jit of {getattr(self._fn, '__qualname__', self._fn)} " \
               f"(target {str(self._target)!r}, {len(self._cache)} entries)>"

    def __get__(self, obj: Any, objtype: Any = None) -> Any:
        """As a method: the instance becomes the first argument (name it in static_argnames)."""
        return self if obj is None else functools.partial(self, obj)

    # ---- calls -----------------------------------------------------------------------------

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if not kwargs and self._direct_calls and not self._dynamic.any:
            # the fast path of a cache hit on arrays alone (the key _key makes of them, see
            # benchmarks/w5_profile.py): every step of the general path below, in one loop
            parts = []
            for a in args:
                if type(a) is not np.ndarray:
                    break
                parts.append((a.shape, a.dtype))
            else:
                key_parts = tuple(parts)
                last_parts, entry = self._last_hit   # one tuple: read and set atomically
                if key_parts != last_parts:   # equal: no hashing, no lookup
                    entry = self._cache.get((self._target, key_parts, ()))
                    if type(entry) is not _Entry or entry.direct is None:
                        entry = None   # a miss, graph breaks (a Program) or a general entry
                    else:
                        self._last_hit = (key_parts, entry)
                        if entry.fast is None:
                            entry.fast = entry.fast_call()
                if entry is not None:
                    self._hits += 1
                    if entry.fast:
                        return entry.fast(*args)
                    try:
                        return entry.pack(entry.direct(args))
                    except (SymbolConflict, SymbolGuardError) as err:
                        return self._guard_failed(err, args, kwargs)
        if not kwargs and self._device_calls:
            # a cache hit on the device arrays of the last device call (same types, shapes,
            # dtypes): no stand-ins, no key; run_arrays still checks device and layout
            last_sig, entry = self._last_device
            if last_sig is not None and \
                    tuple((type(a), a.shape, a.dtype) for a in args) == last_sig \
                    and all(is_device_array(a) for a in args):
                self._hits += 1
                return entry.run_device(args, kwargs)
        device = None
        if self._target.is_cuda and (kwargs or not all(type(a) is np.ndarray for a in args)):
            device = (args, kwargs)   # device arrays: keyed and traced through stand-ins
            args, kwargs = device_standins(args, kwargs)
            if args is device[0] and kwargs is device[1]:
                device = None
        try:
            key = self._key(args, kwargs)
        except InlineCall:  # called on tracers from inside another trace: trace through
            return self._fn(*args, **kwargs)
        except TilefuseError:
            self._explain_key_error(args, kwargs)
            raise
        entry = self._cache.get(key)
        if entry is None:
            entry = self._miss(key, args, kwargs)
        else:
            self._hits += 1
        if device is not None:
            if not isinstance(entry, _Entry):
                raise TraceError(f"{self._qualname} has graph breaks: device arrays are only "
                                 f"taken by functions traced whole (pass NumPy arrays)")
            if not kwargs and self._device_calls and not self._dynamic.any:
                self._last_device = (tuple((type(a), a.shape, a.dtype) for a in device[0]),
                                     entry)
            return entry.run_device(*device)
        try:
            return entry.run(args, kwargs)
        except (SymbolConflict, SymbolGuardError) as err:  # raised before any native code
            return self._guard_failed(err, args, kwargs)

    def _key(self, args: tuple[Any, ...], kwargs: dict[str, Any], *,
             symbolic: bool = True) -> Key:
        static = self._static_positions
        dyn = self._dynamic
        if not (symbolic and dyn.any):
            parts = tuple((a.shape, a.dtype) if type(a) is np.ndarray and i not in static
                          else key_part(a, i in static) for i, a in enumerate(args))
            if not kwargs:
                return (self._target, parts, ())
            names = self._static_names
            kw = tuple((k, (v.shape, v.dtype) if type(v) is np.ndarray and k not in names
                        else key_part(v, k in names)) for k, v in sorted(kwargs.items()))
            return (self._target, parts, kw)
        dyn.resolve_leading(args)
        at, by_name = dyn.positions, dyn.keywords
        parts = tuple(((dyn.shape(a.shape, at[i]) if i in at else a.shape), a.dtype)
                      if type(a) is np.ndarray and i not in static
                      else key_part(a, i in static) for i, a in enumerate(args))
        names = self._static_names
        kw = tuple((k, ((dyn.shape(v.shape, by_name[k]) if k in by_name else v.shape), v.dtype)
                    if type(v) is np.ndarray and k not in names
                    else key_part(v, k in names)) for k, v in sorted(kwargs.items()))
        return (self._target, parts, kw)

    def _explain_key_error(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        """Re-raises the error of the first argument that cannot be keyed, naming it."""
        slots = [(i, a, i in self._static_positions) for i, a in enumerate(args)]
        slots += [(k, v, k in self._static_names) for k, v in kwargs.items()]
        for slot, value, static in slots:
            try:
                key_part(value, static)
            except TilefuseError as err:
                raise type(err)(f"{self._names.label(slot)}: {err.message}", op=err.op,
                                inputs=err.inputs, loc=err.loc) from None
            except InlineCall:
                pass

    def _miss(self, key: Key, args: tuple[Any, ...], kwargs: dict[str, Any]
              ) -> _Entry | Program:
        with self._lock:
            entry = self._cache.get(key)
            if entry is not None:  # another thread compiled it meanwhile
                self._hits += 1
                return entry
            self._misses += 1
            self._log_miss(key)
            if self._dynamic.automatic and self._cache and self._auto_dynamic(key):
                key = self._key(args, kwargs)
                entry = self._cache.get(key)
                if entry is not None:
                    return entry
            return self._compile_entry(key, args, kwargs)

    def _compile_entry(self, key: Key, args: tuple[Any, ...], kwargs: dict[str, Any]
                       ) -> _Entry | Program:
        """Compiles ``key`` (symbolic when it holds symbols; when a symbolic trace fails, its
        dims become static again, logged, and the call's static key is compiled)."""
        self._check_limit(key)
        symbols = _key_symbols(key)
        if symbols:
            try:
                entry = self._compile(key, args, kwargs)
            except (TilefuseError, TypeError, ValueError, IndexError) as err:
                dropped = self._dynamic.refuse(symbols)
                self._recompile_log.warning(
                    "%s: cannot compile with %s dynamic (%s: %s); compiling for the static "
                    "shapes instead", self._qualname, ", ".join(dropped), type(err).__name__,
                    err)
                key = self._key(args, kwargs, symbolic=False)
                entry = self._cache.get(key)
                if entry is not None:
                    return entry
                entry = self._compile(key, args, kwargs)
        else:
            entry = self._compile(key, args, kwargs)
        self._cache[key] = entry
        self._compiles += 1
        return entry

    def _compile(self, key: Key, args: tuple[Any, ...], kwargs: dict[str, Any]
                 ) -> _Entry | Program:
        dump_dir = resolve_dump_dir(self._dump)
        try:
            captured = self._capture(key, args, kwargs)
        except GraphBreakError:
            if self._fullgraph or _key_symbols(key):   # symbolic: compiled static instead
                raise
            return self._trace_in_regions(key, args, kwargs, None, 0)
        # The compile driver: graph pipeline, kernels, schedules, lowering, codegen; an entry
        # with symbolic dims gets a DynamicExecutable whose specialisations run the pipeline
        # again on their static graphs.
        compiled = compile_graph(captured.graph, self._target, self._options(dump_dir))
        return _Entry(key, captured, compiled.optimized, compiled.report, compiled.executable)

    def _capture(self, key: Key, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Captured:
        """The graph of this call (``tilefuse.grad`` appends the gradients)."""
        return capture(self._fn, self._names, args, kwargs, key[1], key[2],
                       fullgraph=self._fullgraph)

    def _options(self, dump_dir: Path | None) -> CompileOptions:
        return CompileOptions(dump_dir=dump_dir, debug=self._debug, pipeline=self._pipeline)

    # ---- graph breaks (see tilefuse.frontend.graph_breaks) -----------------------------------

    def _trace_in_regions(self, key: Key, args: tuple[Any, ...], kwargs: dict[str, Any],
                          program: Program | None, printed: int) -> Program:
        """Traces this call with graph breaks into ``program`` (None: a new one); the call's
        result is handed over to the program's next run."""
        program, result = trace_program(self._fn, self._names, args, kwargs, key[1], key[2],
                                        program, self._compile_region, self._retrace, printed)
        program.hand_over(result)
        dump_dir = resolve_dump_dir(self._dump)
        if dump_dir is not None:
            dump_dir.mkdir(parents=True, exist_ok=True)
            (dump_dir / "graph_breaks.txt").write_text(program.explain() + "\n")
        return program

    def _compile_region(self, graph: Graph, number: int) -> tuple[Graph, Any, Any]:
        dump_dir = resolve_dump_dir(self._dump)
        where = None if dump_dir is None else dump_dir / f"region-{number:02d}"
        compiled = compile_graph(graph, self._target, self._options(where))
        return compiled.optimized, compiled.report, compiled.executable

    def _retrace(self, program: Program, args: tuple[Any, ...], kwargs: dict[str, Any],
                 printed: int) -> Any:
        """A guard saw a value no region was traced for: trace again (the regions before it
        are reused); ``printed`` prints were shown by the replay already."""
        with self._lock:
            self._misses += 1
            if program.retraces >= self._max_recompiles:
                message = (f"{self._qualname} was traced again {program.retraces} times for new "
                           f"guard values, above its limit (max_recompiles="
                           f"{self._max_recompiles}); the guards:\n{program.explain()}")
                self._recompile_log.warning("%s", message)
                raise RecompileLimitError(message)
            key = self._key(args, kwargs, symbolic=False)
            self._trace_in_regions(key, args, kwargs, program, printed)
            program.retraces += 1   # (a trace the function ended by raising does not count)
            return program.run(args, kwargs)

    def explain(self) -> str:
        """The compiled entries: for each argument signature, one region, or the regions,
        graph breaks and guards of a function that has breaks."""
        if not self._cache:
            return f"{self._qualname}: nothing compiled yet"
        lines = []
        for key, entry in self._cache.items():
            parts = [describe_part(p) for p in key[1]] + \
                [f"{k}={describe_part(p)}" for k, p in key[2]]
            signature = f"{self._qualname}({', '.join(parts)})"
            if isinstance(entry, Program):
                regions, breaks, guards = entry.counts()
                lines.append(f"{signature}: {regions} regions, {breaks} graph breaks, "
                             f"{guards} guards, traced again {entry.retraces} times")
                lines.extend("  " + line for line in entry.explain().splitlines())
            else:
                lines.append(f"{signature}: one region, no graph breaks")
        return "\n".join(lines)

    # ---- dynamic dims ----------------------------------------------------------------------

    @property
    def _qualname(self) -> str:
        return getattr(self._fn, "__qualname__", "function")

    def _auto_dynamic(self, key: Key) -> bool:
        """Automatic dynamic dims: when the nearest entry differs from ``key`` only in array
        dim sizes, those dims become dynamic (logged). True when some did."""
        best = None
        for old in self._cache:
            if old[0] != key[0] or [k for k, _ in old[2]] != [k for k, _ in key[2]]:
                continue
            changes = changed_dims(old[1] + tuple(p for _, p in old[2]),
                                   key[1] + tuple(p for _, p in key[2]))
            if changes and (best is None or len(changes) < len(best)):
                best = changes
        if not best:
            return False
        n_pos = len(key[1])
        slots = [(i if i < n_pos else key[2][i - n_pos][0], axis, m, n)
                 for i, axis, m, n in best]
        lines = self._dynamic.mark(slots)
        for line in lines:
            self._recompile_log.debug("%s: %s", self._qualname, line)
        return bool(lines)

    def _guard_failed(self, err: GuardError, args: tuple[Any, ...],
                      kwargs: dict[str, Any]) -> Any:
        """A symbolic entry's guard refused this call's sizes. Symbols the user named are a
        promise (GuardError); automatic ones get a static entry for these shapes (logged)."""
        if self._dynamic.explicit:
            raise GuardError(f"{self._qualname}: {err.message}") from None
        key = self._key(args, kwargs, symbolic=False)
        entry = self._cache.get(key)
        if entry is None:
            with self._lock:
                entry = self._cache.get(key)
                if entry is None:
                    self._misses += 1
                    self._recompile_log.debug("recompiling %s for static shapes: %s",
                                              self._qualname, err.message)
                    entry = self._compile_entry(key, args, kwargs)
        else:
            self._hits += 1
        return entry.run(args, kwargs)

    def _check_limit(self, key: Key) -> None:
        if self._compiles <= self._max_recompiles:
            return
        changing = self._changing_dims(key)
        statics = self._changing_statics(key)
        parts = []
        if changing:
            shown = ", ".join(f"{n}[{a}] ({', '.join(map(str, sorted(v)))})"
                              for (n, a), v in changing.items())
            parts.append(f"the dims that changed: {shown}; mark them dynamic, e.g. "
                         f"tilefuse.jit({getattr(self._fn, '__name__', 'fn')}, dynamic="
                         f"{self._dynamic.suggestion(changing)}) (give dims that are always "
                         "equal one symbol name)")
        if statics:
            parts.append(f"static arguments that changed: {', '.join(statics)}; pass them as "
                         "arrays to trace them")
        if not parts:
            parts.append("its argument signature keeps changing")
        message = (f"{self._qualname} was recompiled {self._compiles - 1} times, above its "
                   f"limit (max_recompiles={self._max_recompiles}): " + "; ".join(parts)
                   + ". Or raise max_recompiles= if every one of these shapes is wanted.")
        self._recompile_log.warning("%s", message)
        raise RecompileLimitError(message)

    def _changing_dims(self, key: Key) -> dict[tuple[str, int], set[int]]:
        """(parameter name, axis) -> the sizes seen, for every array dim whose size differs
        between the cached keys and ``key``."""
        sizes: dict[tuple[str, int], set[int]] = {}
        for k in [*self._cache, key]:
            slots = [(i, p) for i, p in enumerate(k[1])] + list(k[2])
            for slot, part in slots:
                if is_array_part(part):
                    for axis, d in enumerate(part[0]):  # type: ignore[index]
                        if isinstance(d, int):
                            sizes.setdefault((self._names.name(slot), axis), set()).add(d)
        return {dim: seen for dim, seen in sizes.items() if len(seen) > 1}

    def _changing_statics(self, key: Key) -> list[str]:
        seen: dict[str, set[str]] = {}
        for k in [*self._cache, key]:
            for slot, part in [(i, p) for i, p in enumerate(k[1])] + list(k[2]):
                if not is_array_part(part):
                    seen.setdefault(self._names.name(slot), set()).add(describe_part(part))
        return [name for name, values in seen.items() if len(values) > 1]

    def _trace_and_optimize(self, key: Key, args: tuple[Any, ...], kwargs: dict[str, Any],
                            dump_dir: Path | None) -> tuple[Captured, Graph, Any]:
        captured = self._capture(key, args, kwargs)
        optimized, report = optimize(captured.graph, self._options(dump_dir))
        return captured, optimized, report

    # ---- introspection ---------------------------------------------------------------------

    def lower(self, *args: Any, **kwargs: Any) -> Lowered:
        """The captured and optimised graphs for these arguments, without running them (from
        the cache when this specialisation is compiled already)."""
        try:
            key = self._key(args, kwargs)
        except InlineCall:
            raise TraceError("lower() needs concrete arrays, not traced ones") from None
        except TilefuseError:
            self._explain_key_error(args, kwargs)
            raise
        entry = self._cache.get(key)
        if entry is not None:
            return Lowered(entry.captured, entry.optimized, entry.report, entry.executable)
        try:
            captured, optimized, report = self._trace_and_optimize(key, args, kwargs,
                                                                   resolve_dump_dir(self._dump))
        except GraphBreakError as err:
            if self._fullgraph:
                raise
            raise TraceError(f"{self._qualname} has graph breaks ({err.message}), so it is not "
                             "one graph: call it, then jitted.explain() lists its regions and "
                             "jitted.lower() shows the first one", loc=err.loc) from None
        return Lowered(captured.graph, optimized, report)

    def cache_info(self) -> CacheInfo:
        built = sum(getattr(e.executable, "specializations", 0) for e in self._cache.values()
                    if isinstance(e.executable, DynamicExecutable))
        return CacheInfo(self._hits, self._misses, self._compiles, len(self._cache), built)

    def clear_cache(self) -> None:
        """Drops every compiled entry and resets the counters."""
        with self._lock:
            self._cache.clear()
            self._last_hit = (None, None)
            self._last_device = (None, None)
            self._hits = self._misses = self._compiles = 0

    # ---- logs ------------------------------------------------------------------------------

    def _log_miss(self, key: Key) -> None:
        guards = self._guard_log.isEnabledFor(logging.DEBUG)
        recompiles = self._recompile_log.isEnabledFor(logging.DEBUG)
        if not self._cache or not (guards or recompiles):
            return
        _, changes = min((self._changes(entry_key, key) for entry_key in self._cache),
                         key=lambda scored: scored[0])
        name = getattr(self._fn, "__qualname__", "function")
        if guards:
            self._guard_log.debug("%s: no guard of its %d cached entries holds; nearest: %s",
                                  name, len(self._cache), "; ".join(changes))
        if recompiles:
            self._recompile_log.debug("recompiling %s: %s", name, "; ".join(changes))

    def _changes(self, old: Key, new: Key) -> tuple[float, list[str]]:
        """How far apart two keys are, and what differs, one line per argument."""
        if len(old[1]) != len(new[1]) or [k for k, _ in old[2]] != [k for k, _ in new[2]]:
            return math.inf, [f"arguments ({self._signature(old)}) -> ({self._signature(new)})"]
        lines = [f"{self._names.label(i)}: {describe_part(a)} -> {describe_part(b)}"
                 for i, (a, b) in enumerate(zip(old[1], new[1])) if a != b]
        lines += [f"{self._names.label(k)}: {describe_part(a)} -> {describe_part(b)}"
                  for (k, a), (_, b) in zip(old[2], new[2]) if a != b]
        return len(lines), lines

    def _signature(self, key: Key) -> str:
        parts = [self._names.name(i) for i in range(len(key[1]))] + [f"{k}=" for k, _ in key[2]]
        return ", ".join(parts)


@overload
def jit(fn: Callable[..., Any], *, target: str | Target = ..., dump: str | Path | None = ...,
        debug: bool = ..., static_argnames: Iterable[str] | str = ...,
        dynamic: DynamicSpec = ..., max_recompiles: int = ..., reassociate: bool = ...,
        fullgraph: bool = ..., quantize: Any = ...) -> JitFunction: ...


@overload
def jit(fn: None = ..., *, target: str | Target = ..., dump: str | Path | None = ...,
        debug: bool = ..., static_argnames: Iterable[str] | str = ...,
        dynamic: DynamicSpec = ..., max_recompiles: int = ..., reassociate: bool = ...,
        fullgraph: bool = ..., quantize: Any = ...
        ) -> Callable[[Callable[..., Any]], JitFunction]: ...


def jit(fn: Callable[..., Any] | None = None, *, target: str | Target = "cpu",
        dump: str | Path | None = None, debug: bool = False,
        static_argnames: Iterable[str] | str = (), dynamic: DynamicSpec = None,
        max_recompiles: int = DEFAULT_MAX_RECOMPILES, reassociate: bool = False,
        fullgraph: bool = False, quantize: Any = None) -> Any:
    """Compiles a NumPy function: ``@jit`` or ``@jit(dump="dir", static_argnames=("n",))``.

    Arrays (and NumPy scalars) are traced; Python scalars, strings, None and tuples of those,
    and the arguments named in ``static_argnames``, are static: each new value compiles anew.
    Lists are rejected. ``target`` is "cpu", "reference" or "cuda". Under "cuda", torch CUDA
    tensors and CuPy arrays are read in place and the results are fresh arrays of the same
    library on the device (queued on its current stream); NumPy arrays are copied in once per
    call and the results come back as NumPy (see :mod:`tilefuse.runtime.device_arrays` and
    :mod:`tilefuse.runtime.cuda_graph`: after its first call a specialisation replays as one
    CUDA graph). ``dump`` (or ``$TILEFUSE_DUMP``)
    writes the graph after each pass; ``debug`` verifies the graph after every pass.
    ``dynamic`` says which array dims are symbolic (default: automatic, a dim becomes dynamic
    at its second size; see :mod:`tilefuse.frontend.dynamic_dims`); more than
    ``max_recompiles`` recompiles raise :class:`RecompileLimitError`. ``reassociate`` lets
    the compiler fold ``(x @ A) @ B`` with constant A, B into ``x @ (A @ B)`` (fewer FLOPs, but
    an inf in ``x`` then gives ±inf where NumPy gives NaN). ``quantize`` ("int8", "int4",
    "int4:64", "int4:32+zp"; :mod:`tilefuse.passes.quantize`) quantizes the constant weights
    of matrix products and convolutions at build time.

    Python that needs a traced value (``if x.sum() > 0``, ``float(x)``, ``print(x)``, a NumPy
    function without a rule) is a graph break: the function runs as compiled regions with
    guards (:mod:`tilefuse.frontend.graph_breaks`, ``jitted.explain()``). ``fullgraph=True``
    makes each break a TraceError instead.
    """
    def wrap(f: Callable[..., Any]) -> JitFunction:
        return JitFunction(f, target=target, dump=dump, debug=debug,
                           static_argnames=static_argnames, dynamic=dynamic,
                           max_recompiles=max_recompiles, reassociate=reassociate,
                           fullgraph=fullgraph, quantize=quantize)

    return wrap if fn is None else wrap(fn)


__all__ = ["DEFAULT_MAX_RECOMPILES", "CacheInfo", "JitFunction", "Lowered",
           "RecompileLimitError", "jit"]
