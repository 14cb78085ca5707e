"""Starting the ranks: one spawned process per rank, joined into a torch.distributed group.

:func:`run_ranks` is what ``tilefuse run MODEL --devices N`` uses (and the tests): each process
initialises the default group (gloo for CPU processes, NCCL for GPUs) through a file store in a
temporary folder, calls ``fn(rank, world, *args)`` and sends back its result. A rank that fails
fails the whole run with that rank's traceback. ``torchrun`` users need none of this: their
processes already form the group, and ``torch.compile(..., options={"devices": N})`` joins it.
"""

from __future__ import annotations

import tempfile
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from tilefuse.errors import TilefuseError


def run_ranks(fn: Callable[..., Any], world: int, args: Sequence[Any] = (),
              backend: str = "gloo", timeout: float = 600.0) -> list[Any]:
    """``fn(rank, world, *args)`` in ``world`` processes of one group; their results by rank."""
    import torch.multiprocessing as mp

    if world < 1:
        raise TilefuseError(f"--devices must be at least 1, got {world}")
    ctx = mp.get_context("spawn")
    with tempfile.TemporaryDirectory(prefix="tilefuse-ranks-") as tmp:
        store = Path(tmp) / "store"
        queue = ctx.SimpleQueue()
        procs = [ctx.Process(target=_rank_main,
                             args=(fn, rank, world, backend, str(store), tuple(args), queue))
                 for rank in range(world)]
        for p in procs:
            p.start()
        results: dict[int, Any] = {}
        failures: list[str] = []
        for _ in procs:
            rank, ok, payload = queue.get()
            if ok:
                results[rank] = payload
            else:
                failures.append(f"rank {rank}:\n{payload}")
                break
        for p in procs:
            p.join(timeout if not failures else 5.0)
            if p.is_alive():
                p.kill()
                p.join()
        if failures:
            raise TilefuseError("a rank failed; " + failures[0])
        missing = [r for r in range(world) if r not in results]
        if missing:
            raise TilefuseError(f"ranks {missing} ended without a result (exit codes "
                                f"{[procs[r].exitcode for r in missing]})")
        return [results[r] for r in range(world)]


def _rank_main(fn: Callable[..., Any], rank: int, world: int, backend: str, store: str,
               args: tuple[Any, ...], queue: Any) -> None:
    import torch.distributed as dist

    try:
        dist.init_process_group(backend, init_method=f"file://{store}", rank=rank,
                                world_size=world)
        try:
            result = fn(rank, world, *args)
        finally:
            dist.destroy_process_group()
        queue.put((rank, True, result))
    except BaseException:  # report every failure to the parent, which raises it
        queue.put((rank, False, traceback.format_exc()))
