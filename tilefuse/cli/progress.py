"""A progress bar on stderr for the command line's long work (compiling, timing rounds).

Shown only when stderr is a terminal, or when ``--progress`` asks for it (then, off a
terminal, as one plain line per step). No dependency: one ``\\r`` line is enough.
"""

from __future__ import annotations

import sys
from typing import TextIO

_WIDTH = 24


class Bar:
    """``label [#######.........] 7/20``; :meth:`step` advances, :meth:`close` ends the line."""

    def __init__(self, label: str, total: int, *, show: bool | None = None,
                 stream: TextIO | None = None):
        self.stream = stream if stream is not None else sys.stderr
        tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.in_place = tty and show is not False
        self.plain = bool(show) and not tty
        self.label, self.total, self.done = label, max(1, total), 0
        self._draw()

    def step(self, n: int = 1, note: str = "") -> None:
        self.done = min(self.total, self.done + n)
        self._draw(note)

    def _draw(self, note: str = "") -> None:
        filled = _WIDTH * self.done // self.total
        line = (f"{self.label} [{'#' * filled}{'.' * (_WIDTH - filled)}] "
                f"{self.done}/{self.total} {note}").rstrip()
        if self.in_place:
            self.stream.write("\r" + line)
            self.stream.flush()
        elif self.plain:
            self.stream.write(line + "\n")
            self.stream.flush()

    def close(self) -> None:
        if self.in_place:
            self.stream.write("\n")
            self.stream.flush()
            self.in_place = False

    def __enter__(self) -> Bar:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


__all__ = ["Bar"]
