"""The reference interpreter: runs any graph node by node with the ops' NumPy references.

It is the oracle every numeric test compares against, and (until native code exists for a
target) the executor behind ``tilefuse.jit``. It checks that each reference produced exactly
the shape and dtype the op's rules promised, so a rule and its reference cannot drift apart.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from tilefuse.dtypes import from_numpy
from tilefuse.errors import GuardError, TilefuseError, VerifyError
from tilefuse.graph.ir import Graph, Node, Value
from tilefuse.graph.types import Sym, TensorType


def _matches(array: np.ndarray, type_: TensorType, bindings: dict[Sym, int] | None = None) -> bool:
    """Whether ``array`` has ``type_``; symbolic dims bind to sizes (consistently) in bindings."""
    if array.dtype != type_.dtype.np or array.ndim != type_.rank:
        return False
    for d, n in zip(type_.shape, array.shape):
        if isinstance(d, Sym):
            if bindings is not None and bindings.setdefault(d, n) != n:
                return False
        elif d != n:
            return False
    return True


def _bind(value: object, bindings: dict[Sym, int]) -> object:
    """An attribute value with every bound symbol replaced by its size (tuples included)."""
    if isinstance(value, Sym):
        return bindings.get(value, value)
    if isinstance(value, tuple):
        return tuple(_bind(v, bindings) for v in value)
    return value


def run_node(node: Node, args: Sequence[np.ndarray],
             bindings: dict[Sym, int] | None = None) -> tuple[np.ndarray, ...]:
    """Runs one node's reference and checks its outputs against the node's types.

    ``bindings`` maps the symbolic dims seen so far to their sizes; references see attributes
    with those symbols substituted, and symbols first met in an output are bound here.
    """
    attrs = dict(node.attrs)
    if bindings:
        attrs = {k: _bind(v, bindings) for k, v in attrs.items()}
    try:
        result = node.op.reference(*args, **attrs)
    except TilefuseError as err:
        raise err.with_context(op=node.op.name, loc=node.loc) from None
    except (ValueError, TypeError, IndexError, FloatingPointError) as err:
        raise VerifyError(f"reference implementation failed: {err}", op=node.op.name,
                          inputs=tuple(str(v.type) for v in node.inputs), loc=node.loc) from None
    except MemoryError as err:  # a huge shape (a hostile model): an error, not a crash
        made = ", ".join(str(v.type) for v in node.outputs)
        raise TilefuseError(f"out of memory computing {made}: {err}", op=node.op.name,
                            inputs=tuple(str(v.type) for v in node.inputs), loc=node.loc) from None
    outs = result if isinstance(result, tuple) else (result,)
    if len(outs) != len(node.outputs):
        raise VerifyError(f"reference returned {len(outs)} outputs, expected "
                          f"{len(node.outputs)}", op=node.op.name)
    checked = []
    for out, value in zip(outs, node.outputs):
        arr = np.asarray(out)
        if not _matches(arr, value.type, bindings):
            raise VerifyError(f"reference produced {from_numpy(arr.dtype).value}"
                              f"{list(arr.shape)}, rules say {value.type}", op=node.op.name,
                              loc=node.loc)
        checked.append(arr)
    return tuple(checked)


def interpret(graph: Graph, *arrays: np.ndarray) -> list[np.ndarray]:
    """Runs ``graph`` on ``arrays`` and returns its outputs as NumPy arrays."""
    if len(arrays) != len(graph.inputs):
        raise GuardError(f"graph @{graph.name} takes {len(graph.inputs)} inputs, "
                         f"got {len(arrays)}")
    env: dict[Value, np.ndarray] = {}
    bindings: dict[Sym, int] = {}
    for value, array in zip(graph.inputs, arrays):
        arr = np.asarray(array)
        if not _matches(arr, value.type, bindings):
            shown = f"{arr.dtype}{list(arr.shape)}"
            raise GuardError(f"input {value.name or '?'} expects {value.type}, got {shown}")
        env[value] = arr
    for node in graph.nodes:
        outs = run_node(node, [env[v] for v in node.inputs], bindings)
        env.update(zip(node.outputs, outs))
    return [env[v] for v in graph.outputs]
