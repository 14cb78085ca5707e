"""Neural-network window ops on NCHW activations: conv2d (OIHW weights), max_pool2d, avg_pool2d.

Conventions shared by all three:

- ``padding`` is ``(top, left, bottom, right)``: rows added above and below, columns added left
  and right (so asymmetric padding, as ONNX's pads and TF's SAME padding need, is expressible).
- ``stride`` and ``dilation`` are ``(rows, columns)``.
- an output dim is ``floor((n + before + after - span) / stride) + 1`` with
  ``span = dilation·(kernel-1) + 1``; with ``ceil_mode`` the division rounds up, but a window that
  would start past the input and its leading padding is dropped (PyTorch's rule). Windows that
  hang over the end in ceil mode ignore the overhang (max) or leave it out of the divisor (avg).
- pooling pads with -inf (max) or zeros (avg); each padding entry must be at most half the
  window span, as in PyTorch, so that every window sees at least one input element.

References are vectorised: :func:`numpy.lib.stride_tricks.sliding_window_view` plus einsum or a
reduction, computed in f32 for f16/bf16 and rounded once.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from tilefuse.dtypes import FLOAT_TYPES, NUMERIC_TYPES, promote_all
from tilefuse.errors import AttrError, ShapeError
from tilefuse.graph.ir import Attrs
from tilefuse.graph.types import Dim, Shape, Sym, format_shape, static_dim
from tilefuse.ops import vjp
from tilefuse.ops.registry import AttrType, OpDef, OpKind, attr
from tilefuse.ops.rules import as_dtype, dtype_of, promoted, quiet, same_dtype, work_dtype

# ---- geometry --------------------------------------------------------------------------------


def window_out(dim: Dim, kernel: int, stride: int, dilation: int, before: int, after: int,
               ceil_mode: bool = False) -> Dim:
    """The number of window positions along one spatial axis (see the module docstring)."""
    if isinstance(dim, Sym) and kernel == stride == dilation == 1 and before == after == 0:
        return dim
    n = static_dim(dim, "a spatial dimension")
    span = dilation * (kernel - 1) + 1
    room = n + before + after - span
    if room < 0:
        raise ShapeError(f"the window (span {span}) is larger than the padded input "
                         f"({n + before + after})")
    if not ceil_mode:
        return room // stride + 1
    out = -(-room // stride) + 1
    return out - 1 if (out - 1) * stride >= n + before else out


def _check_geometry(attrs: Attrs, kernel: tuple[int, ...] | None = None) -> None:
    """Checks lengths and signs of stride / padding / dilation (and kernel) attributes."""
    lengths = {"stride": 2, "padding": 4, "dilation": 2, "kernel": 2}
    for name, want in lengths.items():
        value = attrs.get(name)
        if value is None:
            continue
        if len(value) != want:
            raise AttrError(f"attribute {name!r} needs {want} entries, got {list(value)}")
        if name == "padding" and min(value) < 0:
            raise AttrError(f"padding must be non-negative, got {list(value)}")
        if name != "padding" and min(value) < 1:
            raise AttrError(f"attribute {name!r} must be positive, got {list(value)}")


def _spatial_out(shape: Shape, kernel: tuple[int, int], attrs: Attrs,
                 ceil_mode: bool = False) -> tuple[Dim, Dim]:
    stride, (top, left, bottom, right) = attrs["stride"], attrs["padding"]
    dilation = attrs.get("dilation", (1, 1))
    return (window_out(shape[2], kernel[0], stride[0], dilation[0], top, bottom, ceil_mode),
            window_out(shape[3], kernel[1], stride[1], dilation[1], left, right, ceil_mode))


def _windows(xp: np.ndarray, kernel: tuple[int, int], stride: tuple[int, ...],
             dilation: tuple[int, ...], out_hw: tuple[int, int]) -> np.ndarray:
    """The view [N, C, Ho, Wo, kh, kw] of the windows of the (already padded) xp."""
    span = tuple(d * (k - 1) + 1 for k, d in zip(kernel, dilation))
    view = sliding_window_view(xp, span, axis=(2, 3))
    view = view[:, :, ::stride[0], ::stride[1], ::dilation[0], ::dilation[1]]
    return view[:, :, :out_hw[0], :out_hw[1]]


def _require_rank4(shape: Shape, what: str) -> None:
    if len(shape) != 4:
        raise ShapeError(f"{what} must be rank 4 (NCHW/OIHW), got {format_shape(shape)}")


# ---- conv2d ----------------------------------------------------------------------------------


def _conv2d_rule(shapes: tuple[Shape, ...], attrs: Attrs) -> tuple[Shape, ...]:
    if len(shapes) not in (2, 3):
        raise ShapeError(f"conv2d takes x, w and an optional bias, got {len(shapes)} inputs")
    _check_geometry(attrs)
    x, w = shapes[0], shapes[1]
    _require_rank4(x, "x")
    _require_rank4(w, "w")
    groups = attrs["groups"]
    if groups < 1:
        raise AttrError(f"groups must be positive, got {groups}")
    out_channels = w[0]
    if groups == 1:
        if x[1] != w[1]:
            raise ShapeError(f"x has {x[1]} channels but w expects {w[1]}")
    else:
        c = static_dim(x[1], "grouped conv channels")
        o = static_dim(out_channels, "grouped conv output channels")
        if c != static_dim(w[1], "grouped conv channels") * groups or o % groups:
            raise ShapeError(f"groups={groups} needs x channels = groups·w.shape[1] and output "
                             f"channels divisible by groups; got x {format_shape(x)}, "
                             f"w {format_shape(w)}")
    if len(shapes) == 3 and shapes[2] != (out_channels,):
        raise ShapeError(f"bias must have shape [{out_channels}], got {format_shape(shapes[2])}")
    kernel = (static_dim(w[2], "kernel height"), static_dim(w[3], "kernel width"))
    return ((x[0], out_channels, *_spatial_out(x, kernel, attrs)),)


def _conv2d_ref(x: np.ndarray, w: np.ndarray, bias: np.ndarray | None = None, *,
                stride: tuple[int, int], padding: tuple[int, ...], dilation: tuple[int, int],
                groups: int) -> np.ndarray:
    arrays = (x, w) if bias is None else (x, w, bias)
    out = promote_all(tuple(dtype_of(a) for a in arrays))
    work = work_dtype(out)
    top, left, bottom, right = padding
    xp = np.pad(x.astype(work), ((0, 0), (0, 0), (top, bottom), (left, right)))
    n, o, (cg, kh, kw) = x.shape[0], w.shape[0], w.shape[1:]
    attrs = {"stride": stride, "padding": padding, "dilation": dilation}
    out_hw = _spatial_out(x.shape, (kh, kw), attrs)  # type: ignore[arg-type]
    win = _windows(xp, (kh, kw), stride, dilation, out_hw)  # type: ignore[arg-type]
    win = win.reshape(n, groups, cg, *out_hw, kh, kw)
    wg = w.astype(work).reshape(groups, o // groups, cg, kh, kw)
    y = np.einsum("ngchwij,gocij->ngohw", win, wg, optimize=True).reshape(n, o, *out_hw)
    if bias is not None:
        y = y + bias.astype(work).reshape(1, o, 1, 1)
    return as_dtype(y, out)


_GEOMETRY = (attr("stride", AttrType.INTS, (1, 1)), attr("padding", AttrType.INTS, (0, 0, 0, 0)))

CONV2D = OpDef("conv2d", OpKind.CONTRACTION, None, _conv2d_rule, promoted, quiet(_conv2d_ref),
               attrs=(*_GEOMETRY, attr("dilation", AttrType.INTS, (1, 1)),
                      attr("groups", AttrType.INT, 1)),
               accepts=FLOAT_TYPES, vjp=vjp.conv2d_vjp,
               doc="2-D cross-correlation: x [N,C,H,W], w [O,C/groups,kH,kW], bias [O]; "
                   "padding is (top, left, bottom, right)")

# ---- pooling ---------------------------------------------------------------------------------


def _pool_rule(shapes: tuple[Shape, ...], attrs: Attrs) -> tuple[Shape, ...]:
    x = shapes[0]
    _require_rank4(x, "x")
    _check_geometry(attrs)
    kernel, (top, left, bottom, right) = attrs["kernel"], attrs["padding"]
    dilation = attrs.get("dilation", (1, 1))
    spans = [d * (k - 1) + 1 for k, d in zip(kernel, dilation)]
    if max(top, bottom) > spans[0] // 2 or max(left, right) > spans[1] // 2:
        raise ShapeError(f"padding {list(attrs['padding'])} exceeds half the window "
                         f"{spans}")
    return ((x[0], x[1], *_spatial_out(x, kernel, attrs, attrs["ceil_mode"])),)


def _pool_windows(x: np.ndarray, fill: Any, attrs: dict[str, Any], out_hw: tuple[int, int],
                  padding: tuple[int, ...]) -> np.ndarray:
    """Windows [N, C, Ho, Wo, kh, kw] of x padded by ``padding`` and, past the bottom/right, by
    whatever the ceil-mode overhang needs, all with ``fill``."""
    kernel, stride = attrs["kernel"], attrs["stride"]
    dilation = attrs.get("dilation", (1, 1))
    top, left, bottom, right = padding
    extra = [max(0, (o - 1) * s + d * (k - 1) + 1 - (n + p))
             for o, s, d, k, n, p in zip(out_hw, stride, dilation, kernel, x.shape[2:],
                                         (top + bottom, left + right))]
    widths = ((0, 0), (0, 0), (top, bottom + extra[0]), (left, right + extra[1]))
    xp = np.pad(x, widths, constant_values=fill)
    return _windows(xp, kernel, stride, dilation, out_hw)


def _pool_out(x: np.ndarray, attrs: dict[str, Any]) -> tuple[int, int]:
    return _spatial_out(x.shape, attrs["kernel"], attrs, attrs["ceil_mode"])  # type: ignore


def _max_pool_ref(x: np.ndarray, **attrs: Any) -> np.ndarray:
    wide = x.astype(work_dtype(dtype_of(x)))
    fill = -np.inf if wide.dtype.kind == "f" else np.iinfo(wide.dtype).min
    windows = _pool_windows(wide, fill, attrs, _pool_out(x, attrs), attrs["padding"])
    return as_dtype(windows.max(axis=(-2, -1)), dtype_of(x))


def _avg_pool_ref(x: np.ndarray, **attrs: Any) -> np.ndarray:
    wide = x.astype(work_dtype(dtype_of(x)))
    out_hw = _pool_out(x, attrs)
    sums = _pool_windows(wide, 0, attrs, out_hw, attrs["padding"]).sum(axis=(-2, -1))
    # The divisor: window sums of a mask that is 1 on the input, 1 or 0 on the padding (per
    # count_include_pad) and 0 on the ceil-mode overhang.
    top, left, bottom, right = attrs["padding"]
    pad_value = 1 if attrs["count_include_pad"] else 0
    mask = np.pad(np.ones((1, 1, *x.shape[2:]), dtype=wide.dtype),
                  ((0, 0), (0, 0), (top, bottom), (left, right)), constant_values=pad_value)
    counts = _pool_windows(mask, 0, attrs, out_hw, (0, 0, 0, 0)).sum(axis=(-2, -1))
    return as_dtype(sums / counts, dtype_of(x))


_POOL_COMMON = (attr("kernel", AttrType.INTS), attr("stride", AttrType.INTS),
                attr("padding", AttrType.INTS, (0, 0, 0, 0)))

MAX_POOL2D = OpDef("max_pool2d", OpKind.REDUCTION, 1, _pool_rule, same_dtype, quiet(_max_pool_ref),
                   attrs=(*_POOL_COMMON, attr("dilation", AttrType.INTS, (1, 1)),
                          attr("ceil_mode", AttrType.BOOL, False)),
                   accepts=NUMERIC_TYPES, vjp=vjp.max_pool2d_vjp,
                   doc="maximum over each window (NaN-propagating); padding is -inf")
AVG_POOL2D = OpDef("avg_pool2d", OpKind.REDUCTION, 1, _pool_rule, same_dtype, quiet(_avg_pool_ref),
                   attrs=(*_POOL_COMMON, attr("count_include_pad", AttrType.BOOL, True),
                          attr("ceil_mode", AttrType.BOOL, False)),
                   accepts=FLOAT_TYPES, vjp=vjp.avg_pool2d_vjp,
                   doc="mean over each window; count_include_pad counts the zero padding in "
                       "the divisor (never the ceil-mode overhang)")

DEFINITIONS: tuple[OpDef, ...] = (CONV2D, MAX_POOL2D, AVG_POOL2D)
