"""``tilefuse dump MODEL -o DIR``: write every compilation stage of a model as text."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from tilefuse.cli.common import add_model_arguments, note, subparser
from tilefuse.cli.models import CliError, load_model, parse_inputs, quiet_torch_warnings

EXAMPLE = """  tilefuse dump model.onnx -o dump/
  tilefuse dump 'tilefuse.zoo:bert_layer()' --input x=1x128x768 --input mask=1x1x1x128 -o bert/
  tilefuse dump 'tilefuse.zoo:bert_layer()' --input x=1x128x768 --input mask=1x1x1x128 \
      --target cuda -o bert-cuda/     # no GPU needed: PTX and partition.txt"""

DETAILS = """Files: 00-captured.graph (the graph as imported or traced), NN-after-<pass>.graph for
each graph pass that changed it, kernels.plan (kernels, launch sequence, memory plan) and per kernel
kernels/<name>.expr, .schedule.json, .loop (loop IR), .ll (LLVM IR) and .s (assembly).
docs/DUMPS.md follows one model through them. With --target cuda (cross-compilation: no GPU needed)
the files are the pipeline's graphs, partition.txt (each step's device: generated kernel, cuBLAS or
host, with the reason for every host step) and kernels/<name>.loop and .ptx."""


def add_parser(sub: Any) -> None:
    parser = subparser(sub, "dump", "write every compilation stage of MODEL as text",
                       EXAMPLE, DETAILS)
    add_model_arguments(parser)
    parser.add_argument("-o", "--output-dir", type=Path, required=True, metavar="DIR",
                        help="the dump directory (created; existing files are overwritten)")
    parser.add_argument("--target", choices=("cpu", "cuda"), default="cpu",
                        help="cpu (default) or cuda: cross-compile to PTX without a GPU")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    quiet_torch_warnings()
    model = load_model(args.model, args.quantize)
    arrays = parse_inputs(model, args.input, args.seed)
    out: Path = args.output_dir
    if out.exists() and not out.is_dir():
        raise CliError(f"{out} exists and is not a directory")
    note(args, f"compiling {args.model}, writing every stage under {out} ...")
    if getattr(args, "target", "cpu") == "cuda":
        from tilefuse.passes.quantize import parse_quantize, pipeline_for
        from tilefuse.runtime.gpu_cross import cross_compile

        built = cross_compile(model.graph(arrays), out,
                              pipeline=pipeline_for(parse_quantize(args.quantize)))
        for step in built.host_steps:
            print(f"warning: {step.group.name} runs on the host: {step.reason}")
    else:
        model.lower(arrays, dump=out)
    files = sorted(p for p in out.rglob("*") if p.is_file())
    if not files:
        raise CliError(f"the build wrote nothing under {out}")
    for path in files:
        print(path.relative_to(out))
    print(f"{len(files)} files under {out}")
    return 0
