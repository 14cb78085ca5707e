"""Progress of a tuning run: one line per round on the ``tune`` log topic (INFO), and the same
line on the shared :class:`~tilefuse.progress.StatusLine` (in place on a terminal, plain lines
when asked)."""

from __future__ import annotations

from typing import TextIO

from tilefuse.log import get_logger
from tilefuse.progress import StatusLine
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
        self.line = StatusLine(show, stream)
        self.label = ""
        self._log = get_logger("tune")

    def start(self, label: str) -> None:
        """A new kernel: its rounds are reported under ``label``."""
        self.finish()
        self.label = label

    def __call__(self, r: Round) -> None:
        text = round_line(self.label, r)
        self._log.info("%s", text)
        self.line.update(text)

    def note(self, text: str) -> None:
        """A line outside the rounds (a skipped kernel, the profile)."""
        self._log.info("%s", text)
        self.line.print(text)

    def finish(self) -> None:
        """Ends the in-place line, if one is open."""
        self.line.close()


__all__ = ["Progress", "round_line"]
