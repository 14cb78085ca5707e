"""The ``tilefuse`` command: run, bench, tune, dump and explain a model; look after the cache.

    tilefuse run model.onnx --input x=x.npy
    tilefuse compile model.onnx -o model.tilefuse --target x86-64-v3
    tilefuse bench model.onnx --vs onnxruntime
    tilefuse tune model.onnx --trials 100
    tilefuse dump model.onnx -o dump/
    tilefuse explain model.onnx --plot roofline.png
    tilefuse cache info

One module per subcommand (each with ``add_parser`` and ``run``); :mod:`tilefuse.cli.models`
reads MODEL and ``--input``. A :class:`~tilefuse.errors.TilefuseError` prints
``tilefuse: error: <message>`` on stderr and exits with status 2 (``--debug``: the traceback).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

import tilefuse
from tilefuse.cli import bench, cache, compile, dump, explain, run, tune
from tilefuse.cli.common import plain
from tilefuse.cli.models import CliError
from tilefuse.errors import TilefuseError

SUBCOMMANDS = (run, compile, bench, tune, dump, explain, cache)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tilefuse", description=plain(__doc__.split("\n\n")[0]),
        epilog="MODEL is a .onnx file, module:function (a NumPy function) or module:attr "
        "(a torch.nn.Module; module:factory() calls a function returning one). "
        "`tilefuse SUBCOMMAND --help` shows an example of each.")
    parser.add_argument("--version", action="version",
                        version=f"tilefuse {tilefuse.__version__}")
    parser.add_argument("--debug", action="store_true",
                        help="show the Python traceback of an error")
    parser.add_argument("--progress", action="store_true",
                        help="progress on stderr even when it is not a terminal")
    sub = parser.add_subparsers(dest="command", metavar="SUBCOMMAND", required=True)
    for module in SUBCOMMANDS:
        module.add_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Runs the command line; returns the exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except CliError as err:  # a usage mistake: no traceback even with --debug
        print(f"tilefuse: error: {err}", file=sys.stderr)
        return 2
    except TilefuseError as err:
        if args.debug:
            raise
        print(f"tilefuse: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("tilefuse: interrupted", file=sys.stderr)
        return 130


__all__ = ["build_parser", "main"]
