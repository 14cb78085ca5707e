"""The launch sequence of a native executable: steps that run compiled kernels or, where no
native lowering exists, the ops' NumPy references on the host.

Every buffer a step touches is a *slot*: an ``int`` indexes the call's table (the call's input
arrays followed by its fresh output arrays); an array is fixed for the executable's lifetime (a
constant, or a view into the arena). Slots are resolved when the executable is built and the
fixed arrays are checked against the kernels' buffer declarations then (as a checked kernel call
would check them), so a call only fills in the addresses of its own arrays and calls the kernels
unchecked.
"""

from __future__ import annotations

import ctypes
import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from tilefuse.codegen.abi import CompiledKernel, KernelCall, aligned_empty, check_arguments
from tilefuse.errors import CompileError, GuardError
from tilefuse.graph.ir import Node, Value

Slot = int | np.ndarray


def resolve(slot: Slot, table: Sequence[np.ndarray]) -> np.ndarray:
    """The array a slot stands for in one call."""
    return table[slot] if isinstance(slot, int) else slot


class KernelLaunch:
    """One call of a compiled kernel, its buffer arguments given as slots (in the kernel's
    buffer order), its scalars (runtime extents of a symbolic kernel) as ints. Fixed arrays are
    checked once, here; the call's own arrays (inputs, checked by the executable's guard, and
    fresh outputs) are only looked up."""

    __slots__ = ("_arrays", "_buffers", "_call", "_dynamic", "_pointers", "_scalars", "args",
                 "kernel", "scalars")

    def __init__(self, kernel: CompiledKernel, args: Sequence[Slot],
                 scalars: Sequence[int] = ()):
        buffers = kernel.signature.buffers
        self.kernel = kernel
        self.args = tuple(args)
        self.scalars = tuple(int(n) for n in scalars)
        if len(self.scalars) != len(kernel.signature.scalars):
            raise CompileError(f"kernel {kernel.name} takes {len(kernel.signature.scalars)} "
                               f"scalars, got {len(self.scalars)}")
        # the call's own arrays are stood in for by aligned scratch of the right dtype
        probe = [aligned_empty(1, b.dtype.np) if isinstance(a, int) else a
                 for a, b in zip(self.args, buffers)]
        try:
            check_arguments(kernel.name, buffers, (), probe)  # scalars: i64 sizes, checked above
        except GuardError as err:
            raise CompileError(f"a build-time array does not suit its kernel: {err}") from None
        self._arrays = tuple(a for a in self.args if not isinstance(a, int))  # kept alive
        self._pointers = [0 if isinstance(a, int) else a.ctypes.data for a in self.args]
        self._dynamic = tuple((pos, a) for pos, a in enumerate(self.args) if isinstance(a, int))
        entry, buffer_table, scalar_table = kernel.raw_entry()
        self._buffers = buffer_table(*self._pointers)   # kept alive; dynamic slots rewritten
        self._scalars = scalar_table(*self.scalars)
        buffers_at, scalars_at = ctypes.addressof(self._buffers), ctypes.addressof(self._scalars)
        self._call = functools.partial(entry, buffers_at, scalars_at, 0)

    def call_spec(self) -> KernelCall:
        """This launch as one call of a whole-sequence launcher (fixed addresses baked in)."""
        dynamic = dict(self._dynamic)
        buffers = tuple(("io", dynamic[pos]) if pos in dynamic else ("fixed", address)
                        for pos, address in enumerate(self._pointers))
        return KernelCall(self.kernel, buffers, self.scalars)

    def run(self, table: Sequence[np.ndarray]) -> None:
        self.run_addresses([a.ctypes.data for a in table])

    def run_addresses(self, addresses: Sequence[int]) -> None:
        """Runs with the call's arrays given by address (``addresses[i]`` is table[i]'s data):
        the executable computes each address once per call, however many kernels read it."""
        buffers = self._buffers
        for pos, index in self._dynamic:
            buffers[pos] = addresses[index]
        self._call()


@dataclass(frozen=True)
class NativeStep:
    """A kernel group run as compiled code: its kernels in order."""

    name: str
    launches: tuple[KernelLaunch, ...]

    def run(self, table: Sequence[np.ndarray]) -> None:
        self.run_addresses([a.ctypes.data for a in table])

    def run_addresses(self, addresses: Sequence[int]) -> None:
        for launch in self.launches:
            launch.run_addresses(addresses)


@dataclass(frozen=True)
class HostStep:
    """A kernel group run node by node with the NumPy references (a fallback, with its
    ``reason``). Results are copied into the planned buffers of the group's outputs."""

    name: str
    nodes: tuple[Node, ...]
    inputs: Mapping[Value, Slot]
    outputs: Mapping[Value, Slot]
    reason: str

    def run(self, table: Sequence[np.ndarray]) -> None:
        from tilefuse.graph.interpreter import run_node  # the ops' references: host steps only

        env = {v: resolve(s, table) for v, s in self.inputs.items()}
        for node in self.nodes:
            env.update(zip(node.outputs, run_node(node, [env[v] for v in node.inputs])))
        for value, slot in self.outputs.items():
            np.copyto(resolve(slot, table), env[value], casting="no")


Step = NativeStep | HostStep
