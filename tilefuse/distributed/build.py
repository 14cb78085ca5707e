"""The driver's sharded stage: shard the optimised graph for this rank, announce the plan, cut
the rank graph at its collectives and build each segment through the driver's back-end stages.

``CompileOptions(devices=Devices(n))`` asks for it (the torch backend's ``devices`` option, the
CLI's ``--devices``); :func:`simulate` builds every rank of a plan in one process.
"""

from __future__ import annotations

import dataclasses
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tilefuse.distributed.executable import DistributedExecutable, SimulatedCluster
from tilefuse.distributed.program import Program, compile_program, cut
from tilefuse.distributed.shard import ShardPlan, shard_graph
from tilefuse.errors import CompileError
from tilefuse.log import get_logger
from tilefuse.target import Target

if TYPE_CHECKING:
    from tilefuse.driver import CompileOptions
    from tilefuse.graph.ir import Graph

_log = get_logger("distributed")


@dataclass(frozen=True)
class Devices:
    """Split the graph over ``world`` ranks; ``comm`` is this rank's communicator (None: the
    torch.distributed default group, :class:`~tilefuse.distributed.comm.TorchCommunicator`)."""

    world: int
    comm: Any = None

    def __post_init__(self) -> None:
        if not isinstance(self.world, int) or isinstance(self.world, bool) or self.world < 1:
            raise CompileError(f"devices must be a positive number of ranks, got "
                               f"{self.world!r}")


def build_sharded(graph: Graph, target: Target, options: CompileOptions
                  ) -> DistributedExecutable:
    """This rank's executable of the optimised ``graph`` (stages 2-6 per segment)."""
    devices: Devices = options.devices
    comm = devices.comm
    if comm is None:
        from tilefuse.distributed.comm import TorchCommunicator

        comm = TorchCommunicator(devices.world)
    if comm.world != devices.world:
        raise CompileError(f"devices={devices.world}, but the communicator has "
                           f"{comm.world} ranks")
    rank_graph, plan = _shard(graph, devices.world, comm.rank, options, announce=comm.rank == 0)
    program = _build(rank_graph, target, options, comm.rank)
    return DistributedExecutable(graph, program, plan, comm,
                                 device="cuda" if target.is_cuda else "cpu")


def simulate(graph: Graph, world: int, target: Target | str = "cpu",
             options: CompileOptions | None = None) -> SimulatedCluster:
    """Every rank of ``graph`` split over ``world`` ranks, built for ``target`` in this
    process (the graph pipeline first, unless ``options.optimize`` is off)."""
    from tilefuse.driver import CompileOptions, optimize

    options = options or CompileOptions()
    target = Target.parse(target)
    if options.optimize:
        graph = optimize(graph, dataclasses.replace(options, devices=None))[0]
    programs, plan = [], None
    for rank in range(world):
        rank_graph, plan = _shard(graph, world, rank, options, announce=rank == 0)
        programs.append(_build(rank_graph, target, options, rank))
    assert plan is not None
    return SimulatedCluster(graph, programs, plan)


def _shard(graph: Graph, world: int, rank: int, options: CompileOptions, announce: bool
           ) -> tuple[Graph, ShardPlan]:
    from tilefuse.runtime.dynamic import is_symbolic

    if is_symbolic(graph):
        raise CompileError(f"graph @{graph.name} has symbolic input dims; devices=N shards "
                           f"static shapes only (specialise the sizes first)")
    rank_graph, plan = shard_graph(graph, world, rank)
    text = plan.text()
    if announce:
        _log.info("%s", text.rstrip())
        if sys.stderr.isatty():
            sys.stderr.write(text)
    where = _dump(options)
    if where is not None:
        where.mkdir(parents=True, exist_ok=True)
        (where / "shard_plan.txt").write_text(text)
        from tilefuse.graph.printer import print_graph

        (where / f"rank{rank}.graph").write_text(print_graph(rank_graph))
    return rank_graph, plan


def _build(rank_graph: Graph, target: Target, options: CompileOptions, rank: int) -> Program:
    from tilefuse.driver import build

    program = cut(rank_graph)
    where = _dump(options)
    if where is not None:
        (where / f"rank{rank}.program.txt").write_text(program.text())

    def build_segment(g: Graph, index: int) -> object:
        seg_dir = None if where is None else where / f"rank{rank}" / f"s{index}"
        return build(g, target, dataclasses.replace(options, devices=None, dump_dir=seg_dir))

    return compile_program(program, build_segment)


def _dump(options: CompileOptions) -> Path | None:
    return None if options.dump_dir is None else Path(options.dump_dir) / "distributed"
