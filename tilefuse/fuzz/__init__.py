"""Differential fuzzing: random valid graphs compiled natively (default and random schedules)
and compared with the reference interpreter; failures shrink to minimal ``.graph`` repros.
``python -m tilefuse.fuzz --graphs N --seed S`` runs a campaign."""
