"""``tilefuse run MODEL``: compile a model, run it once on given (or random) inputs, print or
save the outputs."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import numpy as np

from tilefuse.cli.common import add_model_arguments, note, subparser
from tilefuse.cli.models import CliError, load_model, parse_inputs, quiet_torch_warnings

EXAMPLE = """  tilefuse run model.onnx --input x=x.npy -o outputs/
  tilefuse run mypkg.layers:ffn --input x=512x768 --input w=768x3072 --input b=3072
  tilefuse run model.onnx --devices 2            (tensor parallel: 2 gloo processes)"""


def add_parser(sub: Any) -> None:
    parser = subparser(sub, "run", "compile MODEL and run it once", EXAMPLE,
                       "Prints each output's shape, dtype and a summary; -o saves them as .npy.")
    add_model_arguments(parser)
    parser.add_argument("-o", "--output-dir", type=Path, default=None, metavar="DIR",
                        help="save each output as DIR/<name>.npy")
    parser.add_argument("--print", dest="print_values", action="store_true",
                        help="print the output values (NumPy's abbreviated form)")
    parser.add_argument("--devices", type=int, default=1, metavar="N",
                        help="split the model over N ranks (tensor parallel), one CPU process "
                        "each through torch.distributed's gloo; the plan is printed first")
    parser.add_argument("--simulate", action="store_true",
                        help="with --devices: run every rank in this process instead")
    parser.set_defaults(func=run)


def output_names(model: Any, count: int) -> list[str]:
    info = getattr(model, "info", None)
    if info is not None and len(info.outputs) == count:
        return [_file_safe(s.name) for s in info.outputs]
    return [f"output{i}" for i in range(count)]


def _file_safe(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name) or "output"


def summary(array: np.ndarray) -> str:
    text = f"{array.dtype}{list(array.shape)}"
    if array.size and array.dtype.kind in "fiub":
        values = array.astype(np.float64)
        text += (f"  min {np.nanmin(values):.6g}  max {np.nanmax(values):.6g}  "
                 f"mean {np.nanmean(values):.6g}")
    return text


def run(args: argparse.Namespace) -> int:
    quiet_torch_warnings()
    model = load_model(args.model, args.quantize)
    arrays = parse_inputs(model, args.input, args.seed)
    note(args, f"compiling {args.model} ...")
    if args.devices > 1:
        outputs = _run_sharded(args, model, arrays)
    elif args.devices < 1:
        raise CliError(f"--devices must be at least 1, got {args.devices}")
    else:
        outputs = model.compile()(arrays)
    names = output_names(model, len(outputs))
    if args.output_dir is not None:
        try:
            args.output_dir.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            raise CliError(f"cannot create {args.output_dir}: {err.strerror}") from None
    for name, out in zip(names, outputs):
        print(f"{name}: {summary(out)}")
        if args.print_values:
            print(np.array2string(out, threshold=64))
        if args.output_dir is not None:
            np.save(args.output_dir / f"{name}.npy", out)
    if args.output_dir is not None:
        print(f"saved {len(outputs)} output(s) under {args.output_dir}")
    return 0


def _run_sharded(args: argparse.Namespace, model: Any, arrays: list[np.ndarray]
                 ) -> list[np.ndarray]:
    """``--devices N``: the plan printed, then N gloo processes (or the simulation) run it;
    every rank computes the same outputs, rank 0's are returned."""
    from tilefuse.distributed.build import simulate
    from tilefuse.distributed.launch import run_ranks
    from tilefuse.distributed.shard import shard_graph
    from tilefuse.driver import CompileOptions, optimize

    optimized = optimize(model.graph(arrays), CompileOptions(pipeline=_pipeline(args)))[0]
    print(shard_graph(optimized, args.devices, 0)[1].text(), end="", flush=True)
    if args.simulate:
        cluster = simulate(optimized, args.devices, "cpu", CompileOptions(optimize=False))
        return cluster(*arrays)[0]
    return run_ranks(run_model_rank, args.devices, (args.model, arrays, args.quantize))[0]


def _pipeline(args: argparse.Namespace) -> Any:
    from tilefuse.passes.quantize import parse_quantize, pipeline_for

    return pipeline_for(parse_quantize(args.quantize))


def run_model_rank(rank: int, world: int, spec: str, arrays: list[np.ndarray],
                   quantize: str | None) -> list[np.ndarray]:
    """One rank of ``--devices N`` (in its own process): the model's graph built for this rank
    through the compile driver and run on the replicated inputs."""
    from tilefuse.distributed.build import Devices
    from tilefuse.driver import CompileOptions, compile
    from tilefuse.passes.quantize import parse_quantize, pipeline_for

    quiet_torch_warnings()
    model = load_model(spec, quantize)
    options = CompileOptions(devices=Devices(world),
                             pipeline=pipeline_for(parse_quantize(quantize)))
    return [np.asarray(o) for o in compile(model.graph(arrays), "cpu", options)(*arrays)]
