"""``tilefuse compile MODEL -o model.tilefuse``: compile a model once, for given input shapes and
a CPU target, into an artifact that ``tilefuse.load`` (or ``tilefuse run model.tilefuse``)
runs without compiling (:mod:`tilefuse.artifact`)."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tilefuse.cli.common import add_model_arguments, note, subparser
from tilefuse.cli.models import (
    CliError,
    InputSpec,
    Model,
    OnnxFile,
    load_model,
    parse_inputs,
    quiet_torch_warnings,
)

EXAMPLE = """  tilefuse compile model.onnx -o model.tilefuse
  tilefuse compile model.onnx -o model-avx2.tilefuse --target x86-64-v3 --input x=8x3x224x224:f32
  tilefuse run model.tilefuse --input x=x.npy"""


def add_parser(sub: Any) -> None:
    from tilefuse.artifact.targets import NAMES

    parser = subparser(sub, "compile", "compile MODEL into a .tilefuse artifact", EXAMPLE,
                       "The artifact holds the machine code, memory plan and weights of one "
                       "build for the --input shapes (fixed ONNX shapes by default); loading it "
                       "runs no compiler. --target builds for another x86-64 level than this "
                       "CPU (x86-64-v3: AVX2, no AVX-512).")
    add_model_arguments(parser)
    parser.add_argument("-o", "--output", type=Path, required=True, metavar="FILE",
                        help="the artifact to write (conventionally FILE.tilefuse)")
    parser.add_argument("--target", default="cpu", choices=[*NAMES, *CUDA_NAMES],
                        help="the CPU to build for (default: this one), or a GPU (PTX, built "
                             "without one)")
    parser.set_defaults(func=run)


def _names(model: Model) -> dict[str, Any]:
    if isinstance(model, OnnxFile):
        return {"name": model.info.name, "input_names": [s.name for s in model.info.inputs],
                "output_names": [s.name for s in model.info.outputs]}
    return {"name": model.spec, "input_names": [s.name for s in model.inputs()]}


CUDA_NAMES = ("cuda", "cuda:sm_90", "cuda:sm_80")


def _run_cuda(args: argparse.Namespace, model: Model, arrays: list[Any]) -> int:
    """A cuda artifact: the graph optimised and built to PTX here, with no GPU needed."""
    from tilefuse.artifact.saver import write_cuda_artifact
    from tilefuse.driver import build_gpu_program, optimize

    optimized, _ = optimize(model.graph(arrays))
    program = build_gpu_program(optimized, args.target)
    kind = "onnx" if isinstance(model, OnnxFile) else "executable"
    path = write_cuda_artifact(args.output, kind, _names(model), [program])
    shapes = ", ".join(f"{a.dtype}{list(a.shape)}" for a in arrays)
    print(f"wrote {path} ({path.stat().st_size / 2**20:.1f} MiB) for {args.target} "
          f"({program.target.arch}, {len(program.steps)} steps; not run: built without a GPU): "
          f"inputs {shapes}")
    return 0


def run(args: argparse.Namespace) -> int:
    from tilefuse.artifact.saver import specializations, write_artifact
    from tilefuse.artifact.targets import cpu_target
    from tilefuse.runtime.native import NativeExecutable

    quiet_torch_warnings()
    model = load_model(args.model, args.quantize)
    if str(args.model).endswith(".tilefuse"):
        raise CliError(f"{args.model} is compiled already")
    arrays = parse_inputs(model, args.input, args.seed)
    note(args, f"compiling {args.model} for {args.target} ...")
    if args.target in CUDA_NAMES:
        return _run_cuda(args, model, arrays)
    lowered = model.lower(arrays)
    executable: Any = lowered.executable
    if hasattr(executable, "specialization"):  # symbolic: the build for these sizes
        executable = executable.specialization(arrays)
    built = specializations(executable, args.model)[0]
    if args.target != "cpu":
        built = NativeExecutable(built.graph, target=cpu_target(args.target))
    kind = "onnx" if isinstance(model, OnnxFile) else "executable"
    expected = built(*arrays)  # runs once: a build that cannot run is not written
    path = write_artifact(args.output, kind, _names(model), [(built, {})])
    size = path.stat().st_size
    shapes = ", ".join(f"{a.dtype}{list(a.shape)}" for a in arrays)
    print(f"wrote {path} ({size / 2**20:.1f} MiB) for {args.target}: inputs {shapes}; "
          f"{len(expected)} output(s)")
    return 0


class ArtifactFile(Model):
    """A ``.tilefuse`` MODEL for ``tilefuse run``: loaded, never compiled."""

    kind = "artifact"

    def __init__(self, spec: str):
        super().__init__(spec)
        from tilefuse.artifact import load

        if not Path(spec).is_file():
            raise CliError(f"no such artifact: {spec}")
        self.loaded = load(spec)

    def inputs(self) -> list[InputSpec]:
        first = self.loaded.executables[0].graph.inputs
        names = self.loaded.input_names
        return [InputSpec(name, tuple(v.shape), v.dtype) for name, v in zip(names, first)]

    def compile(self, dump: Path | None = None) -> Callable[[list[Any]], list[Any]]:
        def call(arrays: list[Any]) -> list[Any]:
            exe, _ = self.loaded.executable_for(arrays)
            return exe(*arrays)
        return call

    def lower(self, arrays: list[Any], dump: Path | None = None) -> Any:
        raise CliError(f"{self.spec} is a compiled artifact: it holds no graphs to lower")

    def tune_source(self, arrays: list[Any]) -> Any:
        raise CliError(f"{self.spec} is a compiled artifact: tune the model it was made from")
