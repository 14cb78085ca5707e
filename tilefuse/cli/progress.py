"""A progress bar for the command line's long work (compiling, timing rounds), drawn on the
shared :class:`~tilefuse.progress.StatusLine` (in place on a terminal, plain lines with
``--progress`` off one)."""

from __future__ import annotations

from typing import TextIO

from tilefuse.progress import StatusLine

_WIDTH = 24


class Bar:
    """``label [#######.........] 7/20``; :meth:`step` advances, :meth:`close` ends the line."""

    def __init__(self, label: str, total: int, *, show: bool | None = None,
                 stream: TextIO | None = None):
        self.line = StatusLine(show, stream)
        self.label, self.total, self.done = label, max(1, total), 0
        self._draw()

    def step(self, n: int = 1, note: str = "") -> None:
        self.done = min(self.total, self.done + n)
        self._draw(note)

    def _draw(self, note: str = "") -> None:
        filled = _WIDTH * self.done // self.total
        self.line.update(f"{self.label} [{'#' * filled}{'.' * (_WIDTH - filled)}] "
                         f"{self.done}/{self.total} {note}".rstrip())

    def close(self) -> None:
        self.line.close()

    def __enter__(self) -> Bar:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


__all__ = ["Bar"]
