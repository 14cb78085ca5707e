"""ONNX's recurrent layers RNN, GRU and LSTM, unrolled over the (static) sequence.

Per direction, the input projection of every time step is one matmul
(``X · Wᵀ + Wb`` over ``[seq, batch, gates·H]``); each step then adds ``H · Rᵀ + Rb`` and
applies the cell. The step order is reversed for the backward direction. With
``sequence_lens``, step ``t`` of batch row ``b`` counts only while ``t < len[b]``: the state
is held and the output is zero after the end, which (processing ``t`` from the last step down)
also starts a reversed sequence at its own last element. Activations, ``clip``, peepholes,
``input_forget``, ``linear_before_reset`` and both layouts follow the operators' equations.
Sequences longer than :data:`MAX_STEPS` are refused (the graph grows with every step).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from tilefuse.dtypes import DType
from tilefuse.onnx.context import NodeContext, Tensor

MAX_STEPS = 1024
Act = Callable[[Tensor], Tensor]


# ---- activations -----------------------------------------------------------------------------


def _activation(ctx: NodeContext, name: str, alpha: float | None, beta: float | None) -> Act:
    def k(v: float) -> Tensor:
        return ctx.scalar(v, DType.f32)

    def affine(x: Tensor, a: float, b: float) -> Tensor:
        return ctx.op("add", ctx.op("mul", x, ctx.cast(k(a), x.dtype)), ctx.cast(k(b), x.dtype))

    table: dict[str, tuple[Callable[..., Tensor], tuple[float, ...]]] = {
        "sigmoid": (lambda x: ctx.op("sigmoid", x), ()),
        "tanh": (lambda x: ctx.op("tanh", x), ()),
        "relu": (lambda x: ctx.op("relu", x), ()),
        "softsign": (lambda x: ctx.op("div", x, ctx.op("add", ctx.op("abs", x),
                                                       ctx.cast(k(1), x.dtype))), ()),
        "softplus": (lambda x: ctx.op("softplus", x), ()),
        "affine": (affine, (1.0, 0.0)),
        "leakyrelu": (lambda x, a: ctx.op("where", ctx.op("lt", x, ctx.cast(k(0), x.dtype)),
                                          ctx.op("mul", x, ctx.cast(k(a), x.dtype)), x),
                      (0.01,)),
        "thresholdedrelu": (lambda x, a: ctx.op("where", ctx.op("gt", x, ctx.cast(k(a), x.dtype)),
                                                x, ctx.cast(k(0), x.dtype)), (1.0,)),
        "scaledtanh": (lambda x, a, b: ctx.op("mul", ctx.op("tanh", affine(x, b, 0.0)),
                                              ctx.cast(k(a), x.dtype)), (1.0, 1.0)),
        "hardsigmoid": (lambda x, a, b: ctx.op("clip", affine(x, a, b), min=0.0, max=1.0),
                        (0.2, 0.5)),
        "elu": (lambda x, a: ctx.op("where", ctx.op("gt", x, ctx.cast(k(0), x.dtype)), x,
                                    ctx.op("mul", ctx.op("expm1", x), ctx.cast(k(a), x.dtype))),
                (1.0,)),
    }
    entry = table.get(name.lower())
    if entry is None:
        raise ctx.error(f"activation {name!r} is not one of {', '.join(sorted(table))}")
    fn, defaults = entry
    given = [alpha, beta][:len(defaults)]
    params = [d if g is None else g for g, d in zip(given, defaults)]
    return lambda x: fn(x, *params)


def _activations(ctx: NodeContext, defaults: tuple[str, ...], directions: int) -> list[list[Act]]:
    """Per direction, the layer's activation functions (with their alpha/beta in order)."""
    names = list(ctx.attr("activations") or defaults * directions)
    if len(names) != len(defaults) * directions:
        raise ctx.error(f"needs {len(defaults) * directions} activations, got {len(names)}")
    alphas = list(ctx.attr("activation_alpha") or [])
    betas = list(ctx.attr("activation_beta") or [])
    acts = []
    for name in names:
        takes = {"affine": 2, "scaledtanh": 2, "hardsigmoid": 2, "leakyrelu": 1,
                 "thresholdedrelu": 1, "elu": 1}.get(name.lower(), 0)
        alpha = alphas.pop(0) if takes >= 1 and alphas else None
        beta = betas.pop(0) if takes == 2 and betas else None
        acts.append(_activation(ctx, name, alpha, beta))
    n = len(defaults)
    return [acts[d * n:(d + 1) * n] for d in range(directions)]


# ---- the unrolled layer ----------------------------------------------------------------------


@dataclass
class Step:
    """What a cell gets at one time step: the input projection ``xw`` [batch, gates·H], the
    state, and its direction's recurrence weight ``r`` [gates·H, H] and bias ``rb`` (None
    without B), taken from R and B once a direction; it returns the new ``h`` (and ``c``)."""

    xw: Tensor
    h: Tensor
    c: Tensor | None
    r: Tensor
    rb: Tensor | None


Cell = Callable[[NodeContext, Step, int], tuple[Tensor, Tensor | None]]


def _pick(ctx: NodeContext, t: Tensor, axis: int, index: int) -> Tensor:
    """``t[index]`` along ``axis``, the axis removed."""
    return ctx.op("squeeze", ctx.slice_axis(t, axis, index, index + 1), axes=(axis,))


def gate(ctx: NodeContext, t: Tensor, index: int, hidden: int) -> Tensor:
    """Gate ``index`` of a [..., gates·H] tensor (weights, biases, products)."""
    return ctx.slice_axis(t, -1, index * hidden, (index + 1) * hidden)


def clipped(ctx: NodeContext, t: Tensor) -> Tensor:
    limit = ctx.attr("clip")
    return t if limit is None else ctx.op("clip", t, min=-float(limit), max=float(limit))


def _matmul_t(ctx: NodeContext, a: Tensor, w: Tensor) -> Tensor:
    return ctx.op("matmul", a, ctx.op("transpose", w, perm=(1, 0)))


def run_layer(ctx: NodeContext, gates: int, cell: Cell, with_cell_state: bool) -> list[Tensor]:
    x, w, r = ctx.input(0), ctx.input(1), ctx.input(2)
    layout = int(ctx.attr("layout", 0))
    if x.rank != 3:
        raise ctx.error(f"X must be 3-D, got {list(x.shape)}")
    if layout:
        x = ctx.op("transpose", x, perm=(1, 0, 2))
    seq, batch = x.shape[0], x.shape[1]
    directions, hidden = w.shape[0], r.shape[-1]
    direction = ctx.attr("direction", "forward")
    if (direction == "bidirectional") != (directions == 2) or direction not in (
            "forward", "reverse", "bidirectional"):
        raise ctx.error(f"direction {direction!r} does not fit W's {directions} directions")
    if seq > MAX_STEPS:
        raise ctx.error(f"a sequence of {seq} steps is longer than the {MAX_STEPS} that "
                        "tilefuse unrolls")
    bias = ctx.optional(3)
    lens = ctx.optional(4)
    keep = None if lens is None else ctx.op(
        "lt", ctx.const(np.arange(seq, dtype=np.int64).reshape(seq, 1, 1)),
        ctx.op("reshape", ctx.cast(lens, DType.i64), shape=(1, batch, 1)))   # [seq, batch, 1]
    states = [ctx.optional(5), ctx.optional(6) if with_cell_state else None]
    if layout:
        states = [None if s is None else ctx.op("transpose", s, perm=(1, 0, 2)) for s in states]
    ys, hs, cs = [], [], []
    for d in range(directions):
        rd = _pick(ctx, r, 0, d)
        bd = None if bias is None else _pick(ctx, bias, 0, d)
        rb = None if bd is None else ctx.slice_axis(bd, 0, gates * hidden, 2 * gates * hidden)
        xw = _matmul_t(ctx, x, _pick(ctx, w, 0, d))
        if bd is not None:
            xw = ctx.op("add", xw, ctx.slice_axis(bd, 0, 0, gates * hidden))
        zeros = ctx.const(np.zeros((batch, hidden), dtype=x.dtype.np))
        h = zeros if states[0] is None else _pick(ctx, states[0], 0, d)
        c = None if not with_cell_state else (zeros if states[1] is None
                                              else _pick(ctx, states[1], 0, d))
        reverse = direction == "reverse" or d == 1
        outs: list[Tensor | None] = [None] * seq
        for t in (reversed(range(seq)) if reverse else range(seq)):
            new_h, new_c = cell(ctx, Step(_pick(ctx, xw, 0, t), h, c, rd, rb), d)
            if keep is not None:
                k = _pick(ctx, keep, 0, t)
                new_h = ctx.op("where", k, new_h, h)
                new_c = None if new_c is None else ctx.op("where", k, new_c, c)
                outs[t] = ctx.op("where", k, new_h, zeros)
            else:
                outs[t] = new_h
            h, c = new_h, new_c
        ys.append(ctx.op("stack", *outs, axis=0))   # [seq, batch, H]
        hs.append(h)
        cs.append(c)
    y = ctx.op("stack", *ys, axis=1)                # [seq, dirs, batch, H]
    y_h = ctx.op("stack", *hs, axis=0)              # [dirs, batch, H]
    results = [y, y_h]
    if with_cell_state:
        results.append(ctx.op("stack", *cs, axis=0))
    if layout:
        results = [ctx.op("transpose", results[0], perm=(2, 0, 1, 3)),
                   *(ctx.op("transpose", s, perm=(1, 0, 2)) for s in results[1:])]
    return results


def hidden_product(ctx: NodeContext, step: Step) -> Tensor:
    """``xw + H · Rᵀ + Rb`` for all gates."""
    pre = ctx.op("add", step.xw, _matmul_t(ctx, step.h, step.r))
    return pre if step.rb is None else ctx.op("add", pre, step.rb)


# ---- the cells -------------------------------------------------------------------------------


def _directions(ctx: NodeContext) -> int:
    return ctx.input(1).shape[0]


def _rnn(ctx: NodeContext) -> list[Tensor]:
    acts = _activations(ctx, ("Tanh",), _directions(ctx))

    def cell(ctx: NodeContext, step: Step, d: int) -> tuple[Tensor, Tensor | None]:
        return acts[d][0](clipped(ctx, hidden_product(ctx, step))), None

    return run_layer(ctx, 1, cell, with_cell_state=False)


def _gru(ctx: NodeContext) -> list[Tensor]:
    acts = _activations(ctx, ("Sigmoid", "Tanh"), _directions(ctx))
    linear_before_reset = bool(ctx.attr("linear_before_reset", 0))

    def cell(ctx: NodeContext, step: Step, d: int) -> tuple[Tensor, Tensor | None]:
        f, g = acts[d]
        n = step.h.shape[-1]
        hr = _matmul_t(ctx, step.h, step.r)                      # [batch, 3H]
        if step.rb is not None:
            hr = ctx.op("add", hr, step.rb)
        z, r = (f(clipped(ctx, ctx.op("add", gate(ctx, step.xw, k, n), gate(ctx, hr, k, n))))
                for k in (0, 1))
        if linear_before_reset:
            recur = ctx.op("mul", r, gate(ctx, hr, 2, n))
        else:
            w_h = ctx.slice_axis(step.r, 0, 2 * n, 3 * n)
            recur = _matmul_t(ctx, ctx.op("mul", r, step.h), w_h)
            if step.rb is not None:
                recur = ctx.op("add", recur, gate(ctx, step.rb, 2, n))
        candidate = g(clipped(ctx, ctx.op("add", gate(ctx, step.xw, 2, n), recur)))
        one = ctx.scalar(1, step.h.dtype)
        new = ctx.op("add", ctx.op("mul", ctx.op("sub", one, z), candidate),
                     ctx.op("mul", z, step.h))
        return new, None

    return run_layer(ctx, 3, cell, with_cell_state=False)


def _lstm(ctx: NodeContext) -> list[Tensor]:
    acts = _activations(ctx, ("Sigmoid", "Tanh", "Tanh"), _directions(ctx))
    peepholes = ctx.optional(7)
    input_forget = bool(ctx.attr("input_forget", 0))

    def cell(ctx: NodeContext, step: Step, d: int) -> tuple[Tensor, Tensor | None]:
        f, g, h = acts[d]
        n = step.h.shape[-1]
        assert step.c is not None
        pre = hidden_product(ctx, step)
        i_in, o_in, f_in, c_in = (gate(ctx, pre, k, n) for k in range(4))
        if peepholes is not None:
            p = _pick(ctx, peepholes, 0, d)
            p_i, p_o, p_f = (gate(ctx, p, k, n) for k in range(3))
            i_in = ctx.op("add", i_in, ctx.op("mul", p_i, step.c))
            f_in = ctx.op("add", f_in, ctx.op("mul", p_f, step.c))
        i = f(clipped(ctx, i_in))
        forget = (ctx.op("sub", ctx.scalar(1, i.dtype), i) if input_forget
                  else f(clipped(ctx, f_in)))
        c = ctx.op("add", ctx.op("mul", forget, step.c),
                   ctx.op("mul", i, g(clipped(ctx, c_in))))
        if peepholes is not None:
            o_in = ctx.op("add", o_in, ctx.op("mul", p_o, c))
        o = f(clipped(ctx, o_in))
        return ctx.op("mul", o, h(c)), c

    return run_layer(ctx, 4, cell, with_cell_state=True)


CONVERTERS = (
    ("RNN", 7, _rnn), ("GRU", 7, _gru), ("LSTM", 7, _lstm),
)
