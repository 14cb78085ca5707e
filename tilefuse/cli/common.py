"""Pieces every subcommand shares: its parser (with an example in ``--help``), the common
options, and where the dump and tuning database go."""

from __future__ import annotations

import argparse
import re
import sys
from typing import Any

_ROLE = re.compile(r":(?:func|class|mod|meth|attr|data|exc):`~?([^`]+)`")


def plain(text: str) -> str:
    """Help text from a docstring: Sphinx roles and double backquotes dropped (``--help`` is
    read in a terminal, not rendered)."""
    return _ROLE.sub(r"\1", text).replace("``", "")


def _common() -> argparse.ArgumentParser:
    """``--debug`` and ``--progress`` after the subcommand too (SUPPRESS: an option given
    before the subcommand is not reset by the subparser's default)."""
    parent = argparse.ArgumentParser(add_help=False)
    parent.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                        help="show the Python traceback of an error")
    parent.add_argument("--progress", action="store_true", default=argparse.SUPPRESS,
                        help="progress on stderr even when it is not a terminal")
    return parent


def subparser(sub: Any, name: str, summary: str, example: str,
              details: str = "") -> argparse.ArgumentParser:
    """A subcommand's parser; ``example`` is shown at the end of its ``--help``."""
    parser = sub.add_parser(name, help=plain(summary),
                            description=plain(f"{summary}\n\n{details}".strip()),
                            epilog=plain(f"example:\n{example}"), parents=[_common()],
                            formatter_class=argparse.RawDescriptionHelpFormatter)
    return parser


def add_model_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", metavar="MODEL",
                        help="a .onnx file, module:function (NumPy) or module:attr (torch)")
    parser.add_argument("--input", action="append", default=[], metavar="NAME=FILE.npy",
                        help="an input from a .npy file, or NAME=2x768[:f32] for random values "
                        "(repeat per input; fixed-shape ONNX inputs not given are random)")
    parser.add_argument("--seed", type=int, default=0, help="seed of random inputs")
    parser.add_argument("--quantize", default=None, metavar="MODE",
                        help="quantize the weights of matrix products: int8, int4, int4:64, "
                        "int4:32+zp, fp8 (cuda only) (default: f32)")


def show_progress(args: argparse.Namespace) -> bool | None:
    """The progress setting: True with ``--progress``, else only on a terminal (None)."""
    return True if getattr(args, "progress", False) else None


def note(args: argparse.Namespace, text: str) -> None:
    """A line about long work (``compiling ...``) on stderr, shown where progress is."""
    if getattr(args, "progress", False) or sys.stderr.isatty():
        print(text, file=sys.stderr, flush=True)


__all__ = ["add_model_arguments", "note", "plain", "show_progress", "subparser"]
