"""A contraction group split for the GPU: prologue kernels, one product, an epilogue kernel.

The CPU fuses a matmul's prologue (the transpose, cast, scale or broadcast that computes an
operand) into its packing loops. On the GPU the product is cuBLAS (or the generated tensor-core
kernel), which reads operands from memory, so each operand computed inside the group is either

* **an alias**: a chain of ``reshape`` / ``expand_dims`` / ``squeeze`` of one group input is
  the same bytes (every tilefuse buffer is C-contiguous), so the product reads that input
  directly; no kernel, no copy; or
* **a prologue kernel**: the operand's cone of nodes becomes an elementwise group whose one
  output is the operand (movement ops are index arithmetic in the elementwise lowering), and the
  product reads what it writes.

The rest of the group (what reads the product) is the epilogue, an elementwise group reading the
product as an input, as before. A node both sides need is computed on both sides (it only reads
group inputs). :func:`split_contraction` does the split and needs no GPU.
"""

from __future__ import annotations

from dataclasses import dataclass

from tilefuse.errors import CompileError
from tilefuse.graph.ir import Node, Value
from tilefuse.kernel.fusion import KernelGroup, KernelKind
from tilefuse.kernel.lower_matmul import matmul_node, operand_cone

VIEW_OPS = frozenset({"reshape", "expand_dims", "squeeze"})
"""Ops whose result is the operand's bytes in the same order: a chain of them is an alias."""


@dataclass(frozen=True)
class ContractionSplit:
    """``prologues`` (elementwise groups, run first) write the operands they compute; the
    product is ``node`` reading ``a`` and ``b`` (group inputs or prologue outputs: the same
    bytes as the matmul's own operands, which may be views of them); ``epilogue`` reads the
    product."""

    node: Node
    a: Value
    b: Value
    prologues: tuple[KernelGroup, ...]
    epilogue: KernelGroup | None
    aliases: tuple[str, ...] = ()
    """Operands read in place through a view chain, as text (for the partition report)."""


def _view_source(nodes: tuple[Node, ...], reads: tuple[Value, ...]) -> Value | None:
    """The one value a pure view chain reads, else None."""
    if len(reads) == 1 and nodes and all(n.op.name in VIEW_OPS for n in nodes):
        return reads[0]
    return None


def split_contraction(group: KernelGroup) -> ContractionSplit:
    """``group`` (a CONTRACTION anchored on a matmul) as prologue groups, the product's
    operands and an epilogue group (module docstring); CompileError if it is not such a
    group."""
    node = matmul_node(group)
    inputs = frozenset(group.inputs)
    operands: list[Value] = []
    prologues: list[KernelGroup] = []
    aliases: list[str] = []
    for side, operand in zip("ab", node.inputs):
        if operand in inputs:
            operands.append(operand)
            continue
        nodes, reads = operand_cone(group, operand)
        source = _view_source(nodes, reads)
        if source is not None:
            operands.append(source)
            aliases.append(f"{side.upper()} {operand.type} read in place as {source.type}")
            continue
        prologues.append(KernelGroup(f"{group.name}_prologue_{side}", KernelKind.ELEMENTWISE,
                                     nodes, reads, (operand,), None, operand.shape))
        operands.append(operand)
    after = frozenset({node.output})
    rest: dict[Node, None] = {}
    reads_after: dict[Value, None] = {}
    outputs = tuple(v for v in group.outputs if v is not node.output)
    for v in outputs:
        nodes, reads = operand_cone(group, v, after)
        rest.update(dict.fromkeys(n for n in nodes if n is not node))
        reads_after.update(dict.fromkeys(reads))
    epilogue = None
    if outputs:
        ordered = tuple(n for n in group.nodes if n in rest)
        epilogue = KernelGroup(f"{group.name}_epilogue", KernelKind.ELEMENTWISE, ordered,
                               tuple(reads_after), outputs, None, node.output.shape)
    a, b = operands
    if a.dtype is not b.dtype or b.dtype is not node.output.dtype:
        raise CompileError(f"kernel {group.name}: the product needs one dtype, got {a.dtype}, "
                           f"{b.dtype} -> {node.output.dtype}")
    return ContractionSplit(node, a, b, tuple(prologues), epilogue, tuple(aliases))


__all__ = ["VIEW_OPS", "ContractionSplit", "split_contraction"]
