"""Schedules as data: how one kernel's loops are tiled, ordered, vectorised and threaded.

A :class:`Schedule` is a small frozen record that round-trips through JSON exactly, so a tuner can
store it and a dump can show it. It names the kernel's iteration axes (:func:`iteration_axes`):

- elementwise, movement, opaque: ``i``, the flattened domain;
- row reduction: ``r`` (rows, the leading axes flattened) and ``n`` (the reduced trailing axes);
- reduction: ``i`` (kept axes flattened) and ``r`` (reduced axes flattened);
- contraction: ``b`` (batch, only when batched), ``m``, ``n``, ``k``.

Meaning of the fields: ``tiles`` splits an axis into an outer loop over tiles and an inner loop
of the tile size (the last tile may be partial); the loop nest is the outer tile loops in
``order``, then each axis's remaining loop in ``order``. ``parallel_axes`` run their outermost
loop across threads; the innermost loop of ``vector_axis`` is vectorised with ``vector_width``
lanes (width 1: scalar); ``unroll`` unrolls an axis's innermost loop; ``pack`` copies operands
("A", "B") into contiguous panels. For a contraction ``tiles``/``order`` are the cache blocks
(MC, NC, KC in the BLIS loop order n, k, m) and ``micro_tile`` = (MR, NR) is the register tile
of the micro-kernel inside them (MR rows of A broadcast against NR columns of packed B);
``prefetch`` pairs a packed operand with a distance: ("B", 16) asks for the lines of B's
panel 16 k steps ahead (into L1); ("B_next", 1) spreads hints for the panel one ahead (the
one the register tiles read after this one) into L2 over this panel's tiles. A missing
``prefetch`` key in JSON reads as none (schedules stored before it existed).

:func:`default_schedule` gives every kernel a schedule that is good without search, from the
machine described by :class:`CpuTarget`.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from tilefuse.dtypes import DType
from tilefuse.errors import CompileError, TilefuseError
from tilefuse.graph.ir import Node
from tilefuse.graph.types import Shape, Sym
from tilefuse.kernel.classify import moves_lane_axis
from tilefuse.kernel.fusion import KernelGroup, KernelKind, reduced_axes

PARALLEL_MIN_ELEMENTS = 64 * 1024
"""Elements per thread below which a memory-bound kernel stays serial (a thread costs µs)."""
PARALLEL_MIN_FLOPS = 1 << 20
"""Flops per thread below which a contraction stays serial."""
SYMBOLIC_DIM_HINT = 256
"""The size the default rules assume for a symbolic dim (``batch``, ``seq``)."""
CACHE_TILES = {"m": 96, "k": 768, "n": 384}
"""Target contraction cache blocks (MC, KC, NC): an MC×KC block of A and a KC×NC block of B
(768 × 384 f32: 1.2 MB) in a core's L2, reused by every MC block of the NC block; KC covers
BERT's and W1's K so the accumulators are never reloaded between K blocks (measurements in
docs/PERFORMANCE_LOG.md)."""
MIN_ACCUMULATORS = 8
"""Independent FMA chains a micro-kernel needs to keep two FMA units busy (latency 4 × 2)."""
PACKABLE = ("A", "B")
MAX_PREFETCH = 256
"""The farthest a micro-kernel prefetches, in k steps."""
MAX_PREFETCH_PANELS = 2
"""The farthest ``B_next`` prefetches, in panels."""
NEXT_PANEL_MIN_K = 256
"""The shortest K for which the default prefetches B's next panel (:func:`_next_panel_helps`)."""
PREFETCH_B = 16
"""The default prefetch distance of B's panel, in k steps (16 rows of a 64-wide f32 panel:
4 KiB, ~200 cycles of FMAs ahead). Measured on the BERT layer (M = 128) against none, in one
process, alternating: 1.07-1.08x (8 steps 1.06x, 32 steps 1.02x)."""
BLOCK_Q = 64
"""Attention: query rows per work item (the probabilities scratch is BLOCK_Q × the key block
per thread)."""
KEY_VECTORS = 4
"""Attention: vectors of keys per block: 64 keys of f32 (32 of f64) on AVX-512, 4 zmm per
score row."""
MICRO_ROWS = 4
"""Attention: query rows per register tile: 4 rows × 4 vectors = 16 accumulators of 32 zmm."""
PV_VECTORS = 4
"""Attention: output vectors per register tile of the probabilities · v product."""
KEY_ROUNDING = 16
"""Attention's key axis ``k`` is the key count rounded up to a multiple of this (the most
lanes an attention vector has): key blocks are whole vectors, padded past the last key."""

Extents = Mapping[str, int | None]


class ScheduleError(TilefuseError):
    """A schedule that is malformed (types, JSON) or does not fit its kernel's axes."""


@dataclass(frozen=True)
class CpuTarget:
    """The CPU a schedule is made for: SIMD register width in bits and hardware threads."""

    vector_bits: int = 512
    cores: int = field(default_factory=lambda: os.cpu_count() or 1)

    def __post_init__(self) -> None:
        if self.vector_bits not in (128, 256, 512):
            raise ScheduleError(f"vector_bits must be 128, 256 or 512, got {self.vector_bits!r}")
        if not _is_int(self.cores) or self.cores < 1:
            raise ScheduleError(f"cores must be a positive int, got {self.cores!r}")

    @property
    def vector_registers(self) -> int:
        """32 zmm registers with AVX-512, 16 ymm / xmm otherwise."""
        return 32 if self.vector_bits >= 512 else 16

    def lanes(self, dtype: DType) -> int:
        """Vector lanes for ``dtype`` as computed (f16 and bf16 compute in f32)."""
        bits = 32 if dtype in (DType.f16, DType.bf16) else dtype.itemsize * 8
        return max(1, self.vector_bits // bits)


# ---- the record ------------------------------------------------------------------------------


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _check_axis(name: Any, what: str) -> None:
    if not isinstance(name, str) or not name:
        raise ScheduleError(f"{what} must be a non-empty axis name, got {name!r}")


def _check_pairs(pairs: Any, what: str) -> None:
    if not isinstance(pairs, tuple):
        raise ScheduleError(f"{what} must be a tuple of (axis, size) pairs, got {pairs!r}")
    for pair in pairs:
        if not (isinstance(pair, tuple) and len(pair) == 2):
            raise ScheduleError(f"{what} entries must be (axis, size) pairs, got {pair!r}")
        _check_axis(pair[0], f"{what} axis")
        if not _is_int(pair[1]) or pair[1] < 1:
            raise ScheduleError(f"{what} size for {pair[0]!r} must be a positive int, got "
                                f"{pair[1]!r}")


def _check_names(names: Any, what: str) -> None:
    if not isinstance(names, tuple):
        raise ScheduleError(f"{what} must be a tuple of names, got {names!r}")
    for n in names:
        _check_axis(n, what)


@dataclass(frozen=True)
class Schedule:
    """How one kernel's loops run (see the module docstring for each field's meaning)."""

    kind: KernelKind
    tiles: tuple[tuple[str, int], ...] = ()
    order: tuple[str, ...] = ()
    vector_axis: str | None = None
    vector_width: int = 1
    parallel_axes: tuple[str, ...] = ()
    unroll: tuple[tuple[str, int], ...] = ()
    pack: tuple[str, ...] = ()
    micro_tile: tuple[int, int] | None = None
    prefetch: tuple[tuple[str, int], ...] = ()

    def __post_init__(self) -> None:
        if not isinstance(self.kind, KernelKind):
            raise ScheduleError(f"kind must be a KernelKind, got {self.kind!r}")
        _check_pairs(self.tiles, "tiles")
        _check_names(self.order, "order")
        if self.vector_axis is not None:
            _check_axis(self.vector_axis, "vector_axis")
        if not _is_int(self.vector_width) or self.vector_width < 1:
            raise ScheduleError(f"vector_width must be a positive int, got "
                                f"{self.vector_width!r}")
        _check_names(self.parallel_axes, "parallel_axes")
        _check_pairs(self.unroll, "unroll")
        _check_names(self.pack, "pack")
        _check_pairs(self.prefetch, "prefetch")
        mt = self.micro_tile
        if mt is not None and not (isinstance(mt, tuple) and len(mt) == 2
                                   and all(_is_int(x) and x >= 1 for x in mt)):
            raise ScheduleError(f"micro_tile must be None or two positive ints, got {mt!r}")

    def tile(self, axis: str) -> int | None:
        return dict(self.tiles).get(axis)

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind.value, "tiles": [list(p) for p in self.tiles],
                "order": list(self.order), "vector_axis": self.vector_axis,
                "vector_width": self.vector_width, "parallel_axes": list(self.parallel_axes),
                "unroll": [list(p) for p in self.unroll], "pack": list(self.pack),
                "micro_tile": None if self.micro_tile is None else list(self.micro_tile),
                "prefetch": [list(p) for p in self.prefetch]}

    def to_json(self, indent: int | None = None) -> str:
        return json.dumps(self.to_dict(), indent=indent)

    @classmethod
    def from_dict(cls, data: Any) -> Schedule:
        """The schedule ``data`` (as :meth:`to_dict` writes it) describes; ScheduleError for
        unknown or missing keys and values of the wrong type."""
        if not isinstance(data, dict):
            raise ScheduleError(f"a schedule must be a JSON object, got {type(data).__name__}")
        keys = set(_FIELDS)
        unknown = sorted(set(data) - keys)
        missing = sorted(keys - set(data) - set(_OPTIONAL_FIELDS))
        if unknown:
            raise ScheduleError(f"unknown schedule keys: {', '.join(map(str, unknown))}")
        if missing:
            raise ScheduleError(f"missing schedule keys: {', '.join(missing)}")
        try:
            kind = KernelKind(data["kind"])
        except (ValueError, TypeError):
            raise ScheduleError(f"unknown kernel kind {data['kind']!r}") from None
        mt = data["micro_tile"]
        return cls(kind, _pairs(data["tiles"], "tiles"), _names(data["order"], "order"),
                   data["vector_axis"], data["vector_width"],
                   _names(data["parallel_axes"], "parallel_axes"),
                   _pairs(data["unroll"], "unroll"), _names(data["pack"], "pack"),
                   None if mt is None else _list(mt, "micro_tile"),
                   _pairs(data.get("prefetch", []), "prefetch"))

    @classmethod
    def from_json(cls, text: str | bytes) -> Schedule:
        try:
            data = json.loads(text)
        except (ValueError, TypeError) as err:
            raise ScheduleError(f"schedule JSON does not parse: {err}") from None
        return cls.from_dict(data)

    def __str__(self) -> str:
        parts = [self.kind.value]
        if self.tiles:
            parts.append("tile(" + ",".join(f"{a}={t}" for a, t in self.tiles) + ")")
        parts.append("order(" + ",".join(self.order) + ")")
        if self.vector_axis is not None:
            parts.append(f"vec({self.vector_axis}x{self.vector_width})")
        parts.append("par(" + ",".join(self.parallel_axes) + ")" if self.parallel_axes
                     else "serial")
        if self.unroll:
            parts.append("unroll(" + ",".join(f"{a}={u}" for a, u in self.unroll) + ")")
        if self.pack:
            parts.append("pack(" + ",".join(self.pack) + ")")
        if self.micro_tile is not None:
            parts.append(f"micro({self.micro_tile[0]}x{self.micro_tile[1]})")
        if self.prefetch:
            parts.append("prefetch(" + ",".join(f"{o}+{d}" for o, d in self.prefetch) + ")")
        return " ".join(parts)


_FIELDS = ("kind", "tiles", "order", "vector_axis", "vector_width", "parallel_axes", "unroll",
           "pack", "micro_tile", "prefetch")
_OPTIONAL_FIELDS = ("prefetch",)
"""Keys a schedule's JSON may lack (added after schedules were first stored): they read as
the field's default."""


def _list(value: Any, what: str) -> tuple:
    if not isinstance(value, list):
        raise ScheduleError(f"{what} must be a JSON list, got {value!r}")
    return tuple(value)


def _names(value: Any, what: str) -> tuple:
    return _list(value, what)


def _pairs(value: Any, what: str) -> tuple:
    return tuple(_list(p, f"{what} entry") for p in _list(value, what))


# ---- validation ------------------------------------------------------------------------------

_AXES_BY_KIND = {KernelKind.CONTRACTION: {"m", "n", "k"}, KernelKind.ROW_REDUCTION: {"r", "n"},
                 KernelKind.REDUCTION: {"i", "r"}}


def validate(schedule: Schedule, extents: Extents) -> None:
    """ScheduleError unless ``schedule`` fits a kernel whose axes have ``extents`` (None for a
    symbolic extent): order is a permutation of the axes, every named axis exists and appears at
    most once per field, tiles and unroll factors are at most the extent, the vector width is a
    power of two up to 64 and set exactly when a vector axis is, packing and the micro tile
    belong to contractions (the micro tile fits the cache tiles, NR a multiple of the width)."""
    axes = set(extents)
    need = _AXES_BY_KIND.get(schedule.kind, set())
    if not need <= axes:
        raise ScheduleError(f"a {schedule.kind.value} kernel needs the axes {sorted(need)}")
    _check_unique(schedule.order, "order")
    if set(schedule.order) != axes or len(schedule.order) != len(axes):
        raise ScheduleError(f"order {list(schedule.order)} is not a permutation of the axes "
                            f"{sorted(axes)}")
    for what, pairs in (("tiles", schedule.tiles), ("unroll", schedule.unroll)):
        _check_unique(tuple(a for a, _ in pairs), what)
        for axis, size in pairs:
            _check_known(axis, axes, what)
            extent = extents[axis]
            if extent is not None and size > max(extent, 1):
                raise ScheduleError(f"{what} {size} for axis {axis!r} exceeds its extent "
                                    f"{extent}")
    _check_unique(schedule.parallel_axes, "parallel_axes")
    for axis in schedule.parallel_axes:
        _check_known(axis, axes, "parallel_axes")
    _validate_vector(schedule, axes)
    _validate_contraction(schedule, extents)


def _check_unique(names: tuple[str, ...], what: str) -> None:
    if len(set(names)) != len(names):
        raise ScheduleError(f"{what} names an axis twice: {list(names)}")


def _check_known(axis: str, axes: set[str], what: str) -> None:
    if axis not in axes:
        raise ScheduleError(f"{what} names {axis!r}, which is not an axis (axes: "
                            f"{', '.join(sorted(axes))})")


def _validate_vector(schedule: Schedule, axes: set[str]) -> None:
    w = schedule.vector_width
    if w > 64 or w & (w - 1):
        raise ScheduleError(f"vector_width must be a power of two up to 64, got {w}")
    if (schedule.vector_axis is None) != (w == 1):
        raise ScheduleError("a vector axis needs a vector width > 1 and a width > 1 needs a "
                            f"vector axis (got {schedule.vector_axis!r}, {w})")
    if schedule.vector_axis is not None:
        _check_known(schedule.vector_axis, axes, "vector_axis")


def _validate_contraction(schedule: Schedule, extents: Extents) -> None:
    contraction = schedule.kind is KernelKind.CONTRACTION
    _check_unique(schedule.pack, "pack")
    packable = PACKABLE if contraction else ("k",) if schedule.kind is KernelKind.ATTENTION \
        else ()
    if not set(schedule.pack) <= set(packable):
        raise ScheduleError(f"pack {list(schedule.pack)}: only a contraction packs (operands A "
                            "and B) and an attention (its keys, k)")
    if (schedule.micro_tile is not None) != contraction:
        raise ScheduleError("a contraction needs a micro_tile and other kernels have none")
    _check_unique(tuple(o for o, _ in schedule.prefetch), "prefetch")
    for operand, distance in schedule.prefetch:
        if not contraction or operand not in ("B", "B_next") or "B" not in schedule.pack:
            raise ScheduleError(f"prefetch {list(schedule.prefetch)}: only a contraction "
                                "prefetches, and only its packed B (B or B_next)")
        farthest = MAX_PREFETCH if operand == "B" else MAX_PREFETCH_PANELS
        if not 1 <= distance <= farthest:
            raise ScheduleError(f"prefetch {operand} distance {distance} is not in "
                                f"1..{farthest}")
    if schedule.micro_tile is None:
        return
    mr, nr = schedule.micro_tile
    if nr % schedule.vector_width:
        raise ScheduleError(f"micro tile NR={nr} is not a multiple of the vector width "
                            f"{schedule.vector_width}")
    for axis, size in (("m", mr), ("n", nr)):
        bound = schedule.tile(axis) or extents[axis]
        if bound is not None and size > max(bound, 1):
            raise ScheduleError(f"micro tile {size} along {axis!r} exceeds its block {bound}")


# ---- iteration axes --------------------------------------------------------------------------


def iteration_axes(group: KernelGroup, hint: int | None = None) -> dict[str, int | None]:
    """The named axes of ``group``'s loop nest and their extents: None where a symbolic dim
    enters, or, given ``hint``, with each symbolic dim taken as ``hint``."""

    def _product(dims: Shape) -> int | None:
        if hint is None and any(isinstance(d, Sym) for d in dims):
            return None
        return math.prod(hint if isinstance(d, Sym) else d for d in dims)

    if group.kind is KernelKind.ATTENTION:
        return _attention_axes(group, _product)
    anchor = group.anchor
    if group.kind in _AXES_BY_KIND and not _anchor_fits(group.kind, anchor):
        what = anchor.op.name if anchor is not None else "none"
        raise ScheduleError(f"kernel {group.name}: a {group.kind.value} kernel needs a "
                            f"{'matmul' if group.kind is KernelKind.CONTRACTION else 'reduction'}"
                            f" anchor, got {what}")
    if group.kind is KernelKind.CONTRACTION and anchor is not None:
        a, b = (v.type.shape for v in anchor.inputs)
        out = anchor.outputs[0].type.shape
        m = a[-2] if len(a) > 1 else 1
        n = b[-1] if len(b) > 1 else 1
        batch = out[:len(out) - (len(a) > 1) - (len(b) > 1)]
        axes = {"b": _product(batch)} if batch else {}
        axes.update(m=_product((m,)), n=_product((n,)), k=_product((a[-1],)))
        return axes
    if group.kind in (KernelKind.ROW_REDUCTION, KernelKind.REDUCTION) and anchor is not None:
        shape = anchor.inputs[0].type.shape
        folded = set(reduced_axes(anchor) or ())
        kept = tuple(d for i, d in enumerate(shape) if i not in folded)
        red = tuple(d for i, d in enumerate(shape) if i in folded)
        if group.kind is KernelKind.ROW_REDUCTION:
            return {"r": _product(kept), "n": _product(red)}
        return {"i": _product(kept), "r": _product(red)}
    return {"i": _product(group.domain)}


def attention_node(group: KernelGroup) -> Node:
    """The one node of an ATTENTION group (CompileError for anything else)."""
    found = [n for n in group.nodes if n.op.name == "attention"]
    if len(found) != 1 or len(group.nodes) != 1:
        raise CompileError(f"kernel {group.name}: an attention kernel holds one attention node")
    return found[0]


def _attention_axes(group: KernelGroup, product: Any) -> dict[str, int | None]:
    """``b`` (batch·heads), ``q`` (queries), ``k`` (keys, rounded up to whole vectors:
    :data:`KEY_ROUNDING`), ``v`` (the output's head dim) of an attention group."""
    node = attention_node(group)
    q, k, v = (x.type.shape for x in node.inputs[:3])
    out = node.outputs[0].type.shape
    keys = product((k[-2],))
    return {"b": product(out[:-2]), "q": product((q[-2],)),
            "k": None if keys is None else -(-max(keys, 1) // KEY_ROUNDING) * KEY_ROUNDING,
            "v": product((v[-1],))}


# ---- default rules ---------------------------------------------------------------------------


def _anchor_fits(kind: KernelKind, anchor: Node | None) -> bool:
    if anchor is None:
        return False
    if kind is KernelKind.CONTRACTION:
        return anchor.op.name == "matmul"
    return reduced_axes(anchor) is not None


def _floor_pow2(n: int) -> int:
    return 1 << (max(n, 1).bit_length() - 1)


def _width(lanes: int, extent: int | None) -> int:
    """The vector width for an axis: the target's lanes, less for an axis shorter than that."""
    return lanes if extent is None else min(lanes, _floor_pow2(extent))


def pick_tile(extent: int | None, target: int, multiple: int = 1) -> int:
    """A tile near ``target`` (at most it) for an axis of ``extent``: the whole axis when it is
    no longer; else the largest multiple of ``multiple`` in [target/2, target] that divides the
    extent; else ``target`` rounded down to a multiple."""
    if extent is None:
        return max(multiple, target // multiple * multiple)
    if extent <= target:
        return max(extent, 1)
    low = max(multiple, (target // 2 + multiple - 1) // multiple * multiple)
    for t in range(target // multiple * multiple, low - 1, -multiple):
        if t > 0 and extent % t == 0:
            return t
    return max(multiple, target // multiple * multiple)


def _threads(target: CpuTarget, work: int, per_thread: int, limit: int) -> int:
    """How many threads ``work`` is worth: at least ``per_thread`` each, at most ``limit``."""
    return max(1, min(target.cores, limit, work // per_thread))


def _compute_dtype(group: KernelGroup) -> DType:
    """The widest element type the kernel computes (what sets its vector lanes)."""
    dtypes = [v.dtype for n in group.nodes for v in n.outputs] or [DType.f32]
    return max(dtypes, key=lambda d: 4 if d in (DType.f16, DType.bf16) else d.itemsize)


def as_cpu_target(target: Any = None) -> CpuTarget:
    """``target`` as the schedule rule's :class:`CpuTarget`: itself; the default
    ``CpuTarget()`` for None (512-bit vectors, this machine's cores); from a
    :class:`tilefuse.target.Target` or its string (``"x86-64-v3"``: 256-bit vectors); or from
    the code generator's ``codegen.target.CpuTarget`` (its vector width). Anything else is a
    ScheduleError."""
    if isinstance(target, CpuTarget):
        return target
    if target is None:
        return CpuTarget()
    from tilefuse.target import Target, TargetError

    if isinstance(target, Target | str):
        try:
            return Target.parse(target).schedule_cpu()
        except TargetError as err:
            raise ScheduleError(f"cannot make a schedule for target {target!r}: {err}") from None
    from tilefuse.codegen.target import CpuTarget as LlvmCpu

    if isinstance(target, LlvmCpu):
        return CpuTarget(target.vector_bits)
    raise ScheduleError(f"cannot make a schedule for target {target!r}: not a "
                        "tilefuse.target.Target, a target string or a CpuTarget")


def default_schedule(group: KernelGroup, target: CpuTarget | Any = None) -> Schedule:
    """The schedule a kernel gets without search (rules in each ``_default_*`` function)."""
    target = as_cpu_target(target)
    axes = iteration_axes(group)
    sizes: dict[str, int] = iteration_axes(group, SYMBOLIC_DIM_HINT)  # type: ignore[assignment]
    lanes = target.lanes(_compute_dtype(group))
    if group.kind is KernelKind.CONTRACTION:
        schedule = _default_contraction(axes, sizes, lanes, target)
    elif group.kind is KernelKind.ROW_REDUCTION:
        schedule = _default_row_reduction(axes, sizes, lanes, target)
    elif group.kind is KernelKind.REDUCTION:
        schedule = _default_reduction(group, axes, sizes, lanes, target)
    elif group.kind is KernelKind.ELEMENTWISE:
        scalar = any(moves_lane_axis(node) for node in group.nodes)
        schedule = _default_elementwise(axes["i"], sizes["i"], lanes, target, scalar)
    elif group.kind is KernelKind.ATTENTION:
        schedule = _default_attention(axes, lanes, target)
    else:
        schedule = Schedule(group.kind, order=("i",))
    validate(schedule, axes)
    return schedule


def _default_attention(axes: Extents, lanes: int, target: CpuTarget) -> Schedule:
    """Query blocks of :data:`BLOCK_Q` rows and key blocks of :data:`KEY_VECTORS` vectors (each
    clamped to its axis), register tiles of :data:`MICRO_ROWS` rows (half with 16 vector
    registers, AVX2, so the 8 accumulators leave room) × :data:`PV_VECTORS` output vectors,
    threads over batch·heads and query blocks."""
    rows = MICRO_ROWS if target.vector_registers >= 32 else MICRO_ROWS // 2
    sq, keys, dv = axes["q"], axes["k"], axes["v"]
    block_q = BLOCK_Q if sq is None else min(BLOCK_Q, max(sq, 1))
    block_k = KEY_VECTORS * lanes if keys is None else min(KEY_VECTORS * lanes,
                                                           -(-keys // lanes) * lanes)
    rows = rows if sq is None else min(rows, max(sq, 1))
    pv = PV_VECTORS if dv is None else max(1, min(PV_VECTORS, dv // lanes))
    return Schedule(KernelKind.ATTENTION, tiles=(("q", block_q), ("k", block_k)),
                    order=("b", "q", "k", "v"), vector_axis="k", vector_width=lanes,
                    parallel_axes=("b", "q"), unroll=(("q", rows), ("v", pv)), pack=("k",))


def _default_elementwise(n: int | None, size: int, lanes: int, target: CpuTarget,
                         scalar: bool = False) -> Schedule:
    """Flatten; vectorise by the target's lanes; split into one chunk per thread when each
    thread gets at least 64 Ki elements, else serial. ``scalar``: the kernel reads through a
    transpose that moves the lane axis (:func:`~tilefuse.kernel.classify.moves_lane_axis`), so
    its elements go one at a time and a thread is worth it from 64 Ki / lanes of them
    (ShuffleNet's channel shuffles, 26 656 elements: 40 -> 2x~21 us)."""
    width = _width(lanes, n)
    least = PARALLEL_MIN_ELEMENTS // lanes if scalar else PARALLEL_MIN_ELEMENTS
    threads = _threads(target, size, least, size)
    if threads < 2:
        return Schedule(KernelKind.ELEMENTWISE, order=("i",), vector_axis=_axis(width, "i"),
                        vector_width=width)
    chunk = pick_tile(n, -(-size // threads // width) * width or width, width)
    return Schedule(KernelKind.ELEMENTWISE, tiles=(("i", chunk),), order=("i",),
                    vector_axis=_axis(width, "i"), vector_width=width, parallel_axes=("i",))


def _axis(width: int, axis: str) -> str | None:
    return axis if width > 1 else None


ROW_SPLIT = 8
"""Row tiles per thread of a row-reduction kernel that keeps every core busy
(:func:`_default_row_reduction`)."""


def _default_row_reduction(axes: Extents, sizes: dict[str, int], lanes: int,
                           target: CpuTarget) -> Schedule:
    """Rows across threads (when each gets 64 Ki elements), each row vectorised along ``n``
    with up to 4 vectors in flight (independent accumulators hide the add latency).

    With static rows and every core busy, each thread's share is ``ROW_SPLIT`` tiles: the
    pool lets threads steal a share in grains of a quarter of its tiles
    (:mod:`tilefuse.codegen.llvm_cpu`), and a share of one tile is one grain, so a worker the
    OS descheduled holding its half of the rows held the call until it ran again (W3,
    12x512x512, 2 cores at load 9, interleaved: median 10.7 ms with 2 tiles, 3.3 ms with 16,
    onnxruntime's 3.0). Fewer threads than cores keep one tile each: more tiles would wake
    threads the kernel is too small for."""
    rows, n = sizes["r"], sizes["n"]
    width = _width(lanes, axes["n"])
    threads = _threads(target, rows * n, PARALLEL_MIN_ELEMENTS, rows)
    unroll = min(4, n // width)
    split = ROW_SPLIT if axes["r"] is not None and threads == target.cores else 1
    return Schedule(KernelKind.ROW_REDUCTION,
                    tiles=(("r", pick_tile(axes["r"], -(-rows // (threads * split)))),)
                    if threads > 1 else (),
                    order=("r", "n"), vector_axis=_axis(width, "n"), vector_width=width,
                    parallel_axes=("r",) if threads > 1 else (),
                    unroll=(("n", unroll),) if unroll > 1 else ())


def _default_reduction(group: KernelGroup, axes: Extents, sizes: dict[str, int], lanes: int,
                       target: CpuTarget) -> Schedule:
    """Vectorise along whichever of kept / reduced axes is innermost in memory (the last input
    axis decides); kept outputs across threads when large enough."""
    anchor = group.anchor
    rank = anchor.inputs[0].type.rank if anchor is not None else 0
    inner = "r" if rank and rank - 1 in (reduced_axes(anchor) or ()) else "i"  # type: ignore
    kept, red = sizes["i"], sizes["r"]
    width = _width(lanes, axes[inner])
    threads = _threads(target, kept * red, PARALLEL_MIN_ELEMENTS, kept)
    return Schedule(KernelKind.REDUCTION,
                    tiles=(("i", pick_tile(axes["i"], -(-kept // threads))),) if threads > 1
                    else (),
                    order=("i", "r") if inner == "r" else ("r", "i"),
                    vector_axis=_axis(width, inner), vector_width=width,
                    parallel_axes=("i",) if threads > 1 else ())


def _b_streams(m: int, k: int, mc: int) -> bool:
    """B's panels are read from memory about once (at most two M blocks, so few register tiles
    reuse each panel from cache) along a K long enough to run ahead in: the micro-kernel
    prefetches them (PREFETCH_B). With more M blocks the panel is mostly in cache and the
    prefetches only cost issue slots (W1, M = 512: 0.96x with them; light ResNet-50, every
    kernel: 0.96x; only its M = 49 kernels: 1.015x). Cold B, alone: 1x768x3072 1.12x,
    8x768x768 1.07x, 128x768x3072 1.07x, 128x3072x768 0.96x, 49x4608x512 1.02x."""
    return -(-m // max(mc, 1)) <= 2 and k > 2 * PREFETCH_B


def _threads_over_m(m: int, n: int, mr: int, nr: int, threads: int) -> bool:
    """Threads split M rather than N: when N is narrow (:func:`_narrow`), or when A is the
    larger operand (M > N, with several MR blocks per thread). Split over N, every thread
    reads all of A (M·K) and its share of B; split over M, its share of A and all of B (K·N),
    so the larger operand should be the one split. Measured on light ResNet-50's 1x1
    convolutions at 56x56 and 28x28 (M = 3136, 784; N = 128..512), 2 threads: 1.10-1.30x
    each, 1.04x the whole model's kernels (alternating builds in one process)."""
    return _narrow(m, n, mr, nr, threads) or (m > n and m >= 4 * threads * mr)


def _narrow(m: int, n: int, mr: int, nr: int, threads: int) -> bool:
    """N gives each thread under two NR panels while M has many MR blocks per thread (the
    convolutions of a CNN's early stages: N = 64 output channels, M = 3136 pixels): threads go
    over M, each thread packing A for all of N once instead of every thread packing all of A
    for its one panel (measured 1.7-1.8x on [3136, 576] x [576, 64] and [3136, 64] x [64, 64],
    2 threads; N = 128 is even)."""
    return n < 2 * threads * nr and m >= 4 * threads * mr


def _tile_vectors(target: CpuTarget) -> int:
    """Vectors of the default register tile's row (NR = this × lanes). With 32 vector registers,
    4: a 6×64 f32 tile's 24 accumulators load 4 B vectors and broadcast 6 A elements per k step
    (0.42 loads per FMA) where 12×32 broadcasts 12 and loads 2 (0.58); measured against 12×32
    in one process, alternating (2026-12-01): light ResNet-50 1.04-1.10x, the BERT layer 1.06x,
    W1 1.02x, 128×768×768 1.04x, every ResNet kernel 0.96-1.19x. 7×64 would need 33 registers
    and spills. With 16 registers (AVX2), 2 (6×16)."""
    return 4 if target.vector_registers >= 32 else 2


def _default_contraction(axes: Extents, sizes: dict[str, int], lanes: int,
                         target: CpuTarget) -> Schedule:
    """BLIS-style: an MR×NR register tile (NR = :func:`_tile_vectors` vectors, MR so that the
    MR·NR/lanes accumulators fill 3/4 of the vector registers: 6×64 for f32 with AVX-512, 6×16
    with AVX2),
    cache blocks near (MC, KC, NC) = (96, 768, 3072) that divide the extents where they can,
    B packed into NR-wide panels, threads over N panels (or batches, or M blocks when A is the
    larger operand: :func:`_threads_over_m`), serial when each thread would get under 1
    MFLOP."""
    m, n, k = (sizes[a] for a in "mnk")
    batch = sizes.get("b", 1)
    width = _width(lanes, axes["n"])
    nr = width * max(1, min(_tile_vectors(target), n // width))
    mr = max(1, min(target.vector_registers * 3 // 4 // (nr // width), 16, m))  # m may be 0
    if mr * (nr // width) < MIN_ACCUMULATORS:
        # Few rows (a GEMV at batch 1): each accumulator is one FMA dependency chain, and with
        # 2 chains the FMA latency idles the units 3/4 of the time; widen the tile along N.
        vectors = min(-(-MIN_ACCUMULATORS // mr), max(1, n // width),
                      target.vector_registers * 3 // 4 // mr)
        nr = width * max(nr // width, vectors)
    threads = _threads(target, 2 * batch * m * n * k, PARALLEL_MIN_FLOPS, target.cores)
    nc_target, mc_target, parallel = CACHE_TILES["n"], CACHE_TILES["m"], ()
    if threads > 1 and "b" in axes and axes["b"] is not None and batch >= threads:
        parallel = ("b",)   # a symbolic batch may be 1 at run time: threads go over N or M
    elif threads > 1 and n >= threads * nr and not _threads_over_m(m, n, mr, nr, threads):
        nc_target = min(nc_target, -(-n // threads // nr) * nr)
        parallel = ("n",)
    elif threads > 1 and m >= threads * mr:
        mc_target = min(mc_target, -(-m // threads // mr) * mr)
        parallel = ("m",)
    tiles = (("m", pick_tile(axes["m"], max(mc_target, mr), mr)),
             ("n", pick_tile(axes["n"], max(nc_target, nr), nr)),
             ("k", pick_tile(axes["k"], CACHE_TILES["k"])))
    order = ("b", "n", "k", "m") if "b" in axes else ("n", "k", "m")
    return Schedule(KernelKind.CONTRACTION, tiles=tiles, order=order,
                    vector_axis=_axis(width, "n"), vector_width=width, parallel_axes=parallel,
                    unroll=(("k", 4),) if k >= 4 else (), pack=("B",), micro_tile=(mr, nr),
                    prefetch=_default_prefetch(m, n, k, dict(tiles)["m"], mr, nr))


def _default_prefetch(m: int, n: int, k: int, mc: int, mr: int,
                      nr: int) -> tuple[tuple[str, int], ...]:
    within = (("B", PREFETCH_B),) if _b_streams(m, k, mc) else ()
    return within + ((("B_next", 1),) if _next_panel_helps(m, n, k, mc, mr, nr) else ())


def _next_panel_helps(m: int, n: int, k: int, mc: int, mr: int, nr: int) -> bool:
    """Hints for the next B panel, into L2 while this panel's register tiles run: the first
    tile of a panel otherwise waits on it from L3 or memory (a model's weights are not in L2
    when its kernel starts). It needs several tiles per M block to spread the panel over (not
    a GEMV), more than one panel, and a K long enough that the hints are not most of the
    loads. Measured in-model, alternating builds in one process: BERT layer 1.05x and 1.07x,
    light ResNet-50 1.03x and 1.05x; alone, B warm from the last call: 512x768x3072 1.08x,
    128x768x3072 1.03x, 49x4608x512 1.06x, 128x768x768 and M <= 7 0.96-1.00x; ResNet's
    kernels with K < 256 (its first convolution 0.90x) lost."""
    return min(mc or m, m) // max(mr, 1) >= 4 and n > nr and k >= NEXT_PANEL_MIN_K
