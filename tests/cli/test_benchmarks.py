"""benchmarks/: the report (table, JSON, docs between markers) and the model-workload runner on
a small ONNX model, a model tilefuse cannot import, and a --from-json rewrite of the docs."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"
sys.path.insert(0, str(BENCH))

import report  # noqa: E402
from model_workloads import ModelWorkload, model_workloads, run_model_workload  # noqa: E402


def _records() -> list[dict]:
    return [
        {"workload": "W1", "title": "gelu", "group": "compass", "status": "ok",
         "median_s": {"tilefuse": 9e-3, "numpy": 30e-3, "onnxruntime": 9.9e-3},
         "checks": {"tilefuse": "ok", "numpy": "ok", "onnxruntime": "ok"},
         "skipped": {"torch": "torch not installed"}},
        {"workload": "W5", "title": "mlp", "group": "compass", "status": "ok",
         "median_s": {"tilefuse": 20e-6, "torch": 10e-6},
         "checks": {"tilefuse": "ok", "torch": "differs: max abs error 1"}, "skipped": {}},
        {"workload": "light_x", "title": "x", "group": "onnx-light", "status": "not supported",
         "note": "OnnxError: unsupported op Foo"},
    ]


def test_table_shows_ratios_targets_and_unsupported_models():
    text = report.table(_records())
    w1, w5, light = text.splitlines()[2:]
    assert "| 9 ms |" in w1 and "30 ms (3.33x)" in w1 and "9.9 ms (1.10x)" in w1
    assert "| 0.91x | ≤ 0.8x best peer | no" in w1 and "| n/a |" in w1  # torch left out
    assert "10 us (0.50x) ⚠" in w5 and "| – | ≤ 10 µs and ≤ 0.8x best peer | no" in w5
    assert "**not supported**: OnnxError: unsupported op Foo" in light


def test_a_peer_with_a_wrong_output_is_not_the_best_peer():
    record = {"workload": "W3", "title": "softmax", "group": "compass", "status": "ok",
              "median_s": {"tilefuse": 2e-3, "onnxruntime": 1e-3, "openvino": 4e-3},
              "checks": {"tilefuse": "ok", "onnxruntime": "differs: max abs error 1",
                         "openvino": "ok"}, "skipped": {}}
    row = report.table([record]).splitlines()[2]
    assert "1 ms (0.50x) ⚠" in row and "| 0.50x | ≤ 0.8x best peer | **yes** |" in row


def test_write_docs_replaces_only_the_generated_block(tmp_path):
    doc = tmp_path / "PERFORMANCE.md"
    doc.write_text(f"# Performance\n\nprose before\n\n{report.BEGIN}\nold table\n"
                   f"{report.END}\n\nprose after\n")
    payload = {"meta": {"date": "2026-11-29", "machine": "cpu", "threads": 2, "rounds": 3},
               "results": _records()}
    report.write_docs(payload, doc)
    text = doc.read_text()
    assert "prose before" in text and "prose after" in text and "old table" not in text
    assert text.count(report.BEGIN) == 1 and "| W1 gelu | 9 ms |" in text
    assert "W1: torch left out (torch not installed)" in text


def test_run_from_json_rewrites_docs(tmp_path, capsys):
    import run

    saved, doc = tmp_path / "bench.json", tmp_path / "PERF.md"
    payload = {"meta": {"date": "2026-11-29", "machine": "cpu", "threads": 2, "rounds": 3},
               "results": _records()}
    report.save_json(payload, saved)
    assert run.main(["--from-json", str(saved), "--write-docs", str(doc)]) == 0
    assert "| W1 gelu |" in capsys.readouterr().out
    assert report.BEGIN in doc.read_text() and "bench.json" in doc.read_text()


def test_model_workload_on_small_onnx(small_onnx):
    pytest.importorskip("onnxruntime")
    import numpy as np

    from tilefuse.cli.models import OnnxFile
    from tilefuse.dtypes import DType
    from tilefuse.testing import random_array

    x = random_array(np.random.default_rng(0), (7, 13), DType.f32)
    w = ModelWorkload("small", "relu(x @ w + b)", "onnx-light",
                      lambda: (OnnxFile(str(small_onnx)), [x]), ("onnxruntime",))
    record = run_model_workload(w, rounds=1, threads=1)
    assert record["status"] == "ok"
    assert record["checks"] == {"tilefuse": "ok", "onnxruntime": "reference"}
    assert set(record["median_s"]) == {"tilefuse", "onnxruntime"}


def test_model_workload_on_small_onnx_with_openvino(small_onnx):
    pytest.importorskip("openvino")
    import numpy as np

    from tilefuse.cli.models import OnnxFile
    from tilefuse.dtypes import DType
    from tilefuse.testing import random_array

    x = random_array(np.random.default_rng(1), (7, 13), DType.f32)
    w = ModelWorkload("small", "relu(x @ w + b)", "onnx-light",
                      lambda: (OnnxFile(str(small_onnx)), [x]), ("onnxruntime", "openvino"))
    record = run_model_workload(w, rounds=1, threads=1)
    assert record["status"] == "ok", record
    assert record["checks"] == {"tilefuse": "ok", "onnxruntime": "reference", "openvino": "ok"}


@pytest.mark.parametrize("name", ["W1", "W2", "W7"])
def test_compass_peers_jax_and_openvino_compute_the_workload(name):
    """jax.jit runs the same NumPy function through jax.numpy (W1's erf and W7's expit through
    jax.scipy.special), OpenVINO the same ONNX graph in f32; both match NumPy on small
    inputs of odd sizes."""
    pytest.importorskip("jax")
    pytest.importorskip("openvino")
    import dataclasses

    import numpy as np
    from harness import compass_peers
    from workloads import WORKLOADS

    from tilefuse.testing import assert_close

    small = {"W1": lambda r: [r.standard_normal((5, 24), dtype=np.float32),
                              r.standard_normal((24, 33), dtype=np.float32) / 5,
                              r.standard_normal(33, dtype=np.float32)],
             "W2": lambda r: [r.standard_normal((9, 77), dtype=np.float32),
                              r.standard_normal(77, dtype=np.float32),
                              r.standard_normal(77, dtype=np.float32)],
             "W7": lambda r: [r.standard_normal(1000, dtype=np.float32) * 4]}
    w = dataclasses.replace(next(x for x in WORKLOADS if x.name == name),
                            make_inputs=small[name])
    inputs = w.make_inputs(np.random.default_rng(3))
    impls, skipped = compass_peers(w, inputs, threads=1)
    assert not {"jax", "openvino"} & set(skipped)
    want = w.numpy_fn(*inputs)
    for peer in ("jax", "openvino"):
        out = impls[peer]()
        got = np.asarray(out[0] if isinstance(out, list) else out)
        assert got.dtype == np.float32
        assert_close(got.reshape(want.shape), want.astype(np.float32))


def test_peer_versions_are_recorded():
    versions = report.peer_versions()
    assert "numpy" in versions and "onnxruntime" in versions
    payload = {"meta": {"date": "2026-12-03", "machine": "cpu", "threads": 2, "rounds": 3,
                        "versions": {"jax": "0.10.2"}}, "results": _records()}
    assert "Versions: jax 0.10.2." in report.docs_block(payload)


def test_model_workload_tilefuse_cannot_import_is_not_supported(tmp_path):
    import onnx
    from onnx import TensorProto, helper

    node = helper.make_node("NoSuchOp", ["x"], ["y"], domain="com.example")
    graph = helper.make_graph([node], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3])])
    path = tmp_path / "odd.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                      helper.make_opsetid("com.example", 1)]),
              path)

    def load():
        from tilefuse.cli.models import OnnxFile
        return OnnxFile(str(path)), [np.ones(3, np.float32)]

    import numpy as np
    record = run_model_workload(ModelWorkload("odd", "odd", "onnx-light", load,
                                              ("onnxruntime",)), rounds=1, threads=1)
    assert record["status"] == "not supported" and "NoSuchOp" in record["note"]


def test_model_workloads_list_light_models_and_bert():
    names = [w.name for w in model_workloads()]
    assert "bert" in names
    if pytest.importorskip("onnx"):
        assert "light_squeezenet" in names and "light_resnet50" in names


def test_contraction_peers_runs_on_small_onnx(small_onnx, capsys):
    import contraction_peers

    assert contraction_peers.main([str(small_onnx), "--rounds", "1", "--calls", "1"]) == 0
    out = capsys.readouterr().out
    assert "peaks measured beside the kernels" in out
    [row] = [line for line in out.splitlines() if line.startswith("k")][1:]
    assert " 7x" in row and "x13 " in row and "contraction tile(" in row


def test_kernel_ab_runs_on_small_onnx(small_onnx, capsys):
    import kernel_ab

    assert kernel_ab.main([str(small_onnx), "--prefetch", "B=8", "--rounds", "1",
                           "--calls", "1"]) == 0
    out = capsys.readouterr().out
    [row] = [line for line in out.splitlines() if line.startswith("k")][1:]
    assert "x13 " in row and "prefetch(B+8)" in row
    assert "median ratio" in out


def test_kernel_ab_skips_a_variant_that_does_not_fit(small_onnx, capsys):
    import kernel_ab

    assert kernel_ab.main([str(small_onnx), "--prefetch", "B=999", "--rounds", "1",
                           "--calls", "1"]) == 0
    captured = capsys.readouterr()
    assert "does not fit" in captured.err and "median ratio" not in captured.out


def test_kernel_ab_moves_the_threads_to_another_axis(small_onnx, capsys):
    import kernel_ab

    assert kernel_ab.main([str(small_onnx), "--parallel", "n", "--rounds", "1",
                           "--calls", "1"]) == 0
    [row] = [line for line in capsys.readouterr().out.splitlines()
             if line.startswith("k")][1:]
    assert "par(n)" in row
