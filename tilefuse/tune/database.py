"""Moved to :mod:`tilefuse.schedules.database` (the schedule store is its own package, read by
the back ends and written by the tuner); this name stays for existing imports."""

from tilefuse.schedules.database import *  # noqa: F403
from tilefuse.schedules.database import __all__  # noqa: F401
