"""``tilefuse.load``: a ``.tilefuse`` file back into something callable, without compiling.

Loading reads and validates the container (:func:`tilefuse.artifact.format.read`: version,
lengths, checksum), parses the JSON manifest, checks that this host has every CPU feature the
code was built for (naming the missing ones), and only then links the kernels' object code
(each checked as an ELF relocatable first: :func:`tilefuse.codegen.elf_check.check_object`) and
rebuilds each executable from its program (:mod:`tilefuse.artifact.program`). No tracing, no
graph pass, no LLVM optimisation or code generation runs: the loader imports none of the
modules that do them. Every problem with the file is an :class:`ArtifactError`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from tilefuse.artifact.format import FORMAT_VERSION, ArtifactError, Container, read
from tilefuse.artifact.program import Decoder
from tilefuse.codegen.abi import CompiledKernel, KernelSignature
from tilefuse.codegen.target import CpuTarget
from tilefuse.errors import GuardError
from tilefuse.runtime.executable import select_outputs
from tilefuse.runtime.native import NativeExecutable

_KINDS = ("jit", "onnx", "exported", "executable")


def _manifest(container: Container) -> dict[str, Any]:
    raw = container.section("manifest")
    try:
        manifest = json.loads(bytes(raw).decode("ascii"))
    except (UnicodeDecodeError, ValueError, RecursionError) as err:
        raise ArtifactError(f"{container.path}: its manifest is not JSON: {err}") from None
    if not isinstance(manifest, dict):
        raise ArtifactError(f"{container.path}: its manifest is not a JSON object")
    if manifest.get("format") != FORMAT_VERSION:
        raise ArtifactError(f"{container.path}: manifest of format {manifest.get('format')!r}; "
                            f"this tilefuse reads {FORMAT_VERSION}")
    if manifest.get("kind") not in _KINDS:
        raise ArtifactError(f"{container.path}: unknown artifact kind {manifest.get('kind')!r}")
    return manifest


def _target(container: Container, manifest: Mapping[str, Any]) -> CpuTarget:
    """The artifact's target, after checking this host can run its code."""
    from tilefuse.artifact.targets import missing_features, runs_here_by_cpuinfo
    from tilefuse.codegen.target import host_target

    spec = manifest.get("target")
    if not isinstance(spec, dict) or not all(isinstance(spec.get(k), str)
                                             for k in ("triple", "cpu", "features")):
        raise ArtifactError(f"{container.path}: its manifest names no valid target")
    target = CpuTarget(spec["triple"], spec["cpu"], spec["features"])
    if runs_here_by_cpuinfo(target):  # no need to load LLVM to ask it
        return target
    host = host_target()
    if target.triple.split("-")[0] != host.triple.split("-")[0]:
        raise ArtifactError(f"{container.path}: built for {target.triple}; this host is "
                            f"{host.triple}")
    missing = missing_features(target, host)
    if missing:
        raise ArtifactError(f"{container.path}: built for CPU {target.cpu}, whose features this "
                            f"host ({host.cpu}) lacks: {', '.join(missing)}")
    return target


class LoadedModel:
    """A compiled model loaded from an artifact. ``model(*arrays)`` runs the specialisation
    whose input shapes and dtypes the arrays have:

    - ``kind == "onnx"``: returns the single output or a list, like the ONNX model did;
      ``model.run(output_names, input_feed)`` as onnxruntime;
    - ``"jit"``: takes the traced array arguments (positional, then keyword; static
      arguments were fixed when it was compiled and are not passed) and returns the
      function's result structure (a namedtuple comes back as a tuple);
    - ``"exported"``: takes the exported program's user inputs (NumPy arrays or CPU torch
      tensors, flattened) and returns torch tensors when given tensors;
    - ``"executable"``: a list of arrays.
    """

    def __init__(self, container: Container, manifest: Mapping[str, Any], target: CpuTarget,
                 entries: Sequence[tuple[NativeExecutable, Mapping[str, Any]]]):
        self.path = container.path
        self._container = container
        self.kind: str = manifest["kind"]
        self.name: str = str(manifest.get("name", ""))
        self.target = target
        self.manifest = manifest
        self.executables = [exe for exe, _ in entries]
        self._entries = {self._signature(exe): (exe, extra) for exe, extra in entries}
        self._only = entries[0] if len(entries) == 1 else None
        names = manifest.get("input_names")
        first = self.executables[0].graph.inputs
        self.input_names: list[str] = [str(n) for n in names] if isinstance(names, list) \
            else [v.name or f"#{i}" for i, v in enumerate(first)]
        outs = manifest.get("output_names")
        self.output_names: list[str] = list(outs) if isinstance(outs, list) else []

    @staticmethod
    def _signature(exe: NativeExecutable) -> tuple:
        return tuple((v.dtype.np.str, tuple(v.shape)) for v in exe.graph.inputs)

    def __repr__(self) -> str:
        shapes = "; ".join(", ".join(str(v.type) for v in exe.graph.inputs)
                           for exe in self.executables)
        return (f"<tilefuse artifact {self.kind} {self.name!r} from {self.path} for "
                f"{self.target.cpu}: {shapes}>")

    @property
    def plans(self) -> list[str]:
        """The kernel plan and launch sequence of each specialisation, as saved."""
        return [bytes(self._container.section(e["program"]["plan"])).decode("utf-8",
                                                                            "replace")
                for e in self.manifest["entries"]]

    def executable_for(self, arrays: Sequence[Any]) -> tuple[NativeExecutable, Mapping[str, Any]]:
        """The specialisation a call with ``arrays`` runs; GuardError when none matches."""
        if self._only is not None:
            return self._only
        key = tuple((a.dtype.str, a.shape) if isinstance(a, np.ndarray) else None
                    for a in arrays)
        found = self._entries.get(key)
        if found is None:  # a symbolic program takes every size of its symbolic dims
            found = next(((exe, extra) for exe, extra in self._entries.values()
                          if getattr(exe, "accepts", None) and exe.accepts(arrays)), None)
        if found is None:
            saved = " | ".join(", ".join(f"{np.dtype(d)}{list(s)}" for d, s in sig)
                               for sig in self._entries)
            got = ", ".join(f"{a.dtype}{list(a.shape)}" if isinstance(a, np.ndarray)
                            else type(a).__name__ for a in arrays)
            raise GuardError(f"{self.path}: no saved specialisation takes ({got}); saved: "
                             f"{saved}")
        return found

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self.kind == "exported":
            from tilefuse.artifact.exported import call_exported

            return call_exported(self, args, kwargs)
        if kwargs and self.kind != "jit":
            raise GuardError(f"{self.path}: a {self.kind} artifact takes positional inputs")
        arrays = [_array(a) for a in [*args, *(kwargs[k] for k in sorted(kwargs))]]
        exe, extra = self.executable_for(arrays)
        outs = exe(*arrays)
        if self.kind == "onnx":
            return outs[0] if len(outs) == 1 else outs
        if self.kind == "jit":
            return _pack(extra.get("pack"), outs)
        return outs

    def run(self, output_names: Sequence[str] | None, input_feed: Mapping[str, Any],
            run_options: Any = None) -> list[np.ndarray]:
        """onnxruntime's ``InferenceSession.run`` (ONNX artifacts)."""
        if self.kind != "onnx":
            raise GuardError(f"{self.path}: run(names, feed) is for ONNX artifacts")
        missing = [n for n in self.input_names if n not in input_feed]
        if missing or set(input_feed) - set(self.input_names):
            raise GuardError(f"input_feed must name exactly the inputs {self.input_names}")
        arrays = [_array(input_feed[n]) for n in self.input_names]
        exe, _ = self.executable_for(arrays)
        outs = exe(*arrays)
        return select_outputs(outs, self.output_names, output_names)


def _array(value: Any) -> np.ndarray:
    array = np.asarray(value)
    return array if array.flags.c_contiguous else np.ascontiguousarray(array)


def _pack(structure: Any, outs: list[np.ndarray]) -> Any:
    if structure is None:
        return outs
    if "out" in structure:
        return outs[structure["out"]]
    if "list" in structure:
        return [_pack(s, outs) for s in structure["list"]]
    return tuple(_pack(s, outs) for s in structure["tuple"])


def _check_structure(structure: Any, count: int, path: str, depth: int = 0) -> None:
    ok = isinstance(structure, dict) and len(structure) == 1 and depth < 64
    if ok and "out" in structure:
        ok = type(structure["out"]) is int and 0 <= structure["out"] < count
    elif ok and ("list" in structure or "tuple" in structure):
        items = structure.get("list", structure.get("tuple"))
        ok = isinstance(items, list)
        if ok:
            for item in items:
                _check_structure(item, count, path, depth + 1)
    else:
        ok = False
    if not ok:
        raise ArtifactError(f"{path}: malformed artifact: bad result structure")


def load(path: str | Path) -> LoadedModel:
    """The model saved at ``path`` by :func:`tilefuse.save`, ready to call (see
    :class:`LoadedModel`). ArtifactError for a file that cannot be used."""
    from tilefuse.artifact.link import link_kernels

    container = read(path)
    manifest = _manifest(container)
    from tilefuse.artifact.cuda import target_of

    if target_of(manifest) is not None:
        return _load_cuda(container, manifest)
    target = _target(container, manifest)

    def link(objects: list[tuple[bytes, KernelSignature]]) -> list[CompiledKernel]:
        pool = container.sections.get("pool")
        return link_kernels(objects, target, container.path,
                            None if pool is None else bytes(pool))

    decoder = Decoder(container, manifest, link)
    entries = decoder.read.items(manifest, "entries", "manifest")
    if not entries:
        raise ArtifactError(f"{container.path}: the artifact holds no compiled entry")
    launcher = None
    if "launcher" in container.sections:
        from tilefuse.artifact.launcher import link_launcher

        launcher = link_launcher(bytes(container.section("launcher")), target, container.path)
    made = []
    for i, entry in enumerate(entries):
        program = decoder.read.obj(entry, "program", dict, f"entry {i}")
        exe = decoder.executable(program, launcher)
        extra = {k: v for k, v in entry.items() if k != "program"}
        if "pack" in extra:
            _check_structure(extra["pack"], len(exe.graph.outputs), container.path)
        if manifest["kind"] == "exported":
            from tilefuse.artifact.exported import check_entry

            check_entry(extra, len(exe.graph.inputs), len(exe.graph.outputs),
                        manifest.get("user_inputs"), container.path)
        made.append((exe, extra))
    return LoadedModel(container, manifest, target, made)


def _load_cuda(container: Container, manifest: Mapping[str, Any]) -> LoadedModel:
    """A cuda artifact: every program validated, then loaded on this machine's GPU
    (ArtifactError without one: :mod:`tilefuse.artifact.cuda`)."""
    from tilefuse.artifact.cuda import cuda_program_executable, decode_cuda

    def link(objects: list[tuple[bytes, KernelSignature]]) -> list[CompiledKernel]:
        raise ArtifactError(f"{container.path}: a cuda artifact holds no CPU kernels")

    decoder = Decoder(container, manifest, link)
    entries = decoder.read.items(manifest, "entries", "manifest")
    if not entries:
        raise ArtifactError(f"{container.path}: the artifact holds no compiled entry")
    programs = [decode_cuda(decoder, decoder.read.obj(e, "program", dict, f"entry {i}"))
                for i, e in enumerate(entries)]
    made = [(cuda_program_executable(p, container.path), {}) for p in programs]
    arch = str(manifest["target"]["cuda"])
    return LoadedModel(container, manifest, CpuTarget("nvptx64-nvidia-cuda", arch, ""),
                       made)  # type: ignore[arg-type]
