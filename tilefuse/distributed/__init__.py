"""Tensor parallelism: one model split over the ranks of a group (one process per device).

``shard.py`` is the sharding pass (the per-rank graph and its plan), ``spec.py`` the layout of
one value, ``simulate.py`` runs all ranks of a plan in one process (the oracle for tests and
dumps), ``comm.py`` the communicators (torch.distributed: gloo on CPU processes, NCCL on GPUs)
and ``executable.py`` the per-rank executable: compiled segments between collectives.
"""
