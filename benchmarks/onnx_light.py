"""Whole models on the CPU with RANDOM weights: every model of the ONNX light set (and the
BERT-base layer exported to ONNX) through tilefuse, onnxruntime and OpenVINO, interleaved.

    python benchmarks/onnx_light.py                      # every model, 11 rounds
    python benchmarks/onnx_light.py --only resnet50,bert --rounds 21 --json light.json
    python benchmarks/onnx_light.py --threads 2

Why random weights: the light models ship every initializer as the constant 0.02, so every
activation is the same number, every output is 0.001, and a wrong kernel still passes the output
check. Here each float initializer is redrawn with a scale that keeps activations of order one
through the whole network (He-normal for Conv/Gemm/MatMul weights, a BatchNormalization's
scale near 1, variance in [0.5, 1.5], small mean and bias), and the input is standard normal.
Outputs of tilefuse and OpenVINO are checked against onnxruntime's before timing.

Peers: onnxruntime (CPU provider, ``allow_spinning=0``) and OpenVINO (``compile_model`` on
CPU, latency hint, f32 inference precision so it is not timed in bf16 where the CPU has it),
each with ``--threads`` threads; tilefuse uses its own pool (all cores). Each round calls every
implementation once, in an order that rotates from round to round. Printed: medians, and the
ratios of tilefuse's time over the best peer's and over onnxruntime's (below 1.00: tilefuse is
faster), of the medians and of the minima, and ``paired``: the median over rounds of
tilefuse's time over the best peer's time in the same round. On a shared 2-core host a call
whose worker thread is preempted waits a scheduler slice, so medians there measure the load as
much as the code;
the minima are each implementation undisturbed. Rerun outliers and compare ratios only within
one run.
"""

from __future__ import annotations

import os

from tilefuse.codegen.target import SPIN_COUNT

os.environ.setdefault("GOMP_SPINCOUNT", str(SPIN_COUNT))  # before any OpenMP runtime loads

import argparse
import io
import json
import statistics
import sys
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from model_workloads import light_model_dir

from tilefuse.cli.timing import format_seconds

Impl = Callable[[], list[np.ndarray]]


def materialize_constants(proto: Any) -> Any:
    """A copy of ``proto`` where each ``ConstantOfShape`` of a constant shape (how the light
    models ship their weights: every one the constant 0.02) is an initializer of that shape."""
    import onnx
    from onnx import numpy_helper

    out = onnx.ModelProto()
    out.CopyFrom(proto)
    g = out.graph
    inits = {t.name: t for t in g.initializer}
    keep, used_shapes = [], set()
    for node in g.node:
        if node.op_type == "ConstantOfShape" and node.input and node.input[0] in inits:
            shape = numpy_helper.to_array(inits[node.input[0]]).astype(np.int64)
            value = next((numpy_helper.to_array(a.t) for a in node.attribute
                          if a.name == "value"), np.zeros(1, np.float32))
            g.initializer.append(numpy_helper.from_array(
                np.full(tuple(shape), value.reshape(-1)[0], value.dtype), node.output[0]))
            used_shapes.add(node.input[0])
        else:
            keep.append(node)
    still = {i for n in keep for i in n.input}
    drop = used_shapes - still
    del g.node[:]
    g.node.extend(keep)
    kept_inits = [t for t in g.initializer if t.name not in drop]
    del g.initializer[:]
    g.initializer.extend(kept_inits)
    kept_inputs = [v for v in g.input if v.name not in drop]
    del g.input[:]
    g.input.extend(kept_inputs)
    return out


def randomize_weights(proto: Any, seed: int = 0) -> Any:
    """A copy of ``proto`` with every float initializer redrawn (module docstring)."""
    from onnx import numpy_helper

    rng = np.random.default_rng(seed)
    out = materialize_constants(proto)
    role: dict[str, str] = {}
    for node in out.graph.node:
        ins = list(node.input)
        if node.op_type in ("Conv", "ConvTranspose", "Gemm", "MatMul") and len(ins) > 1:
            trans_b = any(a.name == "transB" and a.i for a in node.attribute)
            role.setdefault(ins[1], "weight:" + node.op_type + ("T" if trans_b else ""))
            if len(ins) > 2:
                role.setdefault(ins[2], "bias")
        elif node.op_type == "BatchNormalization":
            for name, kind in zip(ins[1:5], ("bn_scale", "bias", "bias", "bn_var")):
                role.setdefault(name, kind)
    for i, init in enumerate(out.graph.initializer):
        arr = numpy_helper.to_array(init)
        if arr.dtype != np.float32 or arr.size <= 1:
            continue
        kind = role.get(init.name, "other")
        if kind.startswith("weight"):
            if kind.endswith("Conv") or kind.endswith("ConvTranspose"):
                fan_in = int(np.prod(arr.shape[1:]))
            elif kind.endswith("GemmT"):   # B transposed: [N, K]
                fan_in = arr.shape[-1]
            else:                           # MatMul, Gemm: [K, N]
                fan_in = arr.shape[0]
            new = rng.standard_normal(arr.shape) * np.sqrt(2.0 / max(fan_in, 1))
        elif kind == "bn_scale" or kind == "bn_var":
            new = rng.uniform(0.5, 1.5, arr.shape)
        else:
            new = rng.standard_normal(arr.shape) * 0.1
        out.graph.initializer[i].CopyFrom(numpy_helper.from_array(new.astype(np.float32),
                                                                  init.name))
    return out


def light_models() -> dict[str, Path]:
    """The ONNX light set by short name (``resnet50``), as the benchmarks enumerate it."""
    folder = light_model_dir()
    if folder is None:
        return {}
    return {p.stem.removeprefix("light_"): p for p in sorted(folder.glob("light_*.onnx"))}


def bert_onnx() -> tuple[Any, list[np.ndarray]]:
    """The BERT-base encoder layer (``tilefuse.zoo``, b1 s128) exported to ONNX, and inputs."""
    import onnx
    import torch

    from tilefuse.zoo import bert_inputs, bert_layer

    module, arrays = bert_layer(), bert_inputs(1, 128)
    buf = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(module, tuple(torch.from_numpy(a) for a in arrays), buf,
                          dynamo=False, input_names=["x", "mask"])
    return onnx.load_from_string(buf.getvalue()), arrays


def load_case(name: str, path: Path | None, seed: int) -> tuple[Any, list[np.ndarray]]:
    """The (random-weight) model proto and its inputs."""
    import onnx

    if name == "bert":
        return bert_onnx()
    proto = randomize_weights(onnx.load(str(path)), seed)
    inits = {t.name for t in proto.graph.initializer}
    rng = np.random.default_rng(seed + 1)
    arrays = []
    for v in proto.graph.input:
        if v.name in inits:
            continue
        dims = [d.dim_value or 1 for d in v.type.tensor_type.shape.dim]
        arrays.append(rng.standard_normal(dims).astype(np.float32))
    return proto, arrays


def peers(proto: Any, arrays: list[np.ndarray], threads: int) -> tuple[dict[str, Impl],
                                                                      dict[str, str]]:
    """onnxruntime and OpenVINO on ``proto``; the ones that failed, with the reason."""
    impls: dict[str, Impl] = {}
    skipped: dict[str, str] = {}
    data = proto.SerializeToString()
    try:
        import onnxruntime as ort
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = threads
        opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
        sess = ort.InferenceSession(data, opts, providers=["CPUExecutionProvider"])
        feed = {i.name: a for i, a in zip(sess.get_inputs(), arrays)}
        impls["onnxruntime"] = lambda: sess.run(None, feed)
    except Exception as err:  # a peer that cannot take the model is a note
        skipped["onnxruntime"] = f"{type(err).__name__}: {str(err)[:120]}"
    try:
        import openvino as ov
        core = ov.Core()
        compiled = core.compile_model(core.read_model(data), "CPU", {
            "PERFORMANCE_HINT": "LATENCY", "INFERENCE_NUM_THREADS": str(threads),
            "INFERENCE_PRECISION_HINT": "f32"})
        request = compiled.create_infer_request()
        ov_feed = {i: a for i, a in enumerate(arrays)}

        def run_ov() -> list[np.ndarray]:
            request.infer(ov_feed)
            return [request.get_output_tensor(i).data.copy()
                    for i in range(len(compiled.outputs))]
        impls["openvino"] = run_ov
    except Exception as err:
        skipped["openvino"] = f"{type(err).__name__}: {str(err)[:120]}"
    return impls, skipped


def check(reference: list[np.ndarray], got: list[np.ndarray]) -> str:
    """``ok`` or the largest error relative to the reference's scale."""
    worst = 0.0
    for r, g in zip(reference, got):
        g = np.asarray(g).reshape(np.shape(r))
        scale = float(np.max(np.abs(r))) or 1.0
        worst = max(worst, float(np.max(np.abs(g.astype(np.float64) - r))) / scale)
    return "ok" if worst < 2e-3 else f"differs: max error {worst:.2g} of the output's scale"


def run_case(name: str, path: Path | None, rounds: int, threads: int, seed: int
             ) -> dict[str, Any]:
    """One model's record: medians, checks, compile seconds, the ratio to the best peer."""
    import tilefuse.onnx

    proto, arrays = load_case(name, path, seed)
    start = time.perf_counter()
    model = tilefuse.onnx.load(proto)
    compile_s = time.perf_counter() - start
    feed = dict(zip(model.input_names, arrays))
    impls: dict[str, Impl] = {"tilefuse": lambda: list(model.run(None, feed))}
    more, skipped = peers(proto, arrays, threads)
    impls.update(more)
    first = {n: fn() for n, fn in impls.items()}
    ref = first.get("onnxruntime")
    checks = {n: ("reference" if n == "onnxruntime" else
                  check(ref, out) if ref is not None else "no reference")
              for n, out in first.items()}
    samples = interleaved_samples(impls, rounds)
    medians = {k: statistics.median(v) for k, v in samples.items()}
    minima = {k: min(v) for k, v in samples.items()}

    def ratio(stat: dict[str, float], peer: str | None = None) -> float:
        others = [v for k, v in stat.items() if k != "tilefuse" and peer in (None, k)]
        return stat["tilefuse"] / min(others) if others else float("nan")
    peers_ = [k for k in samples if k != "tilefuse"]
    paired = [t / min(samples[p][r] for p in peers_)
              for r, t in enumerate(samples["tilefuse"])] if peers_ else [float("nan")]
    return {"model": name, "median_s": medians, "min_s": minima, "checks": checks,
            "skipped": skipped, "compile_s": compile_s, "ratio_best": ratio(medians),
            "ratio_ort": ratio(medians, "onnxruntime"), "ratio_best_min": ratio(minima),
            "ratio_ort_min": ratio(minima, "onnxruntime"),
            "ratio_best_paired": statistics.median(paired)}


def interleaved_samples(impls: dict[str, Impl], rounds: int) -> dict[str, list[float]]:
    """Seconds of each call, implementations in turn within each round (the order rotating
    from round to round), so that a slow spell of the shared host falls on all of them."""
    names = list(impls)
    samples: dict[str, list[float]] = {n: [] for n in names}
    for r in range(rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            start = time.perf_counter()
            impls[name]()
            samples[name].append(time.perf_counter() - start)
    return samples


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", default="", help="comma-separated short names (resnet50,bert)")
    parser.add_argument("--rounds", type=int, default=21)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    cases: dict[str, Path | None] = {**light_models(), "bert": None}
    wanted = [s.strip() for s in args.only.split(",") if s.strip()] or list(cases)
    unknown = [w for w in wanted if w not in cases]
    if unknown:
        parser.error(f"unknown model(s) {unknown}; known: {', '.join(cases)}")
    records = []
    print(f"{'model':<14} {'tilefuse':>10} {'onnxruntime':>12} {'openvino':>10} "
          f"{'tf/best':>8} {'tf/ort':>7} {'min:best':>8} {'min:ort':>7} {'paired':>7} "
          f"{'compile':>8}  checks",
          flush=True)
    for name in wanted:
        try:
            rec = run_case(name, cases[name], args.rounds, args.threads, args.seed)
        except Exception as err:  # one model failing is reported; the run goes on
            rec = {"model": name, "error": f"{type(err).__name__}: {str(err)[:200]}"}
            print(f"{name:<14} error: {rec['error']}", flush=True)
            records.append(rec)
            continue
        records.append(rec)
        m = rec["median_s"]
        bad = {k: v for k, v in rec["checks"].items() if v not in ("ok", "reference")}
        print(f"{name:<14} {format_seconds(m['tilefuse']):>10} "
              f"{format_seconds(m.get('onnxruntime', float('nan'))):>12} "
              f"{format_seconds(m.get('openvino', float('nan'))):>10} "
              f"{rec['ratio_best']:>8.2f} {rec['ratio_ort']:>7.2f} "
              f"{rec['ratio_best_min']:>8.2f} {rec['ratio_ort_min']:>7.2f} "
              f"{rec['ratio_best_paired']:>7.2f} {rec['compile_s']:>7.1f}s  "
              f"{bad or 'ok'} {rec['skipped'] or ''}", flush=True)
    if args.json is not None:
        args.json.write_text(json.dumps(records, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
