"""Weight quantization: matrix products against constant f32 weights become quantized ops.

``quantize="int8"``: ``matmul(x, W)`` with a constant 2-D f32 ``W [K, N]`` becomes
``qmatmul_i8`` with W quantized symmetrically per output channel (``s[n] = max|W[:, n]|/127``)
and x quantized per row at run time (:mod:`tilefuse.ops.quant`). ``quantize="int4"`` (or
``"int4:64"``, ``"int4:32"``; ``+zp`` for zero points) gives ``matmul_w4``: W in 4 bits per group
of G rows of K, symmetric (zero point 8, codes -7..7) or asymmetric (zero point per group and
column). A following ``add`` of a constant bias [N] and a ``relu`` are absorbed into the op,
so the native kernel applies them to its accumulators; so is an exact GELU (the ``gelu`` op or
NumPy's ``0.5*v*(1 + erf(v/sqrt 2))`` written out). Convolutions are covered because
``conv_lowering`` runs first and turns a conv2d with a constant weight into such a matmul; with
int8 its im2col operand is read in place by ``qconv_i8`` (:mod:`tilefuse.passes.quantize_conv`).
A product whose activation is a QuantizeLinear/DequantizeLinear pair (a QDQ ONNX model) reads
the pair's input with its static scale and zero point instead of quantizing per row; mode
"qdq" (the default of such ONNX models) quantizes only those products.

The pass runs last in the pipeline (:func:`pipeline_for`), after folding and equality
saturation have made weights plain constants. Products it leaves in f32 are logged on the
``passes`` topic with the reason (a non-constant weight, K not a multiple of any group, too
small to pay).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np

from tilefuse.errors import TilefuseError
from tilefuse.graph.analysis import users
from tilefuse.graph.builder import GraphBuilder
from tilefuse.graph.ir import Graph, Literal, Node, Value
from tilefuse.log import get_logger
from tilefuse.ops.quant import WEIGHT_QUANTIZED
from tilefuse.passes.dce import dce
from tilefuse.passes.manager import PassSpec
from tilefuse.passes.quantize_conv import (
    ConvWindow,
    QdqSource,
    conv_window,
    fuse_epilogues,
    qdq_source,
    replay,
)
from tilefuse.passes.rewrite import rewrite_nodes

MODES = ("int8", "int4", "fp8", "qdq")
GROUPS = (128, 64, 32)
MIN_WEIGHTS = 4096
"""Weights with fewer elements stay f32: the quantization of x costs more than it saves."""

_F32 = np.float32


class QuantizeError(TilefuseError):
    """A ``quantize`` option that names no known scheme."""


@dataclass(frozen=True)
class QuantizeOptions:
    """What to quantize to: ``mode`` "int8", "int4" or "fp8" (cuda only); for int4 the
    ``group`` size along K and whether groups get ``zero_points`` (asymmetric) or are
    symmetric. ``target`` "cuda" makes the GPU's weight-only ops
    (:mod:`tilefuse.passes.quantize_gpu`); :func:`for_target` sets it. "qdq" (CPU; what an
    ONNX model with QuantizeLinear/DequantizeLinear pairs gets by default) puts only the
    products whose activation such a pair quantizes on the int8 kernel, with the pair's
    static scale."""

    mode: str
    group: int = 128
    zero_points: bool = False
    target: str = "cpu"

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise QuantizeError(f"quantize must be one of {list(MODES)}, got {self.mode!r}")
        if self.group not in GROUPS:
            raise QuantizeError(f"the int4 group size must be one of {list(GROUPS)}, "
                                f"got {self.group}")

    def __str__(self) -> str:
        if self.mode in ("int8", "fp8", "qdq"):
            return self.mode
        return f"int4:{self.group}{'+zp' if self.zero_points else ''}"


def parse_quantize(value: str | QuantizeOptions | None) -> QuantizeOptions | None:
    """``None``/"none"/"" (no quantization), "int8", "int4", "int4:64", "int4:32+zp", or
    options as they are. QuantizeError names what was wrong."""
    if value is None or isinstance(value, QuantizeOptions):
        return value
    if not isinstance(value, str):
        raise QuantizeError(f"quantize must be a string such as 'int8' or 'int4', got "
                            f"{type(value).__name__}")
    text = value.strip().lower()
    if text in ("", "none", "f32", "off"):
        return None
    zero_points = text.endswith("+zp")
    text = text.removesuffix("+zp")
    mode, _, group = text.partition(":")
    if mode in ("int8", "fp8", "qdq") and (group or zero_points):
        raise QuantizeError(f"{mode} takes no group size or zero points, got {value!r}")
    try:
        size = int(group) if group else 128
    except ValueError:
        raise QuantizeError(f"bad int4 group size in {value!r}") from None
    return QuantizeOptions(mode, size, zero_points)


# ---- weight quantization (build time, NumPy) ------------------------------------------------

def _grid_codes(w: np.ndarray, g: np.ndarray) -> np.ndarray:
    """Per column: whether ``w[:, n]`` is ``q * g[n]`` with integers |q| <= 127, to within
    f32 rounding (2 ulp: a scale divided by a small integer is rounded once more)."""
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        q = np.rint(w / g)
        err = np.abs(q * g.astype(np.float64) - w) <= 2.5e-7 * np.abs(w)
        ok = np.all(np.abs(q) <= 127, axis=0) & np.all(err, axis=0)
    return ok & np.isfinite(g) & (g > 0)


def _integer_grid(w: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
    """(q, g) with ``w = q * g[n]`` per column (to f32 rounding) when w already is an int8
    grid (a QDQ model's weights, dequantized at import), else None (then
    :func:`quantize_int8` rounds as usual). Candidate steps: the smallest magnitude of the
    whole tensor (a per-tensor scale), then each column's smallest magnitude divided by
    1..16 (a per-channel scale whose column has no code ±1)."""
    a = np.where(w != 0, np.abs(w), np.inf).astype(_F32)
    col_min = np.min(a, axis=0)
    g = np.where(np.isfinite(col_min), np.min(a), _F32(1)).astype(_F32)
    ok = _grid_codes(w, g)
    for j in range(1, 17):
        if ok.all():
            break
        left = ~ok
        trial = g.copy()
        trial[left] = np.where(np.isfinite(col_min[left]), col_min[left] / _F32(j), _F32(1))
        good = _grid_codes(w[:, left], trial[left])
        idx = np.flatnonzero(left)[good]
        g[idx] = trial[idx]
        ok[idx] = True
    if not ok.all():
        return None
    return np.rint(w / g).astype(np.int8), g.astype(_F32)


def quantize_int8(w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Symmetric per output channel: (q i8 [K, N] in -127..127, scale f32 [N]); a weight that
    already is an int8 grid per column keeps its codes exactly (:func:`_integer_grid`)."""
    w = np.asarray(w, _F32)
    exact = _integer_grid(w) if w.size else None
    if exact is not None:
        return exact
    amax = np.max(np.abs(w), axis=0)
    scale = np.where(amax > 0, amax / _F32(127), _F32(1)).astype(_F32)
    q = np.clip(np.rint(w / scale), -127, 127).astype(np.int8)
    return q, scale


def quantize_int4(w: np.ndarray, group: int, zero_points: bool
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per group of ``group`` rows of K: (packed u8 [K/2, N], scales f32 [K/G, N], zero
    points u8 [K/G, N]). Symmetric: codes -7..7 around 8; asymmetric: 0..15 over [min, max]."""
    w = np.asarray(w, _F32)
    k, n = w.shape
    blocks = w.reshape(k // group, group, n)
    if zero_points:
        lo = np.minimum(blocks.min(axis=1), 0)
        hi = np.maximum(blocks.max(axis=1), 0)
        scale = np.where(hi > lo, (hi - lo) / _F32(15), _F32(1)).astype(_F32)
        zero = np.clip(np.rint(-lo / scale), 0, 15).astype(np.uint8)
    else:
        amax = np.max(np.abs(blocks), axis=1)
        scale = np.where(amax > 0, amax / _F32(7), _F32(1)).astype(_F32)
        zero = np.full(scale.shape, 8, np.uint8)
    q = np.rint(blocks / scale[:, None, :]) + zero[:, None, :]
    q = np.clip(q, 0, 15).astype(np.uint8).reshape(k, n)
    packed = (q[0::2] | (q[1::2] << 4)).astype(np.uint8)
    return packed, scale, zero


# ---- the pass --------------------------------------------------------------------------------

def _constant(value: Value, producers: dict[Value, Node]) -> np.ndarray | None:
    node = producers.get(value)
    if node is None or node.op.name != "constant":
        return None
    literal = node.attrs["value"]
    return literal.array if isinstance(literal, Literal) else None


def _only_user(value: Value, readers: dict[Value, list[Node]], graph: Graph) -> Node | None:
    found = readers.get(value, [])
    if len(found) != 1 or value in graph.outputs:
        return None
    return found[0]


def _bias_of(node: Node, mm_out: Value, producers: dict[Value, Node], n: int
             ) -> np.ndarray | None:
    """The [N] bias of ``add(mm, b)`` / ``add(b, mm)`` when b is a constant that broadcasts
    only along N and the add keeps the product's type."""
    if node.op.name != "add" or node.outputs[0].type != mm_out.type:
        return None
    other = node.inputs[1] if node.inputs[0] is mm_out else node.inputs[0]
    if other is mm_out:
        return None
    array = _constant(other, producers)
    if array is None or array.dtype != np.float32 or array.size != n \
            or (array.ndim and array.shape[-1] != n):
        return None
    return array.reshape(n)


def _is_relu(node: Node, value: Value, producers: dict[Value, Node]) -> bool:
    """``relu(v)`` or ``maximum(v, 0)`` / ``maximum(0, v)`` keeping v's type."""
    if node.outputs[0].type != value.type:
        return False
    if node.op.name == "relu":
        return True
    if node.op.name != "maximum" or value not in node.inputs:
        return False
    other = node.inputs[1] if node.inputs[0] is value else node.inputs[0]
    array = _constant(other, producers)
    return array is not None and array.size == 1 and float(array.reshape(())) == 0.0


def _scalar(value: Value, producers: dict[Value, Node]) -> float | None:
    array = _constant(value, producers)
    if array is None or array.size != 1 or array.dtype != np.float32:
        return None
    return float(array.reshape(()))


def _other(node: Node, value: Value) -> Value | None:
    """The other operand of a binary ``node`` reading ``value`` once."""
    if len(node.inputs) != 2 or (node.inputs[0] is value) == (node.inputs[1] is value):
        return None
    return node.inputs[1] if node.inputs[0] is value else node.inputs[0]


_SQRT2 = float(np.float32(np.sqrt(2.0)))


def _gelu_chain(value: Value, readers: dict[Value, list[Node]],
                producers: dict[Value, Node], graph: Graph) -> list[Node] | None:
    """The nodes of ``0.5*v * (1 + erf(v / sqrt 2))`` written out (NumPy's GELU, the
    reference's order), or of ``(v * (1 + erf(v / sqrt 2))) * 0.5`` (torch's ONNX export:
    the same value, a product by 0.5 being exact but for subnormals), when they read ``v`` and
    each other only; None otherwise. The last node (a mul) writes the result."""
    found = readers.get(value, [])
    if len(found) != 2 or value in graph.outputs:
        return None
    div = next((n for n in found if n.op.name == "div" and n.inputs[0] is value
                and _scalar(n.inputs[1], producers) == _SQRT2), None)
    other = next((n for n in found if n is not div), None)
    if div is None or other is None or other.op.name != "mul":
        return None
    erf = _only_user(div.outputs[0], readers, graph)
    if erf is None or erf.op.name != "erf":
        return None
    plus = _only_user(erf.outputs[0], readers, graph)
    if plus is None or plus.op.name != "add" or \
            _scalar(_other(plus, erf.outputs[0]) or value, producers) != 1.0:
        return None
    last = _only_user(plus.outputs[0], readers, graph)
    if last is None or last.op.name != "mul":
        return None
    if _scalar(_other(other, value) or value, producers) == 0.5:   # 0.5*v first
        if _other(last, plus.outputs[0]) is not other.outputs[0] \
                or _only_user(other.outputs[0], readers, graph) is not last:
            return None
        chain = [other, div, erf, plus, last]
    elif other is last and _other(last, value) is plus.outputs[0]:   # v * (1 + erf), * 0.5
        half = _only_user(last.outputs[0], readers, graph)
        if half is None or half.op.name != "mul" or \
                _scalar(_other(half, last.outputs[0]) or value, producers) != 0.5:
            return None
        chain = [div, erf, plus, last, half]
    else:
        return None
    if any(n.outputs[0].type != value.type for n in chain):
        return None
    return chain


def _activation(value: Value, readers: dict[Value, list[Node]], producers: dict[Value, Node],
                graph: Graph) -> tuple[str, list[Node]]:
    """The activation applied to ``value`` that the kernel can fuse and the nodes that make
    it: relu / maximum(v, 0), the ``gelu`` op (exact), or its NumPy spelling."""
    user = _only_user(value, readers, graph)
    if user is not None and _is_relu(user, value, producers):
        return "relu", [user]
    if user is not None and user.op.name == "gelu" and user.attrs["approximate"] == "none" \
            and user.outputs[0].type == value.type:
        return "gelu", [user]
    chain = _gelu_chain(value, readers, producers, graph)
    return ("gelu", chain) if chain is not None else ("none", [])


def _group_for(k: int, options: QuantizeOptions) -> int | None:
    for g in GROUPS:
        if g <= options.group and k % g == 0:
            return g
    return None


def _conv_plan(node: Node, producers: dict[Value, Node], options: QuantizeOptions
               ) -> tuple[ConvWindow | None, QdqSource | None]:
    """The window (a lowered convolution) and the QDQ pair behind the product's activation,
    for int8 and qdq (int4 reads the activation as it is)."""
    if options.mode == "int4":
        return None, None
    a = node.inputs[0]
    window = conv_window(a, producers)
    qdq = qdq_source(window.s if window is not None else a, producers)
    return window, qdq


def quantize_weights(graph: Graph, options: QuantizeOptions) -> tuple[Graph, bool]:
    """``graph`` with every matmul against a constant f32 weight quantized (module docstring);
    for the cuda target the GPU's weight-only ops (:mod:`tilefuse.passes.quantize_gpu`)."""
    if options.target == "cuda":
        if options.mode == "qdq":
            raise QuantizeError("quantize='qdq' (a QDQ model's static int8) runs on the CPU's "
                                "integer kernels; the cuda target takes int8, int4 or fp8")
        from tilefuse.passes.quantize_gpu import quantize_weights_gpu

        return quantize_weights_gpu(graph, options, MIN_WEIGHTS)
    if options.mode == "fp8":
        raise QuantizeError("quantize='fp8' is for the cuda target (e4m3 weights for its "
                            "tensor cores); the CPU takes int8 or int4")
    log = get_logger("passes")
    producers = graph.producers()
    readers = users(graph)
    absorbed: dict[Node, Value] = {}   # add / relu node -> the quantized op's output
    plans: dict[Node, tuple[np.ndarray, Node | None, str, ConvWindow | None,
                            QdqSource | None]] = {}
    for node in graph.nodes:
        if node.op.name != "matmul":
            continue
        x, b = node.inputs
        w = _constant(b, producers)
        why = None
        window = qdq = None
        if w is None or w.ndim != 2 or w.dtype != np.float32:
            why = "the weight is not a constant 2-D f32 matrix"
        elif x.dtype.np != np.float32 or x.type.rank < 1:
            why = "the activation is not f32"
        elif w.size < MIN_WEIGHTS:
            why = f"{w.size} weights are too few to pay for quantizing x"
        elif options.mode == "int4" and _group_for(w.shape[0], options) is None:
            why = f"K = {w.shape[0]} is no multiple of an int4 group (32, 64, 128)"
        else:
            window, qdq = _conv_plan(node, producers, options)
            if window is None and not all(isinstance(d, int) for d in x.shape):
                qdq = None   # qconv_i8 needs static shapes
            if options.mode == "qdq" and qdq is None:
                why = "no QuantizeLinear/DequantizeLinear pair quantizes its activation"
        if why is not None:
            if w is not None:
                log.debug("%s stays f32: %s", node.outputs[0].type, why)
            continue
        out = node.outputs[0]
        add = _only_user(out, readers, graph)
        bias = _bias_of(add, out, producers, w.shape[1]) if add is not None else None
        if bias is None:
            add = None
        last = add.outputs[0] if add is not None else out
        act, act_nodes = _activation(last, readers, producers, graph)
        plans[node] = (w, add, act, window, qdq)
        for absorbed_node in (add, *act_nodes):
            if absorbed_node is not None:
                absorbed[absorbed_node] = out
    if not plans:
        return graph, False
    made: dict[Value, Value] = {}

    def resolve(value: Value) -> Value:
        """``value`` in the graph being built: rewritten products and graph inputs (which
        rewrite_nodes re-creates, in order) have new values; kept nodes keep theirs."""
        if value in graph.inputs:
            return builder_inputs[0][graph.inputs.index(value)]
        return made.get(value, value)

    builder_inputs: list[list[Value]] = []

    def rule(builder: GraphBuilder, node: Node, inputs: tuple[Value, ...]) -> list[Value] | None:
        if not builder_inputs:
            builder_inputs.append(builder._inputs)
        if node in absorbed:
            made[node.outputs[0]] = made[absorbed[node]]
            return [made[absorbed[node]]]
        if node not in plans:
            return None
        w, add, act, window, qdq = plans[node]
        n = w.shape[1]
        bias = _bias_of(add, node.outputs[0], producers, n) if add is not None else None
        bias = np.zeros(n, _F32) if bias is None else np.asarray(bias, _F32)

        def const(array: np.ndarray) -> Value:
            return builder.add1("constant", [], {"value": Literal(array)}, node.loc)

        if window is not None or qdq is not None:
            value = _qconv(builder, node, window, qdq, resolve, act,
                           [const(a) for a in (*quantize_int8(w), bias)])
        elif options.mode == "int8":
            q, scale = quantize_int8(w)
            value = builder.add1("qmatmul_i8", [inputs[0], const(q), const(scale), const(bias)],
                                 {"act": act}, node.loc)
        else:
            group = _group_for(w.shape[0], options)
            packed, scales, zeros = quantize_int4(w, group, options.zero_points)
            value = builder.add1("matmul_w4", [inputs[0], const(packed), const(scales),
                                               const(zeros), const(bias)],
                                 {"group": group, "act": act}, node.loc)
        made[node.outputs[0]] = value
        return [value]

    return rewrite_nodes(graph, rule)


def _qconv(builder: GraphBuilder, node: Node, window: ConvWindow | None, qdq: QdqSource | None,
           resolve: Callable[[Value], Value], act: str, weights: list[Value]) -> Value:
    """The ``qconv_i8`` of a product: over the window's input (a lowered convolution) or over
    the activation matrix as a 1x1 window; reading y through the QDQ pair's static
    quantization when there is one, else quantizing each row at run time."""
    attrs: dict = {"act": act}
    steps = window.steps if window is not None else ()
    pad = steps[-1] if steps and steps[-1].op.name == "pad" else None
    if pad is not None and (any(pad.attrs["pads"][i] for i in (0, 1, 6, 7))
                            or any(n.op.name != "reshape" for n in steps[:-1])):
        pad = None   # only a zero padding of H and W after reshapes is read by the kernel
    if qdq is not None:
        source = replay(builder, qdq.movements, resolve(qdq.y))
        st = qdq.static
        attrs.update(x_scale=st.scale, x_zero=st.zero, x_min=st.lo, x_max=st.hi)
        if pad is None and any(n.op.name != "reshape" for n in steps):
            source = replay(builder, steps, source)
    elif pad is not None:
        source = resolve(window.s)  # type: ignore[union-attr]
    else:
        source = resolve(window.p)  # type: ignore[union-attr]
    if window is not None:
        attrs.update(window.attrs)
        p = source
        view = pad.inputs[0] if pad is not None else window.p
        if pad is not None:
            attrs.update(pads=tuple(int(pad.attrs["pads"][i]) for i in (2, 3, 4, 5)))
        if tuple(p.shape) != tuple(view.shape):   # reshapes alone: read in place
            attrs.update(nhwc=tuple(int(d) for d in view.shape))
    else:
        k = int(source.shape[-1])
        m = int(np.prod(source.shape[:-1], dtype=np.int64))
        p = source
        attrs.update(kernel=(1, 1), nhwc=(1, 1, m, k))
    value = builder.add1("qconv_i8", [p, *weights], attrs, node.loc)
    if value.shape != node.outputs[0].shape:
        value = builder.add1("reshape", [value], {"shape": tuple(node.outputs[0].shape)},
                             node.loc)
    return value


@dataclass(frozen=True)
class QuantSummary:
    """What quantization did to a graph's weights: ops made and constant bytes before/after."""

    kernels: int
    f32_bytes: int
    quantized_bytes: int

    @property
    def saved(self) -> int:
        return self.f32_bytes - self.quantized_bytes

    def __str__(self) -> str:
        if not self.kernels:
            return "no quantized products"
        ratio = self.f32_bytes / max(1, self.quantized_bytes)
        return (f"{self.kernels} quantized products: weights {self.f32_bytes / 2**20:.2f} MiB "
                f"f32 -> {self.quantized_bytes / 2**20:.2f} MiB ({ratio:.1f}x smaller, "
                f"{self.saved / 2**20:.2f} MiB saved)")


def quantization_summary(graph: Graph) -> QuantSummary:
    """Counts the quantized ops of ``graph`` and the bytes their weights take against f32."""
    producers = graph.producers()
    count = before = after = 0
    for node in graph.nodes:
        if node.op not in WEIGHT_QUANTIZED and node.op.name != "matmul_wq":
            continue
        count += 1
        n = node.outputs[0].shape[-1]
        k = node.inputs[1].shape[0] if node.op.name == "qconv_i8" else node.inputs[0].shape[-1]
        before += int(k) * int(n) * 4
        weights = node.inputs[1:3] if node.op.name == "qconv_i8" else node.inputs[1:-1]
        for v in weights:   # the weight and its scales / zero points, not the bias
            array = _constant(v, producers)
            after += array.nbytes if array is not None else 0
    return QuantSummary(count, before, after)


@functools.lru_cache(maxsize=16)
def pipeline_for(options: QuantizeOptions | None,
                 base: tuple[PassSpec, ...] | None = None) -> tuple[PassSpec, ...]:
    """``base`` (default: the graph pipeline), with ``quantize`` and a cleanup DCE at its end
    when asked for."""
    from tilefuse.passes.pipeline import GRAPH_PIPELINE

    base = GRAPH_PIPELINE if base is None else base
    if options is None:
        return base
    return (*base,
            PassSpec("quantize", functools.partial(quantize_weights, options=options),
                     f"matmuls against constant weights -> {options} quantized ops"),
            PassSpec("qconv_epilogue", fuse_epilogues,
                     "elementwise chains after qconv_i8 -> its tile epilogue"),
            PassSpec("dce", dce, "drop the f32 weights the quantized ops replaced"))


def for_target(pipeline: tuple[PassSpec, ...] | None, target: object
               ) -> tuple[PassSpec, ...] | None:
    """``pipeline`` with its ``quantize`` pass made for ``target`` (a Target or its name):
    the cuda target quantizes to the GPU's weight-only ops; other targets keep it as is."""
    if pipeline is None or not str(target).startswith("cuda"):
        return pipeline
    out = []
    for spec in pipeline:
        given = getattr(spec.fn, "keywords", {}).get("options")
        if spec.name == "quantize" and isinstance(given, QuantizeOptions):
            options = replace(given, target="cuda")
            spec = PassSpec("quantize", functools.partial(quantize_weights, options=options),
                            f"matmuls against constant weights -> {options} weight-only "
                            f"GPU products")
        out.append(spec)
    return tuple(out)


__all__ = ["MODES", "QuantSummary", "QuantizeError", "QuantizeOptions", "for_target",
           "parse_quantize", "pipeline_for", "quantization_summary", "quantize_int4",
           "quantize_int8", "quantize_weights"]
