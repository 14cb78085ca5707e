"""ATen backward ops of training graphs: converters and decompositions.

The core-ATen decompositions already turn most backward ops into plain ones
(``threshold_backward``, ``_softmax_backward_data``, ``native_layer_norm_backward``...). What
is left here:

- ``convolution_backward`` converts to tilefuse with the ``conv2d`` reverse-mode rule
  (:func:`tilefuse.ops.vjp.conv2d_vjp`): a stride-1 convolution of the dilated gradient for
  the input, im2col patches times the gradient for the weight, a sum for the bias.
- ``max_pool2d_with_indices`` and its backward, when the windows tile the input (stride =
  kernel, no padding or dilation, sizes divisible: the usual 2×2 pooling), decompose into
  view/amax, a chain of selects for the index, and an elementwise select on the indices in the
  backward. torch's semantics are kept: the index is the first maximum of its window (for
  windows without NaN), and the gradient goes to that element only. Other geometries keep
  torch's own decomposition (a scatter), which runs in torch.
- the functional ``copy`` (optimizer steps) converts to a cast/broadcast.
- (``gather``, nll_loss's forward, converts in :mod:`~tilefuse.frontend.torch.aten_index`.)
- ``scatter.value`` (nll_loss's backward) and
  ``embedding_dense_backward`` decompose into one-hot selects and products (no scatter).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import fx

from tilefuse.frontend.torch.convert import Converter, Lowering, Result, Unsupported, source_loc
from tilefuse.graph.autodiff import GradEmitter
from tilefuse.ops import vjp

aten = torch.ops.aten


def _convolution_backward(lw: Lowering, node: fx.Node) -> Result:
    """(grad_input, grad_weight, grad_bias) per ``output_mask``; 2-D, not transposed, one
    group."""
    g_node, x_node, w_node = node.args[:3]
    stride, padding, dilation, transposed, _, groups, mask = node.args[4:11]
    if transposed:
        raise Unsupported("the gradient of a transposed convolution is not supported",
                          op=lw.op)
    if len(stride) != 2 or int(groups) != 1:
        raise Unsupported(f"only 2-D convolutions of one group are supported here (got "
                          f"{len(stride)}-D, groups={groups})", op=lw.op)
    val = node.meta["val"]
    dtype = lw.out_type.dtype if val[0] is not None else lw.tensor(w_node).dtype
    g, x, w = (lw.cast(lw.tensor(a), dtype) for a in (g_node, x_node, w_node))
    d = GradEmitter(lw.builder, source_loc(node))
    gx, gw = vjp.conv2d_vjp(d, [x, w], g, g, stride=tuple(int(s) for s in stride),
                            padding=(int(padding[0]), int(padding[1]), int(padding[0]),
                                     int(padding[1])),
                            dilation=tuple(int(s) for s in dilation), groups=1)
    gb = lw.add("sum", [g], axes=(0, 2, 3), keepdims=False)
    return tuple(v if want else None for v, want in zip((gx, gw, gb), mask))


def _copy(lw: Lowering, node: fx.Node) -> Result:
    """The functional aten.copy(self, src): src broadcast to self's shape, in its dtype."""
    out = lw.out_type
    src = lw.cast(lw.tensor(node.args[1]), out.dtype)
    if tuple(src.shape) == tuple(out.shape):
        return src
    return lw.add("broadcast_to", [src], shape=tuple(out.shape))


def training_converters() -> Mapping[Any, Converter]:
    """The converters this module adds to the ATen table."""
    return {aten.convolution_backward.default: _convolution_backward,
            aten.copy.default: _copy}


# ---- max pooling: torch-level decompositions -------------------------------------------------


def _pair(v: Any, default: Any) -> tuple[int, int]:
    v = list(v) if isinstance(v, (list, tuple)) else [v]
    v = v or list(default)
    return int(v[0]), int(v[-1])


def _tiling(x: torch.Tensor, kernel: Any, stride: Any, padding: Any, dilation: Any
            ) -> tuple[int, int] | None:
    """The kernel when the pooling windows tile ``x`` exactly, else None."""
    kh, kw = _pair(kernel, ())
    if _pair(stride, (kh, kw)) != (kh, kw) or _pair(padding, (0,)) != (0, 0) \
            or _pair(dilation, (1,)) != (1, 1) or x.dim() not in (3, 4):
        return None
    h, w = x.shape[-2:]
    if not isinstance(h, int) or not isinstance(w, int) or h % kh or w % kw:
        return None
    return kh, kw


def _max_pool_forward(x: torch.Tensor, kernel_size: Any, stride: Any = (), padding: Any = 0,
                      dilation: Any = 1, ceil_mode: bool = False) -> Any:
    geometry = _tiling(x, kernel_size, stride, padding, dilation)
    if geometry is None:
        return NotImplemented
    kh, kw = geometry
    *lead, h, w = x.shape
    ho, wo = h // kh, w // kw
    windows = x.reshape(*lead, ho, kh, wo, kw).transpose(-3, -2).reshape(*lead, ho, wo, kh * kw)
    values = windows.amax(-1)
    # the first tap equal to the maximum, as a chain of selects from the last tap back (all
    # elementwise, so it fuses; an argmax would be a reduction kernel)
    k = torch.full_like(values, kh * kw - 1, dtype=torch.int64)
    for tap in range(kh * kw - 2, -1, -1):
        k = torch.where(windows[..., tap] == values, tap, k)
    rows = torch.arange(ho, device=x.device).view(ho, 1) * kh
    cols = torch.arange(wo, device=x.device).view(1, wo) * kw
    return values, (rows + torch.div(k, kw, rounding_mode="floor")) * w + cols + k % kw


def _max_pool_backward(grad: torch.Tensor, x: torch.Tensor, kernel_size: Any, stride: Any,
                       padding: Any, dilation: Any, ceil_mode: bool, indices: torch.Tensor
                       ) -> Any:
    geometry = _tiling(x, kernel_size, stride, padding, dilation)
    if geometry is None:
        return NotImplemented
    kh, kw = geometry
    *lead, h, w = x.shape
    ho, wo = h // kh, w // kw

    def up(t: torch.Tensor) -> torch.Tensor:
        return t.reshape(*lead, ho, 1, wo, 1).expand(*lead, ho, kh, wo, kw).reshape(*lead, h, w)

    where = torch.arange(h * w, device=x.device).view(h, w)
    zero = torch.zeros((), dtype=grad.dtype, device=grad.device)
    return torch.where(up(indices) == where, up(grad), zero)


# ---- scatters as one-hot selects and products -----------------------------------------------


def _one_hot(index: torch.Tensor, n: int, dim: int) -> torch.Tensor:
    """``index`` compared with ``arange(n)`` on a new axis right after ``dim``."""
    shape = [1] * (index.dim() + 1)
    shape[dim + 1] = n
    wrapped = torch.where(index < 0, index + n, index)
    return wrapped.unsqueeze(dim + 1) == torch.arange(n, device=index.device).view(shape)


def _scatter_value(x: torch.Tensor, dim: int, index: torch.Tensor, value: Any) -> Any:
    """scatter(x, dim, index, value) where index covers x off ``dim`` (nll_loss's backward):
    a select on whether any index hits each position."""
    dim = dim % max(x.dim(), 1)
    if index.dim() != x.dim() or any(index.shape[i] != x.shape[i]
                                     for i in range(x.dim()) if i != dim):
        return NotImplemented
    if index.shape[dim] == 1:   # one index per row (nll_loss): a plain compare, no reduction
        shape = [1] * x.dim()
        shape[dim] = x.shape[dim]
        n = x.shape[dim]
        wrapped = torch.where(index < 0, index + n, index)
        hit = wrapped == torch.arange(n, device=x.device).view(shape)
    else:
        hit = _one_hot(index, x.shape[dim], dim).any(dim)
    return torch.where(hit, torch.full((), value, dtype=x.dtype, device=x.device), x)


def _embedding_backward(grad: torch.Tensor, indices: torch.Tensor, num_weights: int,
                        padding_idx: int, scale_grad_by_freq: bool) -> Any:
    """The embedding's weight gradient as one product: one-hot(indices)ᵀ · grad (what an
    index_put with accumulate computes, without a scatter)."""
    if scale_grad_by_freq or not isinstance(num_weights, int):
        return NotImplemented
    flat = indices.reshape(1, -1)
    wrapped = torch.where(flat < 0, flat + num_weights, flat)
    # [num_weights, tokens], built in the orientation the product reads (a transposed one-hot
    # would move the matmul's lane axis)
    hot = torch.arange(num_weights, device=grad.device).view(num_weights, 1) == wrapped
    if padding_idx >= 0:
        hot = hot & (flat != padding_idx)
    rows = grad.reshape(flat.shape[1], grad.shape[-1])
    return hot.to(grad.dtype) @ rows


def training_decompositions() -> dict[Any, Any]:
    """Decompositions for AOTAutograd's joint graph on top of core ATen's."""
    return {aten.max_pool2d_with_indices.default: _max_pool_forward,
            aten.max_pool2d_with_indices_backward.default: _max_pool_backward,
            aten.scatter.value: _scatter_value,
            aten.embedding_dense_backward.default: _embedding_backward}


__all__ = ["training_converters", "training_decompositions"]
