"""One native executable as artifact data: a JSON *program* plus binary sections, and back.

A program is what :meth:`NativeExecutable.parts` holds, with every Python object replaced by
data: the call's signature (input names, shapes, dtypes; output shapes, dtypes; alignment), the
arena's size and memory plan, the launch sequence and the output copies. Buffer arguments are
*slots*::

    ["io", i]                          the call's input i, or output i - inputs
    ["arena", offset, dtype, shape]    a view of the arena
    ["const", k]                       constant k: a section of raw C-order bytes

A native step names its kernels (index into the kernel table: object code section + signature)
with their slots and i64 scalars; a host step (a group with no native lowering) holds its nodes
as graph text (:mod:`tilefuse.graph.printer`), which the loader parses: no graph pass runs.

Decoding validates every index, dtype, shape and arena bound before it builds anything, and
:class:`~tilefuse.runtime.launch.KernelLaunch` checks each fixed array against its kernel's
declared buffers, as a build does.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from tilefuse.artifact.format import ArtifactError, Container
from tilefuse.codegen.abi import CompiledKernel, KernelSignature, aligned_empty
from tilefuse.dtypes import DType
from tilefuse.graph.ir import Graph, Value
from tilefuse.graph.types import TensorType
from tilefuse.runtime.launch import HostStep, KernelLaunch, NativeStep, Slot, Step
from tilefuse.runtime.memory import MemoryPlan
from tilefuse.runtime.native import ExecutableParts, NativeExecutable

MAX_RANK = 64
MAX_ITEMS = 1 << 24
"""Any list in a program longer than this is a hostile count."""


class Sections:
    """The binary sections a save collects, with kernels and constants stored once each."""

    def __init__(self) -> None:
        self.data: dict[str, bytes] = {}
        self.kernels: list[dict[str, Any]] = []
        self.constants: list[dict[str, Any]] = []
        self._kernel_index: dict[int, int] = {}
        self._constant_index: dict[tuple, int] = {}
        self._keep: list[object] = []  # keeps ids stable while saving

    def add(self, prefix: str, data: bytes) -> str:
        name = f"{prefix}{len(self.data)}"
        self.data[name] = data
        return name

    def kernel(self, kernel: CompiledKernel) -> int:
        found = self._kernel_index.get(id(kernel))
        if found is None:
            found = len(self.kernels)
            self.kernels.append({"section": self.add("k", kernel.object_code()),
                                 "signature": kernel.signature.to_json()})
            self._kernel_index[id(kernel)] = found
            self._keep.append(kernel)
        return found

    def constant(self, array: np.ndarray) -> int:
        key = (array.ctypes.data, array.shape, array.strides, array.dtype.str)
        found = self._constant_index.get(key)
        if found is None:
            found = len(self.constants)
            data = np.ascontiguousarray(array).tobytes()
            self.constants.append({"section": self.add("c", data), "dtype": _dtype_name(array),
                                   "shape": list(array.shape)})
            self._constant_index[key] = found
            self._keep.append(array)
        return found


def _dtype_name(array: np.ndarray) -> str:
    for dtype in DType:
        if dtype.np == array.dtype:
            return dtype.value
    raise ArtifactError(f"cannot save an array of dtype {array.dtype}")


# ---------------------------------------------------------------------------- encode

def encode(exe: NativeExecutable, sections: Sections, plan_text: str) -> dict[str, Any]:
    """The program of ``exe``; its kernels, constants and texts go to ``sections``."""
    parts = exe.parts()
    arena = parts.arena
    start, end = arena.ctypes.data, arena.ctypes.data + arena.nbytes

    def slot(value: Slot) -> list[Any]:
        if isinstance(value, int):
            return ["io", value]
        at = value.ctypes.data
        if start <= at < end or (value.nbytes == 0 and at == end):
            if not value.flags.c_contiguous:
                raise ArtifactError(f"@{exe.graph.name}: an arena view is not C-contiguous")
            return ["arena", at - start, _dtype_name(value), list(value.shape)]
        return ["const", sections.constant(value)]

    steps: list[dict[str, Any]] = []
    for step in parts.steps:
        if isinstance(step, NativeStep):
            steps.append({"native": step.name, "launches": [
                {"kernel": sections.kernel(launch.kernel),
                 "args": [slot(a) for a in launch.args], "scalars": list(launch.scalars)}
                for launch in step.launches]})
        else:
            inputs, outputs = list(step.inputs), list(step.outputs)
            graph = Graph(step.name.replace("/", "_") or "host", tuple(inputs), step.nodes,
                          tuple(outputs))
            steps.append({"host": step.name, "reason": step.reason,
                          "graph": sections.add("h", str(graph).encode("utf-8")),
                          "inputs": [slot(step.inputs[v]) for v in inputs],
                          "outputs": [slot(step.outputs[v]) for v in outputs]})
    graph = parts.graph
    return {
        "name": graph.name,
        "inputs": [[v.name or f"#{i}", v.dtype.value, list(v.shape)]
                   for i, v in enumerate(graph.inputs)],
        "outputs": [[v.dtype.value, list(v.shape)] for v in graph.outputs],
        "align": [[i, a] for i, a in sorted(parts.align.items())],
        "arena_bytes": int(parts.memory_plan.arena_bytes),
        "memory_plan": {"offsets": dict(parts.memory_plan.offsets),
                        "sum_bytes": int(parts.memory_plan.sum_bytes)},
        "steps": steps,
        "copies": [[j, slot(s)] for j, s in parts.copies],
        "plan": sections.add("t", plan_text.encode("utf-8")),
    }


def launch_sequence_text(exe: NativeExecutable) -> str:
    """The kernel plan (when the executable has one) and its launch sequence, as text."""
    from tilefuse.kernel.plan_printer import print_plan

    lines = [print_plan(exe.kernel_plan).rstrip()] if exe.kernel_plan is not None else []
    lines += ["", "launch sequence:"]
    for i, step in enumerate(exe.steps):
        if isinstance(step, NativeStep):
            names = ", ".join(launch.kernel.name for launch in step.launches)
            lines.append(f"  {i}: {step.name} native: {names}")
        else:
            lines.append(f"  {i}: {step.name} HOST FALLBACK: {step.reason}")
    lines += ["", "memory plan: " + exe.memory_plan.report()]
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------- decode

class Reader:
    """Typed access to a program's JSON with errors that name the file and the field."""

    def __init__(self, path: str):
        self.path = path

    def fail(self, what: str) -> ArtifactError:
        return ArtifactError(f"{self.path}: malformed artifact: {what}")

    def obj(self, data: Any, key: str, kind: type | tuple[type, ...], where: str) -> Any:
        if not isinstance(data, dict) or key not in data:
            raise self.fail(f"{where} has no {key!r}")
        value = data[key]
        if not isinstance(value, kind) or (isinstance(value, bool) and kind is int):
            raise self.fail(f"{where}.{key} has the wrong type")
        return value

    def items(self, data: Any, key: str, where: str) -> list[Any]:
        value = self.obj(data, key, list, where)
        if len(value) > MAX_ITEMS:
            raise self.fail(f"{where}.{key} has {len(value)} items")
        return value

    def count(self, value: Any, where: str, limit: int | None = None) -> int:
        if type(value) is not int or value < 0 or (limit is not None and value >= limit):
            raise self.fail(f"{where} is {value!r}, not an index/count in range")
        return value

    def dtype(self, value: Any, where: str) -> DType:
        try:
            return DType(value)
        except (ValueError, TypeError):
            raise self.fail(f"{where}: unknown dtype {value!r}") from None

    def shape(self, value: Any, where: str) -> tuple[int, ...]:
        if not isinstance(value, list) or len(value) > MAX_RANK:
            raise self.fail(f"{where}: bad shape {value!r}")
        shape = tuple(self.count(d, where) for d in value)
        if math.prod(shape) > 1 << 48:
            raise self.fail(f"{where}: shape {list(shape)} is too large")
        return shape


class Decoder:
    """Rebuilds executables from programs of one artifact, sharing its kernels and constants."""

    def __init__(self, container: Container, manifest: Mapping[str, Any],
                 link: Callable[[list[tuple[bytes, KernelSignature]]], list[CompiledKernel]]):
        """``link`` turns every kernel's (object code, signature) into kernels, at once."""
        self.container = container
        self.read = Reader(container.path)
        specs = self.read.items(manifest, "kernels", "manifest")
        self._constant_specs = self.read.items(manifest, "constants", "manifest")
        self._constants: dict[int, np.ndarray] = {}
        objects = []
        for i, spec in enumerate(specs):
            name = self.read.obj(spec, "section", str, f"kernel {i}")
            signature = self.read.obj(spec, "signature", dict, f"kernel {i}")
            try:
                sig = KernelSignature.from_json(signature)
            except Exception as err:
                raise self.read.fail(f"kernel {i}: {err}") from None
            objects.append((bytes(self.container.section(name)), sig))
        self._kernels = link(objects) if objects else []

    def kernel(self, index: Any, where: str) -> CompiledKernel:
        return self._kernels[self.read.count(index, where, len(self._kernels))]

    def constant(self, index: Any, where: str) -> np.ndarray:
        i = self.read.count(index, where, len(self._constant_specs))
        found = self._constants.get(i)
        if found is None:
            spec = self._constant_specs[i]
            where = f"constant {i}"
            dtype = self.read.dtype(self.read.obj(spec, "dtype", str, where), where)
            shape = self.read.shape(self.read.obj(spec, "shape", list, where), where)
            found = self.container.array(self.read.obj(spec, "section", str, where), dtype.np,
                                         shape)
            self._constants[i] = found
        return found

    def executable(self, program: Mapping[str, Any],
                   launcher: tuple[int, object] | None = None) -> NativeExecutable:
        """The executable of one program (see the module docstring); ``launcher`` (address
        and owner of the generic launcher's code), when given, runs an all-native sequence as
        one native call."""
        read = self.read
        if isinstance(program, dict) and "symbolic" in program:
            from tilefuse.artifact.symbolic import SymbolicProgram

            return SymbolicProgram(self, program, launcher)  # type: ignore[return-value]
        name = read.obj(program, "name", str, "program")
        where = f"program {name!r}"
        self.container.section(read.obj(program, "plan", str, where))  # LoadedModel.plans
        inputs = [self._value(v, f"{where} input {i}", named=True)
                  for i, v in enumerate(read.items(program, "inputs", where))]
        outputs = [self._value(v, f"{where} output {j}", named=False)
                   for j, v in enumerate(read.items(program, "outputs", where))]
        io_count = len(inputs) + len(outputs)
        arena_bytes = read.count(read.obj(program, "arena_bytes", int, where), "arena_bytes")
        if arena_bytes > 1 << 40:
            raise read.fail(f"{where}: arena of {arena_bytes} bytes")
        try:
            arena = aligned_empty(max(arena_bytes, 1), np.uint8)
        except MemoryError:
            raise ArtifactError(f"{self.container.path}: out of memory allocating the "
                                f"{arena_bytes}-byte arena of {name}") from None

        def slot(data: Any, at: str) -> Slot:
            if not isinstance(data, list) or not data:
                raise read.fail(f"{at}: bad slot {data!r}")
            kind = data[0]
            if kind == "io" and len(data) == 2:
                return read.count(data[1], at, io_count)
            if kind == "const" and len(data) == 2:
                return self.constant(data[1], at)
            if kind == "arena" and len(data) == 4:
                offset = read.count(data[1], at)
                dtype = read.dtype(data[2], at).np
                shape = read.shape(data[3], at)
                nbytes = math.prod(shape) * dtype.itemsize
                if offset + nbytes > arena.nbytes or offset % dtype.itemsize:
                    raise read.fail(f"{at}: arena view at {offset} ({nbytes} bytes) lies outside "
                                    f"the {arena_bytes}-byte arena")
                return arena[offset:offset + nbytes].view(dtype).reshape(shape)
            raise read.fail(f"{at}: bad slot {data!r}")

        steps: list[Step] = []
        for s, step in enumerate(read.items(program, "steps", where)):
            at = f"{where} step {s}"
            if isinstance(step, dict) and "native" in step:
                steps.append(self._native(step, at, slot))
            elif isinstance(step, dict) and "host" in step:
                steps.append(self._host(step, at, slot))
            else:
                raise read.fail(f"{at} is neither native nor host")
        copies = []
        for c in read.items(program, "copies", where):
            if not isinstance(c, list) or len(c) != 2:
                raise read.fail(f"{where}: bad copy {c!r}")
            j = read.count(c[0], f"{where} copy", len(outputs))
            copies.append((j, slot(c[1], f"{where} copy {j}")))
        align = {}
        for a in read.items(program, "align", where):
            if not isinstance(a, list) or len(a) != 2:
                raise read.fail(f"{where}: bad alignment {a!r}")
            align[read.count(a[0], "align", len(inputs))] = read.count(a[1], "align", 4097)
        memory = read.obj(program, "memory_plan", dict, where)
        offsets = read.obj(memory, "offsets", dict, f"{where} memory_plan")
        plan = MemoryPlan({str(k): v for k, v in offsets.items() if type(v) is int},
                          arena_bytes, read.count(memory.get("sum_bytes"), "sum_bytes"))
        graph = Graph(name, tuple(inputs), (), tuple(outputs))
        parts = ExecutableParts(graph, plan, arena, tuple(steps), align, tuple(copies))
        runs = None
        if launcher is not None and steps and all(isinstance(s, NativeStep) for s in steps):
            from tilefuse.artifact.launcher import SequenceLauncher

            runs = SequenceLauncher(*launcher, steps, io_count)
        return NativeExecutable.from_parts(parts, runs)

    def _value(self, data: Any, where: str, *, named: bool) -> Value:
        read = self.read
        if not isinstance(data, list) or len(data) != (3 if named else 2):
            raise read.fail(f"{where}: bad signature entry {data!r}")
        name = data[0] if named else None
        if named and not isinstance(name, str):
            raise read.fail(f"{where}: bad name")
        dtype = read.dtype(data[-2], where)
        return Value(TensorType(read.shape(data[-1], where), dtype), name)

    def _native(self, step: Mapping[str, Any], at: str,
                slot: Callable[[Any, str], Slot]) -> NativeStep:
        read = self.read
        launches = []
        for k, launch in enumerate(read.items(step, "launches", at)):
            where = f"{at} launch {k}"
            kernel = self.kernel(read.obj(launch, "kernel", int, where), where)
            args = [slot(a, where) for a in read.items(launch, "args", where)]
            scalars = [a for a in read.items(launch, "scalars", where)
                       if type(a) is int and -(1 << 63) <= a < 1 << 63]
            if len(args) != len(kernel.signature.buffers) or \
                    len(scalars) != len(kernel.signature.scalars) or \
                    len(scalars) != len(launch["scalars"]):
                raise read.fail(f"{where}: arguments do not match kernel {kernel.name}")
            try:
                launches.append(KernelLaunch(kernel, args, scalars))
            except ArtifactError:
                raise
            except Exception as err:
                raise read.fail(f"{where}: {err}") from None
        return NativeStep(str(step["native"]), tuple(launches))

    def _host(self, step: Mapping[str, Any], at: str,
              slot: Callable[[Any, str], Slot]) -> HostStep:
        from tilefuse.graph.parser import parse_graph

        read = self.read
        text = bytes(self.container.section(read.obj(step, "graph", str, at)))
        try:
            graph = parse_graph(text.decode("utf-8"))
        except Exception as err:
            raise read.fail(f"{at}: its host graph does not parse: {err}") from None
        ins = read.items(step, "inputs", at)
        outs = read.items(step, "outputs", at)
        if len(ins) != len(graph.inputs) or len(outs) != len(graph.outputs):
            raise read.fail(f"{at}: slots do not match its host graph")
        inputs = {v: slot(s, at) for v, s in zip(graph.inputs, ins)}
        outputs = {v: slot(s, at) for v, s in zip(graph.outputs, outs)}
        for v, s in [*inputs.items(), *outputs.items()]:
            if not isinstance(s, int) and (s.shape != tuple(v.shape) or s.dtype != v.dtype.np):
                raise read.fail(f"{at}: a slot of {s.dtype}{list(s.shape)} for a "
                                f"{v.type} value")
        reason = step.get("reason")
        return HostStep(str(step["host"]), graph.nodes, inputs, outputs,
                        reason if isinstance(reason, str) else "host step")
