"""CPU legalisation before kernel formation: the matmuls the contraction kernel does not take are
rewritten into ones it does, or into a fused reduction, so that none is left to a host step.

The contraction kernel (:mod:`tilefuse.kernel.lower_matmul`) takes f32 or f64 operands of rank
>= 2. For the other matmuls (np.matmul semantics, reference in ``ops/contraction.py``):

* a **1-D operand** becomes a matrix (``[K]`` -> ``[1, K]`` for A, ``[K, 1]`` for B) and the
  result is reshaped back to the 1-D rule's shape (a GEMV is a matmul with M or N = 1);
* **f16 / bf16** operands are cast to f32 and the product rounded once to the operand type:
  the reference accumulates in f32 and rounds once, so this is the same arithmetic;
* **integers** have no matrix kernel: ``sum(a[..., M, K, 1] * b[..., 1, K, N], axis=-2)``, one
  reduction kernel with the multiply as its prologue (nothing M·K·N is written); the i64 sum is
  cast back to the operand type, which wraps exactly as the reference's integer matmul does.

Run after :func:`~tilefuse.passes.decompose.decompose_composites` (an einsum's matmuls too).
"""

from __future__ import annotations

from tilefuse.dtypes import DType
from tilefuse.graph.builder import GraphBuilder
from tilefuse.graph.ir import Graph, Node, Value
from tilefuse.passes.rewrite import rewrite_nodes

KERNEL_TYPES = frozenset({DType.f32, DType.f64})
"""Operand types the contraction kernel takes."""


def legalize_matmuls(graph: Graph) -> tuple[Graph, bool]:
    """``graph`` with every matmul the CPU contraction kernel cannot take rewritten (module
    docstring); changed when there was one."""
    return rewrite_nodes(graph, _rule)


def _needs(node: Node, inputs: tuple[Value, ...]) -> bool:
    if node.op.name != "matmul":
        return False
    a, b = inputs
    return a.type.rank < 2 or b.type.rank < 2 or a.dtype is not b.dtype or \
        a.dtype not in KERNEL_TYPES


def _rule(builder: GraphBuilder, node: Node, inputs: tuple[Value, ...]) -> tuple[Value, ...] | None:
    if not _needs(node, inputs):
        return None
    loc = node.loc
    out = node.outputs[0]

    def em(op: str, *values: Value, **attrs: object) -> Value:
        return builder.add1(op, list(values), attrs, loc)

    a, b = inputs
    a = a if a.dtype is out.dtype else em("cast", a, dtype=out.dtype)
    b = b if b.dtype is out.dtype else em("cast", b, dtype=out.dtype)
    if a.type.rank == 1:
        a = em("expand_dims", a, axes=(0,))
    if b.type.rank == 1:
        b = em("expand_dims", b, axes=(1,))
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


__all__ = ["KERNEL_TYPES", "legalize_matmuls"]
