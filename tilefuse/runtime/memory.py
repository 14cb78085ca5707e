"""Memory planning: liveness intervals → offsets in one arena.

Every buffer an executable needs between its inputs and outputs gets an offset in one arena.
Two buffers may share bytes when their liveness intervals (inclusive, in launch-sequence steps)
do not overlap. The planner is the "greedy by size, best fit" heuristic of TFLite and ONNX
Runtime: buffers are placed largest first (then earliest first); each goes into the gap with the
least waste between the already-placed buffers it conflicts with, or above all of them when no
gap is large enough. Offsets are aligned to :data:`ALIGNMENT` bytes.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TypeVar

from tilefuse.errors import VerifyError

ALIGNMENT = 64
"""Every offset is a multiple of this (one cache line; the widest vector load, AVX-512)."""

T = TypeVar("T", bound=Hashable)


def align_up(n: int, alignment: int = ALIGNMENT) -> int:
    """The smallest multiple of ``alignment`` that is ``>= n``."""
    return -(-n // alignment) * alignment


@dataclass(frozen=True)
class BufferRequest:
    """A buffer to place: ``nbytes`` bytes, live from step ``start`` to step ``end`` inclusive."""

    name: str
    nbytes: int
    start: int
    end: int

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise VerifyError(f"buffer name must be a non-empty string, got {self.name!r}")
        for what in ("nbytes", "start", "end"):
            value = getattr(self, what)
            try:
                if isinstance(value, bool):
                    raise TypeError
                object.__setattr__(self, what, operator.index(value))
            except TypeError:
                raise VerifyError(f"buffer {self.name!r}: {what} must be an int, "
                                  f"got {value!r}") from None
        if self.nbytes < 0:
            raise VerifyError(f"buffer {self.name!r}: negative size {self.nbytes}")
        if self.start > self.end:
            raise VerifyError(f"buffer {self.name!r}: interval [{self.start}, {self.end}] ends "
                              "before it starts")

    def conflicts_with(self, other: BufferRequest) -> bool:
        """True when both are live at some common step (inclusive intervals overlap)."""
        return self.start <= other.end and other.start <= self.end


@dataclass(frozen=True)
class MemoryPlan:
    """Offsets of every buffer in one arena.

    ``arena_bytes`` is the planned peak (the highest ``offset + nbytes``). ``sum_bytes`` is what
    the buffers would take if each had its own allocation: the sum of their sizes, each rounded
    up to :data:`ALIGNMENT`, so a plan is never larger than it. ``buffers`` are the requests the
    plan was made for (for :meth:`report`).
    """

    offsets: Mapping[str, int]
    arena_bytes: int
    sum_bytes: int
    buffers: tuple[BufferRequest, ...] = field(default=(), compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "offsets", MappingProxyType(dict(self.offsets)))

    @property
    def saved_fraction(self) -> float:
        """The share of ``sum_bytes`` the arena saves (0.0 when there is nothing to save)."""
        return 1.0 - self.arena_bytes / self.sum_bytes if self.sum_bytes else 0.0

    def summary(self) -> str:
        """One line, e.g. ``arena 12.0 MiB for 5 buffers, 20.0 MiB if each had its own
        (saves 40%)``."""
        count = len(self.offsets)
        noun = "buffer" if count == 1 else "buffers"
        return (f"arena {format_bytes(self.arena_bytes)} for {count} {noun}, "
                f"{format_bytes(self.sum_bytes)} if each had its own "
                f"(saves {round(100 * self.saved_fraction)}%)")

    def report(self) -> str:
        """:meth:`summary` followed by a table of the buffers (by offset): name, offset, size
        and liveness interval. Used in dumps."""
        by_name = {b.name: b for b in self.buffers}
        rows = [("buffer", "offset", "bytes", "size", "live")]
        for name in sorted(self.offsets, key=lambda n: (self.offsets[n], n)):
            request = by_name.get(name)
            size = str(request.nbytes) if request else "?"
            human = format_bytes(request.nbytes) if request else "?"
            live = f"[{request.start}, {request.end}]" if request else "?"
            rows.append((name, str(self.offsets[name]), size, human, live))
        widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
        lines = [self.summary()]
        for row in rows:
            cells = [row[0].ljust(widths[0])]
            cells += [cell.rjust(w) for cell, w in zip(row[1:4], widths[1:4])]
            cells.append(row[4])
            lines.append("  " + "  ".join(cells).rstrip())
        return "\n".join(lines) + "\n"


def format_bytes(n: int) -> str:
    """``n`` bytes for people: ``512 B``, ``1.5 KiB``, ``12.0 MiB``, ``2.0 GiB``."""
    if n < 1 << 10:
        return f"{n} B"
    if n < 1 << 20:
        return f"{n / (1 << 10):.1f} KiB"
    if n < 1 << 30:
        return f"{n / (1 << 20):.1f} MiB"
    return f"{n / (1 << 30):.1f} GiB"


def plan_memory(requests: Sequence[BufferRequest]) -> MemoryPlan:
    """Places every request in one arena. VerifyError on duplicate names.

    The plan is the greedy best-fit one, unless at most two buffers are ever live together: then
    the conflict graph is a forest, and putting one colour of it at the bottom of the arena and
    the other at the top reaches the live peak, which greedy misses on some chains; the smaller
    of the two plans is kept.
    """
    _check_unique(requests)
    sized = [r for r in requests if r.nbytes]
    offsets = _greedy_offsets(sized)
    two_sided = _two_sided_offsets(sized)
    if two_sided is not None and _arena(two_sided, sized) < _arena(offsets, sized):
        offsets = two_sided
    total = sum(align_up(r.nbytes) for r in requests)
    ordered = {r.name: offsets.get(r.name, 0) for r in requests}
    return MemoryPlan(ordered, _arena(offsets, sized), total, tuple(requests))


def _arena(offsets: Mapping[str, int], requests: Sequence[BufferRequest]) -> int:
    return max((offsets[r.name] + r.nbytes for r in requests), default=0)


def live_peak_bytes(requests: Sequence[BufferRequest], *, aligned: bool = False) -> int:
    """The most bytes live at any one step: a lower bound of every plan's arena (with
    ``aligned``, each size rounded up to :data:`ALIGNMENT` first)."""
    events: list[tuple[int, int]] = []
    for r in requests:
        size = align_up(r.nbytes) if aligned else r.nbytes
        events += [(r.start, size), (r.end + 1, -size)]
    peak = live = 0
    for _, delta in sorted(events, key=lambda e: (e[0], e[1] > 0)):
        live += delta
        peak = max(peak, live)
    return peak


def _greedy_offsets(requests: Sequence[BufferRequest]) -> dict[str, int]:
    """Greedy by size (descending, then by start), best fit."""
    order = sorted(requests, key=lambda r: (-r.nbytes, r.start, r.end, r.name))
    placed: list[tuple[BufferRequest, int]] = []
    offsets: dict[str, int] = {}
    for request in order:
        offsets[request.name] = _best_fit(request, placed)
        placed.append((request, offsets[request.name]))
    return offsets


def _two_sided_offsets(requests: Sequence[BufferRequest]) -> dict[str, int] | None:
    """When no three buffers are live together: one colour of the conflict forest at offset 0,
    the other against the top of an arena as high as the largest conflicting pair. Else None."""
    neighbours = _conflict_forest(requests)
    if neighbours is None:
        return None
    size = {r.name: align_up(r.nbytes) for r in requests}
    height = max((size[a] + size[b] for a in neighbours for b in neighbours[a]), default=0)
    height = max([height, *size.values()])
    top: dict[str, bool] = {}
    for root in neighbours:
        if root in top:
            continue
        top[root] = False
        stack = [root]
        while stack:
            name = stack.pop()
            for other in neighbours[name]:
                if other not in top:
                    top[other] = not top[name]
                    stack.append(other)
    return {name: height - size[name] if top[name] else 0 for name in neighbours}


def _conflict_forest(requests: Sequence[BufferRequest]) -> dict[str, list[str]] | None:
    """Each buffer → the buffers it conflicts with, or None when three are ever live together
    (at most two at a time makes the interval graph a forest)."""
    neighbours: dict[str, list[str]] = {r.name: [] for r in requests}
    live: list[BufferRequest] = []
    for request in sorted(requests, key=lambda r: (r.start, r.end, r.name)):
        live = [other for other in live if other.end >= request.start]
        if len(live) > 1:
            return None
        for other in live:
            neighbours[request.name].append(other.name)
            neighbours[other.name].append(request.name)
        live.append(request)
    return neighbours


def _best_fit(request: BufferRequest, placed: list[tuple[BufferRequest, int]]) -> int:
    """The offset for ``request``: the lowest-waste gap between the placed buffers it conflicts
    with (earliest gap on ties), else the first aligned offset above all of them."""
    busy = sorted((off, off + r.nbytes) for r, off in placed if r.conflicts_with(request))
    best: int | None = None
    best_waste = 0
    top = 0
    for begin, end in busy:
        candidate = align_up(top)
        gap = begin - candidate
        if gap >= request.nbytes and (best is None or gap - request.nbytes < best_waste):
            best, best_waste = candidate, gap - request.nbytes
        top = max(top, end)
    return best if best is not None else align_up(top)


def _check_unique(requests: Sequence[BufferRequest]) -> None:
    seen: set[str] = set()
    for request in requests:
        if not isinstance(request, BufferRequest):
            raise VerifyError(f"expected a BufferRequest, got {type(request).__name__}")
        if request.name in seen:
            raise VerifyError(f"buffer {request.name!r} is requested twice")
        seen.add(request.name)


def value_names(values: Sequence[T]) -> dict[T, str]:
    """The buffer name :func:`plan_from_liveness` gives each value by default: its ``name``
    attribute when that is a string no other value has, else ``%<position in values>``."""
    counts: dict[str, int] = {}
    for value in values:
        name = getattr(value, "name", None)
        if isinstance(name, str) and name:
            counts[name] = counts.get(name, 0) + 1
    names: dict[T, str] = {}
    for i, value in enumerate(values):
        name = getattr(value, "name", None)
        if isinstance(name, str) and counts.get(name) == 1 and not name.startswith("%"):
            names[value] = name
        else:
            names[value] = f"%{i}"
    return names


def plan_from_liveness(values: Sequence[T], liveness: Mapping[T, tuple[int, int]],
                       nbytes_of: Callable[[T], int],
                       name_of: Callable[[T], str] | None = None) -> MemoryPlan:
    """Plans the buffers of ``values`` from liveness intervals such as
    :func:`tilefuse.graph.analysis.liveness` returns (value → (defining step, last use)).

    ``nbytes_of(value)`` is the buffer's size; ``name_of(value)`` its name in the plan (default:
    :func:`value_names`). VerifyError when a value has no interval or two values share a name.
    """
    names = value_names(values) if name_of is None else {v: name_of(v) for v in values}
    requests = []
    for value in values:
        if value not in liveness:
            raise VerifyError(f"value {names[value]!r} has no liveness interval")
        start, end = liveness[value]
        requests.append(BufferRequest(names[value], nbytes_of(value), start, end))
    return plan_memory(requests)


def verify_plan(plan: MemoryPlan, requests: Sequence[BufferRequest]) -> None:
    """VerifyError unless ``plan`` places exactly ``requests``, every offset is a non-negative
    multiple of :data:`ALIGNMENT`, every buffer lies inside the arena and no two buffers that
    are live at a common step share a byte."""
    _check_unique(requests)
    names = {r.name for r in requests}
    missing = sorted(names - set(plan.offsets))
    extra = sorted(set(plan.offsets) - names)
    if missing or extra:
        raise VerifyError(f"plan does not match its requests (unplaced: {missing or 'none'}, "
                          f"unknown: {extra or 'none'})")
    for request in requests:
        offset = plan.offsets[request.name]
        if not isinstance(offset, int) or offset < 0 or offset % ALIGNMENT:
            raise VerifyError(f"buffer {request.name!r}: offset {offset!r} is not a non-negative "
                              f"multiple of {ALIGNMENT}")
        if request.nbytes and offset + request.nbytes > plan.arena_bytes:
            raise VerifyError(f"buffer {request.name!r} at {offset} + {request.nbytes} bytes "
                              f"ends past the arena ({plan.arena_bytes} bytes)")
    _check_no_overlap(plan, [r for r in requests if r.nbytes])


def _check_no_overlap(plan: MemoryPlan, requests: list[BufferRequest]) -> None:
    """Sweeps the requests by start step, comparing each with the earlier ones still live."""
    live: list[BufferRequest] = []
    for request in sorted(requests, key=lambda r: (r.start, r.end, r.name)):
        live = [other for other in live if other.end >= request.start]
        begin = plan.offsets[request.name]
        for other in live:
            other_begin = plan.offsets[other.name]
            if begin < other_begin + other.nbytes and other_begin < begin + request.nbytes:
                raise VerifyError(
                    f"buffers {other.name!r} [{other_begin}, {other_begin + other.nbytes}) and "
                    f"{request.name!r} [{begin}, {begin + request.nbytes}) overlap while both "
                    f"are live (steps [{other.start}, {other.end}] and "
                    f"[{request.start}, {request.end}])")
        live.append(request)
