"""The native CPU executable: kernel groups compiled to machine code, one arena, a launch list.

Building one (:class:`NativeExecutable`) runs, once per graph:

1. take the kernel plan (decomposed composites, kernel groups) from the compile driver
   (:func:`tilefuse.driver.plan_kernels`; :func:`tilefuse.driver.build` passes it in);
2. evaluate the constants, and fold groups whose inputs are all constants (run with the
   references, kept as arrays);
3. give each group its default schedule and lower it: matmul groups with
   :func:`~tilefuse.kernel.lower_matmul.lower_matmul` (a constant B, and a B computed from
   constants by a prologue, packed here once), elementwise and row-reduction groups with
   :func:`~tilefuse.kernel.lower_elementwise.lower_group`; compile every kernel through the
   disk cache (:mod:`tilefuse.runtime.kernel_cache`: a kernel compiled before, by any process,
   is loaded without running LLVM; ``TILEFUSE_CACHE=0`` turns that off);
4. groups with no native lowering (movement, opaque, plain reductions, or a lowering that raised
   CompileError) become host steps that run the ops' NumPy references. Each is a defect, logged
   at WARNING on the ``fallback`` topic with its reason (once per kernel of a build), marked in
   the plan dump and in ``tilefuse explain``: nothing falls back silently;
5. place the intermediates (and scratch buffers such as a packed B) in one 64-byte aligned
   arena, from their liveness over the launch sequence (greedy best fit).

A call checks its inputs (count, dtype, shape, C order, alignment where a kernel needs it:
GuardError) before any native code runs, allocates the outputs (64-byte aligned), runs the
steps and returns the outputs: fresh arrays, never views of the arena, the inputs, the constants
or each other. Calls are serialised by a lock (the arena is shared).
"""

from __future__ import annotations

import dataclasses
import math
import sys
import threading
from collections import ChainMap
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from tilefuse.codegen.jit import CompiledKernel, KernelSignature, aligned_empty
from tilefuse.codegen.launcher import CompiledLauncher
from tilefuse.codegen.target import CpuTarget, host_target
from tilefuse.driver import plan_kernels
from tilefuse.dump import DumpWriter
from tilefuse.errors import CompileError, GuardError, TilefuseError
from tilefuse.graph.interpreter import run_node
from tilefuse.graph.ir import Graph, Node, Value
from tilefuse.graph.types import Sym, is_static
from tilefuse.kernel.access import (
    SCALAR_PREFIX,
    extent_value,
    kernel_buffers,
    symbol_broadcast,
)
from tilefuse.kernel.expr_printer import format_group_expr
from tilefuse.kernel.fusion import (
    KernelGroup,
    KernelKind,
    KernelPlan,
    is_pointwise,
)
from tilefuse.kernel.lower_attention import lower_attention
from tilefuse.kernel.lower_elementwise import lower_elementwise, lower_group
from tilefuse.kernel.lower_gather import INDEX_ERROR, index_error, is_gather_group, lower_gather
from tilefuse.kernel.lower_matmul import lower_matmul, matmul_node, operand_cone
from tilefuse.kernel.lower_movement import lower_movement
from tilefuse.kernel.lower_pool import is_pool_group, lower_pool
from tilefuse.kernel.lower_qmatmul import compile_ir, is_quant_group, lower_quant_group
from tilefuse.kernel.lower_reduce import is_reduce_group, lower_reduce
from tilefuse.kernel.lower_scan import is_scan_group, lower_scan
from tilefuse.kernel.plan_printer import print_plan, value_names
from tilefuse.kernel.schedule import Schedule, as_cpu_target, default_schedule
from tilefuse.log import get_logger
from tilefuse.loop.ir import Expr, LoopFunction
from tilefuse.passes.quantize import quantization_summary
from tilefuse.progress import BuildProgress
from tilefuse.runtime.addresses import AddressCache
from tilefuse.runtime.kernel_cache import KernelArtifact, KernelCache, KernelCacheStats
from tilefuse.runtime.launch import HostStep, KernelLaunch, NativeStep, Slot, Step
from tilefuse.runtime.memory import BufferRequest, MemoryPlan, plan_memory
from tilefuse.runtime.schedules import ScheduleSource

if TYPE_CHECKING:
    from tilefuse.runtime.native_symbolic import SymbolicNativeExecutable

NATIVE_KINDS = frozenset({KernelKind.CONTRACTION, KernelKind.ELEMENTWISE,
                          KernelKind.ROW_REDUCTION, KernelKind.MOVEMENT, KernelKind.ATTENTION})
SYMBOLIC_KINDS = frozenset({KernelKind.ELEMENTWISE, KernelKind.ROW_REDUCTION,
                            KernelKind.CONTRACTION, KernelKind.MOVEMENT, KernelKind.ATTENTION})
"""Kinds whose lowering takes symbolic dims as runtime extents (the others, in a symbolic
build, are specialised per size binding: :mod:`tilefuse.runtime.native_symbolic`)."""


def _remap_chain(group: KernelGroup) -> bool:
    """A movement group that is a chain of index remaps (reshape + transpose): lowered as one
    copy loop by the elementwise lowering (runtime extents included)."""
    return group.kind is KernelKind.MOVEMENT and len(group.nodes) > 1 \
        and all(is_pointwise(n) for n in group.nodes)


def _group_static(group: KernelGroup) -> bool:
    return all(is_static(v.shape) for v in [*group.inputs, *group.outputs,
                                            *(o for n in group.nodes for o in n.outputs)])


@dataclass(frozen=True)
class Scratch:
    """A buffer one step needs only while it runs (a packed B): ``nbytes`` in the arena."""

    name: str
    nbytes: int | Expr  # an Expr over the kernels' runtime extents in a symbolic build
    dtype: np.dtype


Binding = Value | Scratch | np.ndarray  # what one kernel buffer argument holds


@dataclass(frozen=True)
class _Kernel:
    fn: LoopFunction
    artifact: KernelArtifact
    bindings: Mapping[str, Binding]

    @property
    def compiled(self) -> CompiledKernel:
        return self.artifact.kernel


@dataclass
class _Pending:
    """A group before buffers are placed: its kernels, or the reason it runs on the host."""

    group: KernelGroup
    schedule: Schedule | None = None
    kernels: list[_Kernel] = field(default_factory=list)
    reason: str | None = None
    per_size: str | None = None
    """Symbolic builds: why this group's kernels are built per size binding (None: built
    once, with runtime extents)."""
    host: KernelGroup | None = None
    """Symbolic builds: the group specialised to one size binding, whose nodes a host
    fallback runs (``group``'s own nodes may hold symbols in their attributes)."""
    checks: list[tuple[np.ndarray, Node]] = field(default_factory=list)
    """Bad-index records (:data:`~tilefuse.kernel.lower_gather.INDEX_ERROR`) of its kernels
    and the node each belongs to: checked after every call."""

    def scratch(self) -> list[Scratch]:
        found = (b for k in self.kernels for b in k.bindings.values() if isinstance(b, Scratch))
        return list(dict.fromkeys(found))


Sizes = Mapping[Sym, int]
"""A symbolic build's size binding (empty for a static build)."""


def bound_shape(value: Value, sizes: Sizes) -> tuple[int, ...]:
    """``value``'s shape with its symbols replaced by their sizes."""
    return tuple(sizes[d] if isinstance(d, Sym) else d for d in value.shape)


def _nbytes(value: Value, sizes: Sizes = {}) -> int:  # noqa: B006 (read only)
    return math.prod(bound_shape(value, sizes)) * value.dtype.itemsize


def prepare_graph(graph: Graph) -> Graph:
    """The graph kernel formation sees in a CPU build (the compile driver's
    :func:`~tilefuse.driver.prepare`)."""
    from tilefuse.driver import prepare

    return prepare(graph, "cpu")


class _Builder:
    """Everything :class:`NativeExecutable` does once: plan, lower, compile, place buffers."""

    def __init__(self, graph: Graph, target: CpuTarget, cache: KernelCache,
                 schedules: ScheduleSource | None = None, *, symbolic: bool = False,
                 plan: KernelPlan | None = None):
        """``symbolic``: the graph may have symbolic dims; groups whose kind lowers with runtime
        extents are lowered once, the others are left for :meth:`lower` per size binding.
        ``plan``: the driver's kernel plan of ``graph`` (made here, by the driver's stage,
        when None)."""
        for v in [*graph.inputs, *(o for n in graph.nodes for o in n.outputs)]:
            if not symbolic and not is_static(v.shape):
                raise CompileError(f"the native executable needs static shapes, got {v.type}")
        self.target = target
        self.cache = cache
        self.schedules = schedules or ScheduleSource(target)
        self.plan: KernelPlan = plan if plan is not None else plan_kernels(graph)
        self.graph = self.plan.graph
        self.names = value_names(self.graph)
        self.log = get_logger("fallback")
        self.constants: dict[Value, np.ndarray] = {  # literals as they are: only read
            node.output: node.attrs["value"].array
            for node in self.graph.nodes if node.op.name == "constant"}
        self.pending: list[_Pending] = []
        with BuildProgress(self.graph.name, len(self.plan.groups)) as progress:
            for group in self.plan.groups:
                if all(v in self.constants for v in group.inputs):
                    self.evaluate(group.nodes)
                elif symbolic and not _group_static(group):
                    self.pending.append(self.lower_symbolic(group))
                else:
                    self.pending.append(self.lower(group))
                progress.step()

    def evaluate(self, nodes: Sequence[Node]) -> dict[Value, np.ndarray]:
        """Runs ``nodes`` (whose inputs are constants) now; their outputs become constants."""
        made: dict[Value, np.ndarray] = {}
        env = ChainMap(made, self.constants)
        for node in nodes:
            outs = run_node(node, [env[v] for v in node.inputs])
            made.update(zip(node.outputs, (np.require(o, requirements="C") for o in outs)))
        self.constants.update(made)
        return made

    # ---------------------------------------------------------------- lowering
    def lower(self, group: KernelGroup) -> _Pending:
        pending = _Pending(group)
        if is_quant_group(group):
            return self.lower_quant(pending)
        if group.kind not in NATIVE_KINDS and not is_pool_group(group) \
                and not is_reduce_group(group) and not is_gather_group(group) \
                and not is_scan_group(group):
            return self.fall_back(pending, f"no native lowering for {group.kind.value} "
                                  "kernels yet")
        try:
            pending.schedule = self.schedules.schedule(group, self.constants)
            if group.kind is KernelKind.CONTRACTION:
                made = self.lower_contraction(group, pending.schedule)
            elif group.kind is KernelKind.ATTENTION:
                made = self.lower_attention(group, pending.schedule)
            else:
                made = [self.lower_generic(group, pending.schedule)]
            for fn, bindings in made:  # a gather's bad-index record: an array of its own
                if any(b.name == INDEX_ERROR for b in fn.buffers):
                    bindings[INDEX_ERROR] = flags = np.zeros(2, np.int64)
                    pending.checks.append((flags, group.nodes[0]))
            pending.kernels = [
                _Kernel(fn, self.cache.compile(fn, pending.schedule,
                                               f"{self.graph.name}/{fn.name}"), bindings)
                for fn, bindings in made]
        except CompileError as err:
            return self.fall_back(pending, f"{group.kind.value} lowering failed: {err}")
        return pending

    @staticmethod
    def lower_generic(group: KernelGroup, schedule: Schedule
                      ) -> tuple[LoopFunction, dict[str, Binding]]:
        """An elementwise, row-reduction or movement group: its buffers are named by
        :func:`~tilefuse.kernel.access.kernel_buffers` (inputs, then outputs)."""
        if is_pool_group(group):
            fn = lower_pool(group, schedule)
        elif _remap_chain(group):
            # A chain of index remaps (reshape + transpose after an im2col matmul): one copy
            # loop, which the elementwise lowering emits with the remaps as index arithmetic.
            fn = lower_elementwise(group, default_schedule(
                dataclasses.replace(group, kind=KernelKind.ELEMENTWISE), host_target()))
        elif is_gather_group(group):
            fn = lower_gather(group, schedule)
        elif is_scan_group(group):
            fn = lower_scan(group, schedule)
        elif group.kind is KernelKind.MOVEMENT:
            fn = lower_movement(group, schedule)
        elif is_reduce_group(group):
            fn = lower_reduce(group, schedule)
        else:
            fn = lower_group(group, schedule)
        buffers = kernel_buffers(group.inputs, group.outputs)
        bindings: dict[str, Binding] = {p.name: v for v, p in [*buffers.inputs.items(),
                                                               *buffers.outputs.items()]}
        unknown = [b.name for b in fn.buffers if b.name not in bindings and
                   b.name != INDEX_ERROR]
        if unknown:
            raise CompileError(f"kernel {fn.name} has buffers no group value is bound to: "
                               f"{', '.join(unknown)}")
        return fn, bindings

    def lower_symbolic(self, group: KernelGroup) -> _Pending:
        """A group with symbolic dims: lowered once with runtime extents when its kind
        supports them, else marked for a per-size build (``per_size`` says why)."""
        pending = _Pending(group)
        pending.per_size = symbol_broadcast(group.nodes)
        if group.kind not in SYMBOLIC_KINDS or is_pool_group(group) or (
                group.kind is KernelKind.MOVEMENT and not _remap_chain(group)):
            pending.per_size = f"{group.kind.value} kernels take static extents only"
        if pending.per_size is not None:
            return pending
        try:
            pending.schedule = self.schedules.schedule(group, self.constants)
            if group.kind is KernelKind.ATTENTION:
                made = self.lower_attention(group, pending.schedule)
            elif group.kind is KernelKind.CONTRACTION:
                made = self.lower_contraction(group, pending.schedule)
            else:
                made = [self.lower_generic(group, pending.schedule)]
        except (CompileError, TypeError) as err:
            # TypeError: the lowering compared a runtime extent with a number (not supported)
            pending.per_size = f"no runtime-extent lowering: {err}"
            return pending
        pending.kernels = [_Kernel(fn, self.cache.compile(fn, pending.schedule,
                                                          f"{self.graph.name}/{fn.name}"),
                                   bindings) for fn, bindings in made]
        return pending

    def fall_back(self, pending: _Pending, reason: str) -> _Pending:
        group = pending.group
        ops = ", ".join(dict.fromkeys(n.op.name for n in group.nodes))
        pending.reason, pending.kernels = reason, []
        # A host step is a defect (issue 28): said at WARNING, once per kernel of a build.
        self.log.warning("@%s: kernel %s (%s) runs on the host with the NumPy references: %s",
                         self.graph.name, group.name, ops, reason)
        return pending

    def lower_contraction(self, group: KernelGroup, schedule: Schedule
                          ) -> list[tuple[LoopFunction, dict[str, Binding]]]:
        """A matmul group; B known now (a constant, or a prologue over constants) is packed
        once here."""
        b_value = matmul_node(group).inputs[1]
        cone, reads = operand_cone(group, b_value)
        b_array = None
        if all(v in self.constants for v in reads):
            b_array = self.constants.get(b_value)
            if b_array is None:
                b_array = self.evaluate(cone)[b_value]
        lowered = lower_matmul(group, schedule, constant_b=b_array is not None)
        bindings: dict[str, Binding] = dict(lowered.bindings)
        dtype = matmul_node(group).output.dtype.np
        for name, nbytes in lowered.scratch.items():
            bindings[name] = Scratch(f"{group.name}.{name}", nbytes, dtype)
        if lowered.constant_b is not None:
            bindings[lowered.constant_b] = lowered.prepare_b(b_array)
        return [(fn, bindings) for fn in lowered.functions]

    def lower_quant(self, pending: _Pending) -> _Pending:
        """A quantized product (``qmatmul_i8``, ``matmul_w4``): hand-written IR kernels whose
        weights are packed here once (:mod:`tilefuse.kernel.lower_qmatmul`)."""
        group = pending.group
        artifacts: dict[str, KernelArtifact] = {}

        def compiler(text: str, signature: KernelSignature) -> CompiledKernel:
            artifact = self.cache.compile_ir(
                text, signature, f"{self.graph.name}/{signature.name}",
                lambda: compile_ir(text, signature, self.target))
            artifacts[signature.name] = artifact
            return artifact.kernel

        try:
            made = lower_quant_group(group, self.constants, self.target, compiler)
        except CompileError as err:
            return self.fall_back(pending, f"quantized lowering failed: {err}")
        node = group.nodes[0]
        bindings: dict[str, Binding] = dict(made.constants)
        bindings.update({name: node.inputs[i] for name, i in made.inputs.items()})
        bindings.update({name: node.outputs[i] for name, i in made.outputs.items()})
        for name, (nbytes, dtype) in made.scratch.items():
            bindings[name] = Scratch(f"{group.name}.{name}", nbytes, dtype)
        artifact = artifacts.get(made.fn.name) or KernelArtifact(made.kernel, made.ir)
        pending.kernels = [_Kernel(made.fn, artifact, bindings)]
        return pending

    def lower_attention(self, group: KernelGroup, schedule: Schedule
                        ) -> list[tuple[LoopFunction, dict[str, Binding]]]:
        """An attention group: its prep and main kernels and their per-step scratch (linear in
        the sequence; no Sq × Sk buffer)."""
        lowered = lower_attention(group, schedule, as_cpu_target(self.target).cores)
        bindings: dict[str, Binding] = dict(lowered.bindings)
        dtype = group.outputs[0].dtype.np
        for name, nbytes in lowered.scratch.items():
            bindings[name] = Scratch(f"{group.name}.{name}", nbytes, dtype)
        return [(fn, bindings) for fn in lowered.functions]

    # ---------------------------------------------------------------- buffers
    def place(self, pendings: Sequence[_Pending] | None = None, sizes: Sizes = {}  # noqa: B006
              ) -> tuple[MemoryPlan, dict[object, Slot], np.ndarray]:
        """Slots for every value and scratch buffer: graph inputs and outputs index the call's
        table, constants are themselves, the rest are views into one planned arena (sized for
        the binding ``sizes`` in a symbolic build)."""
        graph = self.graph
        slots: dict[object, Slot] = {}
        for i, v in enumerate(graph.inputs):
            slots.setdefault(v, i)
        slots.update(self.constants)
        for j, v in enumerate(graph.outputs):
            slots.setdefault(v, len(graph.inputs) + j)
        requests, keys = self.requests(slots, pendings, sizes)
        memory = plan_memory(requests)
        try:
            arena = aligned_empty(max(memory.arena_bytes, 1), np.uint8)
        except MemoryError:
            raise CompileError(f"@{self.graph.name}: out of memory allocating the "
                               f"{memory.arena_bytes}-byte arena of intermediates") from None
        for request in requests:
            key, shape, dtype = keys[request.name]
            offset = memory.offsets[request.name]
            slots[key] = arena[offset:offset + request.nbytes].view(dtype).reshape(shape)
        return memory, slots, arena

    def requests(self, slots: Mapping[object, Slot], pendings: Sequence[_Pending] | None = None,
                 sizes: Sizes = {}  # noqa: B006 (read only)
                 ) -> tuple[list[BufferRequest], dict[str, tuple[object, tuple, np.dtype]]]:
        """Arena requests for the intermediates (live from the step writing them to their last
        reader) and each step's scratch buffers (live during that step)."""
        pendings = self.pending if pendings is None else pendings
        scalars = {SCALAR_PREFIX + s.name: n for s, n in sizes.items()}
        last_use: dict[Value, int] = {}
        for step, pending in enumerate(pendings):
            last_use.update(dict.fromkeys(pending.group.inputs, step))
        requests: list[BufferRequest] = []
        keys: dict[str, tuple[object, tuple, np.dtype]] = {}
        for step, pending in enumerate(pendings):
            for v in pending.group.outputs:
                if v not in slots:
                    name = self.names[v]
                    requests.append(BufferRequest(name, _nbytes(v, sizes), step,
                                                  max(step, last_use.get(v, step))))
                    keys[name] = (v, bound_shape(v, sizes), v.dtype.np)
            for scratch in pending.scratch():
                nbytes = extent_value(scratch.nbytes, scalars)
                requests.append(BufferRequest(scratch.name, nbytes, step, step))
                count = nbytes // scratch.dtype.itemsize
                keys[scratch.name] = (scratch, (count,), scratch.dtype)
        return requests, keys

    def steps(self, slots: Mapping[object, Slot], pendings: Sequence[_Pending] | None = None,
              sizes: Sizes = {}) -> list[Step]:  # noqa: B006 (read only)
        made: list[Step] = []
        by_name = {SCALAR_PREFIX + s.name: n for s, n in sizes.items()}
        for pending in self.pending if pendings is None else pendings:
            group = pending.group
            if pending.reason is not None:
                host = pending.host or group
                made.append(HostStep(group.name, host.nodes,
                                     {h: slots[v] for v, h in zip(group.inputs, host.inputs)},
                                     {h: slots[v] for v, h in zip(group.outputs, host.outputs)},
                                     pending.reason))
                continue
            launches = []
            for kernel in pending.kernels:
                args = [_slot(kernel.bindings[b.name], slots) for b in kernel.fn.buffers]
                launches.append(KernelLaunch(kernel.compiled, args,
                                             [by_name[name] for name in kernel.fn.scalars]))
            made.append(NativeStep(group.name, tuple(launches)))
        return made

    def aligned_inputs(self, pendings: Sequence[_Pending] | None = None) -> dict[int, int]:
        """Graph input position -> the alignment some kernel declares for it."""
        need: dict[int, int] = {}
        position = {v: i for i, v in enumerate(self.graph.inputs)}
        for pending in self.pending if pendings is None else pendings:
            for kernel in pending.kernels:
                for b in kernel.fn.buffers:
                    value = kernel.bindings[b.name]
                    if b.align and isinstance(value, Value) and value in position:
                        i = position[value]
                        need[i] = max(need.get(i, 1), b.align)
        return need

    # ---------------------------------------------------------------- dumps
    def dump(self, directory: Path | str, memory: MemoryPlan) -> None:
        """``kernels.plan`` (groups, launch sequence with host fallbacks marked, memory plan),
        per group its tensor expression ``kernels/<group>.expr`` and, per compiled kernel,
        ``kernels/<name>.{schedule.json,loop,ll,s}``."""
        writer = DumpWriter(directory)
        lines = [print_plan(self.plan).rstrip(), "", "launch sequence:"]
        for step, pending in enumerate(self.pending):
            group = pending.group
            if pending.reason is not None:
                ops = ", ".join(n.op.name for n in group.nodes)
                lines.append(f"  {step}: {group.name} HOST FALLBACK ({ops}): {pending.reason}")
            else:
                names = ", ".join(k.fn.name + _origin(k.artifact) for k in pending.kernels)
                tuned = self.schedules.tuned.get(group.name)
                origin = f" tuned, {tuned * 1e3:.3f} ms measured" if tuned is not None else ""
                lines.append(f"  {step}: {group.name} native: {names}  [{pending.schedule}]"
                             + origin)
        quantized = quantization_summary(self.graph)
        if quantized.kernels:
            lines += ["", f"quantization: {quantized}"]
        lines += ["", f"constants: {len(self.constants)} arrays evaluated at build time", "",
                  "memory plan: " + memory.report()]
        writer.write("kernels.plan", "\n".join(lines))
        names = value_names(self.plan.graph)
        for pending in self.pending:
            group = pending.group
            writer.write(f"kernels/{group.name}.expr", format_group_expr(group, names))
            for kernel in pending.kernels:
                _dump_kernel(writer, kernel, pending.schedule)


def _dump_kernel(writer: DumpWriter, kernel: _Kernel, schedule: Schedule | None) -> None:
    """``kernels/<name>.{schedule.json,loop,ll,s}``; a kernel loaded from the disk cache shows
    the optimised IR stored with its object code, under a comment saying so."""
    base = f"kernels/{kernel.fn.name}"
    if schedule is not None:
        writer.write(f"{base}.schedule.json", schedule.to_json(indent=2) + "\n")
    writer.write(f"{base}.loop", str(kernel.fn))
    artifact = kernel.artifact
    writer.write(f"{base}.ll", _cache_note(artifact, ";", "the optimised LLVM IR stored with it")
                 + artifact.llvm_ir)
    writer.write(f"{base}.s", _cache_note(artifact, "#", "the assembly LLVM emits from the "
                                          "optimised IR stored with it") + artifact.assembly())


def _origin(artifact: KernelArtifact) -> str:
    """Where a kernel's running code came from, for ``kernels.plan``."""
    if artifact.shared_with is not None:
        return f" (the code of {artifact.shared_with})"
    return " (from the disk cache)" if artifact.entry else ""


def _cache_note(artifact: KernelArtifact, comment: str, what: str) -> str:
    """First comment lines for the dump of a kernel that runs another kernel's code or was
    loaded from the disk cache (none for one compiled now): where the running code came from,
    and what the dumped text is."""
    note = ""
    if artifact.shared_with is not None:
        note = (f"{comment} tilefuse: this kernel's loop IR is {artifact.shared_with}'s but for "
                f"the name, so it runs {artifact.shared_with}'s machine code (its symbols below)\n")
    if artifact.entry is None:
        return note
    return note + (f"{comment} tilefuse: this kernel's machine code was loaded from the disk "
                   f"cache entry {artifact.entry}; below is {what}\n")


def _slot(binding: Binding, slots: Mapping[object, Slot]) -> Slot:
    return binding if isinstance(binding, np.ndarray) else slots[binding]


@dataclass(frozen=True)
class ExecutableParts:
    """A built executable's parts: ``graph`` (its inputs and outputs give the call's
    signature), the memory plan and the arena it placed, the launch sequence (whose fixed slots
    are constants or views of ``arena``), input position -> alignment a kernel needs, and
    (output position, slot) for every output copied out after the steps."""

    graph: Graph
    memory_plan: MemoryPlan
    arena: np.ndarray
    steps: tuple[Step, ...]
    align: Mapping[int, int]
    copies: tuple[tuple[int, Slot], ...]


class NativeExecutable:
    """A graph compiled for this CPU (see the module docstring). ``executable(*arrays)``
    returns one fresh array per graph output.

    ``cache`` compiles the kernels (default: :meth:`KernelCache.from_env`, the disk cache the
    environment asks for); ``cache_stats`` says how many were loaded from disk (hits), compiled
    (misses) and stored. ``schedules`` picks each kernel's schedule (default: the tuning
    database, else the default rule; the fuzzer passes one that samples the search space)."""

    def __init__(self, graph: Graph, dump_dir: Path | str | None = None, *,
                 target: CpuTarget | None = None, cache: KernelCache | None = None,
                 schedules: ScheduleSource | None = None, plan: KernelPlan | None = None):
        target = target or host_target()
        build = _Builder(graph, target, cache or KernelCache.from_env(target), schedules,
                         plan=plan)
        self._assemble(graph, build, build.pending, {})
        if dump_dir is not None:
            build.dump(dump_dir, self.memory_plan)

    @classmethod
    def for_sizes(cls, graph: Graph, build: _Builder, pendings: Sequence[_Pending],
                  sizes: Sizes) -> NativeExecutable:
        """The executable of a symbolic build for one size binding: ``graph`` is the graph
        specialised to ``sizes`` (its guard checks those shapes), ``pendings`` the build's
        groups with the per-size ones lowered for ``sizes``. Only the arena, the launches and
        the launcher are made here; the runtime-extent kernels are shared."""
        made = cls.__new__(cls)
        made._assemble(graph, build, pendings, sizes)
        return made

    def _assemble(self, graph: Graph, build: _Builder, pendings: Sequence[_Pending],
                  sizes: Sizes) -> None:
        self.graph = graph
        self.cache_stats: KernelCacheStats = build.cache.stats
        """How many kernels were loaded from the disk cache, compiled, stored."""
        self.memory_plan, slots, self._arena = build.place(pendings, sizes)
        self._steps = tuple(build.steps(slots, pendings, sizes))
        self._align = build.aligned_inputs(pendings)
        first = len(graph.inputs)
        self._copies = tuple((j, slots[v]) for j, v in enumerate(build.graph.outputs)
                             if not _is_index(slots[v], first + j))
        self.kernel_plan: KernelPlan | None = build.plan
        """The kernel plan this executable was built from (None: loaded from an artifact)."""
        self._finish(_launcher(self._steps, len(graph.inputs) + len(graph.outputs),
                               graph.name))
        # gathers' bad-index records, checked after each call (kernel/lower_gather.py)
        self._index_checks = tuple(c for p in pendings for c in p.checks)

    def parts(self) -> ExecutableParts:
        """What :meth:`from_parts` rebuilds this executable from (for :mod:`tilefuse.artifact`,
        which writes them to a file)."""
        return ExecutableParts(self.graph, self.memory_plan, self._arena, self._steps,
                               dict(self._align), self._copies)

    @classmethod
    def from_parts(cls, parts: ExecutableParts, launcher: Callable[[Sequence[int]], None]
                   | None = None) -> NativeExecutable:
        """An executable of already compiled kernels, placed buffers and a launch sequence (an
        artifact being loaded): nothing is lowered or compiled here. ``launcher``, when given,
        runs the whole (all-native) sequence from the call's addresses; else each step is
        called in turn."""
        made = cls.__new__(cls)
        made.graph = parts.graph
        made.cache_stats = KernelCacheStats(0, 0, 0, None)
        made.kernel_plan = None
        made.memory_plan, made._arena = parts.memory_plan, parts.arena
        made._steps, made._align = tuple(parts.steps), dict(parts.align)
        made._copies = tuple(parts.copies)
        made._finish(launcher)
        return made

    def _finish(self, launcher: Callable[[Sequence[int]], None] | None) -> None:
        """The call's tables, from the graph's signature and the steps."""
        graph = self.graph
        self._inputs = tuple((v.name or f"#{i}", tuple(v.shape), v.dtype.np)
                             for i, v in enumerate(graph.inputs))
        self._outputs = tuple((tuple(v.shape), v.dtype.np) for v in graph.outputs)
        self._addresses = AddressCache(len(graph.inputs))   # the inputs' last data addresses
        self._returned: list[np.ndarray | None] = [None] * len(self._outputs)
        self._returned_at: list[int] = [0] * len(self._outputs)   # their data addresses
        self._strides = tuple(_c_strides(shape, np.dtype(dtype).itemsize)
                              for _, shape, dtype in self._inputs)
        # Native steps take the call's buffers by address (computed once per call); host
        # fallbacks take the arrays.
        self._runners = tuple((step.run_addresses, True) if isinstance(step, NativeStep)
                              else (step.run, False) for step in self._steps)
        # With no host step, the whole sequence is one native entry (one Python→native call).
        self._launcher = launcher
        self._index_checks: tuple[tuple[np.ndarray, Node], ...] = ()
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        native = sum(isinstance(s, NativeStep) for s in self._steps)
        return (f"NativeExecutable(@{self.graph.name}: {native} native steps, "
                f"{len(self._steps) - native} host steps, arena {self.memory_plan.arena_bytes} "
                "bytes)")

    @property
    def single_entry(self) -> bool:
        """True when a call runs the whole launch sequence through one native entry."""
        return self._launcher is not None

    @property
    def steps(self) -> tuple[Step, ...]:
        """The launch sequence."""
        return self._steps

    @property
    def fallbacks(self) -> list[tuple[str, str]]:
        """(kernel name, reason) of every step that runs on the host."""
        return [(s.name, s.reason) for s in self._steps if isinstance(s, HostStep)]

    @property
    def arena(self) -> np.ndarray:
        """The intermediates' buffer (a read-only view, for tests and tools)."""
        view = self._arena.view()
        view.flags.writeable = False
        return view

    def __call__(self, *arrays: np.ndarray) -> list[np.ndarray]:
        self._check(arrays)
        return self._run(arrays)

    def run_trusted(self, arrays: Sequence[np.ndarray]) -> list[np.ndarray]:
        """The call for a caller whose own guard already proved count, dtypes, shapes and
        C-contiguity (``tilefuse.jit``: its cache key holds the shapes and dtypes, and it makes
        every argument contiguous); only alignment, which no key holds, is checked here."""
        addresses = self._addresses.addresses(arrays)
        for i, align in self._align.items():
            if addresses[i] % align:
                raise GuardError(f"input {self._inputs[i][0]} must be {align}-byte aligned")
        return self._run(arrays, addresses)

    def run_args(self, args: Sequence[object]) -> list[np.ndarray]:
        """The call for ``tilefuse.jit``'s fast path: its cache key proved count, dtypes and
        shapes of ``args`` (arrays, or what NumPy makes arrays of); contiguity (a copy where
        needed) and alignment are checked here, in the same pass that reads the addresses."""
        arrays, addresses = self._addresses.contiguous(args)
        if self._align:
            for i, align in self._align.items():
                if addresses[i] % align:
                    raise GuardError(f"input {self._inputs[i][0]} must be {align}-byte aligned")
        launcher = self._launcher
        if launcher is None or self._copies or self._index_checks:
            return self._run(arrays, addresses)
        with self._lock:   # _run's steps for one native entry and nothing after it
            count = len(self._outputs)
            outputs = [self._output(0)] if count == 1 else [self._output(j) for j in range(count)]
            launcher(addresses + self._returned_at)
            self._returned[:] = outputs
        return outputs

    def run_into(self, arrays: Sequence[np.ndarray], into: Mapping[int, np.ndarray]
                 ) -> list[np.ndarray]:
        """A call whose output ``j`` is written into ``into[j]`` (a C-contiguous array of its
        shape and dtype) rather than a buffer of the executable's. ``into[j]`` may be an
        input's memory only where the caller proved that no kernel reads that input after
        (or at another element than) the write (:mod:`tilefuse.frontend.torch.inplace`: an
        optimizer step's state updated in place)."""
        self._check(arrays)
        for j, out in into.items():
            shape, dtype = self._outputs[j]
            if type(out) is not np.ndarray or out.dtype != dtype or out.shape != shape \
                    or not out.flags.c_contiguous or not out.flags.writeable:
                raise GuardError(f"@{self.graph.name}: output {j} must go to a writable "
                                 f"C-contiguous {np.dtype(dtype)}{list(shape)} array, got "
                                 f"{_describe(out)}")
        return self._run(arrays, into=into)

    def _run(self, arrays: Sequence[np.ndarray], given: list[int] | None = None,
             into: Mapping[int, np.ndarray] | None = None) -> list[np.ndarray]:
        """``given``: the arrays' addresses, when the caller has them already; ``into``: see
        :meth:`run_into`."""
        with self._lock:
            outputs = [self._output(j) if not into or j not in into else into[j]
                       for j in range(len(self._outputs))]
            table = [*arrays, *outputs]
            returned_at = self._returned_at if not into else \
                [into[j].ctypes.data if j in into else a for j, a in enumerate(self._returned_at)]
            addresses = (given if given is not None else self._addresses.addresses(arrays)) \
                + returned_at
            if self._launcher is not None:
                self._launcher(addresses)
            else:
                for run, native in self._runners:
                    run(addresses if native else table)
            for flags, node in self._index_checks:
                if flags[0]:  # an index out of range: clamped, so nothing was harmed
                    bad = int(flags[1])
                    flags[:] = 0
                    raise index_error(node, bad)
            for j, slot in self._copies:
                outputs[j][...] = table[slot] if isinstance(slot, int) else slot  # type: ignore[index]
            self._returned[:] = outputs
            for j in into or ():
                self._returned[j] = None   # the caller's array: never reused as ours
        return outputs

    def _output(self, j: int) -> np.ndarray:
        """Output ``j``'s buffer: the one returned last time when the caller has released it
        (nothing but this executable refers to it, not even a view), else a fresh one; its
        address goes to ``_returned_at[j]``.

        A fresh 64 MiB array costs ~15 ms of page faults here, far more than most kernels;
        reusing a released one costs nothing and is safe, since no one can observe it.
        """
        last = self._returned[j]
        if last is not None and _released(last):
            return last
        shape, dtype = self._outputs[j]
        try:
            fresh = aligned_empty(shape, dtype)
        except MemoryError:
            raise TilefuseError(f"@{self.graph.name}: out of memory allocating output {j} "
                                f"({np.dtype(dtype)}{list(shape)})") from None
        self._returned_at[j] = fresh.ctypes.data
        return fresh

    def _check(self, arrays: Sequence[np.ndarray]) -> None:
        """GuardError unless the arrays are exactly what the kernels were compiled for."""
        if len(arrays) != len(self._inputs):
            raise GuardError(f"@{self.graph.name} takes {len(self._inputs)} inputs, "
                             f"got {len(arrays)}")
        for i, (array, (name, shape, dtype), strides) in enumerate(
                zip(arrays, self._inputs, self._strides)):
            if type(array) is not np.ndarray or array.dtype != dtype or array.shape != shape \
                    or (array.strides != strides and not array.flags.c_contiguous):
                raise GuardError(f"input {name} must be a C-contiguous {dtype}{list(shape)} "
                                 f"array, got {_describe(array)}")
            align = self._align.get(i)
            if align and array.ctypes.data % align:
                raise GuardError(f"input {name} must be {align}-byte aligned")


def _launcher(steps: Sequence[Step], io_count: int, name: str) -> CompiledLauncher | None:
    """The whole-sequence entry when every step is native (else None: host steps need Python
    between kernels)."""
    if not steps or not all(isinstance(step, NativeStep) for step in steps):
        return None
    calls = [launch.call_spec() for step in steps for launch in step.launches]
    return CompiledLauncher(calls, io_count, name=f"launch_{_identifier(name)}")


def _identifier(name: str) -> str:
    return "".join(c if c.isalnum() else "_" for c in name) or "graph"


def _c_strides(shape: tuple[int, ...], itemsize: int) -> tuple[int, ...]:
    """The strides NumPy gives a fresh C-ordered array of ``shape`` (the guard's fast path;
    other strides of a C-contiguous array, on size-1 or empty axes, take the slow check)."""
    return np.empty(shape, np.dtype(f"V{itemsize}")).strides


def _released(array: np.ndarray) -> bool:
    """True when nothing outside the caller's frames refers to ``array`` or its memory.

    The counts are: the executable's list slot (or ``.base`` of ``array``), the local name here,
    and getrefcount's own argument. A view of ``array`` anywhere refers to the same base (NumPy
    collapses base chains), which raises the base's count.
    """
    base = array.base
    return sys.getrefcount(array) == 4 and (base is None or sys.getrefcount(base) == 3)


def _is_index(slot: Slot, index: int) -> bool:
    return isinstance(slot, int) and slot == index


def _describe(array: object) -> str:
    if not isinstance(array, np.ndarray):
        return type(array).__name__
    order = "" if array.flags.c_contiguous else " (not C-contiguous)"
    return f"{array.dtype}{list(array.shape)}{order}"


def build_native(graph: Graph, dump_dir: Path | str | None = None
                 ) -> NativeExecutable | SymbolicNativeExecutable:
    """The native CPU executable of ``graph`` (the compile driver's back-end stages for
    target "cpu"): with symbolic input dims, one :class:`SymbolicNativeExecutable` serving
    every size."""
    from tilefuse.driver import CompileOptions, build

    return build(graph, "cpu", CompileOptions(dump_dir=dump_dir))  # type: ignore[return-value]
