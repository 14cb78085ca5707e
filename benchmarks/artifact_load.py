"""Cold start from a compiled artifact vs onnxruntime, each in a fresh process.

    python benchmarks/artifact_load.py [--rounds 5] [--workdir DIR] [--models resnet50,bert]

For each model the script first prepares (once, in this process) the ONNX file and the
``.tilefuse`` artifact compiled from it (``tilefuse.onnx.load`` + ``tilefuse.save``), checking
that the loaded artifact computes bit for bit what the in-process build computes. Then, for
``--rounds`` rounds, alternating, it starts a fresh Python process that

- tilefuse: ``import tilefuse`` + the modules ``tilefuse.load`` imports (timed apart) +
  ``tilefuse.load(artifact)`` + the first call;
- onnxruntime: ``import onnxruntime`` + ``InferenceSession(model.onnx)`` + the first ``run``;

each after ``import numpy`` (both need it; timed apart, not in the totals), with Python's bytecode
cached as an installed package has it (one uncounted process of each first),

and reports each phase's median over the rounds (and the minimum), and the ratio of the totals
tilefuse / onnxruntime, both with and without onnxruntime's import (issue 27 quotes its session
creation + first run). Models: the light ResNet-50 shipped with onnx's test data (its weights
are constant fills, so its output is uniform: it measures loading, not accuracy), and the
BERT-base encoder layer of :mod:`tilefuse.zoo` exported with ``torch.onnx.export`` (batch 1,
sequence 128).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent

CHILD_TILEFUSE = """
import sys, time, json
tn = time.perf_counter()
import numpy as np
t0 = time.perf_counter()
import tilefuse
t1 = time.perf_counter()
import tilefuse.artifact.loader  # the modules tilefuse.load needs (split out, for the report)
t2 = time.perf_counter()
model = tilefuse.load(sys.argv[1])
t3 = time.perf_counter()
inputs = [np.load(p) for p in sys.argv[2:]]
t4 = time.perf_counter()
model(*inputs)
t5 = time.perf_counter()
print(json.dumps({"numpy": t0 - tn, "import": t1 - t0, "loader_imports": t2 - t1,
                  "load": t3 - t2, "first_call": t5 - t4}))
"""

CHILD_ORT = """
import sys, time, json
tn = time.perf_counter()
import numpy as np
t0 = time.perf_counter()
import onnxruntime as ort
t1 = time.perf_counter()
session = ort.InferenceSession(sys.argv[1], providers=["CPUExecutionProvider"])
t2 = time.perf_counter()
names = [i.name for i in session.get_inputs()]
feed = dict(zip(names, (np.load(p) for p in sys.argv[2:])))
t3 = time.perf_counter()
session.run(None, feed)
t4 = time.perf_counter()
print(json.dumps({"numpy": t0 - tn, "import": t1 - t0, "session": t2 - t1,
                  "first_run": t4 - t3}))
"""


def _resnet50(workdir: Path) -> tuple[Path, list[np.ndarray]]:
    import onnx

    path = Path(onnx.__file__).parent / "backend/test/data/light/light_resnet50.onnx"
    x = np.random.default_rng(0).standard_normal((1, 3, 224, 224), dtype=np.float32)
    return path, [x]


def _bert(workdir: Path) -> tuple[Path, list[np.ndarray]]:
    import torch

    from tilefuse import zoo

    path = workdir / "bert_layer.onnx"
    inputs = zoo.bert_inputs(1, 128)
    if not path.exists():
        module = zoo.bert_layer()
        with torch.no_grad():
            torch.onnx.export(module, tuple(torch.from_numpy(a) for a in inputs), str(path),
                              dynamo=False, input_names=["x", "mask"])
    return path, inputs


MODELS = {"resnet50": _resnet50, "bert": _bert}


def prepare(name: str, workdir: Path) -> tuple[Path, Path, list[Path]]:
    """(onnx file, artifact, input .npy files) of model ``name``."""
    import tilefuse
    import tilefuse.onnx

    onnx_path, inputs = MODELS[name](workdir)
    artifact = workdir / f"{name}.tilefuse"
    arrays = []
    for i, a in enumerate(inputs):
        arrays.append(workdir / f"{name}_input{i}.npy")
        np.save(arrays[-1], a)
    model = tilefuse.onnx.load(str(onnx_path))
    expected = model(*inputs)
    tilefuse.save(model, artifact)
    got = tilefuse.load(artifact)(*inputs)
    for g, e in zip(got if isinstance(got, list) else [got],
                    expected if isinstance(expected, list) else [expected]):
        assert np.array_equal(g, e), f"{name}: the loaded artifact differs from the build"
    return onnx_path, artifact, arrays


def child(code: str, args: list[str], workdir: Path) -> dict[str, float]:
    """One fresh process. Python's bytecode is cached under ``workdir`` (an installed package
    has its .pyc files, as onnxruntime's has in site-packages; a source checkout run with
    PYTHONDONTWRITEBYTECODE would compile every module at each start)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env.update(PYTHONPATH=str(ROOT), PYTHONPYCACHEPREFIX=str(workdir / "pycache"))
    done = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True,
                          env=env, timeout=600, check=False)
    if done.returncode != 0:
        raise SystemExit(f"child failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def measure(name: str, workdir: Path, rounds: int) -> dict[str, object]:
    onnx_path, artifact, arrays = prepare(name, workdir)
    inputs = [str(a) for a in arrays]
    tf: list[dict[str, float]] = []
    ort: list[dict[str, float]] = []
    child(CHILD_TILEFUSE, [str(artifact), *inputs], workdir)  # bytecode cached; not counted
    child(CHILD_ORT, [str(onnx_path), *inputs], workdir)
    for _ in range(rounds):  # alternating, so that machine noise hits both alike
        tf.append(child(CHILD_TILEFUSE, [str(artifact), *inputs], workdir))
        ort.append(child(CHILD_ORT, [str(onnx_path), *inputs], workdir))

    def median(rows: list[dict[str, float]], key: str) -> float:
        return statistics.median(r[key] for r in rows)

    tf_total = [sum(r.values()) - r["numpy"] for r in tf]  # NumPy: both import it first
    ort_total = [sum(r.values()) - r["numpy"] for r in ort]
    ort_no_import = [r["session"] + r["first_run"] for r in ort]
    return {
        "model": name, "rounds": rounds, "artifact_mib": artifact.stat().st_size / 2**20,
        "tilefuse": {k: median(tf, k) for k in tf[0]} | {"total": statistics.median(tf_total),
                                                         "total_min": min(tf_total)},
        "onnxruntime": {k: median(ort, k) for k in ort[0]} | {
            "total": statistics.median(ort_total), "total_min": min(ort_total),
            "session_plus_run": statistics.median(ort_no_import)},
        "ratio_total": statistics.median(tf_total) / statistics.median(ort_total),
        "ratio_vs_session_plus_run": statistics.median(tf_total)
        / statistics.median(ort_no_import),
        "ratio_load_plus_call_vs_session_plus_run": statistics.median(
            [r["load"] + r["first_call"] for r in tf]) / statistics.median(ort_no_import),
        "ratio_without_imports_vs_ort_total": statistics.median(
            [r["load"] + r["first_call"] for r in tf]) / statistics.median(ort_total),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/tilefuse-artifact-bench"))
    parser.add_argument("--models", default="resnet50,bert")
    args = parser.parse_args()
    args.workdir.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    for name in args.models.split(","):
        result = measure(name, args.workdir, args.rounds)
        tf, ort = result["tilefuse"], result["onnxruntime"]
        print(f"{name} (artifact {result['artifact_mib']:.1f} MiB, median of "
              f"{args.rounds} fresh processes):")
        print(f"  (NumPy's import, before either: {tf['numpy']:.3f} s / {ort['numpy']:.3f} s)")
        print(f"  tilefuse     import {tf['import']:.3f} s  loader imports "
              f"{tf['loader_imports']:.3f} s  load {tf['load']:.3f} s  first call "
              f"{tf['first_call']:.3f} s  total {tf['total']:.3f} s (min {tf['total_min']:.3f})")
        print(f"  onnxruntime  import {ort['import']:.3f} s  session {ort['session']:.3f} s  "
              f"first run {ort['first_run']:.3f} s  total {ort['total']:.3f} s "
              f"(min {ort['total_min']:.3f})")
        print(f"  tilefuse / onnxruntime: {result['ratio_total']:.2f}x with both imports; "
              f"{result['ratio_vs_session_plus_run']:.2f}x vs session + run only; "
              f"load + first call alone {result['ratio_load_plus_call_vs_session_plus_run']:.2f}x")
        print(json.dumps(result))
    print(f"({time.perf_counter() - started:.0f} s)")


if __name__ == "__main__":
    main()
