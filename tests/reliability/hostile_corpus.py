"""A corpus of hostile ONNX models, written from Python (no binary blobs in the repository),
and a child-process driver that loads each one under a memory cap and a per-case alarm.

``write_corpus(folder)`` makes one sub-folder per case (``model.onnx`` plus whatever files the
case needs: external data, links, a FIFO). ``python hostile_corpus.py FOLDER LIMIT_MB`` loads
every case with ``RLIMIT_AS`` capped at ``LIMIT_MB`` and prints one JSON line per case
(``rejected`` with the error's class and message, ``accepted``, ``escaped`` for a
non-tilefuse exception, ``hang`` when the alarm fired), then one line with the peak RSS.
The existing tests in tests/onnx/test_onnx_errors.py cover a few defects one by one; this
corpus is the systematic sweep.
"""

from __future__ import annotations

import json
import os
import resource
import signal
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

F32 = TensorProto.FLOAT
CASE_SECONDS = 20


def _model(nodes, inputs, outputs, initializers=(), opset: int = 17) -> onnx.ModelProto:
    graph = helper.make_graph(
        list(nodes), "hostile",
        [helper.make_tensor_value_info(n, t, s) for n, t, s in inputs],
        [helper.make_tensor_value_info(n, t, None) for n, t in outputs],
        initializer=list(initializers))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    return model


def _base() -> onnx.ModelProto:
    w = numpy_helper.from_array(np.linspace(-1, 1, 12, dtype=np.float32).reshape(4, 3), "w")
    return _model([helper.make_node("MatMul", ["x", "w"], ["h"], name="mm"),
                   helper.make_node("Relu", ["h"], ["y"], name="act")],
                  [("x", F32, [2, 4])], [("y", F32)], [w])


def _external(location: str, offset: str = "0", length: str | None = "48") -> onnx.ModelProto:
    model = _base()
    w = model.graph.initializer[0]
    w.ClearField("raw_data")
    w.data_location = TensorProto.EXTERNAL
    fields = {"location": location, "offset": offset}
    if length is not None:
        fields["length"] = length
    for key, value in fields.items():
        w.external_data.add(key=key, value=value)
    return model


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


Writer = Callable[[Path], None]


def _save(model: onnx.ModelProto | bytes) -> Writer:
    def write(folder: Path) -> None:
        data = model if isinstance(model, bytes) else model.SerializeToString()
        (folder / "model.onnx").write_bytes(data)
    return write


def _mutated(edit: Callable[[onnx.ModelProto], None]) -> Writer:
    model = _base()
    edit(model)
    return _save(model)


def _with_files(model: onnx.ModelProto, setup: Callable[[Path], None]) -> Writer:
    def write(folder: Path) -> None:
        setup(folder)
        _save(model)(folder)
    return write


def _dims(*dims: int) -> Callable[[onnx.ModelProto], None]:
    def edit(model: onnx.ModelProto) -> None:
        model.graph.initializer[0].dims[:] = list(dims)
    return edit


def _input_dim(value: int) -> Callable[[onnx.ModelProto], None]:
    def edit(model: onnx.ModelProto) -> None:
        model.graph.input[0].type.tensor_type.shape.dim[1].dim_value = value
    return edit


def _elem_type(value: int) -> Callable[[onnx.ModelProto], None]:
    def edit(model: onnx.ModelProto) -> None:
        model.graph.input[0].type.tensor_type.elem_type = value
    return edit


def _init_type(value: int) -> Callable[[onnx.ModelProto], None]:
    def edit(model: onnx.ModelProto) -> None:
        model.graph.initializer[0].data_type = value
    return edit


def _huge_shape_op(op: str) -> onnx.ModelProto:
    """An op that would make 2^40 elements from a tiny model (a memory bomb)."""
    big = numpy_helper.from_array(np.array([1 << 20, 1 << 20], np.int64), "shape")
    if op == "ConstantOfShape":
        node = helper.make_node(op, ["shape"], ["y"], name="bomb")
        return _model([node], [], [("y", F32)], [big])
    if op == "Expand":
        node = helper.make_node(op, ["x", "shape"], ["y"], name="bomb")
        return _model([node], [("x", F32, [1, 1])], [("y", F32)], [big])
    if op == "Tile":
        node = helper.make_node(op, ["x", "shape"], ["y"], name="bomb")
        return _model([node], [("x", F32, [2, 2])], [("y", F32)], [big])
    if op == "Range":
        inits = [numpy_helper.from_array(np.array(v, np.float32), n)
                 for n, v in (("a", 0.0), ("b", 1e13), ("d", 1.0))]
        node = helper.make_node(op, ["a", "b", "d"], ["y"], name="bomb")
        return _model([node], [], [("y", F32)], inits)
    raise ValueError(op)


def _cases() -> dict[str, Writer]:
    base = _base().SerializeToString()
    cases: dict[str, Writer] = {}
    for cut in sorted({1, 2, 5, 9, 17, 33, len(base) // 3, len(base) // 2, len(base) - 1}):
        cases[f"truncated_{cut}"] = _save(base[:cut])
    graph_tag = bytes([0x3A])                      # ModelProto.graph, length-delimited
    cases["declared_length_2^62"] = _save(graph_tag + _varint(1 << 62) + b"\0" * 8)
    cases["declared_length_past_end"] = _save(base + graph_tag + _varint(1 << 20) + b"abc")
    cases["varint_overlong"] = _save(bytes([0x08]) + b"\xff" * 11)
    cases["init_dims_huge"] = _mutated(_dims(1 << 31, 1 << 31))
    cases["init_dims_overflow_int64"] = _mutated(_dims(1 << 62, 1 << 62, 1 << 62))
    cases["init_dims_negative"] = _mutated(_dims(-4, -3))
    cases["init_dims_zero_with_data"] = _mutated(_dims(0, 3))
    cases["input_dim_negative"] = _mutated(_input_dim(-7))
    cases["input_dim_huge"] = _mutated(_input_dim(1 << 40))
    cases["input_type_undefined"] = _mutated(_elem_type(0))
    cases["input_type_string"] = _mutated(_elem_type(TensorProto.STRING))
    cases["input_type_unknown_999"] = _mutated(_elem_type(999))
    cases["init_type_string"] = _mutated(_init_type(TensorProto.STRING))
    cases["init_type_unknown"] = _mutated(_init_type(12345))
    cases["init_type_int64_with_float_bytes"] = _mutated(_init_type(TensorProto.INT64))
    cases.update(_structural_cases())
    cases.update(_external_cases())
    for op in ("ConstantOfShape", "Expand", "Tile", "Range"):
        cases[f"memory_bomb_{op}"] = _save(_huge_shape_op(op))
    return cases


def _structural_cases() -> dict[str, Writer]:
    relu = helper.make_node("Relu", ["y"], ["y"], name="self_loop")
    cases: dict[str, Writer] = {
        "self_loop": _save(_model([relu], [("x", F32, [2])], [("y", F32)])),
        "missing_required_input": _save(_model(
            [helper.make_node("MatMul", ["x", ""], ["y"], name="mm")],
            [("x", F32, [2, 2])], [("y", F32)])),
        "output_names_nothing": _save(_model([], [("x", F32, [2])], [("ghost", F32)])),
        "no_outputs": _save(_model([helper.make_node("Relu", ["x"], ["y"])],
                                   [("x", F32, [2])], [])),
        "duplicate_inputs": _save(_model([helper.make_node("Relu", ["x"], ["y"])],
                                         [("x", F32, [2]), ("x", F32, [3])], [("y", F32)])),
        "no_opset_import": _mutated(lambda m: m.ClearField("opset_import")),
        "wrong_attr_type": _save(_model(
            [helper.make_node("Transpose", ["x"], ["y"], perm=[0.5, 1.5])],
            [("x", F32, [2, 3])], [("y", F32)])),
        "axis_out_of_range": _save(_model(
            [helper.make_node("Softmax", ["x"], ["y"], axis=9)],
            [("x", F32, [2, 3])], [("y", F32)])),
        "reshape_shape_float": _save(_model(
            [helper.make_node("Reshape", ["x", "s"], ["y"])], [("x", F32, [2, 3])],
            [("y", F32)], [numpy_helper.from_array(np.array([3.0, 2.0], np.float32), "s")])),
        "matmul_shape_mismatch": _save(_model(
            [helper.make_node("MatMul", ["x", "w"], ["y"])], [("x", F32, [2, 5])],
            [("y", F32)], [numpy_helper.from_array(np.ones((4, 3), np.float32), "w")])),
        "deep_chain_3000": _save(_model(
            [helper.make_node("Neg", [f"v{i}"], [f"v{i + 1}"]) for i in range(3000)],
            [("v0", F32, [2])], [("v3000", F32)])),
    }
    return cases


def _fifo(folder: Path) -> None:
    os.mkfifo(folder / "w.bin")


def _link_loop(folder: Path) -> None:
    os.symlink("b.bin", folder / "a.bin")
    os.symlink("a.bin", folder / "b.bin")


def _outside_link(folder: Path) -> None:
    (folder.parent / f"{folder.name}-secret.bin").write_bytes(b"\0" * 64)
    os.symlink(folder.parent / f"{folder.name}-secret.bin", folder / "w.bin")


def _weights(folder: Path) -> None:
    (folder / "w.bin").write_bytes(b"\0" * 48)


def _external_cases() -> dict[str, Writer]:
    return {
        "external_dotdot": _with_files(_external("../x.bin"), _weights),
        "external_absolute": _with_files(_external("/dev/zero"), _weights),
        "external_empty_location": _with_files(_external(""), _weights),
        "external_nul_byte": _with_files(_external("w.bin\0x"), _weights),
        "external_directory": _with_files(_external("."), _weights),
        "external_fifo": _with_files(_external("w.bin"), _fifo),
        "external_symlink_loop": _with_files(_external("a.bin"), _link_loop),
        "external_symlink_outside": _with_files(_external("w.bin"), _outside_link),
        "external_length_2^62": _with_files(_external("w.bin", length=str(1 << 62)), _weights),
        "external_offset_negative": _with_files(_external("w.bin", offset="-8"), _weights),
        "external_offset_not_number": _with_files(_external("w.bin", offset="zero"), _weights),
        "external_length_missing_file_short": _with_files(
            _external("w.bin", length=None), lambda f: (f / "w.bin").write_bytes(b"\0" * 7)),
    }


def write_corpus(folder: Path) -> list[str]:
    """Writes every case under ``folder`` (one sub-folder each); returns their names."""
    names = []
    for name, write in _cases().items():
        case = folder / name
        case.mkdir(parents=True)
        write(case)
        names.append(name)
    return names


def _try(path: Path) -> dict:
    import tilefuse.onnx
    from tilefuse.errors import TilefuseError

    try:
        model = tilefuse.onnx.load(path)
        inputs = [np.ones([d if isinstance(d, int) else 3 for d in spec.dims or ()],
                          spec.dtype.np if spec.dtype else np.float32)
                  for spec in model.info.inputs]
        model(*inputs)
        return {"outcome": "accepted"}
    except TilefuseError as err:
        return {"outcome": "rejected", "error": type(err).__name__, "message": str(err)}
    except TimeoutError:
        return {"outcome": "hang"}
    except Exception as err:  # what the test exists to catch
        return {"outcome": "escaped", "error": type(err).__name__, "message": str(err)[:500]}


def _alarm(signum: int, frame: object) -> None:
    raise TimeoutError


def main(folder: str, limit_mb: int) -> None:
    limit = limit_mb << 20
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    signal.signal(signal.SIGALRM, _alarm)
    for case in sorted(Path(folder).iterdir()):
        if not case.is_dir():
            continue
        signal.alarm(CASE_SECONDS)
        result = _try(case / "model.onnx")
        signal.alarm(0)
        print(json.dumps({"case": case.name, **result}), flush=True)
    print(json.dumps({"peak_rss_kb": _peak_rss_kb()}), flush=True)


def _peak_rss_kb() -> int:
    """This process's peak resident set since it started running this program: ``VmHWM`` of
    its own address space. (``getrusage``'s ``ru_maxrss`` survives ``execve``, so in a child
    forked from a large pytest process it reports the parent's size.)"""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
