"""Progress of a tuning run: one line per round on the ``tune`` log topic (INFO), and on stderr
either a line rewritten in place (when stderr is a terminal) or plain lines (when asked).

No progress-bar dependency: tqdm is not a dependency of tilefuse, and one ``\\r`` line does.
"""

from __future__ import annotations

import shutil
import sys
from typing import TextIO

from tilefuse.log import get_logger
from tilefuse.tune.tuner import Round


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.3f} ms" if seconds < float("inf") else "failed"


def round_line(label: str, r: Round) -> str:
    """``k1 contraction matmul+maximum: round 3, 25/40 trials, best 0.412 ms (default 0.530
    ms), 61% of bound``."""
    return (f"{label}: round {r.round}, {r.trials}/{r.trial_budget} trials, best "
            f"{_ms(r.best_seconds)} (default {_ms(r.default_seconds)}), "
            f"{r.percent_of_bound:.0f}% of bound")


class Progress:
    """Reports rounds. ``show``: None shows an in-place line only when ``stream`` is a
    terminal; True also prints plain lines when it is not; False shows nothing (the log lines
    remain)."""

    def __init__(self, show: bool | None = None, stream: TextIO | None = None):
        self.stream = stream if stream is not None else sys.stderr
        tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.in_place = tty and show is not False
        self.plain = show is True and not tty
        self.label = ""
        self._open = False
        self._log = get_logger("tune")

    def start(self, label: str) -> None:
        """A new kernel: its rounds are reported under ``label``."""
        self.finish()
        self.label = label

    def __call__(self, r: Round) -> None:
        line = round_line(self.label, r)
        self._log.info("%s", line)
        if self.in_place:
            width = max(20, shutil.get_terminal_size((100, 20)).columns - 1)
            self.stream.write("\r" + line[:width].ljust(width))
            self.stream.flush()
            self._open = True
        elif self.plain:
            self.stream.write(line + "\n")
            self.stream.flush()

    def note(self, text: str) -> None:
        """A line outside the rounds (a skipped kernel, the profile)."""
        self.finish()
        self._log.info("%s", text)
        if self.in_place or self.plain:
            self.stream.write(text + "\n")
            self.stream.flush()

    def finish(self) -> None:
        """Ends the in-place line, if one is open."""
        if self._open:
            self.stream.write("\n")
            self.stream.flush()
            self._open = False


__all__ = ["Progress", "round_line"]
