"""Artifacts of :func:`tilefuse.torch.compile_exported` results.

Such a result runs, per input signature, a partitioned FX graph. It can be saved when
tilefuse compiled the whole program: one compiled region fed only by placeholders, whose
outputs (or items of them) are the program's outputs; a program with torch fallbacks cannot
(its torch ops would have to be saved too), which is an ArtifactError naming the fallbacks. An
entry records which user input feeds each executable input and which executable output each
user output is; the manifest keeps the output pytree spec (torch's JSON form) so that a loaded
artifact called with tensors returns the same structure.
"""

from __future__ import annotations

import operator
import warnings
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from tilefuse.artifact.format import ArtifactError
from tilefuse.errors import GuardError
from tilefuse.runtime.native import NativeExecutable


def exported_entries(compiled: Any) -> tuple[dict[str, Any],
                                             list[tuple[NativeExecutable, dict[str, Any]]]]:
    """The manifest fields and entries of a CompiledExported."""
    from torch.utils import _pytree as pytree

    from tilefuse.artifact.saver import specializations
    from tilefuse.frontend.torch.partition import CompiledPartition

    specialized = compiled.graph
    if not specialized.traced:
        raise ArtifactError("the compiled exported program has not run yet: call it once with "
                            "example inputs before saving")
    users = list(compiled._user_positions)
    entries = []
    for traced in specialized.traced.values():
        nodes = list(traced.graph.nodes)
        placeholders = [n for n in nodes if n.op == "placeholder"]
        calls = [n for n in nodes if n.op == "call_module"]
        outputs = traced.graph.output_node().args[0]
        outputs = list(outputs) if isinstance(outputs, (tuple, list)) else [outputs]
        items = [n for n in nodes if n.op == "call_function"]
        if len(calls) != 1 or any(n.target is not operator.getitem or n.args[0] is not calls[0]
                                  for n in items):
            torch_ops = sorted({str(n.target) for n in items if n.target is not operator.getitem})
            raise ArtifactError("this exported program runs partly in torch ("
                                f"{', '.join(torch_ops) or 'several compiled regions'}); only a "
                                "program tilefuse compiles whole can be saved")
        call = calls[0]
        part = traced.get_submodule(str(call.target))
        if not isinstance(part, CompiledPartition):
            raise ArtifactError(f"{call.target} is not a compiled tilefuse region")
        if any(a not in placeholders for a in call.args):
            raise ArtifactError("the compiled region is not fed from the inputs directly")
        inputs = []
        for r in part.runtime:
            position = placeholders.index(call.args[r])
            if position not in users:
                raise ArtifactError(f"compiled input {r} is not a user input of the program")
            inputs.append(users.index(position))
        mapped = []
        for node in outputs:
            if node is call and part.single:
                mapped.append(0)
            elif getattr(node, "target", None) is operator.getitem and node.args[0] is call:
                mapped.append(int(node.args[1]))
            else:
                raise ArtifactError("an output of the program is not an output of the compiled "
                                    "region (a placeholder or constant returned as it is)")
        user_outputs = [mapped[i] for i in compiled._user_outputs]
        for exe in specializations(part.executable, "the exported program"):
            entries.append((exe, {"inputs": inputs, "outputs": user_outputs}))
    spec = compiled._out_spec
    with warnings.catch_warnings():  # torch's own deprecation noise inside treespec_dumps
        warnings.simplefilter("ignore", FutureWarning)
        text = None if spec is None else pytree.treespec_dumps(spec)
    fields = {"name": specialized._name, "user_inputs": len(users), "out_spec": text}
    return fields, entries


def call_exported(model: Any, args: Sequence[Any], kwargs: Mapping[str, Any]) -> Any:
    """A loaded exported program's call: flattened user inputs (arrays or CPU tensors) in,
    outputs in the program's structure out (tensors when given tensors)."""
    torch = _torch_if_tensors([*args, *kwargs.values()])
    if torch is not None:
        from torch.utils import _pytree as pytree

        flat, _ = pytree.tree_flatten((tuple(args), dict(kwargs)))
    else:
        flat = [*args, *kwargs.values()]
    count = model.manifest.get("user_inputs")
    if len(flat) != count:
        raise GuardError(f"{model.path}: the exported program takes {count} inputs, got "
                         f"{len(flat)}")
    arrays = [np.ascontiguousarray(a.detach().cpu().numpy() if torch is not None
                                   and isinstance(a, torch.Tensor) else a) for a in flat]
    first = model.manifest["entries"][0]
    exe, extra = model.executable_for([arrays[u] for u in first["inputs"]])
    outs = exe(*[arrays[u] for u in extra["inputs"]])
    user = [outs[i] for i in extra["outputs"]]
    if torch is None:
        return user
    from torch.utils import _pytree as pytree

    tensors = [torch.from_numpy(o) for o in user]
    spec = model.manifest.get("out_spec")
    if not spec:
        return tensors
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            tree = pytree.treespec_loads(spec)
        return pytree.tree_unflatten(tensors, tree)
    except (ValueError, TypeError, KeyError, NotImplementedError) as err:
        raise ArtifactError(f"{model.path}: malformed artifact: bad output structure: "
                            f"{err}") from None


def _torch_if_tensors(values: Sequence[Any]) -> Any:
    import sys

    torch = sys.modules.get("torch")
    if torch is None or not any(isinstance(v, torch.Tensor) for v in values):
        return None
    return torch


def check_entry(extra: Mapping[str, Any], inputs: int, outputs: int, users: Any,
                path: str) -> None:
    """ArtifactError unless an exported entry's input and output maps are in range."""
    ok = type(users) is int and 0 <= users < 1 << 20
    for key, limit, size in (("inputs", users, inputs), ("outputs", outputs, None)):
        items = extra.get(key)
        ok = ok and isinstance(items, list) and (size is None or len(items) == size) and all(
            type(i) is int and 0 <= i < (limit if isinstance(limit, int) else 0)
            for i in items)
    if not ok:
        raise ArtifactError(f"{path}: malformed artifact: bad input/output map of an exported "
                            "program")
