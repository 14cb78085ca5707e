"""One status line on stderr for long work: the command line's bars and the tuner's rounds.

Where it shows: on a terminal, one line rewritten in place (``\\r``); off a terminal only when
asked (``show=True``, the ``--progress`` flag), then as one plain line per update, so a log
file keeps every step; with ``show=False`` nowhere. No progress-bar dependency: this is the
whole of what tilefuse needs from one.
"""

from __future__ import annotations

import shutil
import sys
import time
from typing import TextIO


class StatusLine:
    """Shows successive states of one line of text; :meth:`close` ends an in-place line."""

    def __init__(self, show: bool | None = None, stream: TextIO | None = None):
        self.stream = stream if stream is not None else sys.stderr
        tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.in_place = tty and show is not False
        self.plain = show is True and not tty
        self._open = False

    @property
    def visible(self) -> bool:
        return self.in_place or self.plain

    def update(self, text: str) -> None:
        """Shows ``text`` as the line's new state."""
        if self.in_place:
            width = max(20, shutil.get_terminal_size((100, 20)).columns - 1)
            self.stream.write("\r" + text[:width].ljust(width))
            self._open = True
        elif self.plain:
            self.stream.write(text + "\n")
        else:
            return
        self.stream.flush()

    def print(self, text: str) -> None:
        """A line of its own, outside the status (the in-place line is ended first)."""
        self.close()
        if self.visible:
            self.stream.write(text + "\n")
            self.stream.flush()

    def close(self) -> None:
        if self._open:
            self.stream.write("\n")
            self.stream.flush()
            self._open = False


BUILD_DELAY = 1.0
"""Seconds a build runs before :class:`BuildProgress` shows it."""


class BuildProgress:
    """``building NAME: 12/40 kernels`` for one build (ONNX load, a first torch call, the
    command line's compiles): on a terminal only, and only once the build has taken more than
    ``delay`` seconds, so quick builds and logs stay quiet. Used as a context manager around
    the loop over kernels, calling :meth:`step` after each."""

    def __init__(self, what: str, total: int, *, delay: float | None = None,
                 stream: TextIO | None = None):
        self.what, self.total, self.done = what, total, 0
        self.delay = BUILD_DELAY if delay is None else delay
        self.start = time.perf_counter()
        self.line = StatusLine(None, stream)

    def step(self, count: int = 1) -> None:
        self.done += count
        if self.line.in_place and time.perf_counter() - self.start > self.delay:
            self.line.update(f"building {self.what}: {self.done}/{self.total} kernels")

    def __enter__(self) -> BuildProgress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.line.close()


__all__ = ["BUILD_DELAY", "BuildProgress", "StatusLine"]
