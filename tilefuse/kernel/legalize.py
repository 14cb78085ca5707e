"""CPU legalisation before kernel formation: the matmuls the contraction kernel does not take are
rewritten into ones it does, or into a fused reduction, so that none is left to a host step.

The contraction kernel (:mod:`tilefuse.kernel.lower_matmul`) takes f32 or f64 operands of rank
>= 2. For the other matmuls (np.matmul semantics, reference in ``ops/contraction.py``):

* a **1-D operand** becomes a matrix (``[K]`` -> ``[1, K]`` for A, ``[K, 1]`` for B) and the
  result is reshaped back to the 1-D rule's shape (a GEMV is a matmul with M or N = 1);
* **f16 / bf16** operands are cast to f32 and the product rounded once to the operand type:
  the reference accumulates in f32 and rounds once, so this is the same arithmetic;
* **batch dims that broadcast** against each other (neither the output's nor all 1) are
  broadcast first; a matmul with an **empty** dim is a fill of zeros (K = 0) or nothing;
* **integers** have no matrix kernel: ``sum(a[..., M, K, 1] * b[..., 1, K, N], axis=-2)``, one
  reduction kernel with the multiply as its prologue (nothing M·K·N is written); the i64 sum is
  cast back to the operand type, which wraps exactly as the reference's integer matmul does.

A **conv2d** that ``passes/conv_lowering.py`` left (its weight computed at run time or passed
as an argument, f64 or f16/bf16, more groups than it splits) becomes im2col (``pad``,
``window_patches``) contracted with the weight as an einsum over (pixels, taps, groups,
channels): batched matmuls, one per group, in f32 for f16/bf16. An f16/bf16 **attention**
runs the f32 attention kernel on widened inputs and rounds once, as its reference does.

Run after :func:`~tilefuse.passes.decompose.decompose_composites` (an einsum's matmuls too).
"""

from __future__ import annotations

from typing import Any

from tilefuse.dtypes import DType
from tilefuse.graph.builder import GraphBuilder
from tilefuse.graph.ir import Graph, Node, Value
from tilefuse.ops.contraction import _einsum_decompose
from tilefuse.passes.rewrite import rewrite_nodes

KERNEL_TYPES = frozenset({DType.f32, DType.f64})
"""Operand types the contraction kernel takes."""


def legalize_matmuls(graph: Graph) -> tuple[Graph, bool]:
    """``graph`` with every matmul the CPU contraction kernel cannot take rewritten (module
    docstring); changed when there was one."""
    return rewrite_nodes(graph, _rule)


def legalize_convs(graph: Graph) -> tuple[Graph, bool]:
    """``graph`` with only its conv2d nodes rewritten (im2col + einsum, module docstring): the
    cuda target's preparation for the convolutions its GEMM lowering left (grouped ones with a
    weight computed at run time), whose matmuls the GPU takes in their own dtypes."""
    return rewrite_nodes(graph, lambda b, node, inputs: _rule(b, node, inputs)
                         if node.op.name == "conv2d" else None)


def _needs(node: Node, inputs: tuple[Value, ...]) -> bool:
    if node.op.name == "attention":  # the attention kernel is f32/f64
        return node.outputs[0].dtype in (DType.f16, DType.bf16)
    if node.op.name == "conv2d":  # conv_lowering took the constant-weight f32 ones
        return all(isinstance(d, int) for v in (*inputs, *node.outputs) for d in v.shape) \
            and node.outputs[0].dtype.is_float
    if node.op.name != "matmul":
        return False
    a, b = inputs
    if a.type.rank < 2 or b.type.rank < 2 or a.dtype is not b.dtype or \
            a.dtype not in KERNEL_TYPES:
        return True
    shapes = (a.shape, b.shape, node.outputs[0].shape)
    if not all(isinstance(d, int) for shape in shapes for d in shape):
        return False
    batch = tuple(node.outputs[0].shape[:-2])
    return any(d == 0 for shape in shapes for d in shape) or any(
        tuple(v.shape[:-2]) != batch and any(d != 1 for d in v.shape[:-2]) for v in (a, b))


def _rule(builder: GraphBuilder, node: Node, inputs: tuple[Value, ...]) -> tuple[Value, ...] | None:
    if not _needs(node, inputs):
        return None
    loc = node.loc
    out = node.outputs[0]

    def em(op: str, *values: Value, **attrs: object) -> Value:
        return builder.add1(op, list(values), attrs, loc)

    if node.op.name == "conv2d":
        return (_conv(builder, em, node, inputs),)
    if node.op.name == "attention":  # the reference widens f16/bf16 to f32 and rounds once
        wide = [em("cast", v, dtype=DType.f32) for v in inputs]
        y = builder.add1("attention", wide, dict(node.attrs), loc)
        return (em("cast", y, dtype=out.dtype),)

    if any(d == 0 for v in (*inputs, out) for d in v.shape):  # nothing to multiply
        return (em("full", shape=tuple(out.shape), value=0, dtype=out.dtype),)
    a, b = inputs
    a = a if a.dtype is out.dtype else em("cast", a, dtype=out.dtype)
    b = b if b.dtype is out.dtype else em("cast", b, dtype=out.dtype)
    if a.type.rank == 1:
        a = em("expand_dims", a, axes=(0,))
    if b.type.rank == 1:
        b = em("expand_dims", b, axes=(1,))
    kept = (inputs[0].type.rank > 1) + (inputs[1].type.rank > 1)  # M and N in the output
    batch = tuple(out.shape[:len(out.shape) - kept])
    for pos, v in enumerate((a, b)):  # batch dims broadcast against the other's: made whole
        own = tuple(v.shape[:-2])
        if own != batch and any(d != 1 for d in own):
            full = em("broadcast_to", v, shape=(*batch, *v.shape[-2:]))
            a, b = (full, b) if pos == 0 else (a, full)
    if out.dtype in (DType.f16, DType.bf16):
        a, b = em("cast", a, dtype=DType.f32), em("cast", b, dtype=DType.f32)
    if a.dtype in KERNEL_TYPES:
        product = em("matmul", a, b)
    else:  # integers: a reduction over K of the broadcast products
        terms = em("mul", em("expand_dims", a, axes=(-1,)), em("expand_dims", b, axes=(-3,)))
        product = em("sum", terms, axes=(-2,), keepdims=False)
    if product.dtype is not out.dtype:
        product = em("cast", product, dtype=out.dtype)
    if tuple(product.type.shape) != tuple(out.shape):
        product = em("reshape", product, shape=tuple(out.shape))
    return (product,)


def _conv(builder: GraphBuilder, em: Any, node: Node, inputs: tuple[Value, ...]) -> Value:
    """A conv2d the conv_lowering pass left (a weight computed at run time or passed in, f64,
    f16/bf16, many groups): im2col of the NHWC input (pad, ``window_patches``) contracted with
    the weight as the einsum ``pkgc,gock->pgo`` (P pixels, K taps, G groups, C channels per
    group, O outputs per group: one batched matmul over the groups), then NCHW again."""
    x, w = inputs[0], inputs[1]
    out = node.outputs[0]
    work = DType.f32 if out.dtype in (DType.f16, DType.bf16) else out.dtype
    x = x if x.dtype is work else em("cast", x, dtype=work)
    w = w if w.dtype is work else em("cast", w, dtype=work)
    n = x.type.shape[0]
    o, cg, kh, kw = w.type.shape
    _, _, oh, ow = out.shape
    groups = node.attrs["groups"]
    top, left, bottom, right = node.attrs["padding"]
    nhwc = em("transpose", x, perm=(0, 2, 3, 1))
    if top or left or bottom or right:
        nhwc = em("pad", nhwc, pads=(0, 0, top, bottom, left, right, 0, 0))
    patches = em("window_patches", nhwc, kernel=(kh, kw), strides=tuple(node.attrs["stride"]),
                 dilations=tuple(node.attrs["dilation"]))
    patches = em("reshape", patches, shape=(n * oh * ow, kh * kw, groups, cg))
    weight = em("reshape", w, shape=(groups, o // groups, cg, kh * kw))
    (y,) = _einsum_decompose(builder, (patches, weight), {"equation": "pkgc,gock->pgo"}, node.loc)
    y = em("transpose", em("reshape", y, shape=(n, oh, ow, o)), perm=(0, 3, 1, 2))
    if len(inputs) == 3:
        bias = inputs[2] if inputs[2].dtype is work else em("cast", inputs[2], dtype=work)
        y = em("add", y, em("reshape", bias, shape=(o, 1, 1)))
    return y if y.dtype is out.dtype else em("cast", y, dtype=out.dtype)


__all__ = ["KERNEL_TYPES", "legalize_matmuls"]
