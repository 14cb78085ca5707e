"""The torch entry points: the Dynamo backend :func:`tilefuse_backend` and :func:`compile_exported`.

**Capture.** Dynamo hands the backend a torch-level FX graph (with parameters and buffers lifted
to inputs and marked static) and example inputs. The graph is re-traced with
``make_fx(functionalize(gm), decomposition_table=core_aten_decompositions())`` under
``torch.no_grad()`` and a fresh, static ``FakeTensorMode``, once per runtime input signature
(shapes, dtypes and the values of integer inputs). Why ``make_fx`` rather than ``aot_autograd``:
tilefuse compiles for concrete shapes, and tracing with a fake mode of our own specialises even
a graph that Dynamo made dynamic (automatic dynamic shapes after a recompile) without touching
Dynamo's shape environment; the traced graph's placeholders are exactly Dynamo's inputs in
order, so the parameter/buffer positions Dynamo marked apply as they are; and inference needs
none of aot_autograd's joint-graph machinery. ``functionalize`` turns in-place ops (``relu_``
of ``ReLU(inplace=True)``) into their functional forms.

**Dynamic sizes.** When Dynamo makes a graph dynamic (``torch.compile(dynamic=True)``,
``torch._dynamo.mark_dynamic``, or its automatic dynamic after a second size), the graph is
traced once on Dynamo's symbolic fakes instead (:class:`SymbolicGraph`,
:mod:`~tilefuse.frontend.torch.symbolic`): its sizes become tilefuse symbols and each region is
one :class:`~tilefuse.runtime.dynamic.DynamicExecutable` serving every size. A graph that
cannot be traced that way is specialised per shape as above, logged on ``recompiles`` with the
reason.

**Parameters and buffers are constants.** Their values when a signature is first compiled are
copied into the tilefuse graphs (so weights are packed once, at compile time). Changing them in
place later (``load_state_dict``, an optimiser step) does not change already compiled code:
call ``torch._dynamo.reset()`` or compile again.

**Training.** When Dynamo compiles a graph with grad mode on and an input (usually a
parameter) that requires grad, the forward and backward are compiled through AOTAutograd with
parameters as runtime inputs (:mod:`~tilefuse.frontend.torch.training`). Dynamo guards on grad
mode, so the same model under ``torch.no_grad()`` compiles as an inference graph with frozen
weights. Ops that run in torch are logged once per graph at WARNING on ``fallback``.

**Options** (``torch.compile(m, backend="tilefuse", options={...})`` or keywords of
:func:`compile_exported`): ``dump`` (directory; default ``$TILEFUSE_DUMP``), ``target``
(``"cpu"``, ``"cuda"`` or ``"reference"``; by default the device the inputs live on:
:mod:`tilefuse.frontend.torch.device`), ``debug`` (verify after every pass), ``quantize``
(``"int8"``, ``"int4"``, ...: the weights of matrix products, :mod:`tilefuse.passes.quantize`),
``devices`` (N: tensor parallel over the N ranks of torch.distributed's default group, one
process per device, weights replicated on each rank: :mod:`tilefuse.distributed`).
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Callable, Mapping, Sequence
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import fx
from torch._decomp import core_aten_decompositions
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.proxy_tensor import make_fx
from torch.utils import _pytree as pytree

from tilefuse.driver import CompileOptions, compile
from tilefuse.dump import resolve_dump_dir
from tilefuse.errors import TilefuseError
from tilefuse.frontend.torch import optimizer, training
from tilefuse.frontend.torch.convert import tensors_on
from tilefuse.frontend.torch.device import follow_data
from tilefuse.frontend.torch.partition import (
    CompiledPartition,
    PartitionReport,
    partition_and_compile,
    write_report,
)
from tilefuse.frontend.torch.symbolic import is_symbolic_graph, trace_symbolic
from tilefuse.graph.ir import Graph
from tilefuse.log import get_logger
from tilefuse.passes.quantize import QuantizeOptions, parse_quantize, pipeline_for
from tilefuse.runtime.executable import Executable
from tilefuse.target import Target

_DECOMPOSITIONS = core_aten_decompositions()
KNOWN_OPTIONS = ("dump", "target", "debug", "quantize", "devices")


@dataclass(frozen=True)
class Options:
    """tilefuse options of one compiled torch graph."""

    dump: Path | None = None
    target: str = "cpu"
    debug: bool = False
    quantize: QuantizeOptions | None = None
    devices: int | None = None

    @staticmethod
    def parse(given: Mapping[str, Any] | None) -> Options:
        given = dict(given or {})
        unknown = sorted(set(given) - set(KNOWN_OPTIONS))
        if unknown:
            raise TilefuseError(f"unknown tilefuse option(s) {', '.join(unknown)} "
                                f"(known: {', '.join(KNOWN_OPTIONS)})")
        target = str(Target.parse(str(given.get("target", "cpu"))))  # TargetError naming it
        devices = given.get("devices")
        if devices is not None and (not isinstance(devices, int) or isinstance(devices, bool)
                                    or devices < 1):
            raise TilefuseError(f"option devices must be a positive number of ranks, got "
                                f"{devices!r}")
        return Options(resolve_dump_dir(given.get("dump")), target, bool(given.get("debug")),
                       parse_quantize(given.get("quantize")), devices)


Key = tuple[Any, ...]


class SpecializedGraph:
    """An FX graph compiled per runtime input signature: a call with a new signature traces the
    graph to core ATen, partitions it and compiles each supported region with tilefuse.

    ``constants`` maps input positions to the tensors frozen into the compiled code; the values
    passed at those positions later are ignored. ``reports`` holds one partition report per
    compiled signature (in order)."""

    def __init__(self, gm: fx.GraphModule, constants: Mapping[int, torch.Tensor],
                 options: Options):
        self._gm = gm
        self._constants = dict(constants)
        self._options = options
        self._cache: dict[Key, Callable[..., Any]] = {}
        self._lock = threading.Lock()
        self._name = graph_name(gm)
        self.reports: list[PartitionReport] = []
        self.traced: dict[Key, fx.GraphModule] = {}
        """The partitioned graph of each compiled signature (what tilefuse.save reads)."""

    def __call__(self, *args: Any) -> Any:
        key = self._key(args)
        compiled = self._cache.get(key)
        if compiled is None:
            compiled = self._compile(key, args)
        return compiled(*args)

    def direct(self) -> list[bool]:
        """Per compiled signature, in order: whether its call goes straight to its one compiled
        region (:func:`direct_call`) rather than through the partitioned FX module."""
        return [not isinstance(c, fx.GraphModule) for c in self._cache.values()]

    def _key(self, args: Sequence[Any]) -> Key:
        return tuple((tuple(a.shape), a.dtype, a.device.type) if isinstance(a, torch.Tensor)
                     else (type(a).__name__, a)
                     for i, a in enumerate(args) if i not in self._constants)

    def _compile(self, key: Key, args: Sequence[Any]) -> fx.GraphModule:
        with self._lock:
            if key in self._cache:
                return self._cache[key]
            if self._cache:
                get_logger("recompiles").debug(
                    "%s: compiling for new input signature %d (this graph is specialised per "
                    "shape): %s", self._name, len(self._cache) + 1, _describe_key(key))
            traced = trace_to_core_aten(self._gm, args,
                                        Target.parse(self._options.target).is_cuda)
            dump = None if self._options.dump is None else \
                self._options.dump / self._name / f"s{len(self._cache)}"
            self.reports.append(compile_traced(traced, self._constants, self._options, dump))
            self.traced[key] = traced
            self._cache[key] = direct_call(traced) or traced
            return self._cache[key]


class SymbolicGraph:
    """An FX graph to which Dynamo gave symbolic sizes, compiled once for every size: traced on
    Dynamo's symbolic fakes (:func:`~tilefuse.frontend.torch.symbolic.trace_symbolic`), each
    region a tilefuse graph with :class:`~tilefuse.graph.types.Sym` dims built as one
    :class:`~tilefuse.runtime.dynamic.DynamicExecutable`, whose guards check every call's sizes
    before native code. ``reports`` has the one partition report."""

    def __init__(self, gm: fx.GraphModule, constants: Mapping[int, torch.Tensor],
                 options: Options):
        self._name = graph_name(gm)
        self._traced = trace_symbolic(gm)
        dump = None if options.dump is None else options.dump / self._name / "symbolic"
        self.reports = [compile_traced(self._traced, constants, options, dump)]

    def __call__(self, *args: Any) -> Any:
        return self._traced(*args)


def direct_call(gm: fx.GraphModule) -> Callable[..., Any] | None:
    """When the partitioned graph is one compiled region fed straight from placeholders and
    returned as it is (the whole model compiled, no torch fallback), a call of that region
    without interpreting the FX module around it (~50-100 µs a call on the BERT layer, with
    the caches cold after the model ran); None otherwise."""
    nodes = list(gm.graph.nodes)
    placeholders = [n for n in nodes if n.op == "placeholder"]
    calls = [n for n in nodes if n.op == "call_module"]
    rest = [n for n in nodes if n.op not in ("placeholder", "call_module", "output")]
    if len(calls) != 1 or rest or not all(a in placeholders for a in calls[0].args) \
            or calls[0].kwargs:
        return None
    part = gm.get_submodule(str(calls[0].target))
    if not isinstance(part, CompiledPartition) or not part.single:
        return None
    out = gm.graph.output_node().args[0]
    positions = [placeholders.index(a) for a in calls[0].args]  # type: ignore[arg-type]
    forward = part.forward
    if out is calls[0]:
        return lambda *args: forward(*[args[p] for p in positions])
    if isinstance(out, tuple | list) and len(out) == 1 and out[0] is calls[0]:
        wrap = type(out)
        return lambda *args: wrap([forward(*[args[p] for p in positions])])
    return None


def graph_name(gm: fx.GraphModule) -> str:
    return "graph-" + hashlib.sha1(gm.code.encode()).hexdigest()[:10]


def compile_traced(traced: fx.GraphModule, frozen: Mapping[int, torch.Tensor],
                   options: Options, dump: Path | None) -> PartitionReport:
    """Partitions a core-ATen graph in place and compiles its regions; ``frozen`` maps
    placeholder positions to the tensors frozen into the compiled code."""
    placeholders = [n for n in traced.graph.nodes if n.op == "placeholder"]
    constants = {placeholders[i]: t.detach() for i, t in frozen.items()}
    with tensors_on("cuda" if options.target.startswith("cuda") else "cpu"):
        report = partition_and_compile(traced, constants, _compiler(options, dump))
    if dump is not None:
        write_report(dump, traced, report)
    training.warn_fallbacks(graph_name(traced), report.fallbacks)
    training.warn_host_steps(graph_name(traced), traced)
    return report


def _compiler(options: Options, dump: Path | None) -> Callable[[Graph, str], Executable]:
    """One region's build: a static graph as one executable, a graph with symbolic input dims
    as one DynamicExecutable (one native build for every size on "cpu")."""
    def compile_graph(graph: Graph, name: str) -> Executable:
        where = None if dump is None else dump / name
        devices = None
        if options.devices is not None and options.devices > 1:
            from tilefuse.distributed.build import Devices

            devices = Devices(options.devices)
        return compile(graph, options.target, CompileOptions(
            dump_dir=where, debug=options.debug, pipeline=pipeline_for(options.quantize),
            devices=devices))
    return compile_graph


def _describe_key(key: Key) -> str:
    return ", ".join(f"{str(part[1]).replace('torch.', '')}{list(part[0])}"
                     if isinstance(part[0], tuple) else f"{part[0]} {part[1]!r}"
                     for part in key)


def trace_to_core_aten(gm: fx.GraphModule, args: Sequence[Any],
                       fused_attention: bool = False) -> fx.GraphModule:
    """``gm`` traced on ``args`` (specialised to their shapes) into a functional core-ATen FX
    graph whose placeholders are ``args`` in order; dead nodes removed. ``fused_attention``
    (the cuda target) keeps each SDPA call one fused op (``aten_attention.FusedAttention``)."""
    from tilefuse.frontend.torch.aten_attention import FusedAttention

    mode = FakeTensorMode()
    fakes = [mode.from_tensor(a) if isinstance(a, torch.Tensor) else a for a in args]
    functional = torch.func.functionalize(gm, remove="mutations")
    with torch.no_grad(), mode, (FusedAttention() if fused_attention else nullcontext()):
        traced = make_fx(functional, decomposition_table=_DECOMPOSITIONS,
                         tracing_mode="real")(*fakes)
    traced.graph.eliminate_dead_code()
    traced.recompile()
    return traced


def _is_parameter_or_buffer(node: fx.Node, value: Any) -> bool:
    """Dynamo marks lifted parameters and buffers as static inputs."""
    if isinstance(value, torch.nn.Parameter):
        return True
    static = node.meta.get("tensor_dict", {}).get("_dynamo_static_input_type")
    return static is not None


def tilefuse_backend(gm: fx.GraphModule, example_inputs: Sequence[Any],
                     **kwargs: Any) -> Callable[..., Any]:
    """The Dynamo backend: ``torch.compile(model, backend="tilefuse", options={...})``.

    Returns a callable taking and returning torch tensors. See the module docstring for what is
    compiled, what runs in torch and which options exist."""
    options = follow_data(Options.parse(kwargs.get("options")), kwargs.get("options"),
                          example_inputs)
    if training.needs_training(example_inputs):  # forward and backward through AOTAutograd
        if options.devices is not None and options.devices > 1:
            raise TilefuseError(f"{graph_name(gm)}: devices={options.devices} compiles "
                                f"inference graphs only (call the model under torch.no_grad()), "
                                f"or drop the devices option")
        return training.compile_training(gm, example_inputs, options, graph_name(gm))
    state = optimizer.stateful_attributes(gm)   # an optimizer step: state updated in place
    if state:
        return optimizer.compile_stateful(gm, state, options)
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    constants = {i: v for i, (n, v) in enumerate(zip(placeholders, example_inputs))
                 if isinstance(v, torch.Tensor) and _is_parameter_or_buffer(n, v)}
    if is_symbolic_graph(gm) and not options.devices:
        try:
            return SymbolicGraph(gm, constants, options)
        except Exception as err:  # any tracing or build failure: specialise per shape
            get_logger("recompiles").warning(
                "%s: Dynamo made this graph dynamic but it cannot be compiled with symbolic "
                "sizes (%s: %s); tilefuse specialises it per input shape", graph_name(gm),
                type(err).__name__, err)
    return SpecializedGraph(gm, constants, options)


class CompiledExported:
    """:func:`compile_exported`'s result: call it with the exported program's user inputs
    (positional and keyword, as the original module took them)."""

    def __init__(self, ep: torch.export.ExportedProgram, options: Options):
        from torch.export.graph_signature import InputKind, OutputKind
        ep = ep.run_decompositions(_DECOMPOSITIONS)
        signature = ep.graph_signature
        constants: dict[int, torch.Tensor] = {}
        self._user_positions: list[int] = []
        for i, spec in enumerate(signature.input_specs):
            if spec.kind == InputKind.USER_INPUT:
                self._user_positions.append(i)
            elif spec.kind in (InputKind.PARAMETER, InputKind.BUFFER,
                               InputKind.CONSTANT_TENSOR):
                source = ep.state_dict if spec.target in ep.state_dict else ep.constants
                constants[i] = source[spec.target]
            else:
                raise TilefuseError(f"exported input {spec.arg.name} of kind {spec.kind.name} "
                                    f"is not supported")
        self._n_inputs = len(signature.input_specs)
        self._constants = constants
        self._user_outputs = [i for i, spec in enumerate(signature.output_specs)
                              if spec.kind == OutputKind.USER_OUTPUT]
        self._out_spec = ep.call_spec.out_spec
        self.graph = SpecializedGraph(ep.graph_module, constants, options)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        flat, _ = pytree.tree_flatten((args, kwargs))
        if len(flat) != len(self._user_positions):
            raise TilefuseError(f"the exported program takes {len(self._user_positions)} "
                                f"inputs, got {len(flat)}")
        full: list[Any] = [None] * self._n_inputs
        for i, t in self._constants.items():
            full[i] = t
        for i, a in zip(self._user_positions, flat):
            full[i] = a
        with torch.no_grad():
            outs = self.graph(*full)
        user = [outs[i] for i in self._user_outputs]
        return pytree.tree_unflatten(user, self._out_spec) if self._out_spec else user


def compile_exported(ep: torch.export.ExportedProgram, *, dump: str | Path | None = None,
                     target: str = "cpu", debug: bool = False,
                     quantize: str | None = None) -> CompiledExported:
    """Compiles an exported program (``torch.export.export(model, args)``) for inference:
    decomposed to core ATen, parameters, buffers and constants frozen, unsupported ops run in
    torch. The result takes and returns torch tensors."""
    if not isinstance(ep, torch.export.ExportedProgram):
        raise TilefuseError(f"compile_exported needs a torch.export.ExportedProgram, got "
                            f"{type(ep).__name__}")
    return CompiledExported(ep, Options.parse({"dump": dump, "target": target,
                                               "debug": debug, "quantize": quantize}))


__all__ = ["CompiledExported", "Options", "SpecializedGraph", "SymbolicGraph", "compile_exported",
           "tilefuse_backend", "trace_to_core_aten"]
