"""The ONNX backend test cases the installed onnx package provides, as one list.

Directories shipped as files under ``onnx/backend/test/data/``:

- ``simple``, ``pytorch-converted``, ``pytorch-operator``: ``<test>/model.onnx`` with
  ``test_data_set_*/input_*.pb`` and ``output_*.pb``;
- ``light``: ``light_<model>.onnx`` and the expected ``light_<model>_output_0.pb`` only; the
  input is onnx's dummy input (``arange(n) / n`` in the declared shape, as onnx's runner makes it);
- ``real`` holds download stubs (``data.json`` with a URL), no models: it is not a test source.

The ``node`` directory is not shipped in the wheel, so its cases are generated in memory from
``onnx.backend.test.case.node`` (the same code onnx uses to write ``data/node``), once per
session, in about 5 s.
"""

from __future__ import annotations

import functools
import os
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import TypeProto, numpy_helper

DATA_ROOT = Path(os.path.dirname(onnx.__file__)) / "backend" / "test" / "data"
FILE_DIRS = ("simple", "pytorch-converted", "pytorch-operator")
DIRS = ("node", *FILE_DIRS, "light")

DataSet = tuple[list[Any], list[Any]]


@dataclass(frozen=True)
class Case:
    """One backend test: ``directory`` is one of :data:`DIRS`, ``name`` the test's name."""

    directory: str
    name: str
    source: Path | onnx.ModelProto            # a model file, or a generated model
    data: tuple[Path, ...] | tuple[DataSet, ...]  # data-set folders, or generated data sets

    @property
    def id(self) -> str:
        return f"{self.directory}/{self.name}"

    def data_sets(self) -> list[DataSet]:
        """The (inputs, expected outputs) pairs, read from disk where the case has files."""
        if self.directory == "light":
            return [_light_data(self)]
        if self.data and isinstance(self.data[0], Path):
            model = onnx.load(str(self.source), load_external_data=False)
            return [_read_data_set(model, d) for d in self.data]  # type: ignore[arg-type]
        return [([_normalize(v) for v in i], [_normalize(v) for v in o])
                for i, o in self.data]  # type: ignore[misc]


def _normalize(value: Any) -> Any:
    """A TensorProto (how generated cases give bf16 and float8 data) as an array."""
    return numpy_helper.to_array(value) if isinstance(value, onnx.TensorProto) else value


def _parse(path: Path, type_: TypeProto) -> Any:
    raw = path.read_bytes()
    if type_.HasField("sequence_type"):
        seq = onnx.SequenceProto()
        seq.ParseFromString(raw)
        return numpy_helper.to_list(seq)
    if type_.HasField("optional_type"):
        opt = onnx.OptionalProto()
        opt.ParseFromString(raw)
        return numpy_helper.to_optional(opt)
    tensor = onnx.TensorProto()
    tensor.ParseFromString(raw)
    return numpy_helper.to_array(tensor)


def _read_data_set(model: onnx.ModelProto, folder: Path) -> DataSet:
    inits = {t.name for t in model.graph.initializer}
    ins = [v for v in model.graph.input if v.name not in inits]
    outs = list(model.graph.output)
    n_in = len(list(folder.glob("input_*.pb")))
    n_out = len(list(folder.glob("output_*.pb")))
    inputs = [_parse(folder / f"input_{i}.pb", ins[i].type) for i in range(n_in)]
    expected = [_parse(folder / f"output_{i}.pb", outs[i].type) for i in range(n_out)]
    return inputs, expected


def _light_data(case: Case) -> DataSet:
    path = Path(case.source)  # type: ignore[arg-type]
    model = onnx.load(str(path), load_external_data=False)
    inits = {t.name for t in model.graph.initializer}
    inputs = []
    for v in model.graph.input:
        if v.name in inits:
            continue
        shape = tuple(d.dim_value if d.HasField("dim_value") else 1
                      for d in v.type.tensor_type.shape.dim)
        n = int(np.prod(shape))
        inputs.append((np.arange(n).reshape(shape) / n).astype(np.float32))
    expected = _parse(path.with_name(path.stem + "_output_0.pb"), model.graph.output[0].type)
    return inputs, [expected]


def _file_cases(directory: str) -> list[Case]:
    cases = []
    for test in sorted((DATA_ROOT / directory).iterdir()):
        model = test / "model.onnx"
        if model.is_file():
            sets = tuple(sorted(test.glob("test_data_set_*")))
            cases.append(Case(directory, test.name, model, sets))
    return cases


def _light_cases() -> list[Case]:
    return [Case("light", "test_" + p.stem.removeprefix("light_"), p, ())
            for p in sorted((DATA_ROOT / "light").glob("light_*.onnx"))]


def _node_cases() -> list[Case]:
    from onnx.backend.test.case import node

    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        generated = node.collect_testcases(None)
    seen: set[str] = set()
    cases = []
    for tc in generated:
        if tc.name in seen or tc.model is None:
            continue
        seen.add(tc.name)
        sets = tuple((list(i), list(o)) for i, o in tc.data_sets or ())
        cases.append(Case("node", tc.name, tc.model, sets))
    return sorted(cases, key=lambda c: c.name)


@functools.cache
def all_cases() -> tuple[Case, ...]:
    """Every case of every directory, node cases first, each directory sorted by name."""
    cases = _node_cases()
    for directory in FILE_DIRS:
        cases += _file_cases(directory)
    return tuple(cases + _light_cases())
