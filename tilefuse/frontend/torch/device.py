"""The target follows the data: ``torch.compile(m, backend="tilefuse")`` compiles for the device
the graph's tensors live on.

Without ``options={"target": ...}`` a graph whose example inputs (parameters and buffers
included) include CUDA tensors is built for the ``cuda`` target, any other for ``cpu``; an
explicit target overrides. A graph mixing devices is built for CUDA, and the partitioner leaves
every node whose values live on another device to torch (each logged on the ``fallback``
topic with its reason): the graph is split at the device boundary.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from tilefuse.log import get_logger

if TYPE_CHECKING:
    from tilefuse.frontend.torch.backend import Options


def data_target(devices: Iterable[Any]) -> str:
    """``"cuda"`` when any of ``devices`` (``torch.device`` objects) is a CUDA device, else
    ``"cpu"``."""
    kinds = {getattr(d, "type", str(d)) for d in devices}
    return "cuda" if "cuda" in kinds else "cpu"


def follow_data(options: Options, given: Mapping[str, Any] | None,
                example_inputs: Iterable[Any]) -> Options:
    """``options`` with the target of the example inputs' devices, unless the user named one."""
    if given and "target" in given:
        return options
    devices = [t.device for t in example_inputs if hasattr(t, "device")
               and hasattr(t, "shape")]
    target = data_target(devices)
    if target != options.target:
        kinds = sorted({d.type for d in devices})
        get_logger("fallback").info(
            "inputs live on %s: compiling for the %s target (options={'target': ...} "
            "overrides)", ", ".join(kinds), target)
        if len(kinds) > 1:
            get_logger("fallback").warning(
                "inputs live on %s: values not on CUDA run in torch (the graph is split at the "
                "device boundary)", ", ".join(kinds))
    return replace(options, target=target)


__all__ = ["data_target", "follow_data"]
