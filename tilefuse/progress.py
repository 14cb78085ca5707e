"""One status line on stderr for long work: the command line's bars and the tuner's rounds.

Where it shows: on a terminal, one line rewritten in place (``\\r``); off a terminal only when
asked (``show=True``, the ``--progress`` flag), then as one plain line per update, so a log
file keeps every step; with ``show=False`` nowhere. No progress-bar dependency: this is the
whole of what tilefuse needs from one.
"""

from __future__ import annotations

import shutil
import sys
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


__all__ = ["StatusLine"]
