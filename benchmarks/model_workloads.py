"""Whole-model workloads: the light ONNX models shipped in the onnx package (onnxruntime and
OpenVINO as the peers, fed onnx's own dummy inputs) and one BERT-base encoder layer from
:mod:`tilefuse.zoo` (batch 1, sequence 128) against torch eager, torch.compile (Inductor),
onnxruntime and OpenVINO (the layer exported with ``torch.onnx.export``), tilefuse running it
through ``torch.compile(backend=tilefuse.torch.backend)``.

Each is timed by :func:`tilefuse.cli.bench.bench_model`, the code behind ``tilefuse bench``. A
model tilefuse cannot import or compile yet is recorded as ``not supported`` with the reason,
and the run goes on.
"""

from __future__ import annotations

import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from tilefuse.errors import TilefuseError


@dataclass(frozen=True)
class ModelWorkload:
    name: str
    title: str
    group: str
    load: Callable[[], tuple[Any, list[np.ndarray]]]   # -> (cli Model, input arrays)
    peers: tuple[str, ...]


def light_model_dir() -> Path | None:
    try:
        import onnx
    except ImportError:
        return None
    folder = Path(onnx.__file__).parent / "backend" / "test" / "data" / "light"
    return folder if folder.is_dir() else None


def _dummy_inputs(path: Path) -> list[np.ndarray]:
    """onnx's own dummy inputs for a light model (what its backend test feeds it)."""
    import onnx
    from onnx.backend.test.runner import Runner

    proto = onnx.load(str(path), load_external_data=False)
    initializers = {t.name for t in proto.graph.initializer}
    return [Runner.generate_dummy_data(v, seed=0, name=path.stem, random=False)
            for v in proto.graph.input if v.name not in initializers]


def _light_loader(path: Path) -> Callable[[], tuple[Any, list[np.ndarray]]]:
    def load() -> tuple[Any, list[np.ndarray]]:
        from tilefuse.cli.models import OnnxFile
        return OnnxFile(str(path)), _dummy_inputs(path)
    return load


def _bert_layer() -> tuple[Any, list[np.ndarray]]:
    from tilefuse.cli.models import TorchModule
    from tilefuse.zoo import bert_inputs, bert_layer

    return TorchModule("tilefuse.zoo:bert_layer()", bert_layer()), bert_inputs(1, 128)


def model_workloads() -> list[ModelWorkload]:
    made = []
    folder = light_model_dir()
    for path in sorted(folder.glob("light_*.onnx")) if folder else []:
        name = path.stem
        made.append(ModelWorkload(name, f"{name.removeprefix('light_')} (onnx light model)",
                                  "onnx-light", _light_loader(path),
                                  ("onnxruntime", "openvino")))
    made.append(ModelWorkload("bert", "BERT-base encoder layer, batch 1, seq 128", "bert",
                              _bert_layer, ("torch", "inductor", "onnxruntime", "openvino")))
    return made


def _first_line(err: BaseException) -> str:
    text = str(err).strip().splitlines()
    return f"{type(err).__name__}: {text[0] if text else ''}"[:200]


def run_model_workload(w: ModelWorkload, rounds: int, threads: int,
                       progress: bool | None = None) -> dict[str, Any]:
    """The result record of one model workload; ``not supported`` when tilefuse cannot load,
    compile or run it (the reason kept), ``error`` when something else failed."""
    from tilefuse.cli.bench import bench_model

    record: dict[str, Any] = {"workload": w.name, "title": w.title, "group": w.group}
    try:
        model, arrays = w.load()
        result = bench_model(model, arrays, list(w.peers), rounds, threads=threads,
                             progress=progress)
    except TilefuseError as err:
        return record | {"status": "not supported", "note": _first_line(err)}
    except Exception as err:  # a peer's or harness failure: recorded, the run goes on
        traceback.print_exc()
        return record | {"status": "error", "note": _first_line(err)}
    return record | {"status": "ok", **result.to_json()}
