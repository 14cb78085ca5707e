"""``tilefuse.grad`` and ``tilefuse.value_and_grad``: compiled reverse-mode gradients of NumPy
functions.

A gradient function is a :class:`~tilefuse.frontend.jit.JitFunction` whose trace step does one
more thing: the captured forward graph (which must return one floating-point scalar) is copied
into a builder and :func:`tilefuse.graph.autodiff.gradients` appends the backward nodes, so the
forward and the backward are **one graph** that goes through the same pipeline, fusion and
native build as any ``tilefuse.jit`` function (a value the backward needs is computed once; the
loss is free in ``value_and_grad``). The cache, guards, dynamic dims, ``dump`` and ``lower()``
are the jit's own. Arguments named by ``argnums`` must be traced floating-point arrays.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from tilefuse.errors import GradientError, TraceError
from tilefuse.frontend.capture import Captured, capture
from tilefuse.frontend.dynamic_dims import DynamicSpec
from tilefuse.frontend.jit import DEFAULT_MAX_RECOMPILES, JitFunction, Key
from tilefuse.frontend.tracer import Tracer
from tilefuse.graph.autodiff import gradients
from tilefuse.graph.builder import GraphBuilder
from tilefuse.graph.ir import Value

ArgNums = int | tuple[int, ...]


class GradFunction(JitFunction):
    """``grad(f)`` or ``value_and_grad(f)``, compiled: call it like ``f``."""

    def __init__(self, fn: Callable[..., Any], argnums: ArgNums, with_value: bool,
                 **jit_options: Any):
        super().__init__(fn, **jit_options)
        single = isinstance(argnums, int)
        nums = (argnums,) if single else tuple(argnums)
        if not nums or not all(isinstance(i, int) for i in nums) or len(set(nums)) != len(nums):
            raise TraceError(f"argnums must be an int or a tuple of distinct ints, got "
                             f"{argnums!r}")
        self._argnums = nums
        self._single = single
        self._with_value = with_value

    def __repr__(self) -> str:
        kind = "value_and_grad" if self._with_value else "grad"
        return f"<tilefuse.{kind} of {self._qualname} (argnums {self._argnums}, " \
               f"{len(self._cache)} entries)>"

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if any(isinstance(a, Tracer) for a in (*args, *kwargs.values())):
            raise TraceError(f"{self._qualname}: a tilefuse.grad function cannot be called "
                             "inside another traced function yet; call it on arrays")
        return super().__call__(*args, **kwargs)

    def _capture(self, key: Key, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Captured:
        """The forward graph with its gradients appended (jit's compile driver builds it)."""
        forward = capture(self._fn, self._names, args, kwargs, key[1], key[2])
        return self._differentiate(forward, len(args))

    def _differentiate(self, forward: Captured, n_args: int) -> Captured:
        """The forward graph with the gradients of its scalar output appended, and a packer
        for ``grads`` or ``(value, grads)``."""
        graph = forward.graph
        inputs = []
        for i in self._argnums:
            position = i + n_args if i < 0 else i
            if position not in forward.positions:
                what = "not an argument" if not 0 <= position < n_args else "not a traced array"
                raise GradientError(f"{self._qualname}: argnums {i} is {what}; gradients are "
                                    "taken with respect to array arguments")
            inputs.append(forward.positions.index(position))
        if len(graph.outputs) != 1 or graph.outputs[0].type.rank != 0:
            shown = ", ".join(str(v.type) for v in graph.outputs)
            raise GradientError(f"{self._qualname} must return one scalar to be "
                                f"differentiated, it returned {shown}")
        builder = GraphBuilder(f"grad_{graph.name}")
        mapped: dict[Value, Value] = {v: builder.input(v.type, v.name) for v in graph.inputs}
        for node in graph.nodes:
            outs = builder.add(node.op, [mapped[v] for v in node.inputs], node.attrs, node.loc)
            mapped.update(zip(node.outputs, outs))
        y = mapped[graph.outputs[0]]
        wrt = [mapped[graph.inputs[i]] for i in inputs]
        grads = gradients(builder, builder.nodes, y, wrt)  # errors name the op and line
        pack = self._packer(forward.pack)
        outputs = [y, *grads] if self._with_value else grads
        return dataclasses.replace(forward, graph=builder.build(outputs), pack=pack)

    def _packer(self, value_pack: Callable[[list[Any]], Any]) -> Callable[[list[Any]], Any]:
        single, with_value = self._single, self._with_value

        def pack(outs: list[Any]) -> Any:
            grads = outs[1:] if with_value else outs
            g = grads[0] if single else tuple(grads)
            return (value_pack(outs[:1]), g) if with_value else g

        return pack


def grad(fn: Callable[..., Any], argnums: ArgNums = 0, *, target: str = "cpu",
         dump: str | Path | None = None, debug: bool = False,
         static_argnames: Iterable[str] | str = (), dynamic: DynamicSpec = False,
         max_recompiles: int = DEFAULT_MAX_RECOMPILES) -> GradFunction:
    """The gradient of ``fn`` (a NumPy function returning one float scalar) with respect to
    the positional arguments ``argnums`` (an int: one array; a tuple: a tuple of arrays),
    compiled like :func:`tilefuse.jit` with forward and backward in one graph. Shapes are
    static unless ``dynamic`` says otherwise (as in ``jit``)."""
    return GradFunction(fn, argnums, False, target=target, dump=dump, debug=debug,
                        static_argnames=static_argnames, dynamic=dynamic,
                        max_recompiles=max_recompiles)


def value_and_grad(fn: Callable[..., Any], argnums: ArgNums = 0, *, target: str = "cpu",
                   dump: str | Path | None = None, debug: bool = False,
                   static_argnames: Iterable[str] | str = (), dynamic: DynamicSpec = False,
                   max_recompiles: int = DEFAULT_MAX_RECOMPILES) -> GradFunction:
    """``(fn(*args), grad(fn, argnums)(*args))`` from one compiled graph."""
    return GradFunction(fn, argnums, True, target=target, dump=dump, debug=debug,
                        static_argnames=static_argnames, dynamic=dynamic,
                        max_recompiles=max_recompiles)


__all__ = ["GradFunction", "grad", "value_and_grad"]
