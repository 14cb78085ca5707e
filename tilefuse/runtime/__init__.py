"""Runtime: the executable interface that compiled graphs are run through."""

from tilefuse.runtime.executable import (
    KNOWN_TARGETS,
    Executable,
    InterpreterExecutable,
    build_executable,
    check_target,
)

__all__ = ["KNOWN_TARGETS", "Executable", "InterpreterExecutable", "build_executable",
           "check_target"]
