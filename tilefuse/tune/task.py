"""The kernel under tuning: one kernel group as a standalone graph, built and run per schedule.

A :class:`TuneTask` holds a small graph whose only native kernel is the group being tuned:
the group's non-constant inputs are graph inputs, its constant inputs are ``constant`` nodes
(so a constant B is packed at build time, as the native executable does), its outputs the
graph's outputs. Re-forming kernels on that graph gives the same group back (checked), which is
how a worker process gets the task: the graph travels as plain data (:func:`graph_to_wire`;
printing and re-parsing a 9 MB weight as text takes seconds) and the worker forms it again.

The task also gives the group's fingerprint (sha256 of the graph text with constant values left
out: the schedule depends on shapes and dtypes, not on weights), its reference outputs (the
ops' NumPy references, node by node), and :class:`BuiltKernel`: the lowered and compiled
functions of one schedule bound to inputs, outputs and scratch buffers, ready to run.
"""

from __future__ import annotations

import hashlib
import math
import re
from collections import ChainMap
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from tilefuse.codegen.jit import CompiledKernel, aligned_empty, compile_kernel
from tilefuse.codegen.target import CpuTarget, host_target
from tilefuse.errors import TilefuseError
from tilefuse.graph.builder import GraphBuilder
from tilefuse.graph.interpreter import run_node
from tilefuse.graph.ir import Graph, Value
from tilefuse.graph.printer import print_graph
from tilefuse.graph.types import is_static
from tilefuse.kernel.access import kernel_buffers
from tilefuse.kernel.fusion import KernelGroup, KernelKind, form_kernels, op_cost
from tilefuse.kernel.lower_elementwise import lower_group
from tilefuse.kernel.lower_matmul import lower_matmul, matmul_node, operand_cone
from tilefuse.kernel.schedule import Schedule, iteration_axes, validate
from tilefuse.loop.ir import LoopFunction
from tilefuse.passes.decompose import decompose_composites
from tilefuse.testing import random_array

TUNABLE_KINDS = frozenset({KernelKind.CONTRACTION, KernelKind.ELEMENTWISE,
                           KernelKind.ROW_REDUCTION})


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
        self.graph, _ = decompose_composites(graph)
        plan = form_kernels(self.graph)
        self.constants = _evaluate_constants(self.graph, plan.groups)
        live = [g for g in plan.groups if not all(v in self.constants for v in g.inputs)]
        if len(live) != 1 or live[0].kind not in TUNABLE_KINDS:
            shown = ", ".join(f"{g.name} ({g.kind.value})" for g in live)
            raise TuneError(f"a tuning task needs exactly one contraction, elementwise or row "
                            f"kernel, got: {shown or 'none'}")
        self.group: KernelGroup = live[0]

    @staticmethod
    def of_group(group: KernelGroup, constants: Mapping[Value, np.ndarray] | None = None
                 ) -> TuneTask:
        """The task for ``group``; ``constants`` holds the arrays of its inputs known at build
        time (the others get random data)."""
        if group.kind not in TUNABLE_KINDS:
            raise TuneError(f"kernel {group.name}: {group.kind.value} kernels are not tuned")
        return TuneTask(kernel_graph(group, constants or {}))

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
        """sha256 of the graph text with every constant's value left out."""
        text = print_graph(self.graph, elide_constants_over=0, locations=False)
        text = re.sub(r'elided\("[0-9a-f]+"\)', "elided", text)
        return hashlib.sha256(f"{self.kind.value}\n{text}".encode()).hexdigest()

    def random_inputs(self, rng: np.random.Generator) -> dict[Value, np.ndarray]:
        """Fresh random arrays for the group inputs that are not constants."""
        return {v: random_array(rng, tuple(v.shape), v.dtype) for v in self.group.inputs
                if v not in self.constants}

    def reference(self, inputs: Mapping[Value, np.ndarray]) -> list[np.ndarray]:
        """The group's outputs from the ops' references, node by node."""
        env: dict[Value, np.ndarray] = {}
        scope = ChainMap(env, dict(inputs), self.constants)
        for node in self.group.nodes:
            env.update(zip(node.outputs, run_node(node, [scope[v] for v in node.inputs])))
        return [scope[v] for v in self.group.outputs]

    def work(self) -> tuple[float, float]:
        """(flops, bytes) the kernel must do at least: 2·M·N·K per matmul plus each member's
        scalar ops per element; every input read and every output written once."""
        flops = 0.0
        for node in self.group.nodes:
            if node.op.name == "matmul":
                m, n, k = (iteration_axes(self.group)[a] or 1 for a in "mnk")
                flops += 2.0 * m * n * k * (iteration_axes(self.group).get("b") or 1)
            else:
                flops += max(op_cost(node), 1) * sum(_numel(v) for v in node.outputs)
        moved = sum(_numel(v) * v.dtype.itemsize
                    for v in (*self.group.inputs, *self.group.outputs))
        return flops, float(moved)

    def lower(self, schedule: Schedule) -> Lowered:
        """The loop functions of ``schedule`` (validated first: ScheduleError) and what each
        buffer name is bound to."""
        validate(schedule, self.extents())
        group = self.group
        if group.kind is not KernelKind.CONTRACTION:
            fn = lower_group(group, schedule)
            buffers = kernel_buffers(group.inputs, group.outputs)
            binds = {p.name: v for v, p in [*buffers.inputs.items(), *buffers.outputs.items()]}
            return Lowered((fn,), binds, {}, None, None)
        b_value = matmul_node(group).inputs[1]
        cone, reads = operand_cone(group, b_value)
        b_array = None
        if all(v in self.constants for v in reads):
            b_array = self.constants.get(b_value)
            if b_array is None:
                env = ChainMap({}, self.constants)
                for node in cone:
                    env.update(zip(node.outputs, run_node(node, [env[v] for v in node.inputs])))
                b_array = env[b_value]
        low = lower_matmul(group, schedule, constant_b=b_array is not None)
        prepared = None if b_array is None else (low.constant_b, low.prepare_b(b_array))
        return Lowered(low.functions, dict(low.bindings), dict(low.scratch), prepared,
                       matmul_node(group).output.dtype.np)

    def build(self, schedule: Schedule, inputs: Mapping[Value, np.ndarray],
              target: CpuTarget | None = None) -> BuiltKernel:
        """Lowers and compiles ``schedule`` and binds it to copies of ``inputs``."""
        return BuiltKernel.make(self, self.lower(schedule), inputs, target or host_target())


def _numel(v: Value) -> int:
    return math.prod(int(d) for d in v.shape)


@dataclass(frozen=True)
class Lowered:
    """A schedule's loop functions (run in order), buffer name → group value, scratch buffers
    (name → bytes), the prepared constant B (buffer name, array) and the scratch dtype."""

    functions: tuple[LoopFunction, ...]
    bindings: Mapping[str, Value]
    scratch: Mapping[str, int]
    constant_b: tuple[str, np.ndarray] | None
    scratch_dtype: Any


def _aligned_copy(array: np.ndarray) -> np.ndarray:
    out = aligned_empty(array.shape, array.dtype)
    out[...] = array
    return out


@dataclass
class BuiltKernel:
    """Compiled functions bound to their buffers; :meth:`run` runs them once, in order."""

    kernels: list[tuple[CompiledKernel, list[int]]]
    outputs: list[np.ndarray]
    keep: list[np.ndarray]  # every buffer the addresses point into

    @staticmethod
    def make(task: TuneTask, lowered: Lowered, inputs: Mapping[Value, np.ndarray],
             target: CpuTarget) -> BuiltKernel:
        arrays: dict[object, np.ndarray] = {}
        for v in task.group.inputs:
            arrays[v] = _aligned_copy(np.asarray(inputs[v] if v in inputs else task.constants[v]))
        for v in task.group.outputs:
            arrays[v] = aligned_empty(tuple(int(d) for d in v.shape), v.dtype.np)
        by_name: dict[str, np.ndarray] = {n: arrays[v] for n, v in lowered.bindings.items()}
        for name, nbytes in lowered.scratch.items():
            dtype = np.dtype(lowered.scratch_dtype)
            by_name[name] = aligned_empty(max(1, nbytes // dtype.itemsize), dtype)
        if lowered.constant_b is not None:
            by_name[lowered.constant_b[0]] = _aligned_copy(lowered.constant_b[1])
        kernels = []
        for fn in lowered.functions:
            missing = [b.name for b in fn.buffers if b.name not in by_name]
            if missing:
                raise TuneError(f"kernel {fn.name}: unbound buffers {', '.join(missing)}")
            compiled = compile_kernel(fn, target=target)
            kernels.append((compiled, [by_name[b.name].ctypes.data for b in fn.buffers]))
        return BuiltKernel(kernels, [arrays[v] for v in task.group.outputs],
                           list(by_name.values()) + list(arrays.values()))

    def run(self) -> None:
        for kernel, pointers in self.kernels:
            kernel.call_unchecked(pointers, [])


def tasks_from_graph(graph: Graph) -> list[TuneTask]:
    """One task per tunable kernel of ``graph`` that is not computed from constants alone."""
    return [task for _, task in named_tasks(graph)]


def named_tasks(graph: Graph) -> list[tuple[str, TuneTask]]:
    """:func:`tasks_from_graph` with each kernel's name in ``graph``'s plan (``k3``: the name
    ``kernels.plan`` shows; a task's own group is re-formed alone and always named ``k0``)."""
    decomposed, _ = decompose_composites(graph)
    plan = form_kernels(decomposed)
    constants = _evaluate_constants(decomposed, plan.groups)
    return [(g.name, TuneTask.of_group(g, {v: constants[v] for v in g.inputs if v in constants}))
            for g in plan.groups
            if g.kind in TUNABLE_KINDS and not all(v in constants for v in g.inputs)]


def node_ops(group: KernelGroup) -> tuple[str, ...]:
    """The group's op names in order (a cheap identity check across processes)."""
    return tuple(n.op.name for n in group.nodes)


__all__ = ["BuiltKernel", "Lowered", "TuneError", "TuneTask", "graph_from_wire",
           "graph_to_wire", "kernel_graph", "named_tasks", "node_ops", "tasks_from_graph"]
