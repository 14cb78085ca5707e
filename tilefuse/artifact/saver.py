"""``tilefuse.save``: what has been compiled, written to one ``.tilefuse`` file.

Saving collects the native executables a compiled object holds, one per specialisation (an
input signature it was compiled for), and writes for each its program
(:mod:`tilefuse.artifact.program`: signature, launch sequence, memory plan, kernel plan as
text), with the kernels' relocatable object code and the constants (weights, packed
matrices) stored once. The manifest (JSON) also records the target, the kind of object and how
its outputs are returned, so that :func:`tilefuse.load` gives back a callable that behaves
the same: a jitted function's result structure, an ONNX model's single output or list and
``run(names, feed)``.

Supported: :func:`tilefuse.jit` functions (every specialisation compiled so far; a symbolic
entry as one program with its shape formulas, :mod:`tilefuse.artifact.symbolic`, or, when some
of its kernels are built per size, as the size bindings it has prepared),
:func:`tilefuse.onnx.load` models, and
:class:`~tilefuse.runtime.native.NativeExecutable`. A specialisation that is not a native CPU
build (the ``reference`` or ``cuda`` target) is a TilefuseError: nothing is saved silently in
part.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tilefuse.artifact import program
from tilefuse.artifact.format import FORMAT_VERSION, ArtifactError, write
from tilefuse.codegen.target import CpuTarget, host_target
from tilefuse.runtime.launch import NativeStep
from tilefuse.runtime.native import NativeExecutable

MANIFEST = "manifest"
LAUNCHER = "launcher"
POOL = "pool"


class _Out:
    """Stands for output ``index`` when a jitted function's packer is run on markers."""

    def __init__(self, index: int):
        self.index = index


def _structure(packed: Any) -> Any:
    """A packer's result on markers, as JSON: ``{"out": i}``, ``{"tuple": [...]}``,
    ``{"list": [...]}`` (a namedtuple is saved as a tuple)."""
    if isinstance(packed, _Out):
        return {"out": packed.index}
    if isinstance(packed, list):
        return {"list": [_structure(p) for p in packed]}
    if isinstance(packed, tuple):
        return {"tuple": [_structure(p) for p in packed]}
    raise ArtifactError(f"cannot save a result structure holding {type(packed).__name__}")


def specializations(executable: object, what: str) -> list[NativeExecutable]:
    """The native executables behind one compiled entry (several for a symbolic one: each
    size binding it has prepared). TilefuseError for anything else."""
    from tilefuse.backend.cpu_symbolic import SymbolicNativeExecutable
    from tilefuse.runtime.dynamic import DynamicExecutable

    if isinstance(executable, NativeExecutable):
        return [executable]
    if isinstance(executable, DynamicExecutable):
        if executable.symbolic is not None:
            return specializations(executable.symbolic, what)
        made = [e for exe in list(executable._specialized.values())
                for e in specializations(exe, what)]
        if not made:
            raise ArtifactError(f"{what} has symbolic dims, no build that serves every size, "
                                "and no size built yet: call it once with each input shape "
                                "to save")
        return made
    if isinstance(executable, SymbolicNativeExecutable):
        from tilefuse.artifact.symbolic import savable

        why = savable(executable)
        if why is None:  # one program with shape formulas: runs at every size
            return [executable]  # type: ignore[list-item]
        made = [executable.for_sizes(sizes) for sizes in executable.bindings]
        if not made:
            raise ArtifactError(f"{what} has symbolic dims and no size built yet, and cannot be "
                                f"saved with shape formulas ({why}): call it once with each "
                                "input shape to save")
        return made
    raise ArtifactError(f"{what} is a {type(executable).__name__}, not a native CPU build; only "
                        "target 'cpu' can be saved")


def _jit_entries(fn: Any) -> list[tuple[NativeExecutable, dict[str, Any]]]:
    cache = dict(fn._cache)
    if not cache:
        raise ArtifactError(f"{fn!r} has not been compiled yet: call it (or .lower it) with "
                            "example arguments before saving")
    made = []
    for entry in cache.values():
        count = len(entry.optimized.outputs)
        structure = _structure(entry.pack([_Out(i) for i in range(count)]))
        for exe in specializations(entry.executable, repr(fn)):
            made.append((exe, {"pack": structure}))
    return made


def _onnx_entries(model: Any) -> list[tuple[NativeExecutable, dict[str, Any]]]:
    lowered = [model.symbolic] if model.symbolic is not None else \
        list(model._cache.values())
    if model._by_value:
        raise ArtifactError(f"{model!r} is compiled per value of input(s) "
                            f"{[model.input_names[i] for i in model._by_value]} "
                            "(a shape fed as an input); such a model cannot be saved")
    made = [(exe, {}) for entry in lowered for exe in specializations(entry.executable,
                                                                      repr(model))]
    if not made:
        raise ArtifactError(f"{model!r} has not been compiled yet: call it once before saving")
    return made


def collect(compiled: object) -> tuple[str, dict[str, Any], list[tuple[NativeExecutable,
                                                                     dict[str, Any]]]]:
    """(kind, fields of the manifest, executables with their per-entry fields)."""
    from tilefuse.frontend.jit import JitFunction

    if isinstance(compiled, JitFunction):
        return "jit", {"name": compiled._qualname}, _jit_entries(compiled)
    if isinstance(compiled, NativeExecutable):
        return "executable", {"name": compiled.graph.name}, [(compiled, {})]
    onnx_model = _onnx_model_type()
    if onnx_model is not None and isinstance(compiled, onnx_model):
        return "onnx", {"name": compiled.info.name, "input_names": compiled.input_names,
                        "output_names": compiled.output_names}, _onnx_entries(compiled)
    exported = _exported_type()
    if exported is not None and isinstance(compiled, exported):
        from tilefuse.artifact.exported import exported_entries

        fields, entries = exported_entries(compiled)
        return "exported", fields, entries
    raise ArtifactError(f"cannot save a {type(compiled).__name__}: tilefuse.save takes a "
                        "tilefuse.jit function, a tilefuse.onnx model, a compile_exported "
                        "result or a NativeExecutable")


def _onnx_model_type() -> type | None:
    import sys

    module = sys.modules.get("tilefuse.onnx.compiled")
    return None if module is None else module.OnnxModel


def _exported_type() -> type | None:
    import sys

    module = sys.modules.get("tilefuse.frontend.torch.backend")
    return None if module is None else module.CompiledExported


def _targets(exe: NativeExecutable) -> set[CpuTarget]:
    if not isinstance(exe, NativeExecutable):  # a symbolic build
        return {k.compiled.target for p in exe._builder.pending for k in p.kernels}
    return {launch.kernel.target for step in exe.steps if isinstance(step, NativeStep)
            for launch in step.launches}


def save(compiled: object, path: str | Path) -> Path:
    """Writes ``compiled`` (see the module docstring) to ``path``; returns the path.
    TilefuseError when it holds something that cannot be saved."""
    kind, fields, entries = collect(compiled)
    return write_artifact(path, kind, fields, entries)


def write_artifact(path: str | Path, kind: str, fields: dict[str, Any],
                   entries: list[tuple[NativeExecutable, dict[str, Any]]]) -> Path:
    """Writes executables as an artifact of ``kind`` (``jit``, ``onnx``, ``exported`` or
    ``executable``) with the manifest ``fields`` (name, input and output names) and per entry
    its extra fields (a jitted function's result structure)."""
    import tilefuse

    targets = {t for exe, _ in entries for t in _targets(exe)} or {host_target()}
    if len(targets) != 1:
        raise ArtifactError("the executables to save were built for different targets")
    (target,) = targets
    sections = program.Sections()
    saved = []
    seen: set[tuple] = set()
    for exe, extra in entries:
        signature = tuple((v.dtype.value, tuple(map(str, v.shape))) for v in exe.graph.inputs)
        if signature in seen:
            raise ArtifactError(f"two compiled entries take the same inputs {signature} (a "
                                "function compiled for two values of a static argument); "
                                "save one at a time")
        seen.add(signature)
        if isinstance(exe, NativeExecutable):
            text = program.launch_sequence_text(exe)
            saved.append({"program": program.encode(exe, sections, text), **extra})
        else:  # a symbolic build, saved with its shape formulas
            from tilefuse.artifact.symbolic import encode_symbolic, plan_text

            saved.append({"program": encode_symbolic(exe, sections, plan_text(exe)), **extra})
    manifest = {"format": FORMAT_VERSION, "tilefuse_version": tilefuse.__version__,
                "kind": kind, **fields,
                "target": {"triple": target.triple, "cpu": target.cpu,
                           "features": target.features},
                "entries": saved, "kernels": sections.kernels, "constants": sections.constants}
    if any(getattr(exe, "single_entry", True) for exe, _ in entries):  # one native call a run
        from tilefuse.artifact.launcher import launcher_object

        sections.data[LAUNCHER] = launcher_object(target)
    if any(k["signature"]["threads"] for k in sections.kernels):  # parallel loops' runtime
        from tilefuse.codegen.pool import pool_object

        sections.data[POOL] = pool_object(target)
    text = json.dumps(manifest, ensure_ascii=True, allow_nan=False, separators=(",", ":"))
    write(path, {MANIFEST: text.encode("ascii"), **sections.data})
    return Path(path)


def write_cuda_artifact(path: str | Path, kind: str, fields: dict[str, Any],
                        programs: list[Any]) -> Path:
    """Writes cuda programs (:class:`~tilefuse.runtime.gpu.GpuProgram`, PTX inside, built
    without a GPU) as an artifact of ``kind``: :mod:`tilefuse.artifact.cuda`."""
    import tilefuse
    from tilefuse.artifact.cuda import encode_cuda

    archs = {p.target.arch for p in programs}
    if len(archs) != 1:
        raise ArtifactError("the programs to save were built for different GPUs")
    sections = program.Sections()
    saved = [{"program": encode_cuda(p, sections)} for p in programs]
    manifest = {"format": FORMAT_VERSION, "tilefuse_version": tilefuse.__version__,
                "kind": kind, **fields, "target": {"cuda": archs.pop()}, "entries": saved,
                "kernels": [], "constants": sections.constants}
    text = json.dumps(manifest, ensure_ascii=True, allow_nan=False, separators=(",", ":"))
    write(path, {MANIFEST: text.encode("ascii"), **sections.data})
    return Path(path)
