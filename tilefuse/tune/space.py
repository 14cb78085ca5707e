"""Search spaces: the schedules a kernel may get, generated from the kernel group.

A space is a set of *knobs* (name → ordered candidate values) derived from the group's kind,
iteration extents, dtype and the target, not a template per operator:

- contraction: vector width (the target's lanes, or half), NR (1..4 vectors), MR (1..16, with
  MR·NR/width at most :data:`MAX_ACCUMULATORS` vector accumulators), cache blocks MC / NC / KC
  (targets turned into divisors or near-divisors of the extents, multiples of MR / NR), the
  parallel axis (n, m, b when batched, none), k unroll (1, 2, 4, 8), pack B on / off and
  its prefetch distance (none, 8, 16, 32 k steps) and whether its next panel is prefetched
  into L2;
- elementwise: vector width (4..16) and the number of parallel chunks (0: serial);
- row reduction: vector width, unroll of the row loop (1, 2, 4, 8), parallel row chunks;
- attention: the query block (8..256 rows), the key block (1..8 vectors), the register tile's
  rows (1..8) and P·V vectors (1..4); a point the lowering would refuse (a register tile over
  its accumulator budget: :func:`~tilefuse.kernel.lower_attention.attention_sizes`) is invalid.

(The elementwise lowering has no unroll of its own, so unroll is not a knob there.)

A *point* (knob → value) becomes a :class:`~tilefuse.kernel.schedule.Schedule` through
:meth:`KnobSpace.make`, which returns None for a point that does not validate: every schedule a
space hands out has passed :func:`~tilefuse.kernel.schedule.validate`; invalid ones never reach
a build. ``sample``, ``neighbours`` (every single-knob step) / ``mutate`` and ``crossover``
(uniform per knob) work on points; a schedule from outside (the default) is mapped to the
nearest point.
"""

from __future__ import annotations

import abc
import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from tilefuse.dtypes import DType
from tilefuse.errors import TilefuseError
from tilefuse.kernel.fusion import KernelGroup, KernelKind
from tilefuse.kernel.lower_attention import AttentionShape, attention_sizes
from tilefuse.kernel.schedule import (
    CpuTarget,
    Schedule,
    as_cpu_target,
    attention_node,
    default_schedule,
    iteration_axes,
    pick_tile,
    validate,
)

MAX_ACCUMULATORS = 28
"""Most vector accumulators a micro tile may keep (of 32 zmm registers; B vectors need some)."""
SAMPLE_TRIES = 200

Point = dict[str, Any]


class SearchSpace(abc.ABC):
    """What a search strategy draws schedules from. Every schedule returned is valid."""

    @abc.abstractmethod
    def default(self) -> Schedule:
        """The schedule the kernel gets without search."""

    @abc.abstractmethod
    def sample(self, rng: np.random.Generator) -> Schedule:
        """A random valid schedule."""

    @abc.abstractmethod
    def neighbours(self, schedule: Schedule) -> list[Schedule]:
        """Valid schedules one small change away from ``schedule``."""

    @abc.abstractmethod
    def crossover(self, a: Schedule, b: Schedule, rng: np.random.Generator) -> Schedule:
        """A valid schedule mixing ``a`` and ``b``."""

    def mutate(self, schedule: Schedule, rng: np.random.Generator) -> Schedule:
        """One random neighbour (``schedule`` itself when it has none)."""
        near = self.neighbours(schedule)
        return near[int(rng.integers(len(near)))] if near else schedule


class FixedSpace(SearchSpace):
    """The trivial space: a fixed list of schedules (the first is the default)."""

    def __init__(self, schedules: Sequence[Schedule]):
        if not schedules:
            raise TilefuseError("a fixed space needs at least one schedule")
        self.schedules = list(schedules)

    def default(self) -> Schedule:
        return self.schedules[0]

    def sample(self, rng: np.random.Generator) -> Schedule:
        return self.schedules[int(rng.integers(len(self.schedules)))]

    def neighbours(self, schedule: Schedule) -> list[Schedule]:
        return [s for s in self.schedules if s != schedule]

    def crossover(self, a: Schedule, b: Schedule, rng: np.random.Generator) -> Schedule:
        return a if rng.random() < 0.5 else b


class KnobSpace(SearchSpace):
    """A space of knobs (see the module docstring); subclasses say how a point is a schedule."""

    def __init__(self, group: KernelGroup, target: CpuTarget, knobs: Mapping[str, Sequence]):
        self.group = group
        self.target = target
        self.extents = iteration_axes(group)
        self.knobs: dict[str, tuple] = {k: tuple(dict.fromkeys(v)) for k, v in knobs.items()
                                        if len(v)}
        self._default = default_schedule(group, target)

    @abc.abstractmethod
    def schedule(self, point: Point) -> Schedule:
        """The schedule of ``point`` (may be invalid: :meth:`make` checks)."""

    @abc.abstractmethod
    def point(self, schedule: Schedule) -> Point:
        """The point nearest to ``schedule``."""

    def make(self, point: Point) -> Schedule | None:
        """The schedule of ``point``, or None when it does not validate."""
        try:
            schedule = self.schedule(point)
            validate(schedule, self.extents)
        except TilefuseError:
            return None
        return schedule

    def size(self) -> int:
        return math.prod(len(v) for v in self.knobs.values())

    def default(self) -> Schedule:
        return self._default

    def random_point(self, rng: np.random.Generator) -> Point:
        return {k: v[int(rng.integers(len(v)))] for k, v in self.knobs.items()}

    def sample(self, rng: np.random.Generator) -> Schedule:
        for _ in range(SAMPLE_TRIES):
            made = self.make(self.random_point(rng))
            if made is not None:
                return made
        return self._default

    def neighbours(self, schedule: Schedule) -> list[Schedule]:
        base = self.point(schedule)
        found: list[Schedule] = []
        for name, values in self.knobs.items():
            i = values.index(base[name])
            for j in (i - 1, i + 1):
                if 0 <= j < len(values):
                    made = self.make({**base, name: values[j]})
                    if made is not None and made != schedule and made not in found:
                        found.append(made)
        return found

    def crossover(self, a: Schedule, b: Schedule, rng: np.random.Generator) -> Schedule:
        pa, pb = self.point(a), self.point(b)
        for _ in range(SAMPLE_TRIES // 10):
            child = {k: (pa if rng.random() < 0.5 else pb)[k] for k in self.knobs}
            made = self.make(child)
            if made is not None:
                return made
        return a

    def nearest(self, name: str, value: Any) -> Any:
        """The candidate of knob ``name`` nearest to ``value`` (numbers) or equal to it."""
        values = self.knobs[name]
        if value in values:
            return value
        numeric = [v for v in values if isinstance(v, int | float) and not isinstance(v, bool)]
        if isinstance(value, int | float) and numeric:
            return min(numeric, key=lambda v: abs(v - value))
        return values[0]


def _compute_dtype(group: KernelGroup) -> DType:
    """The widest element type the kernel computes (f16 / bf16 compute in f32)."""
    dtypes = [v.dtype for n in group.nodes for v in n.outputs] or [DType.f32]
    return max(dtypes, key=lambda d: 4 if d in (DType.f16, DType.bf16) else d.itemsize)


def _pow2_upto(low: int, high: int) -> list[int]:
    return [1 << i for i in range(low.bit_length() - 1, 7) if low <= 1 << i <= high]


class ContractionSpace(KnobSpace):
    """Micro tile, cache blocks, parallel axis, k unroll, pack B and B's prefetch distance of
    a matmul kernel."""

    def __init__(self, group: KernelGroup, target: CpuTarget):
        sizes = iteration_axes(group)
        m, n, k = (sizes[a] or 256 for a in "mnk")
        lanes = target.lanes(_compute_dtype(group))
        widths = [w for w in (lanes, lanes // 2) if w >= 1 and w <= max(n, 1)] or [1]
        parallel = ["n", "m", ""] + (["b"] if "b" in sizes else [])
        knobs = {"width": widths, "nr_vectors": [1, 2, 3, 4],
                 "mr": [r for r in range(1, 17) if r <= m],
                 "mc": sorted({min(t, m) for t in (16, 32, 48, 64, 96, 128, 192, 256, 384, m)}),
                 "nc": sorted({min(t, n) for t in (64, 128, 256, 384, 512, 768, 1024, 1536, 2048,
                                                   3072, n)}),
                 "kc": sorted({min(t, k) for t in (64, 128, 256, 384, 512, 768, 1024, k)}),
                 "parallel": parallel, "unroll_k": [u for u in (1, 2, 4, 8) if u <= k],
                 "pack_b": [True, False], "prefetch_b": [0, 8, 16, 32],
                 "prefetch_next": [0, 1]}
        super().__init__(group, target, knobs)

    def schedule(self, point: Point) -> Schedule:
        e = self.extents
        width = point["width"]
        nr = width * point["nr_vectors"]
        mr = point["mr"]
        if mr * point["nr_vectors"] > MAX_ACCUMULATORS:
            raise TilefuseError("too many accumulators")
        tiles = (("m", pick_tile(e["m"], max(point["mc"], mr), mr)),
                 ("n", pick_tile(e["n"], max(point["nc"], nr), nr)),
                 ("k", pick_tile(e["k"], point["kc"])))
        order = ("b", "n", "k", "m") if "b" in e else ("n", "k", "m")
        unroll = point["unroll_k"]
        return Schedule(KernelKind.CONTRACTION, tiles=tiles, order=order,
                        vector_axis="n" if width > 1 else None, vector_width=width,
                        parallel_axes=(point["parallel"],) if point["parallel"] else (),
                        unroll=(("k", unroll),) if unroll > 1 else (),
                        pack=("B",) if point["pack_b"] else (), micro_tile=(mr, nr),
                        prefetch=_prefetch(point))

    def point(self, schedule: Schedule) -> Point:
        mr, nr = schedule.micro_tile or (1, schedule.vector_width)
        width = schedule.vector_width
        e = self.extents
        return {"width": self.nearest("width", width),
                "nr_vectors": self.nearest("nr_vectors", nr // max(width, 1)),
                "mr": self.nearest("mr", mr),
                "mc": self.nearest("mc", schedule.tile("m") or e["m"]),
                "nc": self.nearest("nc", schedule.tile("n") or e["n"]),
                "kc": self.nearest("kc", schedule.tile("k") or e["k"]),
                "parallel": self.nearest("parallel", (schedule.parallel_axes or ("",))[0]),
                "unroll_k": self.nearest("unroll_k", dict(schedule.unroll).get("k", 1)),
                "pack_b": "B" in schedule.pack,
                "prefetch_b": self.nearest("prefetch_b", dict(schedule.prefetch).get("B", 0)),
                "prefetch_next": self.nearest("prefetch_next",
                                              dict(schedule.prefetch).get("B_next", 0))}


def _prefetch(point: Point) -> tuple[tuple[str, int], ...]:
    """The prefetch pairs of a contraction point (only a packed B is prefetched)."""
    if not point["pack_b"]:
        return ()
    return tuple((operand, point[knob]) for operand, knob in
                 (("B", "prefetch_b"), ("B_next", "prefetch_next")) if point[knob])


def _chunk_counts(cores: int) -> list[int]:
    return [0, *sorted({cores * f for f in (1, 2, 4, 8, 16, 64)})]


def _chunk_tile(extent: int | None, chunks: int, multiple: int) -> int:
    size = extent or 1
    per = -(-size // chunks)
    return max(1, min(size, -(-per // multiple) * multiple))


class ElementwiseSpace(KnobSpace):
    """Vector width and parallel chunks of a flat elementwise loop."""

    axis = "i"

    def __init__(self, group: KernelGroup, target: CpuTarget,
                 extra: Mapping[str, Sequence] | None = None):
        widths = _pow2_upto(4, 16)
        super().__init__(group, target, {"width": widths, "chunks": _chunk_counts(target.cores),
                                          **(extra or {})})

    def parallel_part(self, point: Point, multiple: int) -> dict[str, Any]:
        chunks = point["chunks"]
        if not chunks:
            return {"tiles": (), "parallel_axes": ()}
        tile = _chunk_tile(self.extents[self.axis], chunks, multiple)
        return {"tiles": ((self.axis, tile),), "parallel_axes": (self.axis,)}

    def schedule(self, point: Point) -> Schedule:
        width = point["width"]
        return Schedule(KernelKind.ELEMENTWISE, order=("i",), vector_axis="i",
                        vector_width=width, **self.parallel_part(point, width))

    def chunks_of(self, schedule: Schedule) -> int:
        if self.axis not in schedule.parallel_axes:
            return 0
        tile = schedule.tile(self.axis) or 1
        return self.nearest("chunks", -(-(self.extents[self.axis] or 1) // tile))

    def point(self, schedule: Schedule) -> Point:
        return {"width": self.nearest("width", schedule.vector_width),
                "chunks": self.chunks_of(schedule)}


class RowSpace(ElementwiseSpace):
    """Vector width, unroll (independent accumulators) and parallel row chunks of a row
    reduction."""

    axis = "r"

    def __init__(self, group: KernelGroup, target: CpuTarget):
        super().__init__(group, target, {"unroll": [1, 2, 4, 8]})

    def schedule(self, point: Point) -> Schedule:
        unroll = min(point["unroll"], self.extents["n"] or 1)
        return Schedule(KernelKind.ROW_REDUCTION, order=("r", "n"), vector_axis="n",
                        vector_width=point["width"],
                        unroll=(("n", unroll),) if unroll > 1 else (),
                        **self.parallel_part(point, 1))

    def point(self, schedule: Schedule) -> Point:
        return {"width": self.nearest("width", schedule.vector_width),
                "chunks": self.chunks_of(schedule),
                "unroll": self.nearest("unroll", dict(schedule.unroll).get("n", 1))}


class AttentionSpace(KnobSpace):
    """Query and key blocks and the register tile of a fused attention kernel."""

    def __init__(self, group: KernelGroup, target: CpuTarget):
        sizes = iteration_axes(group)
        self.lanes = target.lanes(_compute_dtype(group))
        try:
            self.shape: AttentionShape | None = AttentionShape.of(attention_node(group))
        except TilefuseError:
            self.shape = None  # not lowered natively: every build fails and scores inf
        sq, keys, dv = (sizes[a] or 256 for a in "qkv")
        key_vectors = max(1, -(-keys // self.lanes))
        knobs = {"block_q": sorted({min(t, sq) for t in (8, 16, 32, 64, 128, 256)}),
                 "key_vectors": [v for v in (1, 2, 3, 4, 6, 8) if v <= key_vectors] or [1],
                 "rows": [r for r in range(1, 9) if r <= sq],
                 "pv_vectors": [v for v in (1, 2, 3, 4) if v <= max(1, dv // self.lanes)]}
        super().__init__(group, target, knobs)

    def schedule(self, point: Point) -> Schedule:
        block_k = point["key_vectors"] * self.lanes
        schedule = Schedule(KernelKind.ATTENTION,
                            tiles=(("q", point["block_q"]), ("k", block_k)),
                            order=("b", "q", "k", "v"), vector_axis="k", vector_width=self.lanes,
                            parallel_axes=("b", "q"),
                            unroll=(("q", point["rows"]), ("v", point["pv_vectors"])),
                            pack=("k",))
        if self.shape is not None:
            attention_sizes(self.shape, schedule, 1)  # the lowering's rules: CompileError if not
        return schedule

    def point(self, schedule: Schedule) -> Point:
        unroll = dict(schedule.unroll)
        return {"block_q": self.nearest("block_q", schedule.tile("q") or 64),
                "key_vectors": self.nearest("key_vectors",
                                            (schedule.tile("k") or self.lanes) // self.lanes),
                "rows": self.nearest("rows", unroll.get("q", 1)),
                "pv_vectors": self.nearest("pv_vectors", unroll.get("v", 1))}


def space_for(group: KernelGroup, target: CpuTarget | Any = None) -> KnobSpace:
    """The knob space of ``group`` by its kind (TilefuseError for kinds not tuned)."""
    cpu = as_cpu_target(target)
    if group.kind is KernelKind.CONTRACTION:
        return ContractionSpace(group, cpu)
    if group.kind is KernelKind.ELEMENTWISE:
        return ElementwiseSpace(group, cpu)
    if group.kind is KernelKind.ROW_REDUCTION:
        return RowSpace(group, cpu)
    if group.kind is KernelKind.ATTENTION:
        return AttentionSpace(group, cpu)
    raise TilefuseError(f"kernel {group.name}: no search space for {group.kind.value} kernels")


__all__ = ["MAX_ACCUMULATORS", "AttentionSpace", "ContractionSpace", "ElementwiseSpace",
           "FixedSpace", "KnobSpace", "RowSpace", "SearchSpace", "space_for"]
