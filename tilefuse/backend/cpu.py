"""The CPU back end: a kernel plan lowered to loop IR, compiled to machine code, assembled
into a :class:`~tilefuse.runtime.native.NativeExecutable`.

The compile driver (:func:`tilefuse.driver.build`) hands it the kernel plan and the schedule
source; :func:`build_cpu` then runs, once per graph (:class:`CpuBuild`):

1. evaluate the constants, and fold groups whose inputs are all constants (run with the
   references, kept as arrays);
2. give each group its schedule and lower it: matmul groups with
   :func:`~tilefuse.kernel.lower_matmul.lower_matmul` (a constant B, and a B computed from
   constants by a prologue, packed here once), elementwise and row-reduction groups with
   :func:`~tilefuse.kernel.lower_elementwise.lower_group`; compile every kernel through the
   disk cache (:mod:`tilefuse.runtime.kernel_cache`: a kernel compiled before, by any process,
   is loaded without running LLVM; ``TILEFUSE_CACHE=0`` turns that off);
3. groups with no native lowering (movement, opaque, plain reductions, or a lowering that raised
   CompileError) become host steps that run the ops' NumPy references. Each is a defect, logged
   at WARNING on the ``fallback`` topic with its reason (once per kernel of a build), marked in
   the plan dump and in ``tilefuse explain``: nothing falls back silently;
4. place the intermediates (and scratch buffers such as a packed B) in one 64-byte aligned
   arena, from their liveness over the launch sequence (greedy best fit), and compile the
   whole-sequence launcher (:func:`assemble`).

A graph with symbolic dims is built by :mod:`tilefuse.backend.cpu_symbolic` with the same
:class:`CpuBuild`.
"""

from __future__ import annotations

import dataclasses
import math
from collections import ChainMap
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from tilefuse.codegen.jit import CompiledKernel, KernelSignature, aligned_empty
from tilefuse.codegen.launcher import CompiledLauncher
from tilefuse.codegen.target import CpuTarget, host_target
from tilefuse.driver import plan_kernels
from tilefuse.dump import DumpWriter
from tilefuse.errors import CompileError
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
    ORDER_PRESERVING,
    KernelGroup,
    KernelKind,
    KernelPlan,
    is_pointwise,
)
from tilefuse.kernel.lower_attention import lower_attention
from tilefuse.kernel.lower_elementwise import lower_elementwise, lower_group
from tilefuse.kernel.lower_gather import INDEX_ERROR, is_gather_group, lower_gather
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
from tilefuse.runtime import arena_space
from tilefuse.runtime.kernel_cache import KernelArtifact, KernelCache
from tilefuse.runtime.launch import HostStep, KernelLaunch, NativeStep, Slot, Step
from tilefuse.runtime.memory import BufferRequest, MemoryPlan, plan_memory
from tilefuse.runtime.native import ExecutableParts, NativeExecutable
from tilefuse.runtime.schedules import ScheduleSource

NATIVE_KINDS = frozenset({KernelKind.CONTRACTION, KernelKind.ELEMENTWISE,
                          KernelKind.ROW_REDUCTION, KernelKind.MOVEMENT, KernelKind.ATTENTION})
SYMBOLIC_KINDS = frozenset({KernelKind.ELEMENTWISE, KernelKind.ROW_REDUCTION,
                            KernelKind.CONTRACTION, KernelKind.MOVEMENT, KernelKind.ATTENTION})
"""Kinds whose lowering takes symbolic dims as runtime extents (the others, in a symbolic
build, are specialised per size binding: :mod:`tilefuse.backend.cpu_symbolic`)."""


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
class BuiltKernel:
    fn: LoopFunction
    artifact: KernelArtifact
    bindings: Mapping[str, Binding]

    @property
    def compiled(self) -> CompiledKernel:
        return self.artifact.kernel


@dataclass
class PendingGroup:
    """A group before buffers are placed: its kernels, or the reason it runs on the host."""

    group: KernelGroup
    schedule: Schedule | None = None
    kernels: list[BuiltKernel] = field(default_factory=list)
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


class CpuBuild:
    """Everything a CPU build does once: plan, lower, compile, place buffers."""

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
        self.pending: list[PendingGroup] = []
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
    def lower(self, group: KernelGroup) -> PendingGroup:
        pending = PendingGroup(group)
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
                BuiltKernel(fn, self.cache.compile(fn, pending.schedule,
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

    def lower_symbolic(self, group: KernelGroup) -> PendingGroup:
        """A group with symbolic dims: lowered once with runtime extents when its kind
        supports them, else marked for a per-size build (``per_size`` says why)."""
        pending = PendingGroup(group)
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
        pending.kernels = [BuiltKernel(fn, self.cache.compile(fn, pending.schedule,
                                                          f"{self.graph.name}/{fn.name}"),
                                   bindings) for fn, bindings in made]
        return pending

    def fall_back(self, pending: PendingGroup, reason: str) -> PendingGroup:
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

    def lower_quant(self, pending: PendingGroup) -> PendingGroup:
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
        pending.kernels = [BuiltKernel(made.fn, artifact, bindings)]
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
    def place(self, pendings: Sequence[PendingGroup] | None = None, sizes: Sizes = {},  # noqa: B006
              aliases: Mapping[Value, Value] | None = None
              ) -> tuple[MemoryPlan, dict[object, Slot], np.ndarray]:
        """Slots for every value and scratch buffer: graph inputs and outputs index the call's
        table, constants are themselves, the rest are views into one planned arena (sized for
        the binding ``sizes`` in a symbolic build). ``aliases`` maps a value to the graph
        output it is byte for byte (:func:`output_reshapes`): it takes that output's slot."""
        graph = self.graph
        slots: dict[object, Slot] = {}
        for i, v in enumerate(graph.inputs):
            slots.setdefault(v, i)
        slots.update(self.constants)
        for j, v in enumerate(graph.outputs):
            slots.setdefault(v, len(graph.inputs) + j)
        for value, output in (aliases or {}).items():
            slots[value] = slots[output]
        requests, keys = self.requests(slots, pendings, sizes)
        memory = plan_memory(requests)
        space = arena_space.active()   # a training step's executables share one arena
        shared = None if space is None else space.arena(memory.arena_bytes)
        try:
            arena = shared if shared is not None else \
                aligned_empty(max(memory.arena_bytes, 1), np.uint8)
        except MemoryError:
            raise CompileError(f"@{self.graph.name}: out of memory allocating the "
                               f"{memory.arena_bytes}-byte arena of intermediates") from None
        for request in requests:
            key, shape, dtype = keys[request.name]
            offset = memory.offsets[request.name]
            slots[key] = arena[offset:offset + request.nbytes].view(dtype).reshape(shape)
        return memory, slots, arena

    def requests(self, slots: Mapping[object, Slot], pendings: Sequence[PendingGroup] | None = None,
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

    def steps(self, slots: Mapping[object, Slot], pendings: Sequence[PendingGroup] | None = None,
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

    def aligned_inputs(self, pendings: Sequence[PendingGroup] | None = None) -> dict[int, int]:
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


def _dump_kernel(writer: DumpWriter, kernel: BuiltKernel, schedule: Schedule | None) -> None:
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


def build_cpu(graph: Graph, dump_dir: Path | str | None = None, *,
              target: CpuTarget | None = None, cache: KernelCache | None = None,
              schedules: ScheduleSource | None = None, plan: KernelPlan | None = None
              ) -> NativeExecutable:
    """Stages 4-6 for a CPU target: ``graph`` (static shapes) lowered, compiled and assembled.
    ``cache`` compiles the kernels (default: :meth:`KernelCache.from_env`, the disk cache the
    environment asks for); ``schedules`` picks each kernel's schedule (default: the tuning
    database, else the default rule; the fuzzer passes one that samples the search space);
    ``plan``: the driver's kernel plan (made here when None)."""
    target = target or host_target()
    build = CpuBuild(graph, target, cache or KernelCache.from_env(target), schedules, plan=plan)
    executable = assemble(graph, build, build.pending, {})
    if dump_dir is not None:
        build.dump(dump_dir, executable.memory_plan)
    return executable


def assemble(graph: Graph, build: CpuBuild, pendings: Sequence[PendingGroup],
             sizes: Sizes) -> NativeExecutable:
    """The executable of ``build``'s groups ``pendings`` for the size binding ``sizes`` (empty
    for a static build; ``graph`` is the graph specialised to it, whose signature the call's
    guard checks): the arena placed, the launches made, the launcher compiled."""
    aliases: dict[Value, Value] = {}
    if not sizes:   # a result only reshaped into a graph output is written there directly
        pendings, aliases = output_reshapes(build.graph, pendings)
    memory_plan, slots, arena = build.place(pendings, sizes, aliases)
    steps = tuple(build.steps(slots, pendings, sizes))
    first = len(graph.inputs)
    copies = tuple((j, slots[v]) for j, v in enumerate(build.graph.outputs)
                   if not _is_index(slots[v], first + j))
    parts = ExecutableParts(graph, memory_plan, arena, steps, build.aligned_inputs(pendings),
                            copies)
    made = NativeExecutable.from_parts(
        parts, _launcher(steps, len(graph.inputs) + len(graph.outputs), graph.name),
        cache_stats=build.cache.stats, kernel_plan=build.plan,
        index_checks=tuple(c for p in pendings for c in p.checks))
    space = arena_space.active()
    if space is not None and space.owns(arena):
        made._lock = space.lock   # its arena is shared: one executable of the space at a time
    return made


def output_reshapes(graph: Graph, pendings: Sequence[PendingGroup]
                    ) -> tuple[list[PendingGroup], dict[Value, Value]]:
    """The groups less each movement group that only reshapes (row-major order kept) one
    kernel result into a graph output, and those results -> the outputs: the result is the
    output's bytes, so its kernel writes the output buffer and no arena buffer or copy is
    needed (the logits of a language model reshaped from [B·S, V] to [B, S, V]: 98 MiB of
    arena and a 98 MiB copy per call for GPT-2's loss gradient). Only where every group that
    writes or reads the result runs native kernels (a host step sees the slot's array, whose
    shape would be the output's)."""
    outputs = set(graph.outputs)
    blocked = set(graph.inputs) | outputs
    native: dict[Value, bool] = {}
    readers: dict[Value, list[PendingGroup]] = {}
    for pending in pendings:
        for v in pending.group.outputs:
            native[v] = pending.reason is None
        for v in pending.group.inputs:
            readers.setdefault(v, []).append(pending)
    kept: list[PendingGroup] = []
    aliases: dict[Value, Value] = {}
    for pending in pendings:
        group = pending.group
        if group.kind is KernelKind.MOVEMENT and pending.reason is None \
                and len(group.inputs) == 1 and len(group.outputs) == 1 \
                and all(n.op.name in ORDER_PRESERVING for n in group.nodes):
            (source,), (out,) = group.inputs, group.outputs
            if out in outputs and source not in blocked and source not in aliases \
                    and native.get(source) and out not in aliases.values() \
                    and graph.outputs.count(out) == 1 \
                    and all(r.reason is None for r in readers.get(source, ())) \
                    and _nbytes(source) == _nbytes(out):
                aliases[source] = out
                continue
        kept.append(pending)
    return kept, aliases


def _launcher(steps: Sequence[Step], io_count: int, name: str) -> CompiledLauncher | None:
    """The whole-sequence entry when every step is native (else None: host steps need Python
    between kernels)."""
    if not steps or not all(isinstance(step, NativeStep) for step in steps):
        return None
    calls = [launch.call_spec() for step in steps for launch in step.launches]
    return CompiledLauncher(calls, io_count, name=f"launch_{_identifier(name)}")


def _identifier(name: str) -> str:
    return "".join(c if c.isalnum() else "_" for c in name) or "graph"


def _is_index(slot: Slot, index: int) -> bool:
    return isinstance(slot, int) and slot == index


__all__ = ["NATIVE_KINDS", "SYMBOLIC_KINDS", "BuiltKernel", "CpuBuild", "PendingGroup", "Scratch",
           "assemble", "bound_shape", "build_cpu", "prepare_graph"]
