"""Moved to :mod:`tilefuse.schedules.fingerprint` (the schedule store is its own package, read
by the back ends and written by the tuner); this name stays for existing imports."""

from tilefuse.schedules.fingerprint import *  # noqa: F403
from tilefuse.schedules.fingerprint import __all__  # noqa: F401
