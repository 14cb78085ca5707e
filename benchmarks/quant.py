"""Quantized builds against f32, interleaved in one process (issue 29's CPU targets).

    PYTHONPATH=. python benchmarks/quant.py [--rounds 15] [--only w1,gemv,bert]

- ``w1``: 512x768x3072 (+bias) int8 vs f32;
- ``gemv``: M=1, 4096x4096 int4 (group 128) vs f32 (one weight: int4 and int8 stay in L3);
- ``chain`` (not in the default list): six such GEMVs with distinct weights (out of L3);
- ``bert``: the BERT-base layer (b1 s128) int8 vs f32, vs onnxruntime on the same layer
  quantized by ``onnxruntime.quantization.quantize_dynamic``, and that onnxruntime file run by
  tilefuse (its MatMulInteger / DynamicQuantizeLinear nodes); cosine similarity of int8 vs f32;
- ``resnet`` (not in the default list: slow to quantize): ResNet-50 with random weights (the
  light model's layout), f32 and int8, and onnxruntime's QDQ file (``quantize_static``, random
  calibration data) in onnxruntime and here; logits compared, times against onnxruntime QDQ;
- ``qlinear`` (not in the default list): that ResNet-50 as ``quantize_static`` writes it with
  ``QuantFormat.QOperator`` (batch norm folded by ``quant_pre_process``, u8 activations, per
  channel i8 weights, convolutions only: its 53 QLinearConv), in onnxruntime and here.

Prints medians and minimums over the interleaved rounds and their ratios; figures taken on a
shared machine move with its load (the minimums least).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from collections.abc import Callable
from typing import Any

import numpy as np

import tilefuse
from tilefuse.cli.timing import format_seconds, interleaved_samples
from tilefuse.quant_report import compare_outputs


def _threads() -> int:
    """onnxruntime gets the threads tilefuse's pool has (``TILEFUSE_NUM_THREADS``, else all)."""
    return int(os.environ.get("TILEFUSE_NUM_THREADS") or os.cpu_count() or 1)


def _timed(name: str, impls: dict[str, Any], rounds: int, base: str) -> None:
    """Times ``impls`` interleaved in one process and prints each one's median and minimum over
    the rounds with its ratio to ``base`` (the minimum is the steadier figure on a busy host:
    a short call that the OS preempts once doubles its time, a long one does not)."""
    samples = interleaved_samples(impls, rounds)
    med = {k: statistics.median(v) for k, v in samples.items()}
    low = {k: min(v) for k, v in samples.items()}
    for key in impls:
        print(f"  {name:5s} {key:18s} median {format_seconds(med[key]):>9s} "
              f"{med[base] / med[key]:5.2f}x   min {format_seconds(low[key]):>9s} "
              f"{low[base] / low[key]:5.2f}x of {base}")


def _builds(name: str, fn: Callable[..., Any], args: tuple, modes: tuple[str | None, ...],
            rounds: int, check: str) -> None:
    """``fn`` built by ``tilefuse.jit`` once per quantize mode (None: f32), warmed up, ``check``
    compared with f32, then timed against f32."""
    fns = {q or "f32": tilefuse.jit(fn, quantize=q) for q in modes}
    for built in fns.values():
        built(*args)
    print(compare_outputs(fns["f32"](*args), fns[check](*args)))
    _timed(name, {k: (lambda f=f: f(*args)) for k, f in fns.items()}, rounds, "f32")


def w1(rounds: int) -> None:
    rng = np.random.default_rng(0)
    w = (rng.standard_normal((768, 3072)) * 0.05).astype(np.float32)
    b = rng.standard_normal(3072).astype(np.float32)
    x = rng.standard_normal((512, 768)).astype(np.float32)
    _builds("w1", lambda x: x @ w + b, (x,), (None, "int8"), rounds, "int8")


def gemv(rounds: int) -> None:
    rng = np.random.default_rng(1)
    w = (rng.standard_normal((4096, 4096)) * 0.02).astype(np.float32)
    x = rng.standard_normal((1, 4096)).astype(np.float32)
    _builds("gemv", lambda x: x @ w, (x,), (None, "int4", "int8"), rounds, "int4")


def gemv_chain(rounds: int, layers: int = 6) -> None:
    """``layers`` GEMVs (M=1, 4096x4096) with distinct weights and a tanh between them: the
    int4 weights (6 x 8 MiB + scales) no longer fit this host's 32 MiB L3, as in a model, where
    one repeated GEMV's do."""
    rng = np.random.default_rng(2)
    ws = [(rng.standard_normal((4096, 4096)) * 0.02).astype(np.float32) for _ in range(layers)]
    x = rng.standard_normal((1, 4096)).astype(np.float32)

    def chain(x: np.ndarray) -> np.ndarray:
        for w in ws:
            x = np.tanh(x @ w)
        return x

    _builds("chain", chain, (x,), (None, "int4", "int8"), rounds, "int4")


def bert(rounds: int) -> None:
    import onnxruntime as ort
    import torch
    from onnxruntime.quantization import QuantType, quantize_dynamic

    from tilefuse import zoo

    module = zoo.bert_layer()
    layer = zoo.bert_layer_numpy(module)
    x, mask = zoo.bert_inputs()
    fns = {q or "f32": tilefuse.jit(layer, quantize=q) for q in (None, "int8")}
    impls = {k: (lambda f=f: f(x, mask)) for k, f in fns.items()}
    with tempfile.TemporaryDirectory() as tmp:
        path, qpath = os.path.join(tmp, "bert.onnx"), os.path.join(tmp, "bert.int8.onnx")
        torch.onnx.export(module, (torch.from_numpy(x), torch.from_numpy(mask)), path,
                          input_names=["x", "mask"], output_names=["y"], opset_version=17,
                          dynamo=False)
        quantize_dynamic(path, qpath, weight_type=QuantType.QInt8)
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = _threads()
        opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
        session = ort.InferenceSession(qpath, opts, providers=["CPUExecutionProvider"])
        impls["onnxruntime int8"] = lambda: session.run(None, {"x": x, "mask": mask})[0]
        try:
            from tilefuse import onnx as tf_onnx

            model = tf_onnx.load(qpath)
            model(x, mask)
            impls["tilefuse ort-file"] = lambda: model(x, mask)
            plan = model.lower(x, mask).executable
            print(f"  tilefuse on the onnxruntime file: host steps {plan.fallbacks}")
        except Exception as err:  # reported, not hidden
            print(f"  tilefuse on the onnxruntime-quantized file: {type(err).__name__}: {err}")
        for impl in impls.values():
            impl()
        ref = fns["f32"](x, mask)
        print("  int8 vs f32:", compare_outputs(ref, fns["int8"](x, mask)))
        print("  ort int8 vs f32:", compare_outputs(ref, impls["onnxruntime int8"]()))
        _timed("bert", impls, rounds, "f32")


def _random_resnet50(path: str) -> Any:
    """The light ResNet-50 of onnx's test data with random weights: its 239 weights and batch
    norm parameters are ``ConstantOfShape`` fills (every channel alike, so its logits are all
    equal); here they become initializers (He-normal convolutions, batch norm near identity)
    and the logits (the Softmax's input) are the output."""
    import onnx
    from onnx import numpy_helper

    model = onnx.load(path)
    graph = model.graph
    shapes = {i.name: numpy_helper.to_array(i) for i in graph.initializer}
    rng = np.random.default_rng(50)
    kept = []
    for node in graph.node:
        if node.op_type != "ConstantOfShape":
            kept.append(node)
            continue
        name, shape = node.output[0], tuple(int(d) for d in shapes[node.input[0]])
        if name.endswith("_w_0"):
            fan_in = int(np.prod(shape[1:]))
            value = rng.standard_normal(shape) * np.sqrt(2.0 / fan_in)
        elif name.endswith("_bn_s_0"):
            value = rng.uniform(0.3, 0.6, shape)   # keeps the residual stream bounded
        elif name.endswith("_bn_riv_0"):
            value = rng.uniform(0.5, 1.5, shape)
        else:
            value = rng.standard_normal(shape) * 0.05
        graph.initializer.append(numpy_helper.from_array(value.astype(np.float32), name))
        graph.input.append(onnx.helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT,
                                                              list(shape)))
    del graph.node[:]
    graph.node.extend(kept)
    softmax = next(n for n in graph.node if n.op_type == "Softmax")
    graph.output[0].name = softmax.input[0]
    graph.node.remove(softmax)
    return model


def resnet(rounds: int) -> None:
    """ResNet-50 (the light model of onnx's test data with random weights, logits out):
    tilefuse f32 and ``quantize="int8"``, onnxruntime f32, and the QDQ file made by
    ``quantize_static`` (random calibration data) in onnxruntime and in tilefuse (its default
    for a QDQ file: the convolutions on qconv_i8 with the pairs' static scales)."""
    import onnx
    import onnxruntime as ort
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, quantize_static

    from tilefuse import onnx as tf_onnx

    light = os.path.join(os.path.dirname(onnx.__file__),
                         "backend/test/data/light/light_resnet50.onnx")
    rng = np.random.default_rng(5)
    x = rng.standard_normal((1, 3, 224, 224)).astype(np.float32)

    class Reader(CalibrationDataReader):
        def __init__(self, name: str) -> None:
            self.left = [{name: rng.standard_normal((1, 3, 224, 224)).astype(np.float32)}
                         for _ in range(8)]

        def get_next(self) -> dict | None:
            return self.left.pop() if self.left else None

    with tempfile.TemporaryDirectory() as tmp:
        path, qdq = os.path.join(tmp, "resnet.onnx"), os.path.join(tmp, "resnet.qdq.onnx")
        onnx.save(_random_resnet50(light), path)
        name = onnx.load(path).graph.input[0].name
        quantize_static(path, qdq, Reader(name), quant_format=QuantFormat.QDQ)
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = _threads()
        opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
        sessions = {k: ort.InferenceSession(p, opts, providers=["CPUExecutionProvider"])
                    for k, p in (("onnxruntime f32", path), ("onnxruntime qdq", qdq))}
        models = {"f32": tf_onnx.load(path), "int8": tf_onnx.load(path, quantize="int8"),
                  "qdq file": tf_onnx.load(qdq)}
        impls = {k: (lambda m=m: m(x)) for k, m in models.items()}
        impls.update({k: (lambda s=s: s.run(None, {name: x})[0]) for k, s in sessions.items()})
        ref = impls["f32"]()
        for key, impl in impls.items():
            if key != "f32":
                print(f"  {key} logits vs f32: {compare_outputs(ref, impl())}")
        print("  qdq file vs onnxruntime qdq:",
              compare_outputs(impls["onnxruntime qdq"](), impls["qdq file"]()))
        plan = models["qdq file"].lower(x)
        ops = [n.op.name for n in plan.optimized.nodes]
        print(f"  qdq file: {ops.count('qconv_i8')} qconv_i8, {ops.count('matmul')} f32 "
              f"matmuls, host steps {plan.executable.fallbacks}")
        _timed("rn50", impls, rounds, "onnxruntime qdq")


def qlinear(rounds: int) -> None:
    """The random ResNet-50 of :func:`resnet` with QLinearConv nodes (``QuantFormat.QOperator``,
    only the convolutions: onnxruntime's com.microsoft QGemm / QLinearAveragePool are not
    converted by tilefuse), in onnxruntime and in tilefuse (each QLinearConv on qconv_i8)."""
    import onnx
    import onnxruntime as ort
    from onnxruntime.quantization import (
        CalibrationDataReader,
        QuantFormat,
        QuantType,
        quantize_static,
    )
    from onnxruntime.quantization.shape_inference import quant_pre_process

    from tilefuse import onnx as tf_onnx

    light = os.path.join(os.path.dirname(onnx.__file__),
                         "backend/test/data/light/light_resnet50.onnx")
    rng = np.random.default_rng(5)
    x = rng.standard_normal((1, 3, 224, 224)).astype(np.float32)

    class Reader(CalibrationDataReader):
        def __init__(self, name: str) -> None:
            self.left = [{name: rng.standard_normal((1, 3, 224, 224)).astype(np.float32)}
                         for _ in range(8)]

        def get_next(self) -> dict | None:
            return self.left.pop() if self.left else None

    with tempfile.TemporaryDirectory() as tmp:
        path, pre, qop = (os.path.join(tmp, n) for n in ("rn.onnx", "rn.pre.onnx", "rn.q.onnx"))
        onnx.save(_random_resnet50(light), path)
        name = onnx.load(path).graph.input[0].name
        quant_pre_process(path, pre, skip_symbolic_shape=True)
        quantize_static(pre, qop, Reader(name), quant_format=QuantFormat.QOperator,
                        activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8,
                        per_channel=True, op_types_to_quantize=["Conv"])
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = _threads()
        opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
        session = ort.InferenceSession(qop, opts, providers=["CPUExecutionProvider"])
        models = {"qlinear file": tf_onnx.load(qop),
                  "qlinear file f32": tf_onnx.load(qop, quantize="none")}
        impls = {k: (lambda m=m: m(x)) for k, m in models.items()}
        impls["onnxruntime qlinear"] = lambda: session.run(None, {name: x})[0]
        want = impls["onnxruntime qlinear"]()
        for key in models:
            print(f"  {key} vs onnxruntime: {compare_outputs(want, impls[key]())}")
        plan = models["qlinear file"].lower(x)
        ops = [n.op.name for n in plan.optimized.nodes]
        print(f"  qlinear file: {ops.count('qconv_i8')} qconv_i8, host steps "
              f"{plan.executable.fallbacks}")
        _timed("qlin", impls, rounds, "onnxruntime qlinear")


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--only", default="w1,gemv,bert")
    args = parser.parse_args(argv)
    for name in args.only.split(","):
        print(f"{name}:")
        {"w1": w1, "gemv": gemv, "chain": gemv_chain, "bert": bert,
         "resnet": resnet, "qlinear": qlinear}[name](args.rounds)


if __name__ == "__main__":
    main(sys.argv[1:])
