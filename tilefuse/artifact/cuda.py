"""Cuda artifacts: a :class:`~tilefuse.runtime.gpu.GpuProgram` (PTX inside) saved as data.

Building a cuda program needs no GPU (:func:`tilefuse.driver.build_gpu_program`), so
``tilefuse compile MODEL --target cuda:sm_90`` writes one on any machine. The program is saved
as a *cuda program*: the signature, every value the steps touch (dtype, shape; a graph input,
output, constant or intermediate), and per step

- a generated kernel: its loop IR as text (parsed back: the launch names its entry, and a
  device simulation can run it), its PTX (a section), the values of its parameters, grid,
  block and SIMT width;
- a cuBLAS product: its operands, result and :class:`~tilefuse.runtime.cublas.GemmShape`, and
  the generated tensor-core product timed against it, when there is one (PTX and sizes).

Fused attention kernels and host steps are not saved yet: saving a program with one is an
ArtifactError naming it (nothing is saved in part). Loading validates the whole program first
(indices, dtypes, shapes, that every kernel's parameters match its loop IR), then needs a usable
CUDA GPU: on a machine without one it is an ArtifactError naming the target, raised before any
of the file's code is loaded. The executable is :class:`~tilefuse.runtime.gpu.CudaExecutable`,
which loads the PTX into the device's context (the driver JIT-compiles it for the device).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from tilefuse.artifact.format import ArtifactError
from tilefuse.graph.ir import Graph, Value
from tilefuse.graph.types import TensorType

if TYPE_CHECKING:
    from tilefuse.artifact.program import Decoder, Sections
    from tilefuse.runtime.gpu import GpuProgram

KNOBS = ("arch", "ptx_isa", "block_threads", "max_blocks", "row_unroll", "elementwise_unroll",
         "register_row", "long_row_block", "reciprocal_divisors", "resident_grid")
"""The :class:`~tilefuse.codegen.llvm_nvptx.GpuTarget` fields a cuda program is built with."""


def encode_cuda(program: GpuProgram, sections: Sections) -> dict[str, Any]:
    """The data of ``program``; PTX, loop IR and constants go to ``sections``."""
    from tilefuse.loop.printer import format_function
    from tilefuse.runtime.gpu import FusedStep, GemmStep, GpuKernel, HostGroup

    graph = program.graph
    ids: dict[Value, int] = {}
    values: list[list[Any]] = []

    def ref(v: Value) -> int:
        found = ids.get(v)
        if found is None:
            found = ids[v] = len(values)
            values.append([v.dtype.value, [int(d) for d in v.shape]])
        return found

    inputs = [ref(v) for v in graph.inputs]
    constants = [[ref(v), sections.constant(np.ascontiguousarray(a))]
                 for v, a in program.constants.items()]
    steps: list[dict[str, Any]] = []
    for step in program.steps:
        if isinstance(step, GpuKernel):
            steps.append({"kernel": step.fn.name, "group": step.group.name,
                          "kind": step.group.kind.value,
                          "loop": sections.add("l", format_function(step.fn).encode("utf-8")),
                          "ptx": sections.add("p", step.ptx.encode("utf-8")),
                          "bindings": [ref(v) for v in step.bindings],
                          "outputs": [ref(v) for v in step.group.outputs],
                          "grid": step.grid, "block": step.block, "simt": step.simt_width})
        elif isinstance(step, GemmStep):
            shape = step.shape
            saved: dict[str, Any] = {
                "gemm": step.group.name, "a": ref(step.a), "b": ref(step.b),
                "out": ref(step.out),
                "shape": [shape.batch, shape.m, shape.n, shape.k, shape.stride_a,
                          shape.stride_b, shape.dtype.value]}
            if step.mma is not None:
                mma = step.mma
                saved["mma"] = {"name": mma.name, "m": mma.m, "n": mma.n, "k": mma.k,
                                "out_dtype": mma.out_dtype.value,
                                "ptx": sections.add("p", mma.ptx.encode("utf-8"))}
            steps.append(saved)
        elif isinstance(step, (FusedStep, HostGroup)):
            what = "a fused attention kernel" if isinstance(step, FusedStep) else \
                "a host step"
            raise ArtifactError(f"@{graph.name}: step {step.group.name} is {what}, which cuda "
                                "artifacts do not hold yet")
        else:
            raise ArtifactError(f"@{graph.name}: cannot save a {type(step).__name__}")
    outputs = [ref(v) for v in graph.outputs]
    target = {k: getattr(program.target, k) for k in KNOBS}
    return {"name": graph.name, "cuda": target, "values": values, "inputs": inputs,
            "outputs": outputs, "constants": constants, "steps": steps}


def decode_cuda(decoder: Decoder, program: Mapping[str, Any]) -> GpuProgram:
    """The :class:`GpuProgram` of a saved cuda program, validated (no GPU needed)."""
    from tilefuse.codegen.llvm_nvptx import GpuTarget
    from tilefuse.codegen.nvptx_mma import MmaGemm
    from tilefuse.kernel.fusion import KernelGroup, KernelKind
    from tilefuse.loop.parser import parse_function
    from tilefuse.runtime.cublas import GemmShape
    from tilefuse.runtime.gpu import GemmStep, GpuKernel, GpuProgram

    read = decoder.read
    name = read.obj(program, "name", str, "program")
    where = f"cuda program {name!r}"
    knobs = read.obj(program, "cuda", dict, where)
    try:
        target = GpuTarget(**{k: knobs[k] for k in KNOBS})
    except (KeyError, TypeError) as err:
        raise read.fail(f"{where}: bad target {err}") from None
    if not isinstance(target.arch, str) or not target.arch.startswith("sm_") or not all(
            type(getattr(target, k)) is int for k in KNOBS if k != "arch"):
        raise read.fail(f"{where}: bad target {knobs!r}")
    values = []
    for i, spec in enumerate(read.items(program, "values", where)):
        if not isinstance(spec, list) or len(spec) != 2:
            raise read.fail(f"{where}: bad value {i}")
        values.append(Value(TensorType(read.shape(spec[1], f"{where} value {i}"),
                                       read.dtype(spec[0], f"{where} value {i}"))))

    def value(index: Any, at: str) -> Value:
        return values[read.count(index, at, len(values))]

    inputs = tuple(value(v, f"{where} inputs") for v in read.items(program, "inputs", where))
    outputs = tuple(value(v, f"{where} outputs") for v in read.items(program, "outputs", where))
    constants: dict[Value, np.ndarray] = {}
    for c in read.items(program, "constants", where):
        if not isinstance(c, list) or len(c) != 2:
            raise read.fail(f"{where}: bad constant {c!r}")
        v = value(c[0], f"{where} constant")
        array = decoder.constant(c[1], f"{where} constant")
        if array.size != math.prod(v.shape) or array.dtype != v.dtype.np:
            raise read.fail(f"{where}: constant of {array.dtype}{list(array.shape)} for a "
                            f"{v.type} value")
        constants[v] = array  # as the build held it (a scalar may be [1])
    made = GpuProgram(Graph(name, inputs, (), outputs), target, constants)
    written: set[Value] = set()
    for s, step in enumerate(read.items(program, "steps", where)):
        at = f"{where} step {s}"
        if isinstance(step, dict) and "kernel" in step:
            text = _text(decoder, read.obj(step, "loop", str, at), at)
            try:
                fn = parse_function(text)
            except Exception as err:
                raise read.fail(f"{at}: its loop IR does not parse: {err}") from None
            bindings = tuple(value(v, at) for v in read.items(step, "bindings", at))
            if fn.name != read.obj(step, "kernel", str, at) or len(bindings) != len(fn.buffers) \
                    or fn.scalars or any(b.dtype is not v.dtype
                                         for b, v in zip(fn.buffers, bindings)):
                raise read.fail(f"{at}: its parameters do not match kernel {fn.name}")
            outs = tuple(value(v, at) for v in read.items(step, "outputs", at))
            try:
                kind = KernelKind(read.obj(step, "kind", str, at))
            except ValueError:
                raise read.fail(f"{at}: unknown kernel kind") from None
            group = KernelGroup(read.obj(step, "group", str, at), kind, (),
                                tuple(b for b in bindings if b not in outs), outs, None, ())
            grid = read.count(read.obj(step, "grid", int, at), at, 1 << 31)
            block = read.count(read.obj(step, "block", int, at), at, 1025)
            simt = read.count(read.obj(step, "simt", int, at), at, 33)
            made.steps.append(GpuKernel(group, fn, _text(decoder, read.obj(step, "ptx", str,
                                                                           at), at),
                                        bindings, max(grid, 1), max(block, 1), max(simt, 1)))
            written.update(outs)
        elif isinstance(step, dict) and "gemm" in step:
            a, b, out = (value(step.get(k), at) for k in ("a", "b", "out"))
            spec = read.items(step, "shape", at)
            if len(spec) != 7:
                raise read.fail(f"{at}: bad product shape")
            shape = GemmShape(*(read.count(x, at, 1 << 40) for x in spec[:6]),
                              read.dtype(spec[6], at))
            _check_gemm(read, at, shape, a, b, out)
            mma = None
            if "mma" in step:
                m = read.obj(step, "mma", dict, at)
                mma = MmaGemm(read.obj(m, "name", str, at),
                              *(read.count(m.get(k), at, 1 << 31) for k in ("m", "n", "k")),
                              read.dtype(m.get("out_dtype"), at),
                              _text(decoder, read.obj(m, "ptx", str, at), at))
                if (mma.m, mma.n, mma.k) != (shape.m, shape.n, shape.k):
                    raise read.fail(f"{at}: the tensor-core product's sizes differ")
            group = KernelGroup(str(step["gemm"]), KernelKind.CONTRACTION, (), (a, b), (out,),
                                None, ())
            made.steps.append(GemmStep(group, a, b, out, shape, mma))
            written.add(out)
        else:
            raise read.fail(f"{at} is neither a kernel nor a product")
    known = set(inputs) | set(constants) | written
    for step in made.steps:
        reads = step.bindings if isinstance(step, GpuKernel) else (step.a, step.b)
        if any(v not in known for v in reads):
            raise read.fail(f"{where}: step {step.group.name} reads a value nothing writes")
    if any(v not in known for v in outputs):
        raise read.fail(f"{where}: an output nothing writes")
    return made


def _text(decoder: Decoder, section: str, at: str) -> str:
    try:
        return bytes(decoder.container.section(section)).decode("utf-8")
    except UnicodeDecodeError:
        raise decoder.read.fail(f"{at}: section {section!r} is not text") from None


def _check_gemm(read: Any, at: str, shape: Any, a: Value, b: Value, out: Value) -> None:
    """The operands hold what the product reads and the result what it writes."""
    if shape.dtype is not a.dtype or a.dtype is not b.dtype or min(
            shape.batch, shape.m, shape.n, shape.k) < 1:
        raise read.fail(f"{at}: bad product {shape}")
    need_a = (shape.batch - 1) * shape.stride_a + shape.m * shape.k
    need_b = (shape.batch - 1) * shape.stride_b + shape.k * shape.n
    if math.prod(a.shape) < need_a or math.prod(b.shape) < need_b or \
            math.prod(out.shape) != shape.batch * shape.m * shape.n:
        raise read.fail(f"{at}: the product {shape} does not fit its operands")


def cuda_program_executable(program: GpuProgram, path: str) -> Any:
    """The program loaded on this machine's GPU; ArtifactError without a usable one."""
    from tilefuse.runtime.cuda_driver import CudaContext, CudaError, cuda_available

    if not cuda_available():
        raise ArtifactError(f"{path}: built for cuda:{program.target.arch} (PTX); this machine "
                            "has no usable CUDA GPU (or no cuda-python driver bindings)")
    from tilefuse.runtime.gpu import CudaExecutable

    try:
        return CudaExecutable(program, CudaContext())
    except CudaError as err:
        raise ArtifactError(f"{path}: the GPU refused the program: {err}") from None


def target_of(manifest: Mapping[str, Any]) -> str | None:
    """The cuda target a manifest names (``"sm_90"``), else None."""
    spec = manifest.get("target")
    if isinstance(spec, dict) and isinstance(spec.get("cuda"), str):
        return spec["cuda"]
    return None


__all__ = ["KNOBS", "cuda_program_executable", "decode_cuda", "encode_cuda", "target_of"]

