"""ONNX Resize (opsets 10-19) and Upsample, as separable per-axis resampling.

Resampling is separable, so each resized axis is one step: every output position ``o`` reads
``n`` input positions ``idx[o, :]`` with weights ``coeff[o, :]`` (n = 1 or 2 for nearest, 2 for
linear, 4 for cubic, more with antialias), and the axis's step is
``Σ_k take(x, idx[:, k], axis) · coeff[:, k]``. Shapes are static at import, so the taps are
constants computed here in f64 with the operator's arithmetic (the coordinate transformation,
the neighbour choice with edge clamping, exclude_outside, the antialiased filters); a nearest
axis is a single ``take``. ``tf_crop_and_resize`` positions outside the input get
``extrapolation_value``.

Where the operator's text leaves room, tilefuse computes what onnx's reference implementation
(and so the backend test data) computes, which onnxruntime does not always: an output size from
a scale is ``floor(scale · size)`` in f64 (onnxruntime rounds the product in f32, so 0.45 · 20
gives 9 there and 8 here), and ``align_corners`` and ``half_pixel_symmetric`` use the fractional
output width ``scale · size`` (onnxruntime the integer one); the two agree whenever
``scale · size`` is a whole number.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from tilefuse.onnx.context import NodeContext, Tensor
from tilefuse.onnx.tensors import OnnxError

MAX_SIZE = 1 << 24
"""The largest output extent of one axis (a guard against a hostile scale or size)."""
MAX_TAPS = 1 << 26
"""The most weights one axis's taps may hold (antialiasing by a tiny scale widens the filter)."""
_MODES = ("nearest", "linear", "cubic")
_NEAREST = ("round_prefer_floor", "round_prefer_ceil", "floor", "ceil")
_COORDINATES = ("half_pixel", "half_pixel_symmetric", "pytorch_half_pixel", "align_corners",
                "asymmetric", "tf_crop_and_resize")


@dataclass(frozen=True)
class Sampling:
    """How one node samples: its attributes, validated."""

    mode: str
    coordinates: str
    nearest: str
    cubic_a: float
    exclude_outside: bool
    antialias: bool
    extrapolation: float


@dataclass(frozen=True)
class AxisTaps:
    """The taps of one axis: ``idx``/``coeff`` [out, n]; ``outside`` [out] or None."""

    idx: np.ndarray
    coeff: np.ndarray
    outside: np.ndarray | None


def _source_coordinates(s: Sampling, out: int, size: int, scale: float,
                        roi: tuple[float, float]) -> tuple[np.ndarray, np.ndarray | None]:
    y = np.arange(out, dtype=np.float64)
    width = scale * size
    outside = None
    if s.coordinates == "align_corners":  # over the fractional width, as onnx's reference
        x = np.zeros(out) if width == 1 else y * (size - 1) / (width - 1)
    elif s.coordinates == "asymmetric":
        x = y / scale
    elif s.coordinates == "tf_crop_and_resize":
        lo, hi = roi
        x = (np.full(out, (hi - lo) * (size - 1) / 2) if width == 1
             else y * (hi - lo) * (size - 1) / (width - 1))
        x = x + lo * (size - 1)
        outside = (x < 0) | (x > size - 1)
    elif s.coordinates == "pytorch_half_pixel":
        x = np.full(out, -0.5) if width == 1 else (y + 0.5) / scale - 0.5
    elif s.coordinates == "half_pixel":
        x = (y + 0.5) / scale - 0.5
    else:  # half_pixel_symmetric
        offset = size / 2 * (1 - out / width)
        x = offset + (y + 0.5) / scale - 0.5
    return x, outside


Coeffs = Callable[[np.ndarray, float], np.ndarray]
"""``coeffs(ratios [out], scale) -> [out, n]``: each output's weights of its n neighbours."""


def _nearest_coeffs(s: Sampling) -> Coeffs:
    def coeffs(r: np.ndarray, scale: float) -> np.ndarray:
        if s.nearest in ("floor", "ceil"):
            up = (r == 1.0) | (s.nearest == "ceil")
        else:  # a ratio of 1 is a whole source position: its own neighbour
            up = (r == 1.0) | ((r > 0.5) if s.nearest == "round_prefer_floor" else (r >= 0.5))
        return np.stack([~up, up], axis=-1).astype(np.float64)
    return coeffs


def _footprint(scale: float, reach: int, out: int) -> np.ndarray:
    """The neighbour offsets an antialiased filter of ``reach`` covers when downscaling."""
    start = math.floor(-reach / min(scale, 1.0)) + 1
    if (2 - 2 * start) * max(out, 1) > MAX_TAPS:
        raise OnnxError(f"an antialiased scale of {scale} needs more than {MAX_TAPS} taps")
    return np.arange(start, 2 - start)


def _linear_coeffs(s: Sampling) -> Coeffs:
    def coeffs(r: np.ndarray, scale: float) -> np.ndarray:
        if not s.antialias:
            return np.stack([1 - r, r], axis=-1)
        offsets = _footprint(scale, 1, len(r))
        w = np.clip(1 - np.abs((offsets[None, :] - r[:, None]) * min(scale, 1.0)), 0, 1)
        return w / w.sum(axis=-1, keepdims=True)
    return coeffs


def _cubic_kernel(x: np.ndarray, a: float) -> np.ndarray:
    x = np.abs(x)
    near = ((a + 2) * x - (a + 3)) * x * x + 1
    far = ((a * x - 5 * a) * x + 8 * a) * x - 4 * a
    return np.where(x <= 1, near, np.where(x < 2, far, 0.0))


def _cubic_coeffs(s: Sampling) -> Coeffs:
    def coeffs(r: np.ndarray, scale: float) -> np.ndarray:
        if not s.antialias:
            return _cubic_kernel(np.stack([r + 1, r, 1 - r, 2 - r], axis=-1), s.cubic_a)
        offsets = _footprint(scale, 2, len(r))
        w = _cubic_kernel(min(scale, 1.0) * (offsets[None, :] - r[:, None]), s.cubic_a)
        return w / w.sum(axis=-1, keepdims=True)
    return coeffs


_COEFFS = {"nearest": _nearest_coeffs, "linear": _linear_coeffs, "cubic": _cubic_coeffs}


def axis_taps(s: Sampling, size: int, out: int, scale: float,
              roi: tuple[float, float] = (0.0, 1.0)) -> AxisTaps:
    """The taps that resample an axis of ``size`` to ``out`` positions at ``scale``."""
    x, outside = _source_coordinates(s, out, size, scale, roi)
    floor = np.floor(x)
    ratios = np.where(x == floor, 1.0, x - floor)
    coeff = _COEFFS[s.mode](s)(ratios, scale)
    n = coeff.shape[1]
    pad = math.ceil(n / 2)
    padded = x + pad
    base = np.floor(padded)
    frac = padded - base
    if n % 2 == 0:
        shift = np.where(frac == 0, -(n // 2), -(n // 2) + 1)
    else:
        shift = np.where(frac <= 0.5, -((n - 1) // 2), -((n - 1) // 2) + 1)
    idx = (base + shift).astype(np.int64)[:, None] + np.arange(n)[None, :] - pad
    if s.exclude_outside:
        coeff = np.where((idx < 0) | (idx >= size), 0.0, coeff)
        total = coeff.sum(axis=-1, keepdims=True)
        coeff = coeff / np.where(total == 0, 1.0, total)
    return AxisTaps(np.clip(idx, 0, size - 1), coeff,
                    outside if outside is not None and outside.any() else None)


def _apply_taps(ctx: NodeContext, x: Tensor, axis: int, taps: AxisTaps,
                extrapolation: float) -> Tensor:
    shape = [1] * x.rank
    shape[axis] = taps.idx.shape[0]
    picks_one = (taps.coeff == 1.0) & ((taps.coeff != 0).sum(axis=1, keepdims=True) == 1)
    if picks_one.any(axis=1).all():  # nearest: each output copies one input
        chosen = taps.idx[np.arange(len(taps.idx)), picks_one.argmax(axis=1)]
        y = ctx.op("take", x, ctx.const(chosen), axis=axis)
    else:
        y = None
        for k in range(taps.idx.shape[1]):
            picked = ctx.op("take", x, ctx.const(taps.idx[:, k]), axis=axis)
            w = ctx.const(taps.coeff[:, k].reshape(shape).astype(x.dtype.np))
            term = ctx.op("mul", picked, w)
            y = term if y is None else ctx.op("add", y, term)
        assert y is not None
    if taps.outside is not None:
        y = ctx.op("where", ctx.const(taps.outside.reshape(shape)),
                   ctx.scalar(extrapolation, x.dtype), y)
    return y


def _sampling(ctx: NodeContext, opset: int) -> Sampling:
    mode = ctx.attr("mode", "nearest")
    default_coordinates = "asymmetric" if opset < 11 else "half_pixel"
    s = Sampling(mode, ctx.attr("coordinate_transformation_mode", default_coordinates),
                 ctx.attr("nearest_mode", "round_prefer_floor" if opset >= 11 else "floor"),
                 float(ctx.attr("cubic_coeff_a", -0.75)), bool(ctx.attr("exclude_outside", 0)),
                 bool(ctx.attr("antialias", 0)), float(ctx.attr("extrapolation_value", 0.0)))
    for value, allowed in ((s.mode, _MODES), (s.coordinates, _COORDINATES),
                           (s.nearest, _NEAREST)):
        if value not in allowed:
            raise ctx.error(f"{value!r} is not one of {', '.join(allowed)}")
    if s.antialias and s.mode == "nearest":
        raise ctx.error("antialias applies to linear and cubic modes only")
    return s


def _resize_with(ctx: NodeContext, s: Sampling, scales: np.ndarray | None,
                 sizes: np.ndarray | None, roi: np.ndarray | None) -> list[Tensor]:
    x = ctx.input(0)
    if not x.dtype.is_float and s.mode != "nearest":
        raise ctx.error(f"{s.mode} resizing of {x.dtype.value} tensors is not supported")
    axes = tuple(ctx.axis(a, x.rank) for a in ctx.attr("axes", range(x.rank)))
    out_scales, out_sizes = _targets(ctx, x.shape, axes, scales, sizes)
    lows, highs = _roi(ctx, roi, x.rank, axes)
    for axis in axes:
        trivial_roi = lows[axis] == 0.0 and highs[axis] == 1.0
        if out_sizes[axis] == x.shape[axis] and math.isclose(out_scales[axis], 1.0) \
                and trivial_roi:
            continue
        taps = axis_taps(s, x.shape[axis], out_sizes[axis], out_scales[axis],
                         (lows[axis], highs[axis]))
        x = _apply_taps(ctx, x, axis, taps, s.extrapolation)
    return [x]


def _targets(ctx: NodeContext, shape: tuple[int, ...], axes: tuple[int, ...],
             scales: np.ndarray | None, sizes: np.ndarray | None) -> tuple[list[float],
                                                                           list[int]]:
    """Per axis of the input: the scale and the output size."""
    rank = len(shape)
    given = scales if scales is not None and scales.size else sizes
    if given is None or given.size != len(axes):
        raise ctx.error(f"needs {len(axes)} scales or sizes (one per resized axis)")
    out_scales, out_sizes = [1.0] * rank, list(shape)
    extents = given if given is sizes else given * np.asarray([shape[a] for a in axes])
    if not np.all(np.isfinite(given)) or np.any(given <= 0) or any(shape[a] == 0 for a in axes) \
            or np.any(extents > MAX_SIZE):
        raise ctx.error(f"scales or sizes {given.tolist()} for {list(shape)} must be positive "
                        f"and give at most {MAX_SIZE} positions an axis")
    if given is scales:
        for a, v in zip(axes, scales):  # floor(scale · size) in f64, as onnx's reference
            out_scales[a] = float(v)
            out_sizes[a] = int(float(v) * shape[a])
        return out_scales, out_sizes
    for a, v in zip(axes, sizes):  # type: ignore[arg-type]
        out_scales[a], out_sizes[a] = int(v) / shape[a], int(v)
    policy = ctx.attr("keep_aspect_ratio_policy", "stretch")
    if policy != "stretch":
        pick = {"not_larger": min, "not_smaller": max}.get(policy)
        if pick is None:
            raise ctx.error(f"keep_aspect_ratio_policy {policy!r} is not stretch, not_larger "
                            "or not_smaller")
        scale = pick(out_scales[a] for a in axes)
        for a in axes:
            out_scales[a], out_sizes[a] = scale, int(scale * shape[a] + 0.5)
    return out_scales, out_sizes


def _roi(ctx: NodeContext, roi: np.ndarray | None, rank: int,
         axes: tuple[int, ...]) -> tuple[list[float], list[float]]:
    lows, highs = [0.0] * rank, [1.0] * rank
    if roi is None or roi.size == 0:
        return lows, highs
    if roi.size != 2 * len(axes):
        raise ctx.error(f"roi has {roi.size} values for {len(axes)} axes (needs starts, ends)")
    for i, a in enumerate(axes):
        lows[a], highs[a] = float(roi[i]), float(roi[len(axes) + i])
    return lows, highs


def _resize_10(ctx: NodeContext) -> list[Tensor]:
    return _resize_with(ctx, _sampling(ctx, 10), ctx.const_input(1, "scales"), None, None)


def _resize_11(ctx: NodeContext) -> list[Tensor]:
    roi = ctx.const_input(1, "roi")
    scales = ctx.const_input(2, "scales")
    sizes = ctx.const_input(3, "sizes")
    return _resize_with(ctx, _sampling(ctx, ctx.opset), scales, sizes, roi)


def _upsample(ctx: NodeContext) -> list[Tensor]:
    scales = ctx.const_input(1, "scales") if ctx.opset >= 9 else np.asarray(ctx.attr("scales"))
    return _resize_with(ctx, _sampling(ctx, 10), scales, None, None)


CONVERTERS = (
    ("Resize", 10, _resize_10), ("Resize", 11, _resize_11),
    ("Upsample", 7, _upsample),
)
