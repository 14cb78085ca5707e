"""The schedule store: tuned schedules keyed by kernel fingerprint and target.

- :mod:`~tilefuse.schedules.fingerprint` the key of a kernel (what builds compute) and of a CPU
  target;
- :mod:`~tilefuse.schedules.database` ``MemoryDatabase`` / ``SQLiteDatabase`` (WAL);
- :mod:`~tilefuse.schedules.gpu` the cuda target's keys and lookup.

The back ends read it (:class:`tilefuse.runtime.schedules.ScheduleSource`,
:func:`tilefuse.backend.cuda.build_gpu_program`); the tuner (:mod:`tilefuse.tune`) writes it.
Nothing here imports the tuner, so a build never loads it.
"""
