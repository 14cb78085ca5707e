"""The kernel under tuning: one kernel group as a standalone graph, built and run per schedule.

A :class:`TuneTask` holds a small graph whose only native kernel is the group being tuned:
the group's non-constant inputs are graph inputs, its constant inputs are ``constant`` nodes
(so a constant B is packed at build time, as the native executable does), its outputs the
graph's outputs. Re-forming kernels on that graph gives the same group back (checked), which is
how a worker process gets the task: the graph travels as plain data (:func:`graph_to_wire`;
printing and re-parsing a 9 MB weight as text takes seconds) and the worker forms it again.

A candidate is built by the runtime's own builder: :meth:`TuneTask.build` makes a
:class:`~tilefuse.runtime.native.NativeExecutable` of the task's graph with a
:class:`~tilefuse.runtime.schedules.ForcedSchedules` giving the candidate to the kernel (no disk
cache), so what is timed is exactly what a build with that schedule runs: the same lowering,
B packing, arena and launcher, called through ``run_trusted`` as ``tilefuse.jit`` calls it.
:meth:`TuneTask.loop_functions` only lowers (for the cost model's features, no compiling).

The task also gives the group's fingerprint (:mod:`tilefuse.schedules.fingerprint`, the key builds
look up) and its reference outputs (the ops' NumPy references, node by node).
"""

from __future__ import annotations

from collections import ChainMap, OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from tilefuse.codegen.jit import aligned_empty
from tilefuse.codegen.target import CpuTarget, host_target
from tilefuse.driver import CompileOptions, compile, plan_kernels
from tilefuse.errors import TilefuseError
from tilefuse.graph.builder import GraphBuilder
from tilefuse.graph.interpreter import run_node
from tilefuse.graph.ir import Graph, Value
from tilefuse.graph.types import is_static
from tilefuse.kernel.fusion import KernelGroup, KernelKind
from tilefuse.kernel.lower_attention import lower_attention
from tilefuse.kernel.lower_elementwise import lower_group
from tilefuse.kernel.lower_matmul import lower_matmul, matmul_node, operand_cone
from tilefuse.kernel.schedule import Schedule, iteration_axes, validate
from tilefuse.loop.ir import LoopFunction
from tilefuse.runtime.kernel_cache import KernelArtifact, KernelCache
from tilefuse.runtime.native import NativeExecutable
from tilefuse.runtime.profile import group_work
from tilefuse.runtime.schedules import ForcedSchedules
from tilefuse.schedules.fingerprint import group_fingerprint
from tilefuse.target import Target
from tilefuse.testing import random_array

TUNABLE_KINDS = frozenset({KernelKind.CONTRACTION, KernelKind.ELEMENTWISE,
                           KernelKind.ROW_REDUCTION, KernelKind.ATTENTION})


class TuneError(TilefuseError):
    """A kernel that cannot be tuned, or a tuning component used wrongly."""


# ---- graphs as plain data --------------------------------------------------------------------


def graph_to_wire(graph: Graph) -> dict[str, Any]:
    """``graph`` as picklable plain data: input types, and per node its op name, input
    positions, attributes and output count (constants keep their arrays)."""
    ids: dict[Value, int] = {v: i for i, v in enumerate(graph.inputs)}
    nodes = []
    for node in graph.nodes:
        nodes.append((node.op.name, [ids[v] for v in node.inputs], dict(node.attrs)))
        for out in node.outputs:
            ids[out] = len(ids)
    return {"name": graph.name, "inputs": [(v.type, v.name) for v in graph.inputs],
            "nodes": nodes, "outputs": [ids[v] for v in graph.outputs]}


def graph_from_wire(wire: Mapping[str, Any]) -> Graph:
    """The graph :func:`graph_to_wire` describes (types re-inferred by the builder)."""
    builder = GraphBuilder(wire["name"])
    values = [builder.input(t, name) for t, name in wire["inputs"]]
    for op, inputs, attrs in wire["nodes"]:
        values.extend(builder.add(op, [values[i] for i in inputs], attrs))
    return builder.build([values[i] for i in wire["outputs"]])


# ---- the task --------------------------------------------------------------------------------


def _evaluate_constants(graph: Graph, groups: Sequence[KernelGroup]) -> dict[Value, np.ndarray]:
    """Arrays of the constants and of every group computed from constants alone."""
    env: dict[Value, np.ndarray] = {n.output: n.attrs["value"].array
                                    for n in graph.nodes if n.op.name == "constant"}
    for group in groups:
        if all(v in env for v in group.inputs):
            for node in group.nodes:
                outs = run_node(node, [env[v] for v in node.inputs])
                env.update(zip(node.outputs, (np.require(o, requirements="C") for o in outs)))
    return env


def kernel_graph(group: KernelGroup, constants: Mapping[Value, np.ndarray]) -> Graph:
    """A graph computing exactly ``group``: constant inputs as ``constant`` nodes, the others as
    graph inputs, the group's nodes, its outputs returned."""
    builder = GraphBuilder("tune_kernel")  # no group name: same kernel, same fingerprint
    env: dict[Value, Value] = {}
    for v in group.inputs:
        if v in constants:
            env[v] = builder.add1("constant", [], {"value": constants[v]})
        else:
            env[v] = builder.input(v.type, f"in{len(env)}")
    for node in group.nodes:
        outs = builder.add(node.op, [env[v] for v in node.inputs], dict(node.attrs), node.loc)
        env.update(zip(node.outputs, outs))
    return builder.build([env[v] for v in group.outputs])


class TuneTask:
    """One kernel group to tune (see the module docstring). Make one with :meth:`of_group` (a
    group and the arrays of its constant inputs) or :func:`tasks_from_graph`."""

    def __init__(self, graph: Graph):
        for v in [*graph.inputs, *(o for n in graph.nodes for o in n.outputs)]:
            if not is_static(v.shape):
                raise TuneError(f"tuning needs static shapes, got {v.type}")
        plan = plan_kernels(graph)   # the compile driver's kernel formation
        self.graph = plan.graph
        self.constants = _evaluate_constants(self.graph, plan.groups)
        live = [g for g in plan.groups if not all(v in self.constants for v in g.inputs)]
        if len(live) != 1 or live[0].kind not in TUNABLE_KINDS:
            shown = ", ".join(f"{g.name} ({g.kind.value})" for g in live)
            raise TuneError(f"a tuning task needs exactly one contraction, attention, "
                            f"elementwise or row kernel, got: {shown or 'none'}")
        self.group: KernelGroup = live[0]
        self._fingerprint = group_fingerprint(self.group, self.constants)
        b_known = False
        if self.kind is KernelKind.CONTRACTION:
            _, reads = operand_cone(self.group, matmul_node(self.group).inputs[1])
            b_known = all(v in self.constants for v in reads)
        self.constant_b = b_known

    @staticmethod
    def of_group(group: KernelGroup, constants: Mapping[Value, np.ndarray] | None = None
                 ) -> TuneTask:
        """The task for ``group``; ``constants`` holds the arrays of its inputs known at build
        time (the others get random data). Its fingerprint is ``group``'s, as a build of the
        graph ``group`` comes from computes it."""
        if group.kind not in TUNABLE_KINDS:
            raise TuneError(f"kernel {group.name}: {group.kind.value} kernels are not tuned")
        task = TuneTask(kernel_graph(group, constants or {}))
        task._fingerprint = group_fingerprint(group, constants or {})
        return task

    @property
    def kind(self) -> KernelKind:
        return self.group.kind

    def wire(self) -> dict[str, Any]:
        return graph_to_wire(self.graph)

    @staticmethod
    def from_wire(wire: Mapping[str, Any]) -> TuneTask:
        return TuneTask(graph_from_wire(wire))

    def extents(self) -> dict[str, int | None]:
        return iteration_axes(self.group)

    def fingerprint(self) -> str:
        """The database key's kernel part
        (:func:`~tilefuse.schedules.fingerprint.group_fingerprint`)."""
        return self._fingerprint

    def random_inputs(self, rng: np.random.Generator) -> dict[Value, np.ndarray]:
        """Fresh random arrays for the group inputs that are not constants."""
        return {v: random_array(rng, tuple(v.shape), v.dtype) for v in self.group.inputs
                if v not in self.constants}

    def reference(self, inputs: Mapping[Value, np.ndarray]) -> list[np.ndarray]:
        """The graph's outputs from the ops' references, node by node."""
        env: dict[Value, np.ndarray] = {}
        scope = ChainMap(env, dict(inputs), self.constants)
        for node in self.group.nodes:
            env.update(zip(node.outputs, run_node(node, [scope[v] for v in node.inputs])))
        return [scope[v] for v in self.graph.outputs]

    def work(self) -> tuple[float, float]:
        """(flops, bytes) the kernel must do at least, as ``tilefuse explain`` counts them
        (:func:`tilefuse.runtime.profile.group_work`)."""
        return group_work(self.group)

    def loop_functions(self, schedule: Schedule) -> tuple[LoopFunction, ...]:
        """The loop functions a build of ``schedule`` compiles (validated first:
        ScheduleError), lowered by the same lowering the runtime calls, without compiling."""
        validate(schedule, self.extents())
        if self.kind is KernelKind.CONTRACTION:
            return lower_matmul(self.group, schedule, constant_b=self.constant_b).functions
        if self.kind is KernelKind.ATTENTION:
            return lower_attention(self.group, schedule, host_target().cores).functions
        return (lower_group(self.group, schedule),)

    def build(self, schedule: Schedule, inputs: Mapping[Value, np.ndarray],
              target: Target | str = "cpu", kernels: SessionKernels | None = None
              ) -> BuiltKernel:
        """The runtime's build of the task's graph with ``schedule`` for the kernel (module
        docstring), bound to aligned copies of ``inputs``. TuneError when the build did not run
        the kernel natively with that schedule (a lowering that failed falls back to the host
        in a build; here that is the candidate's failure). ``kernels``: the measuring
        session's compiled kernels, looked up and added to (None: every kernel compiled)."""
        validate(schedule, self.extents())
        cpu = Target.parse(target).llvm_cpu()
        cache = KernelCache(None, cpu) if kernels is None else kernels.cache(cpu)
        exe = compile(self.graph, target, CompileOptions(   # already decomposed: no pipeline
            optimize=False, cache=cache,
            schedules=ForcedSchedules(cpu, {self.group.name: schedule})))
        if exe.fallbacks:
            reasons = "; ".join(f"{name}: {why}" for name, why in exe.fallbacks)
            raise TuneError(f"schedule {schedule} does not build natively: {reasons}")
        arrays = [_aligned_copy(np.asarray(inputs[v])) for v in self.graph.inputs]
        return BuiltKernel(exe, arrays)


KEPT_KERNELS = 32
"""Compiled kernels a :class:`SessionKernels` keeps (the most recently used)."""


class SessionKernels:
    """The machine code compiled while measuring one task, by loop IR (the kernel's name
    aside) and target: a candidate whose loops an earlier build of the session compiled runs
    that code instead of compiling it again. That is the same schedule measured again (the
    tuner's confirmation measures the default and its contenders once more, the in-process
    runner rebuilds each time) or another schedule that lowers to the same loops (tiles
    clipped to small extents). The code is the same LLVM would make again (a kernel's loop IR
    determines it, as the disk cache's key says); only the last :data:`KEPT_KERNELS` are kept,
    in memory. ``compiled`` and ``reused`` count kernels."""

    def __init__(self, limit: int = KEPT_KERNELS):
        self.limit = limit
        self.compiled = self.reused = 0
        self._kept: OrderedDict[tuple[CpuTarget, str], KernelArtifact] = OrderedDict()

    def cache(self, target: CpuTarget) -> KernelCache:
        """A kernel cache for one build for ``target`` (no disk) that looks in and adds to
        the session's kernels."""
        return _SessionCache(self, target)

    def lookup(self, key: tuple[CpuTarget, str]) -> KernelArtifact | None:
        artifact = self._kept.get(key)
        if artifact is not None:
            self._kept.move_to_end(key)
            self.reused += 1
        return artifact

    def keep(self, key: tuple[CpuTarget, str], artifact: KernelArtifact) -> None:
        self.compiled += 1
        self._kept[key] = artifact
        while len(self._kept) > self.limit:
            self._kept.popitem(last=False)


class _SessionCache(KernelCache):
    """:meth:`KernelCache.compile` through a :class:`SessionKernels` first."""

    def __init__(self, kernels: SessionKernels, target: CpuTarget):
        super().__init__(None, target)
        self.kernels = kernels
        self._names: dict[tuple[CpuTarget, str], str] = {}  # this build's kernels, by key

    def compile(self, fn: LoopFunction, schedule: Schedule | None,
                function: str) -> KernelArtifact:
        text = str(fn)
        key = (self.target, text.replace(f"kernel {fn.name}(", "kernel (", 1))
        first = self._names.setdefault(key, fn.name)
        artifact = self.kernels.lookup(key)
        if artifact is not None:   # as a build's own repeats do, the second one says whose
            return artifact if first == fn.name else replace(artifact, shared_with=first)
        artifact = super().compile(fn, schedule, function)
        if artifact.shared_with is None:  # not the code of another kernel of this build
            self.kernels.keep(key, artifact)
        return artifact


def _aligned_copy(array: np.ndarray) -> np.ndarray:
    out = aligned_empty(array.shape, array.dtype)
    out[...] = array
    return out


@dataclass
class BuiltKernel:
    """A built executable and its input arrays; :meth:`run` calls it once (``outputs`` then
    holds the results). The previous outputs are dropped before each call so the executable
    reuses their buffers, as a caller that releases its results gets."""

    executable: NativeExecutable
    arrays: list[np.ndarray]
    outputs: list[np.ndarray] = field(default_factory=list)

    def run(self) -> None:
        self.outputs = []
        self.outputs = self.executable.run_trusted(self.arrays)


def tasks_from_graph(graph: Graph) -> list[TuneTask]:
    """One task per tunable kernel of ``graph`` that is not computed from constants alone."""
    return [task for _, task in named_tasks(graph)]


def named_tasks(graph: Graph) -> list[tuple[str, TuneTask]]:
    """:func:`tasks_from_graph` with each kernel's name in ``graph``'s plan (``k3``: the name
    ``kernels.plan`` shows; a task's own group is re-formed alone and always named ``k0``)."""
    plan = plan_kernels(graph)
    decomposed = plan.graph
    constants = _evaluate_constants(decomposed, plan.groups)
    return [(g.name, TuneTask.of_group(g, {v: constants[v] for v in g.inputs if v in constants}))
            for g in plan.groups
            if g.kind in TUNABLE_KINDS and not all(v in constants for v in g.inputs)]


def node_ops(group: KernelGroup) -> tuple[str, ...]:
    """The group's op names in order (a cheap identity check across processes)."""
    return tuple(n.op.name for n in group.nodes)


__all__ = ["KEPT_KERNELS", "BuiltKernel", "SessionKernels", "TuneError", "TuneTask",
           "graph_from_wire", "graph_to_wire", "kernel_graph", "named_tasks", "node_ops",
           "tasks_from_graph"]
