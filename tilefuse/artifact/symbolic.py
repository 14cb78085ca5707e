"""Symbolic programs: one saved build that runs at every size of its symbolic dims.

A graph with symbolic input dims (``f32[batch,16]``) whose every kernel takes its extents at
run time (:class:`~tilefuse.backend.cpu_symbolic.SymbolicNativeExecutable` with no per-size
group) is saved once, with *shape formulas* instead of sizes:

- the signature's dims are ints or symbol names; a call binds each symbol from the first dim
  that names it (two different sizes for one symbol: GuardError);
- every arena buffer (an intermediate value, or a kernel's scratch) is a request: its byte size
  and shape as formulas over the symbols, and the steps it lives over;
- every launch names its buffers (``["io", i]``, ``["const", k]``, ``["buf", r]``) and its
  scalars by symbol.

A formula is JSON: an int, a symbol's scalar name (``"dim_batch"``), or ``[op, a, b]`` with op
one of ``add sub mul floordiv mod min max`` (the integer arithmetic of
:func:`tilefuse.kernel.access.extent_value`). The loader evaluates them for each new binding,
places the arena (:func:`tilefuse.runtime.memory.plan_memory`, as a build does), makes the
launches and keeps the executable (the newest :data:`MAX_BINDINGS`). Nothing is compiled: the
kernels and the generic launcher are the saved ones. The encoder lives here too (run at save
time, it reads the CPU back end's build); decoding imports none of the compiler.
"""

from __future__ import annotations

import math
import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from tilefuse.artifact.format import ArtifactError
from tilefuse.codegen.abi import aligned_empty
from tilefuse.dtypes import DType
from tilefuse.errors import GuardError
from tilefuse.graph.ir import Graph, Value
from tilefuse.graph.types import Sym, TensorType
from tilefuse.runtime.launch import KernelLaunch, NativeStep
from tilefuse.runtime.memory import BufferRequest, plan_memory
from tilefuse.runtime.native import ExecutableParts, NativeExecutable

if TYPE_CHECKING:
    from tilefuse.artifact.program import Decoder, Sections
    from tilefuse.backend.cpu_symbolic import SymbolicNativeExecutable

SCALAR_PREFIX = "dim_"
"""A symbol's scalar name in kernels and formulas (:data:`tilefuse.kernel.access.SCALAR_PREFIX`)."""
MAX_BINDINGS = 64
"""Size bindings whose arena and launches a loaded symbolic program keeps."""
MAX_DEPTH = 64
MAX_SIZE = 1 << 48
_OPS: dict[str, Callable[[int, int], int]] = {
    "add": lambda a, b: a + b, "sub": lambda a, b: a - b, "mul": lambda a, b: a * b,
    "floordiv": lambda a, b: a // b if b else 0, "mod": lambda a, b: a % b if b else 0,
    "min": min, "max": max}


# ---------------------------------------------------------------------------- encode (save)

def savable(exe: SymbolicNativeExecutable) -> str | None:
    """None when ``exe`` can be saved as one symbolic program, else why not."""
    build = exe._builder
    if exe.per_size_groups:
        return ("groups built per size (" + "; ".join(f"{g}: {why}" for g, why in
                                                      exe.per_size_groups) + ")")
    symbols = set(exe.symbols)
    for pending in build.pending:
        for v in [*pending.group.inputs, *pending.group.outputs]:
            other = [d for d in v.shape if isinstance(d, Sym) and d not in symbols]
            if other:
                return f"value {v.type} has dims no input names ({other})"
        if pending.reason is not None:
            return f"kernel {pending.group.name} runs on the host ({pending.reason})"
        if pending.checks:
            return f"kernel {pending.group.name} records bad indices (a gather)"
    return None


def _formula(expr: Any) -> Any:
    """An ``i64`` size expression (loop IR) or dim as a JSON formula."""
    from tilefuse.loop.ir import XOp

    if isinstance(expr, bool):
        raise ArtifactError(f"cannot save the size {expr!r}")
    if isinstance(expr, int):
        return expr
    if isinstance(expr, Sym):
        return SCALAR_PREFIX + expr.name
    if expr.op is XOp.CONST:
        return int(expr.arg)
    if expr.op is XOp.VAR:
        return str(expr.arg)
    name = expr.op.name.lower()
    if name not in _OPS or len(expr.args) != 2:
        raise ArtifactError(f"cannot save the size {expr} (not integer arithmetic)")
    return [name, _formula(expr.args[0]), _formula(expr.args[1])]


def _signature(values: Sequence[Value]) -> list[list[Any]]:
    return [[v.name or f"#{i}", v.dtype.value, [d if isinstance(d, int) else d.name
                                                for d in v.shape]]
            for i, v in enumerate(values)]


def encode_symbolic(exe: SymbolicNativeExecutable, sections: Sections,
                    plan_text: str) -> dict[str, Any]:
    """The program of a symbolic build (:func:`savable` said yes); its kernels and
    constants go to ``sections``."""
    from tilefuse.backend.cpu import Scratch
    from tilefuse.kernel.plan_printer import value_names

    build = exe._builder
    graph = build.graph
    names = value_names(graph)
    slots: dict[object, list[Any]] = {}
    for i, v in enumerate(graph.inputs):
        slots.setdefault(v, ["io", i])
    for v, array in build.constants.items():
        slots[v] = ["const", sections.constant(array)]
    for j, v in enumerate(graph.outputs):
        slots.setdefault(v, ["io", len(graph.inputs) + j])
    last_use: dict[Value, int] = {}
    for step, pending in enumerate(build.pending):
        last_use.update(dict.fromkeys(pending.group.inputs, step))
    buffers: list[dict[str, Any]] = []

    def request(key: object, name: str, nbytes: Any, shape: list[Any], dtype: np.dtype,
                first: int, last: int) -> None:
        slots[key] = ["buf", len(buffers)]
        buffers.append({"name": name, "nbytes": nbytes, "shape": shape,
                        "dtype": _dtype(dtype), "first": first, "last": last})

    steps = []
    for step, pending in enumerate(build.pending):
        for v in pending.group.outputs:
            if v not in slots:
                shape = [_formula(d) for d in v.shape]
                nbytes: Any = v.dtype.itemsize
                for d in shape:
                    nbytes = ["mul", nbytes, d]
                request(v, names[v], nbytes, shape, v.dtype.np, step,
                        max(step, last_use.get(v, step)))
        for scratch in pending.scratch():
            nbytes = _formula(scratch.nbytes)
            request(scratch, scratch.name, nbytes,
                    [["floordiv", nbytes, scratch.dtype.itemsize]], scratch.dtype, step, step)
        launches = []
        for kernel in pending.kernels:
            args = []
            for b in kernel.fn.buffers:
                bound = kernel.bindings[b.name]
                if isinstance(bound, np.ndarray):
                    args.append(["const", sections.constant(bound)])
                elif isinstance(bound, (Value, Scratch)):
                    args.append(slots[bound])
                else:
                    raise ArtifactError(f"kernel {kernel.fn.name}: cannot save the binding of "
                                        f"{b.name}")
            launches.append({"kernel": sections.kernel(kernel.compiled), "args": args,
                             "scalars": list(kernel.fn.scalars)})
        steps.append({"native": pending.group.name, "launches": launches})
    first = len(graph.inputs)
    copies = [[j, slots[v]] for j, v in enumerate(graph.outputs)
              if slots[v] != ["io", first + j]]
    return {"name": exe.graph.name, "symbolic": [s.name for s in exe.symbols],
            "inputs": _signature(exe.graph.inputs), "outputs": _signature(graph.outputs),
            "align": [[i, a] for i, a in sorted(build.aligned_inputs().items())],
            "buffers": buffers, "steps": steps, "copies": copies,
            "plan": sections.add("t", plan_text.encode("utf-8"))}


def _dtype(dtype: np.dtype) -> str:
    for d in DType:
        if d.np == dtype:
            return d.value
    raise ArtifactError(f"cannot save an array of dtype {dtype}")


def plan_text(exe: SymbolicNativeExecutable) -> str:
    """The kernel plan and launch sequence of a symbolic build, as text."""
    from tilefuse.kernel.plan_printer import print_plan

    build = exe._builder
    lines = [print_plan(build.plan).rstrip(), "", "launch sequence (every size):"]
    for i, pending in enumerate(build.pending):
        lines.append(f"  {i}: {pending.group.name} native: "
                     + ", ".join(k.fn.name for k in pending.kernels))
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------- decode (load)

def evaluate(formula: Any, sizes: Mapping[str, int], fail: Callable[[str], Exception],
             depth: int = 0) -> int:
    """A formula's value for one binding (``sizes`` by scalar name); ``fail(what)`` for a
    malformed one or a value out of range."""
    if depth > MAX_DEPTH:
        raise fail("a size formula nests too deep")
    if type(formula) is int:
        value = formula
    elif isinstance(formula, str):
        if formula not in sizes:
            raise fail(f"a size formula names an unknown symbol {formula!r}")
        value = sizes[formula]
    elif isinstance(formula, list) and len(formula) == 3 and formula[0] in _OPS:
        a = evaluate(formula[1], sizes, fail, depth + 1)
        b = evaluate(formula[2], sizes, fail, depth + 1)
        value = _OPS[formula[0]](a, b)
    else:
        raise fail(f"malformed size formula {str(formula)[:80]!r}")
    if not -MAX_SIZE <= value <= MAX_SIZE:
        raise fail(f"a size formula gives {value}")
    return value


class SymbolicProgram:
    """A loaded symbolic program: ``program(*arrays)`` binds the symbols from the arrays'
    shapes, builds (once per binding) the arena and launches of that binding, and runs.
    ``graph`` is the symbolic signature (its inputs and outputs)."""

    def __init__(self, decoder: Decoder, program: Mapping[str, Any],
                 launcher: tuple[int, object] | None):
        read = decoder.read
        self._read, self._decoder, self._launcher = read, decoder, launcher
        self.name = read.obj(program, "name", str, "program")
        where = f"symbolic program {self.name!r}"
        symbols = read.items(program, "symbolic", where)
        if not symbols or not all(isinstance(s, str) and s.isidentifier() for s in symbols) \
                or len(set(symbols)) != len(symbols):
            raise read.fail(f"{where}: bad symbols {symbols!r}")
        self.symbols = tuple(symbols)
        by_name = {s: Sym(s) for s in symbols}
        self.graph = Graph(self.name, tuple(self._value(v, by_name, f"{where} input {i}")
                                            for i, v in enumerate(read.items(program, "inputs",
                                                                             where))), (),
                           tuple(self._value(v, by_name, f"{where} output {j}")
                                 for j, v in enumerate(read.items(program, "outputs", where))))
        self._binders = [(i, axis, self.symbols.index(d.name))
                         for i, v in enumerate(self.graph.inputs)
                         for axis, d in enumerate(v.shape) if isinstance(d, Sym)]
        if {k for _, _, k in self._binders} != set(range(len(self.symbols))):
            raise read.fail(f"{where}: a symbol no input names")
        decoder.container.section(read.obj(program, "plan", str, where))
        self._program = program
        self._where = where
        self._sized: OrderedDict[tuple[int, ...], NativeExecutable] = OrderedDict()
        self._lock = threading.Lock()
        self.for_sizes(tuple(1 for _ in self.symbols))  # validates every field now

    def _value(self, data: Any, symbols: Mapping[str, Sym], where: str) -> Value:
        read = self._read
        if not isinstance(data, list) or len(data) != 3 or not isinstance(data[0], str) \
                or not isinstance(data[2], list) or len(data[2]) > 64:
            raise read.fail(f"{where}: bad signature entry {str(data)[:80]!r}")
        dims = []
        for d in data[2]:
            if isinstance(d, str) and d in symbols:
                dims.append(symbols[d])
            else:
                dims.append(read.count(d, where))
        return Value(TensorType(tuple(dims), read.dtype(data[1], where)), data[0])

    def __repr__(self) -> str:
        return (f"SymbolicProgram(@{self.name}: {', '.join(str(v.type) for v in self.graph.inputs)}"
                f"; {len(self._sized)} bindings prepared)")

    def accepts(self, arrays: Sequence[Any]) -> bool:
        """Whether ``arrays`` have this program's count, dtypes, ranks and static dims."""
        if len(arrays) != len(self.graph.inputs):
            return False
        return all(isinstance(a, np.ndarray) and a.dtype == v.dtype.np and a.ndim == v.type.rank
                   and all(not isinstance(d, int) or d == n for d, n in zip(v.shape, a.shape))
                   for a, v in zip(arrays, self.graph.inputs))

    def bind(self, arrays: Sequence[np.ndarray]) -> tuple[int, ...]:
        """Each symbol's size in this call (GuardError: the arrays do not fit, or one symbol
        meets two sizes)."""
        if not self.accepts(arrays):
            got = ", ".join(f"{a.dtype}{list(a.shape)}" if isinstance(a, np.ndarray)
                            else type(a).__name__ for a in arrays)
            want = ", ".join(str(v.type) for v in self.graph.inputs)
            raise GuardError(f"@{self.name} takes ({want}), got ({got})")
        sizes: list[int | None] = [None] * len(self.symbols)
        for i, axis, k in self._binders:
            n = arrays[i].shape[axis]
            if sizes[k] is None:
                sizes[k] = n
            elif sizes[k] != n:
                raise GuardError(f"@{self.name}: symbol {self.symbols[k]} must be one size in "
                                 f"every dim it names, got {sizes[k]} and {n}")
        return tuple(sizes)  # type: ignore[arg-type]

    def __call__(self, *arrays: np.ndarray) -> list[np.ndarray]:
        return self.for_sizes(self.bind(arrays))(*arrays)

    def for_sizes(self, sizes: tuple[int, ...]) -> NativeExecutable:
        """The executable of one binding (made on first sight, then kept)."""
        with self._lock:
            found = self._sized.get(sizes)
            if found is None:
                found = self._make(dict(zip(self.symbols, sizes)))
                self._sized[sizes] = found
                while len(self._sized) > MAX_BINDINGS:
                    self._sized.popitem(last=False)
            else:
                self._sized.move_to_end(sizes)
            return found

    def _make(self, binding: Mapping[str, int]) -> NativeExecutable:
        read, program, where = self._read, self._program, self._where
        scalars = {SCALAR_PREFIX + s: n for s, n in binding.items()}

        def size(formula: Any, at: str) -> int:
            value = evaluate(formula, scalars, lambda what: read.fail(f"{at}: {what}"))
            if value < 0:
                raise read.fail(f"{at}: a size formula gives {value} for {dict(binding)}")
            return value

        specs = []
        for r, spec in enumerate(read.items(program, "buffers", where)):
            at = f"{where} buffer {r}"
            name = read.obj(spec, "name", str, at)
            dtype = read.dtype(read.obj(spec, "dtype", str, at), at).np
            shape = tuple(size(d, at) for d in read.items(spec, "shape", at))
            nbytes = size(read.obj(spec, "nbytes", (int, str, list), at), at)
            if math.prod(shape) * dtype.itemsize != nbytes:
                raise read.fail(f"{at}: {nbytes} bytes for a {dtype}{list(shape)} buffer")
            steps = len(read.items(program, "steps", where))
            first = read.count(read.obj(spec, "first", int, at), at, steps)
            last = read.count(read.obj(spec, "last", int, at), at, steps)
            specs.append((BufferRequest(f"{r}:{name}", nbytes, first, max(first, last)),
                          dtype, shape))
        try:
            memory = plan_memory([request for request, _, _ in specs])
        except Exception as err:
            raise read.fail(f"{where}: {err}") from None
        try:
            arena = aligned_empty(max(memory.arena_bytes, 1), np.uint8)
        except MemoryError:
            raise GuardError(f"@{self.name}: out of memory allocating the "
                             f"{memory.arena_bytes}-byte arena for {dict(binding)}") from None
        views = []
        for request, dtype, shape in specs:
            at = memory.offsets[request.name]
            views.append(arena[at:at + request.nbytes].view(dtype).reshape(shape))
        inputs = tuple(Value(TensorType(self._bound(v, binding), v.dtype), v.name)
                       for v in self.graph.inputs)
        outputs = tuple(Value(TensorType(self._bound(v, binding), v.dtype))
                        for v in self.graph.outputs)
        io_count = len(inputs) + len(outputs)

        def slot(data: Any, at: str) -> Any:
            if isinstance(data, list) and len(data) == 2 and data[0] == "buf":
                return views[read.count(data[1], at, len(views))]
            if isinstance(data, list) and len(data) == 2 and data[0] == "io":
                return read.count(data[1], at, io_count)
            if isinstance(data, list) and len(data) == 2 and data[0] == "const":
                return self._decoder.constant(data[1], at)
            raise read.fail(f"{at}: bad slot {str(data)[:80]!r}")

        steps = []
        for s, step in enumerate(read.items(program, "steps", where)):
            at = f"{where} step {s}"
            launches = []
            for k, launch in enumerate(read.items(step, "launches", at)):
                here = f"{at} launch {k}"
                kernel = self._decoder.kernel(read.obj(launch, "kernel", int, here), here)
                args = [slot(a, here) for a in read.items(launch, "args", here)]
                names = read.items(launch, "scalars", here)
                if not all(isinstance(n, str) and n in scalars for n in names) or \
                        len(args) != len(kernel.signature.buffers) or \
                        len(names) != len(kernel.signature.scalars):
                    raise read.fail(f"{here}: arguments do not match kernel {kernel.name}")
                try:
                    launches.append(KernelLaunch(kernel, args, [scalars[n] for n in names]))
                except Exception as err:
                    raise read.fail(f"{here}: {err}") from None
            steps.append(NativeStep(str(read.obj(step, "native", str, at)), tuple(launches)))
        copies = []
        for c in read.items(program, "copies", where):
            if not isinstance(c, list) or len(c) != 2:
                raise read.fail(f"{where}: bad copy {str(c)[:80]!r}")
            j = read.count(c[0], f"{where} copy", len(outputs))
            copies.append((j, slot(c[1], f"{where} copy {j}")))
        for j, copied in copies:
            if not isinstance(copied, int) and (copied.shape != tuple(outputs[j].shape)
                                                or copied.dtype != outputs[j].dtype.np):
                raise read.fail(f"{where}: output {j} copied from a {copied.dtype}"
                                f"{list(copied.shape)} buffer")
        align = {}
        for a in read.items(program, "align", where):
            if not isinstance(a, list) or len(a) != 2:
                raise read.fail(f"{where}: bad alignment {str(a)[:80]!r}")
            align[read.count(a[0], "align", len(inputs))] = read.count(a[1], "align", 4097)
        graph = Graph(self.name, inputs, (), outputs)
        parts = ExecutableParts(graph, memory, arena, tuple(steps), align, tuple(copies))
        runs = None
        if self._launcher is not None and steps:
            from tilefuse.artifact.launcher import SequenceLauncher

            runs = SequenceLauncher(*self._launcher, steps, io_count)
        return NativeExecutable.from_parts(parts, runs)

    @staticmethod
    def _bound(value: Value, binding: Mapping[str, int]) -> tuple[int, ...]:
        return tuple(binding[d.name] if isinstance(d, Sym) else d for d in value.shape)


__all__ = ["MAX_BINDINGS", "SymbolicProgram", "encode_symbolic", "evaluate", "plan_text",
           "savable"]
