"""Kernels: kernel formation (graph → kernel plan, :mod:`.fusion`, over the node classification
of :mod:`.classify`), its text form (:mod:`.plan_printer`) and schedules as data
(:mod:`.schedule`)."""

from tilefuse.kernel.fusion import (
    MAX_RECOMPUTE_OPS,
    KernelGroup,
    KernelKind,
    KernelPlan,
    Role,
    form_kernels,
)
from tilefuse.kernel.plan_check import verify_plan
from tilefuse.kernel.plan_printer import print_plan
from tilefuse.kernel.schedule import (
    CpuTarget,
    Schedule,
    ScheduleError,
    default_schedule,
    iteration_axes,
    validate,
)

__all__ = ["MAX_RECOMPUTE_OPS", "CpuTarget", "KernelGroup", "KernelKind", "KernelPlan", "Role",
           "Schedule", "ScheduleError", "default_schedule", "form_kernels", "iteration_axes",
           "print_plan", "validate", "verify_plan"]
