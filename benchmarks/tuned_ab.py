"""Tuned against default, in one process: two builds of one model (no tuning database, and
``--db``), interleaved round by round with onnxruntime, medians and ratios.

A tuning report's speed-ups come from kernels run alone; this is what a whole call gains. Both
builds and onnxruntime run the same inputs in turn each round, the two builds swapping places
every round, so noise from the shared machine hits them alike.

    .venv/bin/python benchmarks/tuned_ab.py --db /tmp/tune_bert.sqlite bert
    .venv/bin/python benchmarks/tuned_ab.py --db /tmp/tune_rn.sqlite resnet50

``bert`` is :func:`tilefuse.zoo.bert_layer` (batch 1, sequence 128) built from its torch graph
(the graph ``tilefuse tune "tilefuse.zoo:bert_layer()"`` tunes), onnxruntime running its
``torch.onnx.export``; ``resnet50`` is the light ONNX model shipped with onnx; any other
argument is the path of an ``.onnx`` file.
"""

from __future__ import annotations

import os

from tilefuse.codegen.target import SPIN_COUNT

os.environ.setdefault("GOMP_SPINCOUNT", str(SPIN_COUNT))  # before any OpenMP runtime loads

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from tilefuse.codegen.target import host_target
from tilefuse.runtime.native import NativeExecutable
from tilefuse.runtime.schedules import ForcedSchedules, ScheduleSource


def _session(path: str) -> Any:
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    opts.intra_op_num_threads = os.cpu_count() or 1
    opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return ort.InferenceSession(path, opts, providers=["CPUExecutionProvider"])


def _bert(workdir: Path) -> tuple[Any, list[np.ndarray], str]:
    import torch

    from tilefuse import zoo
    from tilefuse.tune.api import graph_of

    rng = np.random.default_rng(0)
    x = rng.standard_normal((1, 128, 768)).astype(np.float32)
    mask = np.zeros((1, 1, 1, 128), np.float32)
    module = zoo.bert_layer().eval()
    path = str(workdir / "bert.onnx")
    torch.onnx.export(module, (torch.from_numpy(x), torch.from_numpy(mask)), path,
                      dynamo=False, input_names=["x", "mask"])
    return graph_of(module, [x, mask]), [x, mask], path


def _onnx(path: str) -> tuple[Any, list[np.ndarray], str]:
    import onnx

    from tilefuse.tune.api import graph_of

    model = onnx.load(path)
    rng = np.random.default_rng(0)
    arrays = []
    weights = {init.name for init in model.graph.initializer}
    for value in (v for v in model.graph.input if v.name not in weights):
        dims = [d.dim_value or 1 for d in value.type.tensor_type.shape.dim]
        arrays.append(rng.standard_normal(dims).astype(np.float32))
    return graph_of(path, arrays), arrays, path


def _model(name: str, workdir: Path) -> tuple[Any, list[np.ndarray], str]:
    if name == "bert":
        return _bert(workdir)
    if name == "resnet50":
        import onnx

        name = str(Path(onnx.__file__).parent / "backend/test/data/light/light_resnet50.onnx")
    return _onnx(name)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model", help="bert, resnet50, or an .onnx file")
    parser.add_argument("--db", required=True, help="the tuning database to compare against")
    parser.add_argument("--rounds", type=int, default=21)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        graph, arrays, onnx_path = _model(args.model, Path(tmp))
        target = host_target()
        default = NativeExecutable(graph, schedules=ForcedSchedules(target, {}))  # no database
        source = ScheduleSource(target, env={"TILEFUSE_TUNE_DB": args.db})
        tuned = NativeExecutable(graph, schedules=source)
        session = _session(onnx_path)
    print(f"kernels with a tuned schedule: {', '.join(sorted(source.tuned)) or 'none'}")
    feed = {i.name: a for i, a in zip(session.get_inputs(), arrays)}
    expected = session.run(None, feed)[0]
    for exe in (default, tuned):
        got = exe(*arrays)[0]
        if not np.allclose(got, expected, rtol=1e-3, atol=1e-3):
            print("tilefuse's output differs from onnxruntime's", file=sys.stderr)
            return 1
    impls: dict[str, Callable[[], Any]] = {"default": lambda: default(*arrays),
                                            "tuned": lambda: tuned(*arrays),
                                            "onnxruntime": lambda: session.run(None, feed)}
    times: dict[str, list[float]] = {k: [] for k in impls}
    order = list(impls)
    for r in range(args.rounds):
        # the two builds swap places every round: the one that runs right after onnxruntime
        # finds the caches and threads as onnxruntime left them (1.5 % slower for BERT's layer)
        first = order if r % 2 == 0 else [order[1], order[0], *order[2:]]
        for name in first:
            fn = impls[name]
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)
    med = {k: statistics.median(v) for k, v in times.items()}
    for name, ts in times.items():
        print(f"{name:12s} median {med[name] * 1e3:7.2f} ms   min {min(ts) * 1e3:7.2f} ms")
    print(f"tuned / default {med['default'] / med['tuned']:.3f}x; onnxruntime / default "
          f"{med['onnxruntime'] / med['default']:.2f}; onnxruntime / tuned "
          f"{med['onnxruntime'] / med['tuned']:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
