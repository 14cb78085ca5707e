"""A kernel's tensor expression as text (``kernels/<name>.expr`` in the dump): what each value
of the group is at a symbolic index, with reduction axes named, and no loops.

    k0 : contraction over [512,3072], axes i0 < 512, i1 < 3072
      %0[i0,i1] = sum(k0 < 768: %x[i0,k0] * %w[k0,i1])
      %1[i0,i1] = add(%0[i0,i1], %b[i1])
      %2[i0,i1] = gelu(%1[i0,i1]) {approximate="none"}
      write %2

Operands index their own shape: a broadcast operand drops the leading axes it lacks and reads
0 along its size-1 axes, as NumPy broadcasting does. Movement ops are shown as the op applied to
the whole operand (their index maps are what the lowering computes); reductions name the folded
axes ``r0, r1, ...``; a matmul names its contraction axis ``k0``.
"""

from __future__ import annotations

from tilefuse.graph.ir import Node, Value
from tilefuse.graph.printer import format_attrs
from tilefuse.graph.types import normalize_axes
from tilefuse.kernel.fusion import KernelGroup
from tilefuse.ops.registry import OpKind

_REDUCTIONS = frozenset({"sum", "mean", "max", "min", "prod", "var"})


def _indexed(value: Value, names: dict[Value, str], axes: list[str]) -> str:
    """``%v[i0,i1]`` with broadcasting applied to ``value``'s own shape."""
    shape = value.type.shape
    own = axes[len(axes) - len(shape):] if len(shape) <= len(axes) else \
        [f"j{d}" for d in range(len(shape))]
    idx = ["0" if d == 1 else a for d, a in zip(shape, own)]
    return f"{names[value]}[{','.join(idx)}]" if shape else names[value]


def _axes(value: Value) -> list[str]:
    return [f"i{d}" for d in range(value.type.rank)]


def _matmul(node: Node, names: dict[Value, str]) -> str:
    a, b = node.inputs
    out = _axes(node.outputs[0])
    k = a.type.shape[-1]
    rows = out[:-1] if a.type.rank > 1 else []
    a_idx = [*rows[len(rows) - (a.type.rank - 1):], "k0"] if a.type.rank > 1 else ["k0"]
    b_idx = ["k0", out[-1]] if b.type.rank > 1 else ["k0"]
    if b.type.rank > 2:
        b_idx = [*out[len(out) - b.type.rank:-2], *b_idx]
    return (f"sum(k0 < {k}: {names[a]}[{','.join(a_idx)}] * "
            f"{names[b]}[{','.join(b_idx)}])")


def _reduction(node: Node, names: dict[Value, str]) -> str:
    (x,) = node.inputs[:1]
    folded = normalize_axes(node.attrs.get("axes"), x.type.rank)
    keep = node.attrs.get("keepdims", False)
    out_axes = iter(_axes(node.outputs[0]))
    idx, bounds, r = [], [], 0
    for d in range(x.type.rank):
        if d in folded:
            idx.append(f"r{r}")
            bounds.append(f"r{r} < {x.type.shape[d]}")
            r += 1
            if keep:
                next(out_axes)
        else:
            idx.append(next(out_axes))
    return f"{node.op.name}({', '.join(bounds)}: {names[x]}[{','.join(idx)}])"


def _rhs(node: Node, names: dict[Value, str]) -> str:
    if node.op.name == "matmul":
        return _matmul(node, names)
    if node.op.name in _REDUCTIONS:
        return _reduction(node, names)
    axes = _axes(node.outputs[0])
    if node.op.kind is OpKind.ELEMENTWISE:
        args = ", ".join(_indexed(v, names, axes) for v in node.inputs)
    else:
        args = ", ".join(names[v] for v in node.inputs)
    return f"{node.op.name}({args}){format_attrs(node.attrs, elide_constants_over=8)}"


def format_group_expr(group: KernelGroup, names: dict[Value, str]) -> str:
    """The tensor expression of ``group``; ``names`` are the graph dump's value names."""
    domain = ",".join(str(d) for d in group.domain)
    axes = ", ".join(f"i{d} < {n}" for d, n in enumerate(group.domain))
    lines = [f"{group.name} : {group.kind.value} over [{domain}]" + (f", axes {axes}" if axes
                                                                     else "")]
    lines.append("  reads " + (", ".join(names[v] for v in group.inputs) or "nothing"))
    for node in group.nodes:
        lhs = ", ".join(_indexed(v, names, _axes(v)) for v in node.outputs)
        lines.append(f"  {lhs} = {_rhs(node, names)}")
    lines.append("  write " + ", ".join(names[v] for v in group.outputs))
    return "\n".join(lines) + "\n"
