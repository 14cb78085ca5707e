"""Every op of the registry, in a small graph of its own, cross-compiles for cuda with no host
step (issue 26: whatever compiles natively on the CPU compiles natively on the GPU). Ops that
cannot be such a graph on their own, or that the cuda target never sees, are listed in
:data:`EXEMPT` with the reason; a new op must join one table or the other."""

from __future__ import annotations

import logging
from collections.abc import Callable

import numpy as np
import pytest

from tilefuse.dtypes import DType
from tilefuse.graph.builder import GraphBuilder
from tilefuse.graph.ir import Graph, Literal, Value
from tilefuse.ops import OPS
from tilefuse.runtime.gpu_cross import cross_compile

F32, F16, BF16, I32, I64, BOOL = DType.f32, DType.f16, DType.bf16, DType.i32, DType.i64, DType.bool
Make = Callable[[GraphBuilder], list[Value]]

EW1 = ("abs", "ceil", "cos", "erf", "exp", "expm1", "floor", "gelu", "isnan", "log", "log1p",
       "neg", "reciprocal", "relu", "round", "rsqrt", "sigmoid", "sign", "silu", "sin",
       "softplus", "sqrt", "tanh")
EW2 = ("add", "div", "eq", "floordiv", "ge", "gt", "le", "lt", "maximum", "minimum", "mod",
       "mul", "ne", "pow", "sub")
LOGICAL = ("logical_and", "logical_or", "logical_xor")
REDUCTIONS = ("sum", "mean", "max", "min", "prod", "var")

EXEMPT: dict[str, str] = {
    "constant": "a source: folded into the program's constants",
    "onnx_node": "an ONNX node run by onnx's reference (the importer's per-node fallback): a "
                 "host step on every target by design",
    "all_gather": "a collective: only in distributed rank programs",
    "all_reduce": "a collective: only in distributed rank programs",
    "qmatmul_i8": "made by the CPU's quantize pass only (the cuda target's makes matmul_wq)",
    "matmul_wq": "the cuda quantize pass's product: tests/cross/test_cuda_quant.py",
}


def _x(b: GraphBuilder, shape: tuple[int, ...], dtype: DType, name: str = "x") -> Value:
    return b.input((shape, dtype), name)


def _const(b: GraphBuilder, array: np.ndarray) -> Value:
    return b.add1("constant", [], {"value": Literal(array)})


CASES: dict[str, list[tuple[str, Make]]] = {}


def case(op: str, label: str, make: Make) -> None:
    CASES.setdefault(op, []).append((label, make))


for _op in EW1:
    for _dt in (F32, F16, I32):
        if _op in ("erf", "gelu", "cos", "sin", "exp", "expm1", "log", "log1p", "rsqrt",
                   "sigmoid", "silu", "softplus", "sqrt", "tanh", "isnan", "reciprocal") \
                and _dt is I32:
            continue
        case(_op, _dt.value, lambda b, op=_op, dt=_dt: [b.add1(op, [_x(b, (3, 5), dt)])])
for _op in EW2:
    for _dt in (F32, BF16, I64):
        case(_op, _dt.value, lambda b, op=_op, dt=_dt: [
            b.add1(op, [_x(b, (3, 5), dt), _x(b, (5,), dt, "y")])])
for _op in LOGICAL:
    case(_op, "bool", lambda b, op=_op: [b.add1(op, [_x(b, (3, 5), BOOL), _x(b, (5,), BOOL, "y")])])
case("logical_not", "bool", lambda b: [b.add1("logical_not", [_x(b, (3, 5), BOOL)])])
for _op in REDUCTIONS:
    for _axes in ([0], [2], [0, 2], None):
        for _dt in (F32, I32):
            case(_op, f"{_dt.value}{_axes}", lambda b, op=_op, dt=_dt, axes=_axes: [
                b.add1(op, [_x(b, (4, 5, 6), dt)], {"axes": axes, "keepdims": False})])
for _op in ("argmax", "argmin"):
    for _ax in (0, 2, None):
        case(_op, str(_ax), lambda b, op=_op, ax=_ax: [
            b.add1(op, [_x(b, (4, 5, 6), F32)], {"axis": ax, "keepdims": False})])
case("cast", "f16", lambda b: [b.add1("cast", [_x(b, (3, 5), F16)], {"dtype": DType.f64})])
case("clip", "i32", lambda b: [b.add1("clip", [_x(b, (3, 5), I32)], {"min": 0, "max": 3})])
case("where", "f32", lambda b: [b.add1("where", [_x(b, (3, 5), BOOL, "c"), _x(b, (3, 5), F32),
                                                 _x(b, (5,), F32, "y")])])
for _mode in ("constant", "reflect", "edge"):
    case("pad", _mode, lambda b, mode=_mode: [b.add1("pad", [_x(b, (4, 6), F16)], {
        "pads": (1, 2, 2, 1), "mode": mode, "value": 0.0})])
case("stack", "f32", lambda b: [b.add1("stack", [_x(b, (3, 5), F32), _x(b, (3, 5), F32, "y")],
                                       {"axis": 1})])
case("concat", "f32", lambda b: [b.add1("concat", [_x(b, (3, 5), F32), _x(b, (3, 2), F32, "y")],
                                        {"axis": 1})])
case("slice", "i32", lambda b: [b.add1("slice", [_x(b, (7, 9), I32)], {
    "starts": (1, 0), "stops": (6, 9), "steps": (2, 3)})])
case("transpose", "f32", lambda b: [b.add1("transpose", [_x(b, (3, 5, 4), F32)],
                                           {"perm": (2, 0, 1)})])
case("broadcast_to", "f32", lambda b: [b.add1("broadcast_to", [_x(b, (1, 5), F32)],
                                              {"shape": (3, 5)})])
case("reshape", "f32", lambda b: [b.add1("reshape", [_x(b, (3, 5, 4), F32)],
                                         {"shape": (15, 4)})])
case("expand_dims", "f32", lambda b: [b.add1("expand_dims", [_x(b, (3, 5), F32)],
                                             {"axes": (1,)})])
case("squeeze", "f32", lambda b: [b.add1("squeeze", [_x(b, (3, 1, 5), F32)], {"axes": (1,)})])
case("split", "f32", lambda b: list(b.add("split", [_x(b, (3, 7), F32)],
                                          {"axis": 1, "sizes": [3, 4]})))
case("take", "f32", lambda b: [b.add1("take", [_x(b, (6, 5), F32), _x(b, (2, 3), I32, "i")],
                                      {"axis": 1})])
case("take_along_axis", "f32", lambda b: [b.add1("take_along_axis", [
    _x(b, (6, 5), F32), _x(b, (6, 2), I64, "i")], {"axis": 1})])
case("cumsum", "i32", lambda b: [b.add1("cumsum", [_x(b, (6, 5), I32)], {"axis": 0})])
case("cumprod", "f32", lambda b: [b.add1("cumprod", [_x(b, (6, 5), F32)], {"axis": 1})])
case("topk", "f32", lambda b: list(b.add("topk", [_x(b, (6, 5), F32)],
                                         {"k": 2, "axis": 1, "largest": True})))
case("scatter_elements", "f32", lambda b: [b.add1("scatter_elements", [
    _x(b, (6, 5), F32), _x(b, (2, 5), I64, "i"), _x(b, (2, 5), F32, "u")],
    {"axis": 0, "reduction": "add"})])
case("scatter_nd", "f16", lambda b: [b.add1("scatter_nd", [
    _x(b, (6, 5), F16), _x(b, (2, 1), I64, "i"), _x(b, (2, 5), F16, "u")],
    {"reduction": "none"})])
for _dt in (F32, I32):
    case("matmul", _dt.value, lambda b, dt=_dt: [b.add1("matmul", [_x(b, (3, 4), dt),
                                                                  _x(b, (4, 5), dt, "y")])])
    case("einsum", _dt.value, lambda b, dt=_dt: [b.add1("einsum", [
        _x(b, (2, 3, 4), dt), _x(b, (2, 4, 5), dt, "y")], {"equation": "bij,bjk->bik"})])
case("window_patches", "f32", lambda b: [b.add1("window_patches", [_x(b, (1, 6, 6, 2), F32)], {
    "kernel": (3, 3), "strides": (1, 1), "dilations": (1, 1)})])
case("arange", "i64", lambda b: [b.add1("add", [_x(b, (5,), I64), b.add1(
    "arange", [], {"start": 0, "stop": 5, "step": 1, "dtype": I64})])])
case("full", "f32", lambda b: [b.add1("add", [_x(b, (5,), F32), b.add1(
    "full", [], {"shape": (5,), "value": 2.0, "dtype": F32})])])
for _dt in (F32, F16):
    case("softmax", _dt.value, lambda b, dt=_dt: [b.add1("softmax", [_x(b, (3, 5), dt)],
                                                         {"axis": 0})])
    case("log_softmax", _dt.value, lambda b, dt=_dt: [b.add1("log_softmax", [_x(b, (3, 5), dt)],
                                                             {"axis": -1})])
    case("layer_norm", _dt.value, lambda b, dt=_dt: [b.add1("layer_norm", [
        _x(b, (3, 8), dt), _x(b, (8,), dt, "g"), _x(b, (8,), dt, "b")], {"eps": 1e-5})])
    case("rms_norm", _dt.value, lambda b, dt=_dt: [b.add1("rms_norm", [
        _x(b, (3, 8), dt), _x(b, (8,), dt, "g")], {"eps": 1e-5})])
    case("group_norm", _dt.value, lambda b, dt=_dt: [b.add1("group_norm", [
        _x(b, (2, 4, 3, 3), dt), _x(b, (4,), dt, "g"), _x(b, (4,), dt, "b")],
        {"groups": 2, "eps": 1e-5})])
    for _groups in (1, 4):
        case("conv2d", f"{_dt.value}_g{_groups}", lambda b, dt=_dt, g=_groups: [b.add1(
            "conv2d", [_x(b, (1, 4, 6, 6), dt), _x(b, (4, 4 // g, 3, 3), dt, "w")],
            {"stride": [2, 1], "padding": [1, 1, 1, 1], "groups": g})])
    case("max_pool2d", _dt.value, lambda b, dt=_dt: [b.add1("max_pool2d", [
        _x(b, (1, 2, 6, 6), dt)], {"kernel": [2, 2], "stride": [2, 2],
                                    "padding": [0, 0, 0, 0]})])
    case("avg_pool2d", _dt.value, lambda b, dt=_dt: [b.add1("avg_pool2d", [
        _x(b, (1, 2, 6, 6), dt)], {"kernel": [3, 3], "stride": [2, 2],
                                    "padding": [1, 1, 1, 1]})])
    case("attention", _dt.value, lambda b, dt=_dt: [b.add1("attention", [
        _x(b, (1, 2, 5, 8), dt, "q"), _x(b, (1, 2, 7, 8), dt, "k"), _x(b, (1, 2, 7, 8), dt, "v")],
        {"scale": 0.3})])
case("dynamic_quantize_u8", "f32", lambda b: list(b.add("dynamic_quantize_u8",
                                                        [_x(b, (64, 64), F32)], {})))
case("matmul_u8s8", "u8", lambda b: [b.add1("matmul_u8s8", [
    _x(b, (3, 8), DType.u8), _const(b, np.array(3, np.uint8)),
    _const(b, np.ones((8, 5), np.int8))], {})])
case("matmul_u8s8", "epilogue", lambda b: [b.add1("matmul_u8s8", [
    _x(b, (3, 8), DType.u8), _const(b, np.array(3, np.uint8)),
    _const(b, np.ones((8, 5), np.int8)), _x(b, (5,), F32, "s")],
    {"epilogue": (("mul", "t", 0, False), ("gelu",), ("add", "s", 0.5, False))})])
case("qconv_i8", "static", lambda b: [b.add1("qconv_i8", [
    _x(b, (1, 5, 5, 4), F32), _const(b, np.ones((36, 3), np.int8)),
    _const(b, np.ones(3, np.float32)), _const(b, np.zeros(3, np.float32))],
    {"kernel": (3, 3), "x_scale": 0.5, "x_zero": 3, "x_min": 0, "x_max": 255,
     "pads": (1, 1, 1, 1)})])
case("qconv_i8", "raw", lambda b: [b.add1("qconv_i8", [
    _x(b, (1, 5, 5, 4), F32), _const(b, np.ones((36, 3), np.int8)),
    _const(b, np.ones(3, np.float32)), _const(b, np.zeros(3, np.float32))],
    {"kernel": (3, 3), "x_scale": 1.0, "x_zero": 0, "x_min": 0, "x_max": 255, "raw": True})])
case("matmul_w4", "f32", lambda b: [b.add1("matmul_w4", [
    _x(b, (2, 64), F32), _const(b, np.ones((32, 16), np.uint8)),
    _const(b, np.ones((1, 16), np.float32)), _const(b, np.full((1, 16), 8, np.uint8)),
    _const(b, np.zeros(16, np.float32))], {"group": 64, "act": "relu"})])


def test_every_op_is_scanned_or_exempt() -> None:
    missing = set(OPS) - set(CASES) - set(EXEMPT)
    assert not missing, sorted(missing)
    assert not set(CASES) & set(EXEMPT)


@pytest.mark.parametrize("op", sorted(CASES))
def test_op_has_no_host_step_under_cuda(op: str) -> None:
    logging.getLogger("tilefuse.fallback").disabled = True
    try:
        for label, make in CASES[op]:
            b = GraphBuilder(f"{op}_{label}")
            graph: Graph = b.build(make(b))
            built = cross_compile(graph)
            assert not built.host_steps, (label, [s.reason for s in built.host_steps])
    finally:
        logging.getLogger("tilefuse.fallback").disabled = False
