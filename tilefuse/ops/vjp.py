"""Reverse-mode rules of the movement, gather, convolution, pooling, einsum and softmax ops.

The short rules live next to their ops; these are the longer ones, kept here so that the op
modules stay about shapes and references. Each rule has the ``vjp(d, inputs, out, g, **attrs)``
signature of :class:`~tilefuse.ops.registry.OpDef` and builds graph IR through the
:class:`~tilefuse.graph.autodiff.GradEmitter` ``d``, by op name, so this module imports no op
module. Scatter-adds (the gradients of gathers) are one-hot products: ``eq(index, arange)``
times the gradient, summed, which the fusion turns into a matmul or a reduction. A case a rule
does not cover (overlapping pooling windows, grouped convolutions, reflect padding) is a
:class:`GradientError` naming it, never a wrong gradient.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from tilefuse.dtypes import DType
from tilefuse.errors import GradientError
from tilefuse.graph.types import normalize_axis, static_dim

_HUGE = 2**62


def _dims(v: Any, what: str) -> tuple[int, ...]:
    return tuple(static_dim(n, what) for n in v.type.shape)


def _place(d: Any, g: Any, axis: int, n: int, first: int, count: int, step: int) -> Any:
    """``g`` (``count`` long on ``axis``) written at ``first, first+step, ...`` of a zero axis
    of length ``n`` (``step`` > 0): dilation by padding a new axis, then edge padding."""
    rank = g.type.rank
    if count == 0:
        shape = list(g.type.shape)
        shape[axis] = n
        return d.op("broadcast_to", d.scalar(0, g), shape=tuple(shape))
    if step > 1:
        wide = d.op("expand_dims", g, axes=(axis + 1,))
        pads = [0] * (2 * (rank + 1))
        pads[2 * (axis + 1) + 1] = step - 1
        wide = d.op("pad", wide, pads=tuple(pads))
        shape = list(g.type.shape)
        shape[axis] = count * step
        g = d.op("reshape", wide, shape=tuple(shape))
        starts, stops, steps = [0] * rank, [_HUGE] * rank, [1] * rank
        stops[axis] = (count - 1) * step + 1
        g = d.op("slice", g, starts=tuple(starts), stops=tuple(stops), steps=tuple(steps))
    span = (count - 1) * step + 1
    pads = [0] * (2 * rank)
    pads[2 * axis], pads[2 * axis + 1] = first, n - first - span
    return d.op("pad", g, pads=tuple(pads)) if first or n - first - span else g


def _reverse(d: Any, g: Any, axis: int) -> Any:
    rank = g.type.rank
    starts, stops, steps = [0] * rank, [_HUGE] * rank, [1] * rank
    starts[axis], stops[axis], steps[axis] = -1, -_HUGE, -1
    return d.op("slice", g, starts=tuple(starts), stops=tuple(stops), steps=tuple(steps))


def slice_vjp(d: Any, ins: Any, out: Any, g: Any, starts: Any, stops: Any, steps: Any
              ) -> tuple[Any, ...]:
    x = ins[0]
    for axis, n in enumerate(_dims(x, "a sliced dimension")):
        picked = range(n)[slice(starts[axis], stops[axis], steps[axis])]
        if len(picked) == n and picked.step == 1:
            continue
        if picked.step < 0:
            g = _reverse(d, g, axis)
            picked = picked[::-1]
        g = _place(d, g, axis, n, picked.start if len(picked) else 0, len(picked), picked.step)
    return (g,)


def _cut(d: Any, g: Any, axis: int, sizes: list[int]) -> tuple[Any, ...]:
    if len(sizes) == 1:
        return (g,)
    return tuple(d.builder.add("split", [g], {"axis": axis, "sizes": tuple(sizes)}, d.loc))


def concat_vjp(d: Any, ins: Any, out: Any, g: Any, axis: int) -> tuple[Any, ...]:
    axis = normalize_axis(axis, out.type.rank)
    sizes = [static_dim(v.type.shape[axis], "a concatenated dimension") for v in ins]
    return _cut(d, g, axis, sizes)


def stack_vjp(d: Any, ins: Any, out: Any, g: Any, axis: int) -> tuple[Any, ...]:
    axis = normalize_axis(axis, out.type.rank)
    pieces = _cut(d, g, axis, [1] * len(ins))
    return tuple(d.op("squeeze", p, axes=(axis,)) for p in pieces)


def split_vjp(d: Any, ins: Any, outs: Any, grads: Any, axis: int, sizes: Any
              ) -> tuple[Any, ...]:
    if not isinstance(outs, tuple):  # one piece: the whole input
        return (grads,)
    return (d.op("concat", *grads, axis=axis),)


def pad_vjp(d: Any, ins: Any, out: Any, g: Any, pads: Any, mode: str, value: float
            ) -> tuple[Any, ...]:
    if mode != "constant":
        raise GradientError(f"the gradient of {mode} padding is not supported (constant "
                            "padding is)")
    x = ins[0]
    rank = x.type.rank
    dims = _dims(x, "a padded dimension")
    starts = tuple(pads[2 * i] for i in range(rank))
    stops = tuple(pads[2 * i] + dims[i] for i in range(rank))
    return (d.op("slice", g, starts=starts, stops=stops, steps=(1,) * rank),)


def _one_hot(d: Any, index: Any, n: int, like: Any) -> Any:
    """``index[..., None] == arange(n)`` in ``like``'s dtype, negative indices wrapped."""
    idx = d.op("cast", index, dtype=DType.i64)
    zero = d.op("full", shape=(), value=0, dtype=DType.i64)
    wrapped = d.op("add", idx, d.op("full", shape=(), value=n, dtype=DType.i64))
    idx = d.op("where", d.op("lt", idx, zero), wrapped, idx)
    hit = d.op("eq", d.op("expand_dims", idx, axes=(-1,)),
               d.op("arange", start=0, stop=n, step=1, dtype=DType.i64))
    return d.op("cast", hit, dtype=like.type.dtype)


def take_vjp(d: Any, ins: Any, out: Any, g: Any, axis: int) -> tuple[Any, ...]:
    """grad_x[pre, j, post] = Σ_I onehot[I, j] · g[pre, I, post]: one matmul."""
    x, index = ins
    dims = _dims(x, "a gathered-from dimension")
    axis = normalize_axis(axis, len(dims))
    n = dims[axis]
    pre = int(np.prod(dims[:axis], dtype=np.int64))
    post = int(np.prod(dims[axis + 1:], dtype=np.int64))
    count = int(np.prod(_dims(index, "an index dimension"), dtype=np.int64))
    hot = d.op("reshape", _one_hot(d, index, n, g), shape=(count, n))
    g3 = d.op("reshape", g, shape=(pre, count, post))
    scattered = d.op("matmul", d.op("transpose", g3, perm=(0, 2, 1)), hot)   # [pre, post, n]
    grad = d.op("transpose", scattered, perm=(0, 2, 1))
    return d.op("reshape", grad, shape=x.type.shape), None


def take_along_axis_vjp(d: Any, ins: Any, out: Any, g: Any, axis: int) -> tuple[Any, ...]:
    """grad_x[..., j, ...] = Σ_i g[..., i, ...] · (index[..., i, ...] == j)."""
    x, index = ins
    rank = x.type.rank
    axis = normalize_axis(axis, rank)
    n = static_dim(x.type.shape[axis], "a gathered-from dimension")
    hot = _one_hot(d, index, n, g)                               # [..., I, ..., n]
    last = list(range(rank + 1))
    perm = (*last[:axis + 1], rank, *last[axis + 1:rank])        # n right after I
    hot = d.op("transpose", hot, perm=perm)                      # [..., I, n, ...]
    spread = d.op("mul", hot, d.op("expand_dims", g, axes=(axis + 1,)))
    grad = d.op("sum", spread, axes=(axis,), keepdims=False)     # [..., n, ...]
    return d.sum_to(grad, x), None


def softmax_vjp(d: Any, ins: Any, out: Any, g: Any, axis: int) -> tuple[Any, ...]:
    """y·(g - Σ g·y)."""
    dot = d.op("sum", d.op("mul", g, out), axes=(axis,), keepdims=True)
    return (d.op("mul", out, d.op("sub", g, dot)),)


def log_softmax_vjp(d: Any, ins: Any, out: Any, g: Any, axis: int) -> tuple[Any, ...]:
    """g - exp(y)·Σ g."""
    total = d.op("sum", g, axes=(axis,), keepdims=True)
    return (d.op("sub", g, d.op("mul", d.op("exp", out), total)),)


# ---- convolution and pooling -----------------------------------------------------------------


def _dilate_spatial(d: Any, g: Any, stride: tuple[int, int], extent: tuple[int, int]) -> Any:
    """g [N, O, Ho, Wo] with stride-1 zeros between elements, padded at the end to
    ``extent`` (the rows and columns a strided window never reached)."""
    for axis, s, size in ((2, stride[0], extent[0]), (3, stride[1], extent[1])):
        count = static_dim(g.type.shape[axis], "a convolution output dimension")
        g = _place(d, g, axis, size, 0, count, s)
    return g


def conv2d_vjp(d: Any, ins: Any, out: Any, g: Any, stride: Any, padding: Any, dilation: Any,
               groups: int) -> tuple[Any, ...]:
    """dx: a stride-1 convolution of the dilated, padded g with the flipped, transposed
    kernel; dw: the im2col patches of x contracted with g; dbias: g summed."""
    if groups != 1:
        raise GradientError(f"the gradient of a grouped convolution (groups={groups}) is not "
                            "supported")
    x, w = ins[0], ins[1]
    n, c, h, wd = _dims(x, "a convolution input dimension")
    o, _, kh, kw = _dims(w, "a kernel dimension")
    top, left, bottom, right = padding
    (sh, sw), (dh, dw) = stride, dilation
    ho, wo = _dims(out, "a convolution output dimension")[2:]
    # dx: positions of the padded input the windows covered, then a full correlation
    extent = (h + top + bottom - dh * (kh - 1), wd + left + right - dw * (kw - 1))
    gd = _dilate_spatial(d, g, (sh, sw), extent)
    span_h, span_w = dh * (kh - 1), dw * (kw - 1)
    gd = d.op("pad", gd, pads=(0, 0, 0, 0, span_h, span_h, span_w, span_w))
    flipped = _reverse(d, _reverse(d, w, 2), 3)
    wt = d.op("transpose", flipped, perm=(1, 0, 2, 3))           # [C, O, kh, kw]
    full = d.op("conv2d", gd, wt, stride=(1, 1), padding=(0, 0, 0, 0), dilation=(dh, dw),
                groups=1)                                        # the padded input's shape
    hp, wp = h + top + bottom, wd + left + right
    gx = d.op("slice", full, starts=(0, 0, top, left), stops=(n, c, top + h, left + wd),
              steps=(1, 1, 1, 1)) if (hp, wp) != (h, wd) else full
    # dw: patches of the padded input in NHWC, [N·Ho·Wo, kh·kw·C], against g as [O, N·Ho·Wo]
    xh = d.op("transpose", x, perm=(0, 2, 3, 1))
    xh = d.op("pad", xh, pads=(0, 0, top, bottom, left, right, 0, 0))
    patches = d.op("window_patches", xh, kernel=(kh, kw), strides=(sh, sw),
                   dilations=(dh, dw))                           # [N, Ho, Wo, kh, kw, C]
    patches = d.op("reshape", patches, shape=(n * ho * wo, kh * kw * c))
    g2 = d.op("reshape", d.op("transpose", g, perm=(1, 0, 2, 3)), shape=(o, n * ho * wo))
    gw = d.op("reshape", d.op("matmul", g2, patches), shape=(o, kh, kw, c))
    gw = d.op("transpose", gw, perm=(0, 3, 1, 2))
    grads = [gx, gw]
    if len(ins) == 3:
        grads.append(d.op("sum", g, axes=(0, 2, 3), keepdims=False))
    return tuple(grads)


def _tiles(x: Any, kernel: Any, stride: Any, padding: Any, attrs: dict[str, Any]) -> bool:
    """Whether the pooling windows tile x exactly (stride = kernel, no padding, no dilation,
    no overhang): then the gradient is a reshape, no scatter."""
    h, w = _dims(x, "a pooled dimension")[2:]
    return (tuple(stride) == tuple(kernel) and not any(padding)
            and tuple(attrs.get("dilation", (1, 1))) == (1, 1)
            and h % kernel[0] == 0 and w % kernel[1] == 0)


def _windows(d: Any, v: Any, kernel: Any) -> Any:
    """[N, C, H, W] as [N, C, Ho, kh, Wo, kw]."""
    n, c, h, w = _dims(v, "a pooled dimension")
    return d.op("reshape", v, shape=(n, c, h // kernel[0], kernel[0], w // kernel[1], kernel[1]))


def _unpool(d: Any, x: Any, per_window: Any) -> Any:
    """[N, C, Ho, Wo] spread over each window: [N, C, Ho, kh, Wo, kw] by broadcasting."""
    return d.op("expand_dims", per_window, axes=(3, 5))


def _check_tiles(x: Any, kernel: Any, stride: Any, padding: Any, attrs: dict[str, Any],
                 name: str) -> None:
    if not _tiles(x, kernel, stride, padding, attrs):
        raise GradientError(f"the gradient of {name} is supported when the windows tile the "
                            f"input (stride = kernel, no padding or dilation); got kernel "
                            f"{list(kernel)}, stride {list(stride)}, padding {list(padding)}")


def max_pool2d_vjp(d: Any, ins: Any, out: Any, g: Any, kernel: Any, stride: Any, padding: Any,
                   **attrs: Any) -> tuple[Any, ...]:
    """Each window's gradient to its maximum (shared equally on ties)."""
    x = ins[0]
    _check_tiles(x, kernel, stride, padding, attrs, "max_pool2d")
    win = _windows(d, x, kernel)
    shape = win.type.shape
    hit = d.op("eq", win, d.op("broadcast_to", _unpool(d, x, out), shape=shape))
    ones = d.op("cast", hit, dtype=g.type.dtype)
    count = d.op("sum", ones, axes=(3, 5), keepdims=True)
    share = d.op("div", d.op("broadcast_to", _unpool(d, x, g), shape=shape),
                 d.op("broadcast_to", count, shape=shape))
    return (d.op("reshape", d.select(hit, share), shape=x.type.shape),)


def avg_pool2d_vjp(d: Any, ins: Any, out: Any, g: Any, kernel: Any, stride: Any, padding: Any,
                   **attrs: Any) -> tuple[Any, ...]:
    x = ins[0]
    _check_tiles(x, kernel, stride, padding, attrs, "avg_pool2d")
    shape = _windows(d, x, kernel).type.shape
    spread = d.op("broadcast_to", _unpool(d, x, g), shape=shape)
    scaled = d.op("div", spread, d.scalar(kernel[0] * kernel[1], g))
    return (d.op("reshape", scaled, shape=x.type.shape),)


# ---- einsum ----------------------------------------------------------------------------------


def einsum_vjp(d: Any, ins: Any, out: Any, g: Any, equation: str) -> tuple[Any, ...]:
    """Operand k's gradient: einsum of g with the other operands onto k's labels; labels only
    k holds (summed in the forward) are broadcast back."""
    from tilefuse.ops.contraction import parse_einsum

    spec = parse_einsum(equation, tuple(v.type.rank for v in ins))
    labels = sorted({lab for term in (*spec.inputs, spec.output) for lab in term})
    letter = {lab: chr(ord("a") + i) if i < 26 else chr(ord("A") + i - 26)
              for i, lab in enumerate(labels)}

    def term(labs: Any) -> str:
        return "".join(letter[lab] for lab in labs)

    grads = []
    for k, own in enumerate(spec.inputs):
        if len(set(own)) != len(own):
            raise GradientError(f"the gradient of einsum {equation!r} with a repeated label "
                                "in one operand is not supported")
        others = [(term(spec.inputs[j]), ins[j]) for j in range(len(ins)) if j != k]
        present = set(spec.output) | {lab for j, t in enumerate(spec.inputs) if j != k
                                      for lab in t}
        kept = [lab for lab in own if lab in present]
        eq = ",".join([term(spec.output), *(t for t, _ in others)]) + "->" + term(kept)
        grad = d.op("einsum", g, *(v for _, v in others), equation=eq)
        if len(kept) != len(own):
            axes = tuple(i for i, lab in enumerate(own) if lab not in present)
            grad = d.op("broadcast_to", d.op("expand_dims", grad, axes=axes),
                        shape=ins[k].type.shape)
        grads.append(d.sum_to(grad, ins[k]) if grad.type.shape != ins[k].type.shape
                     else grad)
    return tuple(grads)
