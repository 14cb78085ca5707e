"""Integer matrix products (``matmul`` of i8, i16, i32, i64, u8) lowered for the GPU.

cuBLAS has no integer products with NumPy's semantics (wrapping arithmetic in the operands'
dtype), so such a contraction's product is a generated kernel: a thread per output element
``(batch..., m, n)`` walks ``k`` and accumulates ``a[batch, m, k] * b[batch, k, n]`` in the
output dtype (integer addition and multiplication wrap, so the result is NumPy's modulo
``2^bits`` whatever the order). Batch dims broadcast as in ``np.matmul`` (a size-1 batch dim is
read at 0) and 1-D operands are promoted (``[k]`` is ``[1, k]`` for A, ``[k, 1]`` for B).

The operands are buffers (the contraction's prologues and view aliases are
:func:`tilefuse.kernel.lower_gpu_contraction.split_contraction`'s, as for cuBLAS); the
epilogue is the split's elementwise kernel. A thread per output with a serial ``k`` loop is no
tensor-core GEMM: the integer products the fuzzer and models make are small (an index
computation, a count); quantized models' int8 GEMMs are
:mod:`tilefuse.kernel.lower_gpu_qmatmul`'s.
"""

from __future__ import annotations

import math

from tilefuse.dtypes import INT_TYPES
from tilefuse.errors import CompileError
from tilefuse.graph.ir import Node, Value
from tilefuse.kernel.access import dims, flatten, identifier, kernel_buffers, unflatten
from tilefuse.loop.ir import (
    Expr,
    Local,
    LocalStore,
    LoopFunction,
    LoopKind,
    LType,
    Stmt,
    Store,
    block,
    const,
    local_load,
    loop,
    var,
)
from tilefuse.loop.simplify import simplify


def lower_product_gpu(name: str, node: Node, a: Value, b: Value) -> LoopFunction:
    """Kernel ``name``: the product ``node`` (a matmul) reading buffers ``a`` and ``b`` (its
    operands or values with their bytes) and writing ``node.output`` (module docstring)."""
    out = node.output
    if out.dtype not in INT_TYPES or a.dtype is not out.dtype or b.dtype is not out.dtype:
        raise CompileError(f"the generated GPU product takes integer operands of the output's "
                           f"dtype, got {a.dtype}, {b.dtype} -> {out.dtype}", op="matmul",
                           loc=node.loc)
    a_shape, b_shape = dims(node.inputs[0].shape), dims(node.inputs[1].shape)
    out_shape = dims(out.shape)
    a2 = (1, *a_shape) if len(a_shape) == 1 else a_shape
    b2 = (*b_shape, 1) if len(b_shape) == 1 else b_shape
    batch = out_shape[:len(out_shape) - (len(a_shape) > 1) - (len(b_shape) > 1)]
    k_size = a2[-1]
    buffers = kernel_buffers(tuple(dict.fromkeys((a, b))), (out,))
    a_buf, b_buf = buffers.inputs[a], buffers.inputs[b]
    out_buf = buffers.outputs[out]
    names = [p.name for p in buffers.params]
    o, k = _fresh(names, "o"), _fresh(names, "k")
    index = unflatten(var(o), out_shape) if out_shape else ()
    ob = index[:len(batch)]
    m = index[len(batch)] if len(a_shape) > 1 else const(0)
    n = index[-1] if len(b_shape) > 1 else const(0)

    def operand(shape: tuple[int, ...], rows: Expr, cols: Expr) -> Expr:
        lead = shape[:-2]
        at = tuple(const(0) if d == 1 else ob[len(batch) - len(lead) + i]
                   for i, d in enumerate(lead))
        return flatten((*at, rows, cols), shape)

    acc = Local(_fresh(names, "acc"), LType(out.dtype))
    total = math.prod(out_shape)
    if not total:
        body: list[Stmt] = []
    else:
        step = local_load(acc) + a_buf.load(operand(a2, m, var(k))) * \
            b_buf.load(operand(b2, var(k), n))
        body = [loop(o, 0, total, [
            acc, LocalStore(acc.name, const(0), const(0, out.dtype)),
            loop(k, 0, k_size, [LocalStore(acc.name, const(0), step)]),
            Store(out_buf.name, var(o), local_load(acc))], kind=LoopKind.PARALLEL)]
    fn = LoopFunction(identifier(name), buffers.params, (),
                      block(*body))
    return simplify(fn)[0]


def _fresh(taken: list[str], prefix: str) -> str:
    name = prefix
    while name in taken:
        name += "_"
    taken.append(name)
    return name


__all__ = ["lower_product_gpu"]
