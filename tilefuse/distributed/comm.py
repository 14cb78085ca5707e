"""Communicators: how a rank's collectives reach the other ranks.

:class:`TorchCommunicator` uses torch.distributed's default process group, one process per
device: gloo between CPU processes (what CI runs), NCCL between GPUs. tilefuse hands it NumPy
arrays (CPU segments' results) or torch tensors; NumPy arrays are wrapped without a copy
(``torch.from_numpy``), bf16 through an int16 view. Every call is asynchronous: it returns a
handle whose ``wait()`` gives the result, so the executable can run other segments meanwhile.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from tilefuse.errors import TilefuseError


def _torch() -> Any:
    try:
        import torch
        import torch.distributed as dist
    except ImportError:  # pragma: no cover - torch is a declared extra
        raise TilefuseError("devices=N runs the ranks through torch.distributed: "
                            "pip install torch") from None
    return torch, dist


def torch_dtype(dtype: Any) -> Any:
    """The torch dtype of a tilefuse :class:`~tilefuse.dtypes.DType`."""
    torch, _ = _torch()
    if dtype.name == "bf16":
        return torch.bfloat16
    return torch.from_numpy(np.empty(0, dtype.np)).dtype


def _as_tensor(x: Any) -> tuple[Any, Any]:
    """``x`` as a torch tensor sharing its memory, and how to turn the result back."""
    torch, _ = _torch()
    if isinstance(x, torch.Tensor):
        return x, lambda t: t
    arr = np.ascontiguousarray(x)
    if not arr.flags.writeable:
        arr = arr.copy()
    if arr.dtype.name == "bfloat16":
        t = torch.from_numpy(arr.view(np.int16)).view(torch.bfloat16)
        return t, lambda r: r.view(torch.int16).numpy().view(arr.dtype)
    return torch.from_numpy(arr), lambda r: r.numpy()


@dataclass
class _Handle:
    work: Any
    result: Any

    def wait(self) -> Any:
        if self.work is not None:
            self.work.wait()
        return self.result()


class TorchCommunicator:
    """Collectives over torch.distributed's default group (gloo or NCCL)."""

    def __init__(self, world: int | None = None):
        _, dist = _torch()
        if not dist.is_available() or not dist.is_initialized():
            raise TilefuseError(
                f"devices={world or 'N'} runs one process per device: initialise "
                f"torch.distributed first (torchrun --nproc-per-node {world or 'N'}, or "
                f"torch.distributed.init_process_group with backend gloo or nccl)")
        size = dist.get_world_size()
        if world is not None and size != world:
            raise TilefuseError(f"devices={world}, but torch.distributed has {size} ranks")
        self.world, self.rank = size, dist.get_rank()
        self.backend = dist.get_backend()

    def __repr__(self) -> str:
        return f"TorchCommunicator({self.backend}, rank {self.rank} of {self.world})"

    def all_reduce(self, x: Any) -> _Handle:
        _, dist = _torch()
        t, back = _as_tensor(x)
        work = dist.all_reduce(t, op=dist.ReduceOp.SUM, async_op=True)
        return _Handle(work, lambda: back(t))

    def all_gather(self, x: Any, axis: int) -> _Handle:
        torch, dist = _torch()
        t, back = _as_tensor(x)
        parts = [torch.empty_like(t) for _ in range(self.world)]
        work = dist.all_gather(parts, t, async_op=True)
        return _Handle(work, lambda: back(torch.cat(parts, dim=axis)))
