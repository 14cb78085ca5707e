"""The exception hierarchy. Every error tilefuse raises on purpose derives from TilefuseError.

An error carries optional context: the op it concerns, the input types it saw and, for traced
code, the user's source location. The message is assembled once, from those parts, so that every
error reads the same way:
``matmul: contraction dims differ (inputs f32[2,3], f32[4,5]) at model.py:12``.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class SourceLoc:
    """A user's source position, captured when a traced op was recorded."""

    file: str
    line: int
    function: str = ""

    def __str__(self) -> str:
        where = f"{self.file}:{self.line}"
        return f"{where} in {self.function}" if self.function else where


class TilefuseError(Exception):
    """Base class of every error tilefuse raises on purpose."""

    def __init__(self, message: str, *, op: str | None = None,
                 inputs: tuple[str, ...] | None = None, loc: SourceLoc | None = None):
        self.message = message
        self.op = op
        self.inputs = inputs
        self.loc = loc
        super().__init__(self._render())

    def _render(self) -> str:
        text = f"{self.op}: {self.message}" if self.op else self.message
        if self.inputs is not None:
            text += f" (inputs {', '.join(self.inputs) if self.inputs else 'none'})"
        if self.loc is not None:
            text += f" at {self.loc}"
        return text

    def with_context(self, *, op: str | None = None, inputs: tuple[str, ...] | None = None,
                     loc: SourceLoc | None = None) -> TilefuseError:
        """Returns a copy of this error with the missing context filled in."""
        return type(self)(self.message, op=self.op or op,
                          inputs=self.inputs if self.inputs is not None else inputs,
                          loc=self.loc or loc)


class ShapeError(TilefuseError):
    """Shapes that an op's shape rule rejects (incompatible dims, bad axes, ...)."""


class DTypeError(TilefuseError):
    """A dtype an op does not accept, or an unknown dtype."""


class AttrError(TilefuseError):
    """An unknown, missing or ill-typed op attribute."""


class UnknownOpError(TilefuseError):
    """An op name that the registry does not define."""


class VerifyError(TilefuseError):
    """A graph that breaks an IR invariant (SSA, types, dangling uses)."""


class ParseError(TilefuseError):
    """Graph text that does not parse."""


class TraceError(TilefuseError):
    """Something the tracer cannot capture: data-dependent control flow, an unsupported function."""


class GuardError(TilefuseError):
    """Arguments that no compiled specialisation accepts and that cannot be compiled for."""


class CompileError(TilefuseError):
    """A failure while lowering or generating code."""


class GradientError(TilefuseError):
    """A gradient that cannot be formed: an op without a reverse-mode rule on the path."""
