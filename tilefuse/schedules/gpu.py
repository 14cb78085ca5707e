"""The ``cuda`` target's side of the schedule store: the key a GPU kernel's measured knobs are
stored under, and a build's lookup (:func:`tuned_target`), which needs no GPU.

A GPU kernel's schedule is the set of :class:`~tilefuse.codegen.llvm_nvptx.GpuTarget` knobs its
lowering reads, written as a :class:`~tilefuse.kernel.schedule.Schedule` of the group's kind
whose ``unroll`` pairs are ``(knob, value)``; :mod:`tilefuse.tune.gpu` measures and writes them.
"""

from __future__ import annotations

from dataclasses import fields, replace

from tilefuse.codegen.llvm_nvptx import SM90, GpuTarget
from tilefuse.errors import TilefuseError
from tilefuse.kernel.fusion import KernelGroup
from tilefuse.kernel.schedule import Schedule
from tilefuse.schedules.database import TuneKey, TuningDatabase
from tilefuse.schedules.fingerprint import group_fingerprint

_FIELDS = {f.name for f in fields(GpuTarget)}


def gpu_target_string(target: GpuTarget = SM90) -> str:
    """What a GPU measurement is valid for (the database's target column)."""
    return f"cuda/{target.triple}/{target.arch}/ptx{target.ptx_isa}"


def gpu_key(group: KernelGroup, constants: object, target: GpuTarget = SM90) -> TuneKey:
    known = constants if isinstance(constants, dict) else {}
    return TuneKey(group_fingerprint(group, known), gpu_target_string(target))


def knob_target(base: GpuTarget, schedule: Schedule) -> GpuTarget:
    """``base`` with the schedule's knobs set (TilefuseError for a knob GpuTarget lacks)."""
    knobs = dict(schedule.unroll)
    unknown = sorted(set(knobs) - _FIELDS)
    if unknown:
        raise TilefuseError(f"GPU schedule names unknown knobs {unknown}")
    return replace(base, **knobs)


def tuned_target(group: KernelGroup, constants: object, target: GpuTarget,
                 database: TuningDatabase | None) -> GpuTarget:
    """``target`` with the database's fastest schedule of ``group`` applied, if any."""
    if database is None:
        return target
    found = database.best(gpu_key(group, constants, target))
    return target if found is None else knob_target(target, found[0])


__all__ = ["gpu_key", "gpu_target_string", "knob_target", "tuned_target"]
