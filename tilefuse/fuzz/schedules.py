"""Random valid schedules for fuzzed builds: a :class:`ScheduleSource` that samples each
kernel's search space (the tuner's, :func:`tilefuse.tune.space.space_for`) with a seed, so a
failing build can be rebuilt with the very same schedules."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from tilefuse.codegen.target import CpuTarget
from tilefuse.errors import TilefuseError
from tilefuse.graph.ir import Value
from tilefuse.kernel.fusion import KernelGroup
from tilefuse.kernel.schedule import Schedule, default_schedule
from tilefuse.runtime.schedules import ScheduleSource


class RandomScheduleSource(ScheduleSource):
    """Each kernel gets a schedule drawn from its search space (every one validated there);
    kernels of a kind without a space keep the default. ``picked`` records what each got."""

    def __init__(self, target: CpuTarget, seed: int):
        super().__init__(target, env={"TILEFUSE_TUNE_DB": ""})
        self.path = None   # never the tuning database
        self.seed = seed
        self.picked: dict[str, Schedule] = {}

    def schedule(self, group: KernelGroup, constants: Mapping[Value, np.ndarray]) -> Schedule:
        from tilefuse.tune.space import space_for

        rng = np.random.default_rng([self.seed, len(self.picked)])
        try:
            space = space_for(group, self.target)
        except TilefuseError:
            chosen = default_schedule(group, self.target)
        else:
            chosen = space.sample(rng)
        self.picked[group.name] = chosen
        return chosen
